"""The bench: identical-output flags, HF peers and their sweep, reports and the CLI (the timing harness
itself is tested in test_harness.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import transformers
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch import bench as bn
from skipsearch.bench import peers
from skipsearch.bench import report as br
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.data import Prompt
from skipsearch.engine import harness
from skipsearch.profile import Measured, load_profile, profile_from_dict, save_profile

CPU = torch.device("cpu")
EXAMPLE = "profiles/smollm2-135m/example.yaml"
runner = CliRunner()


class _CharTokenizer:
    """Enough of a tokenizer for encode_prompt on plain prompts: one id per character."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [2 + ord(c) % 60 for c in text]}


@pytest.fixture(scope="module")
def sm():
    torch.set_num_threads(1)
    model = make_tiny_model(name="tiny-bench")
    model.tokenizer = _CharTokenizer()
    # An EOS id past the vocabulary (0..63): never emitted, so every decode still runs its full length, but HF's
    # prompt lookup has one to look for (transformers 4.x's crashes on a model without EOS: isin(ids, None)).
    model.hf.generation_config.eos_token_id = model.hf.config.vocab_size
    return model


# Repetitive prompts, so that prompt lookup finds n-grams to draft from.
PROMPT_IDS = [[1, 5, 7, 9, 1, 5, 7, 9, 3], [2, 11, 4, 11, 4, 11, 6], [8, 8, 3, 8, 8, 3, 8]]
LABELS = ["t:a", "t:b", "t:c"]


def _tiny_profile(**draft):
    return profile_from_dict({"schema_version": 1, "model": {"name": "tiny-bench", "num_layers": 4},
                              "method": "layer-skip", "draft": {"max_draft_tokens": 3, **draft}})


def _broken(method: harness.Contender, *, prompt: tuple[int, ...], position: int) -> harness.Contender:
    """``method`` with one output token changed on one prompt: what a decoder bug looks like."""

    def decode(ids, max_new_tokens):
        out = method.decode(ids, max_new_tokens)
        if tuple(ids) != prompt:
            return out
        tokens = list(out.token_ids)
        tokens[position] = (tokens[position] + 1) % 64
        return dataclasses.replace(out, token_ids=tuple(tokens))

    return harness.Contender("broken", "skipsearch", "one token changed", decode)


# -- the identical-output check ------------------------------------------------------------------
def test_a_method_that_changes_one_token_is_flagged_and_gets_no_speedup(sm):
    ar = harness.ours_autoregressive(sm)
    methods = [bn.peer_method(sm, bn.BASELINE), ar, _broken(ar, prompt=tuple(PROMPT_IDS[1]), position=5)]
    runs = harness.run_rounds(methods, PROMPT_IDS, max_new_tokens=12, device=CPU)
    rows = {r.method: r for r in bn.summarize(methods, runs, LABELS)}
    bad = rows["broken"]
    assert bad.flagged and (bad.identical, bad.prompts) == (2, 3)
    assert bad.speedup is None and bad.vs_ours_ar is None
    assert bad.first_mismatch == "prompt t:b, token 5"
    for name in (bn.BASELINE, harness.OURS_AR):
        assert not rows[name].flagged and rows[name].identical == 3 and rows[name].speedup is not None
    # a flagged method gets no speedup on a subset where it happens to match either
    [sub] = [r for r in bn.summarize(methods, runs, LABELS, subset=[0], flagged=frozenset({"broken"}))
             if r.method == "broken"]
    assert sub.identical == sub.prompts == 1 and sub.speedup is None


def test_the_report_shows_the_flag_and_leaves_a_broken_profile_out_of_the_summary(sm):
    prof = _tiny_profile(skip_attn=[1])
    report = bn.bench(sm, [Prompt("a", "abcabcabc", False, "x", "t")], profiles=[("p/ok.yaml", prof)],
                      max_new_tokens=8)
    ok = report.row("layer-skip:ok")
    broken = dataclasses.replace(ok, method="layer-skip:bad", identical=0, speedup=None, vs_ours_ar=None,
                                 first_mismatch="prompt t:a, token 2")
    report = dataclasses.replace(report, rows=(*report.rows, broken))
    md = br.render_markdown(report)
    assert "| layer-skip:bad |" in md and "0/1 DIFFERS" in md and "no (output differs)" in md
    assert "Output differs from HF greedy (no speedup given): layer-skip:bad" in md
    summary = br.summarize_report(report)
    assert summary.flagged == ("layer-skip:bad",) and summary.best_profile == "layer-skip:ok"


