"""``optimize --engine llama.cpp``: llama.cpp's settings timed on its own server over two passes (the second
reversed), a setting shipped only if it stayed identical and beat plain by the margin in every pass, the record the
profile keeps (``measured.engines``, validated on load), and the export that writes the measured setting or
refuses where nothing beat plain. Against the stand-in llama-server of test_llamacpp_peer; no real engine here."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import assert_one_line_error
from test_export import _profile
from test_llamacpp_peer import _requests, bpe_sm, fake_server  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from skipsearch.api.export import export_profile
from skipsearch.bench import llamacpp as lp
from skipsearch.bench import llamacpp_ggufs as lg
from skipsearch.bench import llamacpp_search as ls
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.export import ExportError
from skipsearch.files.engine_runs import DRAFT_GGUF, EngineRun, engine_run_to_dict
from skipsearch.files.errors import ProfileError
from skipsearch.profile import engine_run, load_profile, profile_to_dict, save_profile, with_engine_run
from skipsearch.servers.llamacpp import Completion

runner = CliRunner()


def _answers(sm, prompts, n, path):
    """The stand-in server's answers: HF greedy's tokens for each prompt, as llama.cpp's F32 target computes them."""
    from skipsearch.engine.decoding import hf_generate

    path.write_text(json.dumps({json.dumps(p): list(hf_generate(sm, p, max_new_tokens=n)) for p in prompts}))
    return path


def test_two_passes_the_second_reversed_and_the_fastest_identical_setting_ships(fake_server, bpe_sm, tmp_path,  # noqa: F811
                                                                                monkeypatch):
    sm, ckpt = bpe_sm
    prompts = [[3, 4, 5, 3, 4], [9, 9, 8]]
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(sm, prompts, 6, tmp_path / "answers.json")))
    lookup = _profile(sm, "ngram", min_n=2, max_n=2)
    opened = []
    passes = ls.search_llamacpp(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server), checkpoint=ckpt,
                                profiles=[("lookup", lookup)], runs=2, n_max=(2, 4), ngram_n=(3,), drafts=("q8_0",),
                                cache=tmp_path / "cache", start_timeout=60,
                                on_setting=lambda run, name, i, n: opened.append((run, name)))
    assert len(passes) == 2
    first = [r.setting.name for r in passes[0].settings]
    assert first[0] == "plain" and [r.setting.name for r in passes[1].settings] == first[::-1]  # plain last
    assert opened[-1] == (1, "")  # the pass closes
    # every request of pass 2 came after pass 1's: the passes did not overlap
    servers = [q["argv"][q["argv"].index("--port") + 1] for q in _requests(tmp_path)]
    assert len(set(servers)) == 2 * len(first)  # a server of its own for each setting in each pass
    ranked = ls.rank(passes)
    by = {r.name: r for r in ranked}
    assert ranked[0].name == "plain" and by["plain"].clean and by["plain"].speedups == (1.0, 1.0)
    # the stand-in answers a draft model's settings fastest, with token 1 changed: never shipped
    assert not by["draft q8_0 n=2"].clean and by["draft q8_0 n=2"].identical == 0
    assert by["draft q8_0 n=2"].worst > by["ngram 3/2"].worst > 1.5  # faster, and differs
    ships, best = ls.choose(ranked)
    assert ships is best and ships.kind in (lp.NGRAM, lp.DEFAULT, lp.EXPORT) and ships.clean
    run = ls.engine_run(passes, ranked, version="version: test", hardware="this CPU", workload="2 prompts")
    assert run.setting == ships.name and run.speedup == pytest.approx(ships.worst, abs=1e-4) and not run.ships_plain
    assert run.plain_tokens_per_s == pytest.approx(by["plain"].tokens_per_s, abs=0.01)  # as the file keeps them
    assert run.identical == run.prompts == 2
    assert run.checked_against == "HF greedy" and run.target == "target-f32.gguf" and run.runs == 2
    # the record travels in the profile and comes back equal
    path = save_profile(with_engine_run(lookup, run), tmp_path / "p.yaml")
    assert engine_run(load_profile(path), "llama.cpp") == run


