"""The one timing harness: warm-up, rotation, the baseline in the same rounds, the output check, memory."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from clocks import ManualClock

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.engine import harness as hn
from skipsearch.engine import timing
from skipsearch.engine.decoding import Draft, Drafter, generate, make_drafter
from skipsearch.memory import memory_probe
from skipsearch.search.objective import LosslessnessError, time_drafter

CPU = torch.device("cpu")
PROMPTS = ((3, 17, 5, 9, 22, 41), (7, 7, 30, 2), (11, 4, 11, 4, 9))


def _fake(name: str, log: list, *, tokens=lambda ids: tuple(ids[:2])) -> hn.Contender:
    """A method that records each call (name, prompt, max_new_tokens) and returns ``tokens(ids)``."""

    def decode(ids, max_new_tokens):
        log.append((name, tuple(ids), max_new_tokens))
        return hn.ContenderOutput(tokens(ids))

    return hn.Contender(name, "skipsearch", "", decode)


def test_every_method_is_warmed_up_then_runs_once_per_round_on_the_same_ids():
    log: list = []
    methods = [_fake("base", log), _fake("m1", log), _fake("m2", log)]
    runs = hn.run_rounds(methods, [[1, 2, 3], [4, 5], [6, 7, 8, 9]], max_new_tokens=20, device=CPU, warmup_tokens=4)
    # 1. one short warm-up call per method, on the first prompt, before anything is timed
    assert log[:3] == [(m.name, (1, 2, 3), 4) for m in methods]
    # 2. then rounds: each is every method once, back to back, on exactly the same ids; the baseline
    # is one of them, so it runs in the same rounds as the candidates, never apart from them
    timed = log[3:]
    assert len(timed) == len(runs) == 9
    for k in range(3):
        rnd = timed[3 * k: 3 * k + 3]
        assert sorted(c[0] for c in rnd) == ["base", "m1", "m2"]
        assert len({c[1] for c in rnd}) == 1 and {c[2] for c in rnd} == {20}
    assert [(r.method, r.slot) for r in runs] == [(c[0], j % 3) for j, c in enumerate(timed)]


def test_the_order_rotates_so_every_method_takes_every_slot():
    log: list = []
    methods = [_fake(name, log) for name in ("a", "b", "c")]
    runs = hn.run_rounds(methods, [[1], [2]], max_new_tokens=3, device=CPU, repeats=3)  # six rounds
    for m in methods:
        assert sorted(r.slot for r in runs if r.method == m.name) == [0, 0, 1, 1, 2, 2]
    # round k starts with method k mod 3: the rotation moves by one place every round
    firsts = [r.method for r in runs if r.slot == 0]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert [(r.prompt, r.repeat) for r in runs if r.slot == 0] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_the_warm_up_is_not_timed_and_on_warmed_runs_between():
    log: list = []
    calls = {"n": 0}
    clock = ManualClock()

    def slow_first(ids, max_new_tokens):
        calls["n"] += 1
        clock.advance(0.3 if calls["n"] == 1 else 0.01)  # a first call's set-up, exaggerated; then 10 ms a call
        return hn.ContenderOutput((1,))

    methods = [hn.Contender("slow-first", "skipsearch", "", slow_first), _fake("other", log)]
    with timing.use_clock(clock):  # the harness's clock: only the calls move it, whatever else the machine runs
        runs = hn.run_rounds(methods, [[1], [2]], max_new_tokens=4, device=CPU,
                             on_warmed=lambda: log.append(("warmed", calls["n"])))
    assert ("warmed", 1) in log and log.index(("warmed", 1)) == 1  # after both warm-ups, before any timed call
    assert sorted(r.seconds for r in runs) == pytest.approx([0.0, 0.0, 0.01, 0.01])  # the 0.3 s is on no figure


def test_a_method_that_changes_one_token_is_caught():
    log: list = []

    def one_wrong(ids):
        out = list(ids[:3])
        if tuple(ids) == PROMPTS[1]:
            out[2] += 1
        return tuple(out)

    methods = [_fake("ref", log, tokens=lambda ids: tuple(ids[:3])), _fake("broken", log, tokens=one_wrong)]
    runs = hn.run_rounds(methods, PROMPTS, max_new_tokens=3, device=CPU, reference="ref")
    checks = hn.check_outputs(runs, reference="ref")
    assert not checks["ref"].flagged and checks["ref"].identical == 3
    assert checks["broken"].flagged and checks["broken"].identical == 2
    assert checks["broken"].first_mismatch == (1, 2)
    assert hn.check_outputs(runs, reference="ref", prompts=[0, 2])["broken"].identical == 2
    # strict: the run stops at the end of the first round that differs
    log.clear()
    with pytest.raises(LosslessnessError, match=r"broken differs from ref \(prompt 1, token 2\)"):
        hn.run_rounds(methods, PROMPTS, max_new_tokens=3, device=CPU, reference="ref", strict=True)
    assert {c[1] for c in log[2:]} == {PROMPTS[0], PROMPTS[1]}  # prompt 2 never ran
    # ``same`` decides instead of token equality (bf16 ties): what it accepts passes, the rest still raises
    seen = []
    hn.run_rounds(methods, PROMPTS, max_new_tokens=3, device=CPU, reference="ref", strict=True,
                  same=lambda ids, got, want: seen.append((tuple(ids), got, want)) or True)
    assert seen == [(PROMPTS[1], one_wrong(PROMPTS[1]), PROMPTS[1][:3])]  # asked only where tokens differ
    with pytest.raises(LosslessnessError):
        hn.run_rounds(methods, PROMPTS, max_new_tokens=3, device=CPU, reference="ref", strict=True,
                      same=lambda ids, got, want: False)


def test_the_search_accepts_numerical_ties_only_below_fp32(tiny_sm):
    from skipsearch.engine.equivalence import lossless_check
    from skipsearch.model.skippable import SkippableModel

    assert lossless_check(tiny_sm) is None  # fp32: identical, or a LosslessnessError
    bf16 = SkippableModel(copy.deepcopy(tiny_sm.hf).to(torch.bfloat16), tokenizer=None, name="tiny-bf16")
    check = lossless_check(bf16)
    prompt = [3, 9, 4, 17]
    reference = generate(bf16, prompt, max_new_tokens=6).token_ids
    assert check(prompt, reference, reference)
    clear = list(reference)
    clear[2] = int(bf16.forward(torch.tensor([*prompt, *reference[:2]]), start=0, cache=bf16.new_cache())[-1]
                   .argmin())  # the least likely token: far outside any tie tolerance
    assert not check(prompt, tuple(clear), reference)


def test_run_rounds_rejects_duplicate_names_empty_input_and_an_unknown_reference():
    m = hn.Contender("a", "hf", "", lambda ids, n: hn.ContenderOutput(()))
    with pytest.raises(ConfigError, match="unique"):
        hn.run_rounds([m, m], [[1]], max_new_tokens=2, device=CPU)
    with pytest.raises(ConfigError, match="at least one"):
        hn.run_rounds([m], [], max_new_tokens=2, device=CPU)
    with pytest.raises(ConfigError, match="reference"):
        hn.run_rounds([m], [[1]], max_new_tokens=2, device=CPU, strict=True)


def test_method_seconds_is_the_median_over_repeats_summed_over_prompts():
    out = hn.ContenderOutput(())

    def run(method, prompt, repeat, seconds):
        return hn.Run(method, prompt, repeat, 0, seconds, 0, 0, out)

    runs = [run("a", 0, 0, 1.0), run("a", 0, 1, 9.0), run("a", 0, 2, 2.0), run("a", 1, 0, 5.0),
            run("b", 0, 0, 3.0)]
    assert hn.method_seconds(runs) == {"a": 2.0 + 5.0}  # b did not run on prompt 1: no figure
    assert hn.method_seconds(runs, prompts=[0]) == {"a": 2.0, "b": 3.0}


def test_time_interleaved_warms_up_and_rotates():
    log: list = []
    calls = {name: (lambda name=name: log.append(name)) for name in ("x", "y")}
    timings = hn.time_interleaved(calls, rounds=4, warmup=2)
    assert log[:4] == ["x", "x", "y", "y"]
    assert log[4:] == ["x", "y", "y", "x", "x", "y", "y", "x"]
    assert {name: len(t.seconds) for name, t in timings.items()} == {"x": 4, "y": 4}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the per-call peak needs Linux")
def test_the_memory_probe_sees_what_a_call_allocates_and_only_that():
    size = 128 * 2**20

    def allocate(ids, max_new_tokens):
        # fresh anonymous pages, written, so resident: 128 MiB. Not a tensor: an allocator may hand back memory it
        # freed earlier and still holds, which the resident size already counts (in the lowest-versions venv,
        # after earlier tests, a 128 MiB tensor added nothing to it).
        import mmap

        block = mmap.mmap(-1, size)
        block.write(b"\1" * size)
        block.close()
        return hn.ContenderOutput((1,))

    methods = [hn.Contender("allocates", "skipsearch", "", allocate),
               hn.Contender("idle", "skipsearch", "", lambda ids, n: hn.ContenderOutput((1,)))]
    runs = hn.run_rounds(methods, [[1], [2]], max_new_tokens=2, device=CPU)
    if "peak per call" not in memory_probe(CPU).kind:
        pytest.skip("this system does not let the resident peak be reset")
    for r in runs:
        if r.method == "allocates":
            assert r.added_bytes >= 0.9 * size and r.peak_bytes >= r.added_bytes
        else:
            # the peak is reset before each call: the allocation before it must not show here
            assert r.added_bytes < size / 4


# -- time_drafter, on the tiny model -----------------------------------------------------------------------
class _CorruptingDrafter(Drafter):
    """Drafts nothing but rewrites the KV of the token before the pending one, with another token's:
    what an off-by-one crop inside a drafter looks like. The engine cannot see it; the output changes."""

    threshold = None

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        sm.crop(cache, start - 1)
        sm.forward(torch.tensor([(pending + 7) % 64]), start=start - 1, cache=cache)
        return Draft((), None)

    def observe(self, drafted: int, accepted: int) -> None:
        pass


def test_time_drafter_raises_for_a_drafter_that_changes_the_output(tiny_sm):
    with pytest.raises(LosslessnessError, match="broken differs from autoregressive"):
        time_drafter(tiny_sm, PROMPTS, lambda _prompt: _CorruptingDrafter(), max_new_tokens=16, label="broken")


def test_time_drafter_times_a_lossless_drafter_against_autoregressive(tiny_sm):
    config = DraftConfig(skip_attn=(2,), max_draft_tokens=2)
    m, per_verify = time_drafter(tiny_sm, PROMPTS, lambda _prompt: make_drafter(config), max_new_tokens=16,
                                 repeats=2)
    assert m.kind == "timed" and m.speedup == pytest.approx(m.tokens_per_s / m.baseline_tokens_per_s)
    assert 1.0 <= m.tau <= 3.0 and 0.0 <= per_verify <= 2.0 and m.acceptance_rate is not None


def test_hierplan_validation_pools_alpha_and_beta_over_one_pass(tiny_sm):
    # the harness warms up and repeats; the α, β that validation reports must still be those of one
    # drafter run once over each prompt, as the planner defines them
    from skipsearch.engine.decoding import generate
    from skipsearch.engine.surrogate import calibrate
    from skipsearch.methods.hierarchical import Hierarchy
    from skipsearch.methods.hierarchical.closed_form import PlanInputs
    from skipsearch.methods.hierarchical.drafter import HierarchicalDrafter
    from skipsearch.methods.hierarchical.planner import validate

    h = Hierarchy(DraftConfig(skip_attn=(2,), skip_mlp=(3,)), DraftConfig(skip_attn=(1, 2), skip_mlp=(1, 3)), 2, 1)
    cal = calibrate(tiny_sm, PROMPTS, max_new_tokens=12)
    one = HierarchicalDrafter(h)
    for p in cal.prompts:
        generate(tiny_sm, p, drafter=one, max_new_tokens=12)
    want = dict(one.report())
    inputs = PlanInputs(0.5, 0.5, 0.5, 0.5, (1.0,) * 8, (1.0,) * 3)
    [row] = validate(tiny_sm, cal, inputs, [h], repeats=2)
    assert row.alpha == pytest.approx(want["alpha"]) and row.beta == pytest.approx(want["beta"])
    assert row.tokens == sum(len(c) for c in cal.continuations)
    assert dataclasses.asdict(row)["measured_speedup"] > 0