# -- the HF peers (the harness itself: tests/test_harness.py) ------------------------------------------
def test_hf_peers_are_lossless_and_their_forwards_are_counted(sm):
    greedy = bn.peer_method(sm, bn.BASELINE)
    lookup = bn.peer_method(sm, "hf-prompt-lookup", 4)
    early = bn.peer_method(sm, "hf-early-exit", 2)
    for ids in PROMPT_IDS:
        ref = greedy.decode(ids, 16)
        # plain greedy: one full forward per token, nothing drafted
        assert ref.drafted == 0 and ref.accepted == 0 and ref.verify_steps == len(ref.token_ids) - 1
        for out in (lookup.decode(ids, 16), early.decode(ids, 16)):
            assert out.token_ids == ref.token_ids
            assert 0 <= out.accepted <= out.drafted
            # every full forward emits its accepted drafts plus one token
            assert out.accepted + out.verify_steps + 1 == len(out.token_ids)
    assert early.decode(PROMPT_IDS[0], 16).draft_steps > 0  # the truncated model's forwards are drafts
    assert lookup.decode(PROMPT_IDS[0], 16).drafted > 0  # the repeated 4-gram is looked up
    with pytest.raises(ConfigError, match="unknown peer"):
        bn.peer_method(sm, "hf-warp")


def test_early_exit_candidates_stay_inside_the_model():
    assert bn.early_exit_layers(30) == (4, 8, 15)
    assert all(1 <= v < 4 for v in bn.early_exit_layers(4))


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="transformers 4.x's prompt lookup can return more than max_new_tokens (12 for 10 here), "
                           "which bench rightly flags as a different output")
def test_the_sweep_times_every_value_and_picks_an_identical_one(sm):
    sweep = bn.sweep_peer(sm, "hf-prompt-lookup", PROMPT_IDS[:2], max_new_tokens=10, values=(2, 4))
    assert [r.setting for r in sweep.rows] == ["prompt_lookup_num_tokens=2", "prompt_lookup_num_tokens=4"]
    assert sweep.best in (2, 4) and all(not r.flagged for r in sweep.rows)
    fastest = max(sweep.rows, key=lambda r: r.tokens_per_s)
    assert fastest.setting.endswith(f"={sweep.best}")
    with pytest.raises(ConfigError, match="no setting"):
        bn.sweep_peer(sm, bn.BASELINE, PROMPT_IDS, max_new_tokens=4)


def test_bench_end_to_end_on_the_tiny_model(sm, tmp_path):
    prompts = [Prompt("a", "abcabcabc", False, "x", "t"), Prompt("b", "hello hello", False, "y", "t"),
               Prompt("c", "zzzz", False, "x", "t")]
    stages = []
    report = bn.bench(
        sm, prompts, profiles=[("p/ls.yaml", _tiny_profile(skip_attn=[1, 2])), ("q/ls.yaml", _tiny_profile())],
        peers=["hf-prompt-lookup", "hf-early-exit"], max_new_tokens=10, sweep_prompts=prompts[:1],
        peer_values={"hf-early-exit": (2,)}, dataset="t", split="all",
        on_stage=lambda title, total: stages.append((title, total)),
    )
    # a single value needs no sweep; the profiles' drafts are a stage of their own (a compiled one builds there)
    assert stages == [("sweep hf-prompt-lookup", 4), ("prepare the profiles' drafts", 0), ("bench", 3 * 6)]
    names = [r.method for r in report.rows]
    assert names == ["hf-greedy", "skipsearch-ar", "hf-prompt-lookup", "hf-early-exit", "layer-skip:ls",
                     "layer-skip:ls#2"]
    assert all(r.identical == r.prompts == 3 and r.speedup is not None for r in report.rows)
    assert report.row(bn.BASELINE).speedup == pytest.approx(1.0)
    assert report.row("layer-skip:ls").acceptance_rate is not None and report.row("layer-skip:ls").draft_ms > 0
    assert [c for c, _ in report.categories] == ["x", "y"]
    assert [r.prompts for r in dict(report.categories)["x"]] == [2] * 6
    assert len(report.prompts) == 3 * 6 and all(p.identical for p in report.prompts)
    assert report.settings.n_prompts == 3 and report.settings.sweep_prompts == 1
    # JSON: everything, machine-readable
    doc = json.loads(br.report_json(report))
    assert doc["format"] == "skipsearch-bench" and doc["version"] == br.JSON_VERSION
    assert [r["method"] for r in doc["rows"]] == names and set(doc["categories"]) == {"x", "y"}
    assert doc["sweeps"][0]["peer"] == "hf-prompt-lookup" and len(doc["sweeps"][0]["rows"]) == 3
    assert doc["summary"]["loop_overhead_gain"] == pytest.approx(report.row(harness.OURS_AR).speedup)
    # Markdown: one row per method, the breakdown, the sweep, the definitions
    md = br.render_markdown(report, command="skipsearch bench --n-prompts 3")
    for name in names:
        assert f"| {name} |" in md
    assert "3/3" in md and "### x (2 prompts)" in md and "(chosen)" in md and "skipsearch bench --n-prompts 3" in md
    assert "## Why" in md and "process resident memory" in md
    # rich: the same rows
    tables = br.rich_tables(report, by_category=True)
    assert len(tables) == 3 and tables[0].row_count == 6