def _result(rates: dict[str, float], *, differs: tuple[str, ...] = ()) -> lp.LlamaCppResult:
    """A pass whose settings decoded 2 prompts of 10 tokens at ``rates`` (tokens/s, prefill included)."""
    rows = []
    for name, rate in rates.items():
        kind = lp.PLAIN if name == "plain" else lp.NGRAM
        args = () if kind == lp.PLAIN else tuple(lp.spec_args(ngram=(3, 4)))
        done = tuple(Completion(tokens=(1,) * 10, prompt_n=3, prompt_ms=0.0, predicted_n=10,
                                predicted_ms=10_000 / rate) for _ in range(2))
        differs_at = (1, None) if name in differs else (None, None)
        rows.append(lp.SettingResult(lp.Setting(name, kind, args), done, differs_at))
    return lp.LlamaCppResult(server="llama-server", settings=tuple(rows), target="target-f32.gguf", prompts=2)


def test_a_setting_ships_only_if_it_beat_plain_by_the_margin_in_every_pass():
    # "ngram a" beat plain by 10% in pass 1 and by 1% in pass 2: its worse pass is under the 3% margin
    passes = (_result({"plain": 100.0, "ngram a": 110.0, "ngram b": 150.0}, differs=("ngram b",)),
              _result({"plain": 100.0, "ngram a": 101.0, "ngram b": 150.0}))
    ranked = ls.rank(passes)
    by = {r.name: r for r in ranked}
    assert by["ngram a"].speedups == pytest.approx((1.10, 1.01)) and by["ngram a"].worst == pytest.approx(1.01)
    assert not by["ngram b"].clean  # differed in one pass: out, however fast
    ships, best = ls.choose(ranked)
    assert ships is None and best.name == "ngram a"
    run = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w")
    assert run.ships_plain and run.setting == "plain" and run.args == () and run.speedup == 1.0
    assert run.best_tried == "ngram a" and run.best_tried_speedup == pytest.approx(1.01)
    assert "plain decoding ships (nothing beat plain by 3% in every pass)" in run.summary()
    # with the margin met in both passes it ships
    passes = (_result({"plain": 100.0, "ngram a": 110.0}), _result({"plain": 90.0, "ngram a": 99.0}))
    ships, _ = ls.choose(ls.rank(passes))
    assert ships.name == "ngram a" and ships.worst == pytest.approx(1.10)


def _run(**changes) -> EngineRun:
    base = dict(engine="llama.cpp", version="v1", hardware="this CPU", target="target-f32.gguf", setting="plain",
                kind="plain", args=(), draft=None, concurrency=1, runs=2, plain_tokens_per_s=(50.0, 51.0),
                tokens_per_s=(50.0, 51.0), speedup=1.0, margin=1.03, best_tried="ngram 3/4",
                best_tried_speedup=0.87, identical=4, prompts=4, checked_against="HF greedy",
                workload="mtbench (calib split), 4 prompts x 64 tokens", date="2026-11-30")
    return EngineRun(**{**base, **changes})


