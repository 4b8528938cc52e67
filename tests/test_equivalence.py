"""The equivalence check: identical, equal up to numerical ties, or different (skipsearch/engine/equivalence.py).

Synthetic logits pin down the rules exactly; tiny random Llamas in bfloat16 and float16 run it
through the model on CPU; the real default model (marked ``model``) checks the goal of issue 13:
layer-skip and every shipped method in bfloat16 on 8 held-out prompts x 48 tokens are identical or
equal up to ties with 0 tokens outside tolerance, a clear-margin change is still caught, and fp32
stays identical.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import assert_greedy_equivalent, make_tiny_model
from typer.testing import CliRunner

from skipsearch import bench as bn
from skipsearch.bench import report as br
from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.engine import equivalence as eq
from skipsearch.engine import harness
from skipsearch.engine.decoding import generate, hf_generate
from skipsearch.model.skippable import SkippableModel

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
CPU = torch.device("cpu")
runner = CliRunner()


# -- the tolerance -----------------------------------------------------------------------------------
def _spacing(dtype: torch.dtype, x: float) -> float:
    """The distance from x (made representable) to the next number of ``dtype`` above it, bit by bit."""
    value = torch.tensor(x, dtype=dtype)
    bits = value.view(torch.int16 if dtype.itemsize == 2 else torch.int32)
    return float((bits + 1).view(dtype).double() - value.double())


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("x", [0.3, 1.0, 1.9, 7.5, 20.0, 31.9, 40.0, 300.0])
def test_ulp_is_the_dtype_s_own_spacing(dtype, x):
    assert eq.ulp(dtype, x) == _spacing(dtype, x) == eq.ulp(dtype, -x)


def test_tolerance_is_a_few_ulps_in_16_bit_floats_and_zero_in_fp32():
    assert eq.tie_tolerance(BF16, 20.0) == 8 * 0.125 == 1.0  # bf16 numbers in [16, 32) are 0.125 apart
    assert eq.tie_tolerance(BF16, 40.0) == 2.0
    assert eq.tie_tolerance(FP16, 20.0) == 8 * 2**-6
    assert eq.tie_tolerance(FP32, 20.0) == eq.tie_tolerance(torch.float64, 20.0) == 0.0
    assert eq.tie_tolerance(BF16, 20.0, ulps=1) == 0.125
    assert "8 ulps of bfloat16" in eq.tolerance_rule("bfloat16") and "tolerance 0" in eq.tolerance_rule(FP32)


# -- the rules, on synthetic logits ----------------------------------------------------------------
def _logits(rows: list[dict[int, float]], dtype=BF16, vocab: int = 8) -> torch.Tensor:
    """[n, vocab] logits in ``dtype``: every token at 0.0 except those given per row."""
    out = torch.zeros(len(rows), vocab)
    for j, row in enumerate(rows):
        for token, value in row.items():
            out[j, token] = value
    return out.to(dtype)


def test_identical_needs_no_logits():
    v = eq.judge(torch.empty(0, 0), (1, 2, 3), (1, 2, 3), dtype=BF16)
    assert v.kind == eq.IDENTICAL and v.ok and v.tie_tokens == 0 and v.describe() == "identical"


def test_a_divergence_at_a_near_tie_is_equal_up_to_ties():
    # position 1: tokens 2 and 3 one bf16 ulp apart (20.0 vs 20.125); the method took 2, HF greedy 3
    logits = _logits([{1: 20.0}, {2: 20.0, 3: 20.125}, {4: 21.0}, {5: 18.0}])
    v = eq.judge(logits, (1, 2, 4, 5), (1, 3, 6, 6), dtype=BF16)
    assert v.kind == eq.TIES and v.ok and v.ties == (1,) and v.divergence == 1
    assert v.describe() == "equal up to numerical ties (1 token, first at 1; bfloat16)"


def test_every_token_is_checked_after_the_divergence_too():
    tie = {2: 20.0, 3: 20.125}
    # after the tie a later non-argmax pick within tolerance is one more tied token ...
    v = eq.judge(_logits([tie, {4: 20.25, 5: 20.0}, {6: 20.0}]), (2, 5, 6), (3, 0, 0), dtype=BF16)
    assert v.kind == eq.TIES and v.ties == (0, 1)
    # ... and one with a clear margin makes the output different, however late it comes
    v = eq.judge(_logits([tie, {4: 20.0}, {6: 20.0}, {7: 25.0, 1: 20.0}]), (2, 4, 6, 1), (3, 0, 0, 0), dtype=BF16)
    assert v.kind == eq.DIFFERENT and not v.ok
    assert (v.position, v.margin, v.tolerance, v.ties) == (3, 5.0, 1.0, (0,))  # 8 ulps at 25.0
    assert "its token 1 is 5 below the argmax 7" in v.describe()


def test_a_clear_margin_change_is_different_at_its_position():
    logits = _logits([{1: 20.0}, {2: 20.0, 3: 22.0}, {4: 20.0}])
    v = eq.judge(logits, (1, 2, 4), (1, 3, 4), dtype=BF16)
    assert v.kind == eq.DIFFERENT and v.position == v.divergence == 1 and v.margin == 2.0 and v.tolerance == 1.0
    assert v.describe().startswith("different at token 1: its token 2 is 2 below the argmax 3")


def test_the_reference_side_of_a_divergence_must_be_within_a_tie_too():
    # the method's token is the argmax; HF greedy's is 3 logits below: that is no tie either
    logits = _logits([{2: 20.0, 3: 17.0}, {4: 20.0}])
    v = eq.judge(logits, (2, 4), (3, 4), dtype=BF16)
    assert v.kind == eq.DIFFERENT and v.position == 1 - 1 and "the reference's token 3 is 3 below" in v.reason


def test_the_tolerance_follows_the_logit_magnitude():
    # a gap of 1.5 is 6 ulps at 40 (a tie) and 12 ulps at 20 (not one)
    assert eq.judge(_logits([{2: 40.0, 3: 41.5}]), (2,), (3,), dtype=BF16).kind == eq.TIES
    assert eq.judge(_logits([{2: 20.0, 3: 21.5}]), (2,), (3,), dtype=BF16).kind == eq.DIFFERENT
    # and 9 ulps are no tie where 8 are: 20.0 vs 21.125 in bf16
    assert eq.judge(_logits([{2: 20.0, 3: 21.0}]), (2,), (3,), dtype=BF16).kind == eq.TIES
    assert eq.judge(_logits([{2: 20.0, 3: 21.125}]), (2,), (3,), dtype=BF16).kind == eq.DIFFERENT
    # fp16 is 8 times finer than bf16: at 20 its ulp is 1/64, so 8 ulps tie and 9 do not
    assert eq.judge(_logits([{2: 20.0, 3: 20.25}], FP16), (2,), (3,), dtype=FP16).kind == eq.DIFFERENT
    assert eq.judge(_logits([{2: 20.0, 3: 20.140625}], FP16), (2,), (3,), dtype=FP16).kind == eq.DIFFERENT
    assert eq.judge(_logits([{2: 20.0, 3: 20.125}], FP16), (2,), (3,), dtype=FP16).kind == eq.TIES


def test_fp32_keeps_exact_identity_only_exactly_equal_logits_tie():
    near = eq.judge(_logits([{2: 20.0, 3: 20.000002}], FP32), (2,), (3,), dtype=FP32)
    assert near.kind == eq.DIFFERENT and near.tolerance == 0.0
    assert eq.judge(_logits([{2: 20.0, 3: 20.0}], FP32), (2,), (3,), dtype=FP32).kind == eq.TIES


def test_a_strict_prefix_is_different():
    v = eq.judge(_logits([{1: 20.0}, {2: 20.0}]), (1, 2), (1, 2, 3), dtype=BF16)
    assert v.kind == eq.DIFFERENT and v.position == 2 and "2 tokens where the reference has 3" in v.reason


def test_the_worst_verdict_wins_and_verdicts_serialise():
    same = eq.Verdict(eq.IDENTICAL, 3, "bfloat16")
    tie = eq.Verdict(eq.TIES, 3, "bfloat16", (1,), 1)
    bad = eq.Verdict(eq.DIFFERENT, 3, "bfloat16", (), 1, 1, 2.0, 0.5, "x")
    assert eq.worst([same, tie, same]) is tie and eq.worst([tie, bad, same]) is bad
    doc = json.loads(json.dumps(tie.to_dict()))
    assert doc["kind"] == eq.TIES and doc["ties"] == [1] and doc["ok"] and doc["text"].startswith("equal up to")


# -- through a model: tiny random Llamas ------------------------------------------------------------
def _tiny(dtype: torch.dtype) -> SkippableModel:
    sm = make_tiny_model(seed=3, name=f"tiny-{dtype}")
    return SkippableModel(sm.hf.to(dtype), tokenizer=None, name=sm.name)


TINY_PROMPTS = ([3, 14, 15, 9, 26], [7], [11, 4, 11, 4, 9, 2, 60, 33], [5, 5, 5, 5, 5, 5])
TINY_CONFIGS = (DraftConfig(skip_attn=(1,), max_draft_tokens=3), DraftConfig(skip_mlp=(0, 2), max_draft_tokens=4),
                DraftConfig(skip_attn=(0, 2), skip_mlp=(3,), max_draft_tokens=2))


def test_teacher_forced_logits_line_up_with_greedy_decoding(tiny_sm):
    # fp32: HF greedy's every token is the argmax of the one-forward logits at its own position
    for ids in TINY_PROMPTS:
        ref = hf_generate(tiny_sm, ids, max_new_tokens=20)
        logits = eq.teacher_forced_logits(tiny_sm, ids, ref)
        assert logits.shape == (len(ref), 64)
        assert tuple(logits.argmax(-1).tolist()) == ref


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_speculative_output_in_16_bit_floats_is_never_different(dtype):
    sm = _tiny(dtype)
    kinds = []
    for ids in TINY_PROMPTS:
        ref = hf_generate(sm, ids, max_new_tokens=32)
        for config in TINY_CONFIGS:
            out = generate(sm, ids, config=config, max_new_tokens=32, eos_token_ids=()).token_ids
            kinds.append(assert_greedy_equivalent(sm, ids, out, ref).kind)
        assert max(eq.margin_drift(sm, ids, ref)) <= eq.TIE_ULPS[dtype]  # what the factor must cover
    assert set(kinds) <= {eq.IDENTICAL, eq.TIES}


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
def test_a_token_changed_with_a_clear_margin_is_caught_in_every_dtype(dtype):
    sm = _tiny(dtype) if dtype != FP32 else make_tiny_model(seed=3)
    ids = TINY_PROMPTS[0]
    ref = hf_generate(sm, ids, max_new_tokens=16)
    logits = eq.teacher_forced_logits(sm, ids, ref)
    broken = list(ref)
    broken[6] = int(logits[6].float().argmin())  # the least likely token: a clear margin
    v = eq.check(sm, ids, broken, ref)
    assert v.kind == eq.DIFFERENT and v.position == 6 and v.margin > 10 * max(v.tolerance, 0.01)
    assert eq.check(sm, ids, ref, ref).kind == eq.IDENTICAL


def test_fp32_identical_output_stays_identical(tiny_sm):
    for ids in TINY_PROMPTS:
        for config in TINY_CONFIGS:
            out = generate(tiny_sm, ids, config=config, max_new_tokens=24, eos_token_ids=()).token_ids
            assert assert_greedy_equivalent(tiny_sm, ids, out, allow_ties=False).kind == eq.IDENTICAL


# -- in bench --------------------------------------------------------------------------------------
def _changed(method: harness.Contender, name: str, position: int, pick) -> harness.Contender:
    """``method`` with token ``position`` replaced by ``pick(prompt ids, tokens)`` on every prompt."""

    def decode(ids, max_new_tokens):
        out = method.decode(ids, max_new_tokens)
        tokens = list(out.token_ids)
        tokens[position] = pick(ids, out.token_ids)
        return dataclasses.replace(out, token_ids=tuple(tokens))

    return harness.Contender(name, "skipsearch", "", decode)


def test_bench_rows_carry_verdicts_and_tie_equal_rows_keep_their_speedup():
    sm = _tiny(BF16)
    ids = [list(p) for p in TINY_PROMPTS[:3]]
    ar = harness.ours_autoregressive(sm)

    def least(prompt, tokens):  # the least likely token at position 4: a decoder bug
        return int(eq.teacher_forced_logits(sm, prompt, tokens)[4].float().argmin())

    methods = [bn.peer_method(sm, bn.BASELINE), ar, _changed(ar, "broken", 4, least),
               _changed(ar, "tied", 4, least)]
    runs = harness.run_rounds(methods, ids, max_new_tokens=12, device=CPU)
    verdicts = bn.model_verdicts(sm, runs, ids)
    assert all(verdicts["broken", i].kind == eq.DIFFERENT and verdicts["broken", i].position == 4 for i in range(3))
    assert all(verdicts[harness.OURS_AR, i].ok for i in range(3))  # bf16: identical or tied, never different
    # what bench does with a tie-equal method, whatever made it one: speedup given, ties counted
    verdicts.update({("tied", i): eq.Verdict(eq.TIES, 12, "bfloat16", (4, 7), 4) for i in range(3)})
    rows = {r.method: r for r in bn.summarize(methods, runs, ["t:a", "t:b", "t:c"], verdicts=verdicts)}
    bad, tied = rows["broken"], rows["tied"]
    assert bad.verdict == eq.DIFFERENT and bad.flagged and bad.speedup is None and bad.vs_ours_ar is None
    assert bad.first_mismatch.startswith("prompt t:a, token 4: its token") and "bfloat16" in bad.first_mismatch
    assert tied.verdict == eq.TIES and not tied.flagged and (tied.identical, tied.ties, tied.tie_tokens) == (0, 3, 6)
    assert tied.speedup is not None and tied.vs_ours_ar is not None
    # without a model only identical output counts: the tied method is then flagged too
    plain = {r.method: r for r in bn.summarize(methods, runs, ["t:a", "t:b", "t:c"])}
    assert plain["tied"].flagged and plain["tied"].first_mismatch == "prompt t:a, token 4"


def test_the_report_and_json_show_ties_with_their_count(tmp_path):
    from skipsearch.data import Prompt

    sm = make_tiny_model(name="tiny-report")

    class Chars:
        eos_token_id = None
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1] + [2 + ord(c) % 60 for c in text]}

    sm.tokenizer = Chars()
    report = bn.bench(sm, [Prompt("a", "abcabc", False, "x", "t"), Prompt("b", "zzz", False, "x", "t")],
                      max_new_tokens=6)
    ar = report.row(harness.OURS_AR)
    assert ar.verdict == eq.IDENTICAL and ar.ties == 0 and ar.speedup is not None
    tied = dataclasses.replace(ar, method="layer-skip:tied", identical=1, ties=1, tie_tokens=2)
    bad = dataclasses.replace(ar, method="layer-skip:bad", identical=1, ties=0, speedup=None, vs_ours_ar=None,
                              first_mismatch="prompt t:b, token 3: its token 9 is 4 below the argmax 2")
    report = dataclasses.replace(report, rows=(*report.rows, tied, bad))
    assert tied.verdict == eq.TIES and not tied.flagged and bad.verdict == eq.DIFFERENT and bad.flagged
    md = br.render_markdown(report)
    assert "| 1/2 + 1 up to ties (2 tokens) |" in md and "(ties: 2 tokens)" in md and "1/2 DIFFERS" in md
    assert "Equal to HF greedy up to numerical ties (speedup given): layer-skip:tied (1 prompt, 2 tokens)" in md
    assert "tolerance 0 in float32" in md
    summary = br.summarize_report(report)
    assert summary.best_profile == "layer-skip:tied" and summary.flagged == ("layer-skip:bad",)
    doc = json.loads(br.report_json(report))
    assert doc["version"] == br.JSON_VERSION
    rows = {r["method"]: r for r in doc["rows"]}
    assert rows["layer-skip:tied"]["verdict"] == eq.TIES and rows["layer-skip:tied"]["tie_tokens"] == 2
    assert rows["layer-skip:bad"]["verdict"] == eq.DIFFERENT and all(p["verdict"] for p in doc["prompts"])
    assert "equal up to numerical ties on 1 (2 tokens)" in br.measured_for(report, tied).notes


# -- decode --check ---------------------------------------------------------------------------------
def test_decode_check_refuses_sampling_before_the_model_loads():
    result = runner.invoke(app, ["decode", "--model", "no-such-model", "--prompt", "x", "--check",
                                 "--temperature", "0.7"])
    assert result.exit_code == 2 and "--check compares greedy output" in result.stderr


@pytest.mark.model
def test_decode_check_prints_and_records_the_verdict(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def fib(n):"}\n{"prompt": "The capital of France is"}\n')
    args = ["decode", "--profile", "profiles/smollm2-135m/example.yaml", "--prompts-file", str(prompts),
            "--max-new-tokens", "12", "--device", "cpu", "--check"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["check"]["kind"] for r in rows] == [eq.IDENTICAL] * 2 and all(r["check"]["ok"] for r in rows)
    assert result.stderr.count("[check: identical]") == 2
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and text.stderr.count("[check: identical]") == 2


# -- the real model: issue 13's goal ----------------------------------------------------------------
REAL_NEW = 48
LAYER_SKIP = DraftConfig(skip_attn=(4, 9, 17, 25), skip_mlp=(22,), max_draft_tokens=3)


def _heldout(sm):
    from skipsearch.data import encode_prompt, load_prompts

    prompts = load_prompts("mtbench,humaneval", split="heldout", n=8, seed=0)
    return [(f"{p.source}:{p.id}", encode_prompt(sm.tokenizer, p)) for p in prompts]


def _prefills_each_prompt_once(sm: SkippableModel) -> None:
    """``sm.forward`` with the full model's prefill of a prompt (start 0, an empty cache, the full model: no draft,
    stand-in or draft head in place) computed once per prompt and copied after, bit for bit: every method's decode
    of a prompt begins with this same forward (the engine's step 0, and ``margin_drift``'s), and in 16 bits on a CPU
    without native bf16 products it costs about 35 ms a token (755 tokens for the 8 prompts), which the 12 shipped
    drafts and the two dtypes paid again and again. Every other forward runs as it is."""
    real, kept = sm.forward, {}

    def forward(token_ids: torch.Tensor, *, start: int, cache, last_only: bool = False) -> torch.Tensor:
        full = not sm._drafting and not sm._partial and sm.kernel.name == "eager"
        if start != 0 or not last_only or not full or cache.get_seq_length() != 0:
            return real(token_ids, start=start, cache=cache, last_only=last_only)
        key = tuple(token_ids.view(-1).tolist())
        if key not in kept:
            fresh = sm.new_cache()
            kept[key] = fresh, real(token_ids, start=0, cache=fresh, last_only=True)
        fresh, logits = kept[key]
        for i, layer in enumerate(fresh.layers):
            cache.update(layer.keys.clone(), layer.values.clone(), i)
        return logits.clone()

    sm.forward = forward


@functools.cache
def _real16(dtype: str):
    """The real model in a 16-bit dtype (its prompts prefilled once each) with its held-out prompts and HF greedy's
    outputs on them."""
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype=dtype)
    _prefills_each_prompt_once(sm)
    return sm, [(name, ids, hf_generate(sm, ids, max_new_tokens=REAL_NEW)) for name, ids in _heldout(sm)]


@pytest.fixture(params=["bfloat16", "float16"])
def real16(request):
    return _real16(request.param)


_VERDICTS: dict[tuple, eq.Verdict] = {}  # (prompt ids, output, HF greedy's) -> the bf16 model's verdict


@pytest.fixture
def real_bf16(monkeypatch):
    """The bf16 model and its cases, with ``eq.check`` on that model given each (prompt, output, reference) once: the
    shipped drafts' outputs that tie with HF greedy's are often the same tokens, and each check of one is a
    teacher-forced forward over the prompt and 48 tokens (a few seconds in bf16 here). A verdict is a function of
    the model, the prompt, the output and the reference alone."""
    sm, cases = _real16("bfloat16")
    real = eq.check

    def check_once(model, prompt_ids, tokens, reference, **kwargs):
        if model is not sm or kwargs:
            return real(model, prompt_ids, tokens, reference, **kwargs)
        key = (tuple(prompt_ids), tuple(tokens), tuple(reference))
        if key not in _VERDICTS:
            _VERDICTS[key] = real(model, prompt_ids, tokens, reference)
        return _VERDICTS[key]

    monkeypatch.setattr(eq, "check", check_once)
    return sm, cases


@pytest.mark.model
def test_real_model_layer_skip_in_16_bit_is_identical_or_equal_up_to_ties(real16):
    sm, cases = real16
    verdicts, drift, forced = {}, [], {}
    for name, ids, ref in cases:
        out = generate(sm, ids, config=LAYER_SKIP, max_new_tokens=REAL_NEW).token_ids
        forced[name] = eq.teacher_forced_logits(sm, ids, out), out  # one forward: the verdict, the drifts, below
        verdicts[name] = eq.judge(forced[name][0], out, ref, dtype=sm.dtype)  # what eq.check decides with it
        assert verdicts[name].ok, (name, verdicts[name].describe())  # 0 tokens outside tolerance
        drift += eq.margin_drift(sm, ids, out, blockings=((), (3, 9, 1, 5)), forced=forced[name][0])
    assert len(verdicts) == 8
    # the factor's evidence, measured again: one forward vs one-token steps or verify-sized blocks moves a
    # margin by at most TIE_ULPS
    assert max(drift) <= eq.TIE_ULPS[sm.dtype], max(drift)
    # and a token changed with a clear margin is still caught, on every prompt
    for name, ids, ref in cases:
        logits, out = forced[name]
        if tuple(out[:10]) != tuple(ref[:10]):  # position 10's logits see ids and the 10 tokens before it
            logits = eq.teacher_forced_logits(sm, ids, ref)
        broken = list(ref[:11])  # what follows position 10 cannot change a verdict found there: left out
        broken[10] = int(logits[10].float().topk(50).indices[-1])  # the 50th most likely token
        v = eq.check(sm, ids, broken, ref[:11])
        assert v.kind == eq.DIFFERENT and v.position == 10 and v.margin > 2 * v.tolerance, (name, v)


def _drafts_nothing(raw: dict) -> bool:
    """A profile whose draft may propose no token (``max_draft_tokens: 0``, what a search ships where no draft paid):
    it decodes plain, whatever its method."""
    return (raw.get("draft") or {}).get("max_draft_tokens") == 0


def _distinct_drafts(paths: list[Path]) -> list[Path]:
    """One profile per distinct draft (method, its params and the draft config, schedule aside): the thread-count
    copies and re-plans that draft the same way decode the same tokens, and so do all the profiles that draft
    nothing (the test checks that they draft nothing); each real-model bf16 case costs a minute or more on a CPU
    without native bf16."""
    import yaml

    seen, out = set(), []
    for path in paths:
        raw = yaml.safe_load(path.read_text())
        key = "plain" if _drafts_nothing(raw) else json.dumps(
            [raw.get("method"), raw.get("method_params"), raw.get("draft")], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


# every shipped draft but the two halves of the hierarchical one (hier-medium/hier-small), which ship only as its
# parts
SHIPPED = _distinct_drafts(sorted(p for p in (Path(__file__).parents[1] / "profiles" / "smollm2-135m").glob("*.yaml")
                                  if not p.name.startswith("hier-")))


@pytest.mark.model
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_real_model_every_shipped_method_in_bf16_is_never_different(real_bf16, path):
    import yaml

    from skipsearch.api import drafter_factory
    from skipsearch.profile import load_profile

    sm, cases = real_bf16
    make = drafter_factory(load_profile(path, num_layers=sm.num_layers), sm)
    kinds, drafted = [], 0
    for _, ids, ref in cases:
        result = generate(sm, ids, drafter=make(), max_new_tokens=REAL_NEW)
        kinds.append(assert_greedy_equivalent(sm, ids, result.token_ids, ref).kind)
        drafted += result.stats.drafted_tokens
    assert len(kinds) == 8 and eq.DIFFERENT not in kinds
    # the case stands for every profile that drafts nothing only if it drafts nothing; the others do draft
    assert (drafted == 0) == _drafts_nothing(yaml.safe_load(path.read_text())), drafted


@pytest.mark.model
def test_real_model_fp32_identical_stays_identical(real_sm):
    for _, ids in _heldout(real_sm)[:4]:
        out = generate(real_sm, ids, config=LAYER_SKIP, max_new_tokens=REAL_NEW).token_ids
        v = assert_greedy_equivalent(real_sm, ids, out, allow_ties=False)
        assert v.kind == eq.IDENTICAL and math.isclose(eq.tie_tolerance(real_sm.dtype, 20.0), 0.0)