def test_bench_rejects_unknown_peers_and_unswept_knobs_need_prompts(sm):
    prompts = [Prompt("a", "abc", False, "", "t")]
    with pytest.raises(ConfigError, match="unknown peer 'hf-warp'"):
        bn.bench(sm, prompts, peers=["hf-warp"])
    with pytest.raises(ConfigError, match="needs sweep prompts"):
        bn.bench(sm, prompts, peers=["hf-prompt-lookup"], max_new_tokens=4)
    report = bn.bench(sm, prompts, peers=["hf-prompt-lookup"], max_new_tokens=4, sweep=False)
    assert report.row("hf-prompt-lookup").setting == "prompt_lookup_num_tokens=4 (not swept)"


# -- summary and profile block ---------------------------------------------------------------------
def _row(method, family, speedup, vs_ar=None, identical=4):
    # a profile row drafted (acceptance 0.8); the AR row and the peers have none
    acceptance = 0.8 if family == "skipsearch" and method != "skipsearch-ar" else None
    return bn.BenchRow(method, family, "", 4, identical, 100, 1.0, 100.0, speedup, vs_ar, None, acceptance, None,
                       None, None, None, None)


def _report(rows):
    settings = bn.BenchSettings("m", "cpu", "float32", "d", "heldout", 4, 32, 1, 1, 0, "memory")
    return bn.BenchReport(settings, (("device_name", "cpu"),), tuple(rows), (), (), (), 1.0)


def test_the_summary_keeps_loop_overhead_and_speculation_gains_apart():
    report = _report([
        _row("hf-greedy", "hf", 1.0), _row("skipsearch-ar", "skipsearch", 1.25, 1.0),
        _row("layer-skip:a", "skipsearch", 1.5, 1.2), _row("layer-skip:b", "skipsearch", 0.9, 0.72),
        _row("hf-prompt-lookup", "hf", 0.8), _row("hf-early-exit", "hf", None, identical=3),
    ])
    s = br.summarize_report(report)
    assert s.loop_overhead_gain == 1.25 and s.speculation_gain == 1.2
    assert s.best_profile == "layer-skip:a" and s.best_profile_speedup == 1.5
    assert s.not_slower_than_hf_greedy and s.beats_every_peer and s.flagged == ("hf-early-exit",)
    text = "\n".join(br.summary_lines(report))
    assert "Loop overhead gain" in text and "1.25x" in text and "Speculation gain (layer-skip:a" in text
    assert "hf-early-exit differs" in text
    slow = br.summarize_report(_report([_row("hf-greedy", "hf", 1.0), _row("layer-skip:a", "skipsearch", 0.7, 0.8),
                                        _row("hf-prompt-lookup", "hf", 0.8)]))
    assert not slow.not_slower_than_hf_greedy and not slow.beats_every_peer


def test_a_profile_that_drafted_nothing_claims_no_speculation_gain():
    # the GPU bench: both searches shipped max_draft_tokens 0, and the plain-decoding profile's row ran 1.44x faster
    # than skipsearch-ar's on the same path; the summary called that a speculation gain
    report = _report([
        _row("hf-greedy", "hf", 1.0), _row("skipsearch-ar", "skipsearch", 0.97, 1.0),
        dataclasses.replace(_row("layer-skip:plain", "skipsearch", 1.39, 1.44), acceptance_rate=None),
    ])
    s = br.summarize_report(report)
    assert s.speculation_gain is None and not s.best_drafted and s.best_vs_ours_ar == 1.44
    text = "\n".join(br.summary_lines(report))
    assert "Speculation gain: none" in text and "drafted no token" in text and "1.44x" in text
    assert "Speculation gain (" not in text