@pytest.mark.parametrize("change, fragment", [
    ({"kind": "magic"}, "kind must be one of"),
    ({"args": ["--spec-type"]}, "args must be empty exactly when kind is plain"),
    ({"plain_tokens_per_s": [50.0]}, "plain_tokens_per_s must list 2 positive tokens/s"),
    ({"speedup": float("nan")}, "speedup must be a finite number"),
    ({"identical": 9}, "identical must be at most prompts"),
    ({"draft": "q2_k"}, "draft must be one of f16, q8_0, q4_0"),
    ({"colour": "red"}, "unknown key measured.engines.llama.cpp.colour"),
])
def test_a_bad_engine_record_is_one_line_naming_its_key(bpe_sm, tmp_path, change, fragment):  # noqa: F811
    sm, _ = bpe_sm
    raw = profile_to_dict(with_engine_run(_profile(sm, "ngram", min_n=3, max_n=3), _run()))
    raw["measured"]["engines"]["llama.cpp"].update(change)
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=fragment) as e:
        load_profile(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_the_export_refuses_what_llama_cpp_measured_slower_and_writes_what_it_measured_fastest(bpe_sm, tmp_path):  # noqa: F811
    sm, ckpt = bpe_sm
    lookup = _profile(sm, "ngram", min_n=3, max_n=3)
    slow = save_profile(with_engine_run(lookup, _run()), tmp_path / "slow.yaml")
    with pytest.raises(ExportError, match="Serve the model with llama.cpp's plain decoding") as e:
        export_profile(str(slow), engine="llama.cpp", out=tmp_path / "out")
    assert "ngram 3/4, ran 0.87x its plain decoding" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing written
    result = runner.invoke(app, ["export", "--profile", str(slow), "--engine", "llama.cpp", "--out",
                                 str(tmp_path / "out")])
    assert_one_line_error(result, "--allow-slower writes this profile's own setting anyway")
    done = export_profile(str(slow), engine="llama.cpp", out=tmp_path / "out", allow_slower=True)
    assert done.setting.startswith("--spec-type ngram-simple --spec-ngram-simple-size-n 3")  # the profile's own
    assert any(n.startswith("written with --allow-slower: llama.cpp v1") for n in done.manifest["notes"])
    # a record whose fastest setting beat plain: that setting is what the export writes, with its measured speedup
    ngram = lp.spec_args(ngram=(2, 8))
    fast = save_profile(with_engine_run(lookup, _run(setting="ngram 2/8", kind="ngram-simple", args=tuple(ngram),
                                                     tokens_per_s=(60.0, 61.2), speedup=1.2,
                                                     best_tried="ngram 2/8", best_tried_speedup=1.2)),
                        tmp_path / "fast.yaml")
    done = export_profile(str(fast), engine="llama.cpp", out=tmp_path / "fast-out")
    assert (tmp_path / "fast-out" / "llama-args.txt").read_text().split() == ngram
    assert done.speedup.kind == "measured" and done.speedup.value == 1.2 and "llama.cpp itself" in done.speedup.source
    assert any(n.startswith("measured: llama.cpp v1 on this CPU") for n in done.manifest["notes"])
    # a self-draft setting: the flags load the draft GGUF the export writes beside them
    from skipsearch.export import llamacpp

    run = _run(setting="draft q8_0 n=4", kind="draft", args=tuple(lp.draft_args(DRAFT_GGUF, 4)), draft="q8_0",
               speedup=1.1, tokens_per_s=(55.0, 56.1))
    (tmp_path / "draft").mkdir()
    written = llamacpp.write_run(tmp_path / "draft", run, lambda: (sm, ckpt))
    args = written.setting["flags"]
    assert args[args.index("-md") + 1] == str(tmp_path / "draft" / "draft-q8_0.gguf")
    assert (tmp_path / "draft" / "draft-q8_0.gguf").is_file() and "draft-q8_0.gguf" in written.files
    assert engine_run_to_dict(run)["args"][1] == DRAFT_GGUF


def test_optimize_engine_refuses_bad_input_in_one_line_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("SKIPSEARCH_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server anywhere
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "sglang", "--out", str(tmp_path / "a.yaml")]),
                          "optimize searches llama.cpp, vllm settings here")
    assert_one_line_error(runner.invoke(app, ["optimize", "--profile", "x.yaml"]),
                          "--profile, --llama-server, --llama-target and --vllm-python go with --engine llama.cpp|vllm")
    # llama.cpp's target: a name it knows, with llama.cpp only, one the int8 target has
    assert_one_line_error(runner.invoke(app, ["optimize", "--llama-target", "exact"]),
                          "go with --engine llama.cpp|vllm")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "vllm", "--llama-target", "exact"]),
                          "--llama-target goes with --engine llama.cpp, not --engine vllm")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "llama.cpp", "--llama-target", "q4_k"]),
                          "no llama.cpp target 'q4_k': use f32, exact, q8_0")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "llama.cpp", "--llama-target", "exact",
                                              "--target-precision", "int8"]),
                          "llama.cpp's target for the int8 target is q8_0, not exact")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "llama.cpp", "--study", str(tmp_path)]),
                          "drop --costs, --study and --storage")
    assert_one_line_error(runner.invoke(app, ["optimize", "--engine", "llama.cpp", "--out", str(tmp_path / "b.yaml")]),
                          "no llama-server found")
    assert not list(tmp_path.glob("*.yaml"))


def test_the_bench_runs_a_profile_s_llama_cpp_export_as_export_writes_it(bpe_sm, tmp_path):  # noqa: F811
    sm, ckpt = bpe_sm
    lookup = _profile(sm, "ngram", min_n=3, max_n=3)
    model = lambda: (sm, ckpt)  # noqa: E731
    own = lp.profile_setting("own", lookup, tmp_path / "own", model)
    assert own.args[:2] == ("--spec-type", "ngram-simple") and own.note == "exact"  # no record: its own setting
    slow = lp.profile_setting("slow", with_engine_run(lookup, _run()), tmp_path / "slow", model)
    assert slow.args == () and "the export refuses" in slow.note  # plain, as the refusal says to serve it
    ngram = tuple(lp.spec_args(ngram=(2, 8)))
    fast = with_engine_run(lookup, _run(setting="ngram 2/8", kind="ngram-simple", args=ngram, speedup=1.2,
                                        tokens_per_s=(60.0, 61.2)))
    setting = lp.profile_setting("fast", fast, tmp_path / "fast", model)
    assert setting.args == ngram  # what llama.cpp measured
    # the bench's summary line names an export's setting beside plain, not "no speculative setting"
    from skipsearch.bench import llamacpp_report as report

    done = tuple(Completion(tokens=(1,), prompt_n=1, prompt_ms=1.0, predicted_n=1, predicted_ms=10.0) for _ in "ab")
    res = lp.LlamaCppResult(server="s", settings=(lp.SettingResult(lp.Setting("plain", lp.PLAIN, ()), done,
                                                                   (None, None)),
                                                  lp.SettingResult(setting, done, (None, None))), prompts=2)
    line = report.summary_line(res)
    assert "export fast 100.0 tokens/s (--spec-type ngram-simple" in line and "no speculative setting" not in line


@pytest.mark.skipif(lp.find_server(None)[0] is None, reason="no llama-server (--llama-server, $SKIPSEARCH_LLAMA_SERVER "
                    "or PATH)")
def test_a_real_llama_server_searched_over_a_small_grid(real_sm, encode_offline, tmp_path_factory):
    import torch

    from skipsearch.engine.decoding import hf_generate

    prompts = [ids for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2)]
    want = [list(hf_generate(real_sm, ids, max_new_tokens=8)) for ids in prompts]
    shallow = ls.shallow_drafts(real_sm, prompts, want, shares=(0.2,), tokens_per_sequence=4)
    passes = ls.search_llamacpp(real_sm, prompts, max_new_tokens=8, threads=torch.get_num_threads(),
                                server=lp.find_server(None)[0], runs=2, n_max=(2,), ngram_n=(3,), drafts=("q8_0",),
                                cache=tmp_path_factory.mktemp("gguf"), shallow=shallow)
    ranked = ls.rank(passes)
    plain = ranked[0]
    assert plain.name == "plain" and plain.clean and plain.error is None  # llama.cpp F32 decodes as HF greedy
    assert [list(c.tokens) for c in passes[1].setting("plain").completions] == want  # the reversed pass too
    name = f"draft {shallow[0].name}"
    assert {r.name for r in ranked} == {"plain", "draft q8_0 n=2", "ngram 3/2", "ngram 3/2 + draft q8_0 n=2",
                                        "spec-default (ngram-mod)", f"{name} n=2", f"{name} n=4"}
    # llama.cpp loads the shallow GGUF as a draft model and decodes every prompt with it, in both passes
    deep = next(r for r in ranked if r.name == f"{name} n=4")
    assert deep.error is None and len(deep.speedups) == 2 and deep.draft_layers == shallow[0].layers
    run = ls.engine_run(passes, ranked, version=ls.server_version(lp.find_server(None)[0]), hardware="here",
                        workload="2 prompts x 8 tokens")
    assert run.version.startswith("version") and (run.ships_plain or run.speedup >= run.margin)