def test_a_profile_inside_hf_generate_is_held_to_its_own_row_not_counted_as_a_peer():
    report = _report([
        _row("hf-greedy", "hf", 1.0), _row("skipsearch-ar", "skipsearch", 2.0, 1.0),
        _row("hybrid:code", "skipsearch", 3.0, 1.5), _row("hf-prompt-lookup", "hf", 1.1),
        _row("hf-generate+profile:code", bn.PROFILE_IN_HF, 3.06),
        _row("hf-generate+profile:chat", bn.PROFILE_IN_HF, 2.0),
    ])
    s = br.summarize_report(report)
    assert s.peers == (("hf-prompt-lookup", 1.1),) and s.beats_every_peer  # 3.06x inside HF is not a rival
    assert s.inside_hf[0] == ("hf-generate+profile:code", 3.06, pytest.approx(1.02))
    assert s.inside_hf[1] == ("hf-generate+profile:chat", 2.0, None)  # no own row to hold it to
    text = "\n".join(br.summary_lines(report))
    assert "1.020 of the same profile's own row; goal 'within 5% of decode': met" in text
    slow = _report([_row("hf-greedy", "hf", 1.0), _row("hybrid:code", "skipsearch", 3.0, 1.5),
                    _row("hf-generate+profile:code", bn.PROFILE_IN_HF, 2.7)])
    assert "0.900 of the same profile's own row; goal 'within 5% of decode': missed" in "\n".join(
        br.summary_lines(slow))


def test_the_last_line_says_what_shipped_beside_hf_greedy_and_hf_compiled_on_this_machine():
    env = (("cpu_model", "AMD EPYC"), ("cpu_capability", "AVX2"), ("threads", 2))
    rows = [_row("hf-greedy", "hf", 1.0), _row("hf-compiled", "hf", 2.0), _row("skipsearch-ar", "skipsearch", 2.2, 1),
            _row("hybrid:quickstart", "skipsearch", 3.7, 1.7), _row("layer-skip:x", "skipsearch", None, identical=3)]
    report = dataclasses.replace(_report(rows), environment=env)
    last = br.summary_lines(report)[-1]
    assert last == ("hybrid:quickstart: 100.0 tokens/s on this machine (AMD EPYC, AVX2, 2 threads), 3.70x HF greedy "
                    "and 1.85x HF compiled greedy in this run; output identical to HF greedy on 4 of 4 prompts.")
    alone = _report([_row("hf-greedy", "hf", 1.0), _row("hybrid:q", "skipsearch", 1.5, 1.2)])
    assert br.headline(alone).startswith("hybrid:q: 100.0 tokens/s on this machine (cpu), 1.50x HF greedy in this run")
    assert br.headline(_report([_row("hf-greedy", "hf", 1.0), _row("hybrid:q", "skipsearch", None, identical=2)])) \
        is None  # no profile whose output was HF greedy's: nothing to claim


def test_a_bench_row_becomes_a_valid_measured_block(tmp_path):
    report = _report([_row("hf-greedy", "hf", 1.0), _row("layer-skip:example", "skipsearch", 1.1, 1.05)])
    measured = br.measured_for(report, report.row("layer-skip:example"))
    assert measured.source == "bench" and measured.speedup == 1.1 and measured.baseline == "hf-greedy"
    path = save_profile(dataclasses.replace(load_profile(EXAMPLE), measured=measured), tmp_path / "p.yaml")
    assert load_profile(path).measured.speedup == 1.1
    # what optimize measured against our own loop moves aside, with its baseline: two speedups, two baselines
    searched = Measured(speedup=1.3, baseline="skipsearch-ar", source="optimize", extra=(("alpha", 0.7),))
    again = br.measured_for(report, report.row("layer-skip:example"), searched)
    assert again.baseline == "hf-greedy" and again.speedup == 1.1
    assert dict(again.extra) == {"alpha": 0.7, "before_bench": {"speedup": 1.3, "baseline": "skipsearch-ar",
                                                                 "source": "optimize"}}