def test_a_setting_slower_than_plain_with_requests_in_flight_does_not_ship(bpe_sm, tmp_path):  # noqa: F811
    passes = (_result({"plain": 100.0, "ngram a": 120.0}), _result({"plain": 100.0, "ngram a": 118.0}))
    ranked = ls.rank(passes)
    ships = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w", concurrency=[(2, 1.02), (4, 1.0)])
    assert ships.setting == "ngram a" and ships.at_concurrency == ((2, 1.02), (4, 1.0))
    assert "with several requests in flight, 2: 1.02x plain, 4: 1.00x plain" in ships.summary()
    failed = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w", concurrency=[(2, 1.05), (4, 0.0)])
    assert failed.ships_plain and "2: 1.05x plain, 4: differed or failed" in failed.summary()
    from skipsearch.api.engine_search import EngineSearchSettings, _verdict

    line = _verdict(EngineSearchSettings(), failed, [(2, 1.05), (4, 0.0)], "ngram a (1.18x)")
    assert line == ("llama.cpp's chosen setting, ngram a (1.18x), lost to its plain decoding with 4 requests in "
                    "flight: an output differed from the reference, or a request failed: plain ships")
    lost = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w", concurrency=[(2, 1.05), (4, 0.97)])
    assert lost.ships_plain and lost.best_tried == "ngram a" and lost.at_concurrency[1] == (4, 0.97)
    sm, _ = bpe_sm  # the record keeps the checks, and a file without them loads as before
    path = save_profile(with_engine_run(_profile(sm, "ngram", min_n=3, max_n=3), lost), tmp_path / "p.yaml")
    assert engine_run(load_profile(path), "llama.cpp") == lost
    assert "at_concurrency" not in engine_run_to_dict(_run())


def test_requests_in_flight_run_in_a_server_of_as_many_slots_timed_by_the_wall_clock(fake_server, tmp_path):  # noqa: F811
    prompts = [[3, 4, 5], [9, 9], [7, 1], [2, 2, 2]]
    setting = lp.Setting("ngram 3/4", lp.NGRAM, tuple(lp.spec_args(ngram=(3, 4))))
    r = lp.run_setting(str(fake_server), tmp_path / "t.gguf", setting, prompts, [[0] * 6] * 4, max_new_tokens=6,
                       threads=1, context=256, log=tmp_path / "s.log", start_timeout=60, concurrency=2)
    assert r.error is None and len(r.completions) == 4 and r.concurrency == 2 and r.wall_seconds > 0
    assert r.throughput == pytest.approx(24 / r.wall_seconds)  # tokens over the wall clock, not the server's sums
    argv = _requests(tmp_path)[0]["argv"]
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("-c") + 1] == "512"  # two slots of 256
    assert sorted(q["body"]["prompt"] for q in _requests(tmp_path)[1:]) == sorted(prompts)  # each prompt once


def test_a_shallow_self_draft_keeps_only_its_layers_from_the_grid_to_the_record_and_the_export(bpe_sm, tmp_path):  # noqa: F811
    import gguf

    sm, ckpt = bpe_sm
    kept = tuple(i for i in range(sm.num_layers) if i != 1)  # layer 1 dropped
    shallow = lg.Shallow("q4_0", kept, sm.num_layers)
    files = lg.write_shallow(sm, ckpt, [shallow], cache=tmp_path / "cache")
    path = files[shallow]
    assert path.name == shallow.file and path.parent == lg.gguf_cache(sm, cache=tmp_path / "cache")
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    blocks = reader.fields["llama.block_count"] if "llama.block_count" in reader.fields else next(
        f for k, f in reader.fields.items() if k.endswith(".block_count"))
    assert int(blocks.parts[-1][0]) == len(kept) == sm.num_layers - 1
    assert {n.split(".")[1] for n in tensors if n.startswith("blk.")} == {str(i) for i in range(len(kept))}
    # the file's block i is the model's kept layer i (its norm is kept F32: compared exactly)
    for i, source in enumerate(kept):
        norm = tensors[f"blk.{i}.attn_norm.weight"].data
        assert np.array_equal(np.asarray(norm), sm.layers[source].input_layernorm.weight.detach().numpy())
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "Q4_0"
    # the grid runs it alone at its own lengths, and names it by its type and depth
    settings = lp.grid(drafts={"q8_0": "d.gguf"}, n_max=(2,), kinds=(lp.PLAIN, lp.DRAFT), shallow=files,
                       shallow_n=(2, 4))
    by = {s.name: s for s in settings}
    name = f"draft q4_0 {len(kept)}/{sm.num_layers} n=4"
    assert set(by) == {"plain", "draft q8_0 n=2", f"draft q4_0 {len(kept)}/{sm.num_layers} n=2", name}
    assert by[name].draft_layers == kept and by["draft q8_0 n=2"].draft_layers is None
    assert by[name].args[by[name].args.index("-md") + 1] == str(path)
    # the ranking and the record carry the kept layers; the profile keeps them; the export writes that draft
    done = tuple(Completion(tokens=(1,) * 10, prompt_n=3, prompt_ms=0.0, predicted_n=10, predicted_ms=100.0 / r)
                 for r in (1.0, 1.0))
    passes = tuple(lp.LlamaCppResult(server="s", target="target-f32.gguf", prompts=2, settings=(
        lp.SettingResult(by["plain"], done, (None, None)),
        lp.SettingResult(by[name], tuple(replace(c, predicted_ms=c.predicted_ms / 1.5) for c in done),
                         (None, None)))) for _ in range(2))
    ranked = ls.rank(passes)
    assert ranked[1].name == name and ranked[1].draft == "q4_0" and ranked[1].draft_layers == kept
    run = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w")
    assert run.setting == name and run.draft == "q4_0" and run.draft_layers == kept
    assert engine_run_to_dict(run)["draft_layers"] == list(kept)
    assert "draft_layers" not in engine_run_to_dict(_run())  # a record of a whole draft, as before
    saved = save_profile(with_engine_run(_profile(sm, "ngram", min_n=3, max_n=3), run), tmp_path / "p.yaml")
    assert engine_run(load_profile(saved), "llama.cpp") == run
    from skipsearch.export import llamacpp

    (tmp_path / "out").mkdir()
    written = llamacpp.write_run(tmp_path / "out", run, lambda: (sm, ckpt))
    assert written.setting["draft_gguf"]["layers"] == list(kept)
    out = gguf.GGUFReader(tmp_path / "out" / "draft-q4_0.gguf")
    assert {t.name for t in out.tensors} == set(tensors)  # the same shallow draft the search timed
    with pytest.raises(ConfigError, match="a shallow draft keeps 1 to"):
        lg.write_shallow(sm, ckpt, [lg.Shallow("q4_0", (0, sm.num_layers), sm.num_layers)], cache=tmp_path / "c2")


@pytest.mark.parametrize("layers, fragment", [([3, 1], "ascending"), ([], "ascending"), ([-1], "ascending"),
                                              (["a"], "ascending"), (None, None)])
def test_a_record_s_shallow_layers_go_only_beside_a_draft_ascending(bpe_sm, tmp_path, layers, fragment):  # noqa: F811
    import yaml

    sm, _ = bpe_sm
    run = _run(setting="draft q4_0 2/3 n=2", kind="draft", args=tuple(lp.draft_args(DRAFT_GGUF, 2)), draft="q4_0",
               speedup=1.1, tokens_per_s=(55.0, 56.1))
    raw = profile_to_dict(with_engine_run(_profile(sm, "ngram", min_n=3, max_n=3), run))
    record = raw["measured"]["engines"]["llama.cpp"]
    if layers is None:  # beside no draft
        record.update(kind="plain", args=[], draft=None, draft_layers=[0, 2])
        fragment = "only beside a draft"
    else:
        record["draft_layers"] = layers
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=fragment) as e:
        load_profile(path)
    assert "\n" not in str(e.value) and "draft_layers" in str(e.value)


def test_the_shallow_drafts_drop_the_dp_s_layers_never_the_ends(real_sm, encode_offline):
    from skipsearch.engine.decoding import hf_generate

    prompts = [ids for _, ids in encode_offline(real_sm, "mtbench,humaneval", n=2)]
    greedy = [hf_generate(real_sm, ids, max_new_tokens=8) for ids in prompts]
    drafts = ls.shallow_drafts(real_sm, prompts, greedy, shares=(0.1, 0.2, 0.0), tokens_per_sequence=4)
    n = real_sm.num_layers
    assert [len(d.layers) for d in drafts] == [n - round(0.1 * n), n - round(0.2 * n)]  # a share of 0 adds nothing
    for d in drafts:
        assert d.of == n and d.draft == ls.SHALLOW_DRAFT and d.layers[0] == 0 and d.layers[-1] == n - 1
        assert list(d.layers) == sorted(set(d.layers))