# -- CLI ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--peers", "hf-greedy,hf-warp"], "unknown peer 'hf-warp'"),
        (["--vllm-python", "x"], "--vllm-python needs --peers vllm"),
        (["--profiles", "no/such/*.yaml"], "no profile matches"),
        (["--profiles", "no-such.yaml"], "cannot read the profile"),
        (["--dataset", "nope.txt"], "unknown dataset"),
        (["--split", "test"], "unknown split"),
        (["--model", "other-model", "--profiles", EXAMPLE], "bench one model at a time"),
    ],
)
def test_cli_bad_input_is_one_line_before_the_model_loads(args, fragment):
    assert_one_line_error(runner.invoke(app, ["bench", *args]), fragment)


def test_cli_takes_shell_expanded_profiles_after_the_option(tmp_path):
    # `--profiles dir/*.yaml` reaches the CLI as `--profiles a.yaml b.yaml`: b.yaml must count as a profile
    good, bad = tmp_path / "a.yaml", tmp_path / "b.yaml"
    shutil.copy(EXAMPLE, good)
    bad.write_text("schema_version: 1\n")
    assert_one_line_error(runner.invoke(app, ["bench", "--profiles", str(good), str(bad), "--peers", "hf-greedy"]),
                    f"{bad}: missing required key")


def test_cli_collects_profiles_from_options_commas_globs_and_arguments(tmp_path):
    from skipsearch.api import profile_paths

    for name in ("a.yaml", "b.yaml"):
        shutil.copy(EXAMPLE, tmp_path / name)
    a, b = str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")
    assert profile_paths([str(tmp_path / "*.yaml")]) == [a, b]
    assert profile_paths([f"{b},{a}", a]) == [b, a]


@pytest.mark.model
def test_cli_end_to_end_on_the_default_model(tmp_path):
    prof = tmp_path / "example.yaml"
    shutil.copy(EXAMPLE, prof)
    md, js = tmp_path / "bench.md", tmp_path / "bench.json"
    result = runner.invoke(app, [
        "bench", "--profiles", str(prof), "--peers", "hf-greedy", "--dataset", "humaneval", "--n-prompts", "1",
        "--max-new-tokens", "8", "--threads", "1", "--report", str(md), "--json-out", str(js), "--write-measured",
    ])
    assert result.exit_code == 0, result.output
    assert "layer-skip:example" in result.stdout and "Loop overhead gain" in result.stdout
    doc = json.loads(js.read_text())
    assert [r["method"] for r in doc["rows"]] == ["hf-greedy", "skipsearch-ar", "layer-skip:example"]
    assert all(r["identical"] == r["prompts"] == 1 for r in doc["rows"])
    assert doc["settings"]["split"] == "heldout" and doc["settings"]["model"] == "smollm2-135m"
    assert "skipsearch bench --model smollm2-135m" in md.read_text()
    measured = load_profile(prof).measured
    assert measured.source == "bench" and measured.n_prompts == 1 and measured.speedup is not None
    assert measured.baseline == "hf-greedy"  # bench's speedup is over HF greedy, and the field says so


def test_a_failed_hf_call_cannot_leave_the_model_truncated(sm):
    # HF's early-exit drafter lowers num_hidden_layers without try/finally; the counter restores it
    with pytest.raises(RuntimeError), peers._count_forwards(sm):
        sm.hf.model.config.num_hidden_layers = 1
        raise RuntimeError("inside HF generate")
    assert sm.hf.model.config.num_hidden_layers == sm.num_layers


def test_writing_a_measured_block_keeps_what_the_search_recorded(tmp_path):
    from skipsearch.profile import Measured

    report = _report([_row("hf-greedy", "hf", 1.0), _row("layer-skip:example", "skipsearch", 0.9, 0.95)])
    searched = Measured(speedup=0.83, source="optimize", notes="no (n, w) beat plain decoding",
                        extra=(("grid", [[3, 3, 0.83]]), ("alpha", 0.87)))
    measured = br.measured_for(report, report.row("layer-skip:example"), searched)
    assert measured.source == "bench" and measured.speedup == 0.9
    extra = dict(measured.extra)
    assert extra["grid"] == [[3, 3, 0.83]] and extra["alpha"] == 0.87
    assert extra["before_bench"] == {"speedup": 0.83, "source": "optimize", "notes": "no (n, w) beat plain decoding"}
    path = save_profile(dataclasses.replace(load_profile(EXAMPLE), measured=measured), tmp_path / "p.yaml")
    again = br.measured_for(report, report.row("layer-skip:example"), load_profile(path).measured)
    assert dict(again.extra)["grid"] == [[3, 3, 0.83]]  # a second bench keeps it too