def test_a_shallow_checkpoint_is_the_model_without_its_dropped_layers(bpe_sm, tmp_path):  # noqa: F811
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from skipsearch.export.shallow import write_shallow_checkpoint

    sm, ckpt = bpe_sm
    kept = tuple(i for i in range(sm.num_layers) if i != 1)
    info = write_shallow_checkpoint(tmp_path / "shallow", sm, ckpt, kept)
    assert info["layers"] == list(kept) and info["of"] == sm.num_layers
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "shallow", dtype=torch.float32)
    assert loaded.config.num_hidden_layers == len(kept)
    assert (tmp_path / "shallow" / "tokenizer.json").is_file()  # the model's tokenizer beside it
    # the same logits as the model itself with that layer taken out
    cut = copy.deepcopy(sm.hf)
    cut.model.layers = torch.nn.ModuleList([cut.model.layers[i] for i in kept])
    for j, layer in enumerate(cut.model.layers):
        layer.self_attn.layer_idx = j
    cut.config.num_hidden_layers = len(kept)
    ids = torch.tensor([[3, 4, 5, 9, 9, 8]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, cut(ids).logits)
        assert not torch.equal(loaded(ids).logits, sm.hf(ids).logits)  # the dropped layer mattered
    with pytest.raises(ConfigError, match="a shallow draft keeps 1 to"):
        write_shallow_checkpoint(tmp_path / "bad", sm, ckpt, ())


def test_a_setting_that_can_no_longer_ship_is_not_timed_again_and_keeps_its_first_figure():
    first = _result({"plain": 100.0, "ngram a": 110.0, "ngram b": 101.0, "ngram c": 150.0}, differs=("ngram c",))
    assert ls.in_reach(first, 1.03) == {"plain", "ngram a"}  # b under the margin, c differed: neither can ship
    assert ls.in_reach(first, 1.2) == {"plain"}
    second = _result({"plain": 90.0, "ngram a": 99.0})  # what a pass of the settings still in reach times
    ranked = ls.rank((first, second))
    by = {r.name: r for r in ranked}
    assert by["ngram a"].speedups == pytest.approx((1.10, 1.10)) and by["ngram a"].error is None
    assert by["ngram b"].speedups == pytest.approx((1.01,)) and by["ngram b"].clean  # its first pass's figure
    assert not by["ngram c"].clean
    assert [r.name for r in ranked][:3] == ["plain", "ngram a", "ngram b"]
    ships, best = ls.choose(ranked)
    assert ships.name == best.name == "ngram a"
    # nothing within the margin: plain ships, and the fastest identical setting is named with its one figure
    ranked = ls.rank((_result({"plain": 100.0, "ngram b": 101.0}), _result({"plain": 95.0})))
    ships, best = ls.choose(ranked)
    assert ships is None and best.name == "ngram b" and best.worst == pytest.approx(1.01)


def test_the_second_pass_times_only_what_can_still_ship(fake_server, bpe_sm, tmp_path, monkeypatch):  # noqa: F811
    sm, ckpt = bpe_sm
    prompts = [[3, 4, 5, 3, 4], [9, 9, 8]]
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(sm, prompts, 6, tmp_path / "answers.json")))
    passes = ls.search_llamacpp(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server), checkpoint=ckpt,
                                runs=2, n_max=(2,), ngram_n=(3,), drafts=("q8_0",), cache=tmp_path / "cache",
                                start_timeout=60, margin=1.03)
    first = {r.setting.name for r in passes[0].settings}
    second = {r.setting.name for r in passes[1].settings}
    assert second == ls.in_reach(passes[0], 1.03) and "plain" in second and second < first
    assert not any(n.startswith("draft q8_0") for n in second)  # they differed in the first pass
    by = {r.name: r for r in ls.rank(passes)}
    assert len(by["draft q8_0 n=2"].speedups) == 1 and not by["draft q8_0 n=2"].clean
    ships, _ = ls.choose(ls.rank(passes))
    assert ships is not None and len(ships.speedups) == 2  # what ships was timed in both passes
    # nothing in reach after the first pass: no second pass
    nothing = ls.search_llamacpp(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server),
                                 checkpoint=ckpt, runs=2, n_max=(2,), ngram_n=(3,), drafts=("q8_0",),
                                 cache=tmp_path / "cache", start_timeout=60, margin=100.0)
    assert len(nothing) == 1


def test_the_table_says_which_settings_ran_the_first_pass_only(bpe_sm, tmp_path, capsys):  # noqa: F811
    from skipsearch.api.engine_search import EngineSearched
    from skipsearch.cli.optimize import _print_engine

    sm, _ = bpe_sm
    passes = (_result({"plain": 100.0, "ngram a": 110.0, "ngram b": 101.0}), _result({"plain": 90.0, "ngram a": 99.0}))
    ranked = ls.rank(passes)
    run = ls.engine_run(passes, ranked, version="v", hardware="h", workload="w")
    profile = with_engine_run(_profile(sm, "ngram", min_n=3, max_n=3), run)
    _print_engine(EngineSearched(profile, tmp_path / "p.yaml", run, ranked, "verdict"), replace=False)
    lines = {line.split()[0] + " " + line.split()[1]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("ngram")}
    assert lines["ngram b"].endswith("[first pass only: it could not ship]") and "101.0 " in lines["ngram b"]
    assert "first pass only" not in lines["ngram a"] and "110.0/99.0" in lines["ngram a"]


def test_over_three_passes_a_setting_keeps_the_figures_of_the_passes_it_ran():
    passes = (_result({"plain": 100.0, "ngram a": 110.0, "ngram b": 108.0}),
              _result({"plain": 100.0, "ngram a": 112.0, "ngram b": 102.0}),  # b falls short: left out of pass 3
              _result({"plain": 100.0, "ngram a": 109.0}))
    by = {r.name: r for r in ls.rank(passes)}
    assert by["ngram a"].speedups == pytest.approx((1.10, 1.12, 1.09)) and by["ngram a"].clean
    assert by["ngram b"].speedups == pytest.approx((1.08, 1.02)) and by["ngram b"].error is None
    assert ls.choose(ls.rank(passes))[0].name == "ngram a"


def test_on_the_exact_target_the_search_checks_against_llama_cpp_s_own_plain_decoding_and_the_export_carries_it(
        fake_server, bpe_sm, tmp_path, monkeypatch):  # noqa: F811
    sm, ckpt = bpe_sm
    prompts = [[3, 4, 5, 3, 4], [9, 9, 8]]
    monkeypatch.setenv("FAKE_ANSWERS", str(_answers(sm, prompts, 6, tmp_path / "answers.json")))
    passes = ls.search_llamacpp(sm, prompts, max_new_tokens=6, threads=1, server=str(fake_server), checkpoint=ckpt,
                                runs=2, n_max=(2,), ngram_n=(3,), drafts=(), cache=tmp_path / "cache",
                                start_timeout=60, target=lg.EXACT)
    # the server loaded the exact target, and nothing decoded HF greedy for it: the first pass's plain is the reference
    served = {q["argv"][q["argv"].index("-m") + 1] for q in _requests(tmp_path)}
    assert {p.rsplit("/", 1)[-1] for p in served} == {"target-exact.gguf"}
    assert all(p.target == "target-exact.gguf" for p in passes)
    assert passes[0].checked_against == "llama.cpp's plain decoding of its target"
    run = ls.engine_run(passes, ls.rank(passes), version="v1", hardware="this CPU", workload="2 prompts")
    assert run.target == "target-exact.gguf" and run.checked_against == passes[0].checked_against
    # its export writes the target it was timed on beside the flags, and the line serves that file
    from skipsearch.export import llamacpp

    ngram = lp.spec_args(ngram=(2, 8))
    fast = replace(run, setting="ngram 2/8", kind="ngram-simple", args=tuple(ngram), speedup=1.2)
    (tmp_path / "out").mkdir()
    written = llamacpp.write_run(tmp_path / "out", fast, lambda: (sm, ckpt))
    target = tmp_path / "out" / "target-exact.gguf"
    assert "target-exact.gguf" in written.files and target.is_file()
    assert written.usage.startswith(f"llama-server -m {target} --spec-type ngram-simple")
    timed = next((tmp_path / "cache").rglob("target-exact.gguf"))
    assert target.read_bytes() == timed.read_bytes()  # the bytes llama.cpp was timed on
    assert lg.tensor_types(target) == written.setting["target_gguf"]["tensor_types"]
    assert not any("TARGET.gguf" in n for n in written.notes)
    # an F32 record's export names the target the user converts, as before
    f32 = llamacpp.write_run(tmp_path / "out", replace(fast, target="target-f32.gguf"), lambda: (sm, ckpt))
    assert f32.usage.startswith("llama-server -m TARGET.gguf") and "target-exact.gguf" not in f32.files
