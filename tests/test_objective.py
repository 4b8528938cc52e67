"""The objective: cost model, teacher-forced traces, the replay, and the timed stage's checks."""

from __future__ import annotations

import math
import time

import pytest
from clocks import WorkCosts, work_clock

from skipsearch.config import NO_EXIT, Candidate, ConfigError, DraftConfig, ExitRule, Trace
from skipsearch.engine.surrogate import (
    CostModel,
    calibrate,
    interpolate,
    measure_costs,
    replay,
    trace,
)
from skipsearch.search.objective import ModelObjective

PROMPTS = ((3, 17, 5, 9, 22, 41), (7, 7, 30, 2))


@pytest.fixture(scope="module")
def calibration(tiny_sm):
    return calibrate(tiny_sm, PROMPTS, max_new_tokens=16)


def _costs(c: float, verify: tuple[float, ...], layers: int = 4) -> CostModel:
    """A cost model whose every draft config costs exactly ``c`` (all cost is fixed)."""
    return CostModel(step_seconds=1.0, attn_seconds=0.0, mlp_seconds=0.0, fixed_seconds=c,
                     verify_ratio=verify, num_layers=layers)


def test_interpolation_passes_through_the_measured_points():
    v = interpolate([(1, 1.0), (2, 1.6), (4, 2.0), (9, 2.5)])
    assert len(v) == 9
    assert v[0] == 1.0 and v[1] == 1.6 and v[3] == 2.0 and v[8] == 2.5
    assert v[2] == pytest.approx(1.8) and v[5] == pytest.approx(2.2)


def test_measure_costs_puts_a_slow_sublayer_where_it_is(tiny_sm, calibration):
    # Layer 1's MLP is made 10 ms slower on a clock that only the model's work and that delay move (so the
    # verdict is the same on a loaded machine): the cost model must charge it to the MLPs, not to attention,
    # and an extra config that skips that MLP, costed in the same rounds, must come out that much cheaper
    # than one that skips another.
    slow = 0.010
    with work_clock(tiny_sm) as clock:
        handle = tiny_sm.hf.model.layers[1].mlp.register_forward_hook(lambda *_: clock.advance(slow))
        try:
            costs = measure_costs(
                tiny_sm, calibration.prompts[0] + calibration.continuations[0], repeats=5,
                extra={"skip-slow": DraftConfig(skip_mlp=(1,)), "skip-other": DraftConfig(skip_mlp=(2,))},
                extra_verify_sizes={"skip-other": (1, 3)},
            )
        finally:
            handle.remove()
    L, work = tiny_sm.num_layers, WorkCosts()
    assert L * costs.mlp_seconds == pytest.approx(slow + L * work.mlp)  # skipping every MLP saved the delay
    assert L * costs.attn_seconds == pytest.approx(L * work.attn)  # skipping every attention did not
    assert costs.fixed_seconds == pytest.approx(work.embed + work.head)
    every_mlp, every_attn = DraftConfig(skip_mlp=tuple(range(L))), DraftConfig(skip_attn=tuple(range(L)))
    assert costs.draft_ratio(every_mlp) < 0.5 < costs.draft_ratio(every_attn)
    fast, other = costs.extra("skip-slow"), costs.extra("skip-other")
    assert other.step_seconds - fast.step_seconds == pytest.approx(slow)
    assert len(other.verify_ratio) == 3 and other.verify_ratio[0] == 1.0 and len(fast.verify_ratio) == 1
    assert other.verify_ratio[2] > 1.0  # a 3-token forward costs more than one token
    with pytest.raises(KeyError, match="no extra config 'nope'"):
        costs.extra("nope")


def test_measure_costs_on_the_real_clock_reads_real_time(tiny_sm, calibration):
    # The real clock (no injected one): only bounds that hold under any load are asserted, never an order
    # between two timings (a neighbour's burst may land on either). Every MLP sleeps 30 ms, and a sleep never
    # ends early, so a full step takes at least L * 30 ms however idle or busy the machine; load only adds.
    # Which sublayer the delay is charged to is checked exactly on the work clock (the test above).
    slow = 0.03
    handles = [layer.mlp.register_forward_hook(lambda *_: time.sleep(slow)) for layer in tiny_sm.layers]
    try:
        costs = measure_costs(tiny_sm, calibration.prompts[0] + calibration.continuations[0], repeats=3,
                              verify_sizes=(1, 2))
    finally:
        for h in handles:
            h.remove()
    assert costs.step_seconds >= tiny_sm.num_layers * slow
    parts = (costs.attn_seconds, costs.mlp_seconds, costs.fixed_seconds)
    assert all(math.isfinite(x) and x >= 0 for x in parts)
    assert len(costs.verify_ratio) == 2 and 1.0 == costs.verify_ratio[0] <= costs.verify_ratio[1]


def test_extra_verify_sizes_must_name_an_extra_config(tiny_sm):
    with pytest.raises(ConfigError, match="not in extra: small"):
        measure_costs(tiny_sm, PROMPTS[0], extra={"medium": DraftConfig()}, extra_verify_sizes={"small": (2,)})


def test_a_config_that_skips_nothing_matches_everywhere(tiny_sm, calibration):
    # With full-model context KV and nothing skipped, the draft *is* the full model: a wrong mask
    # (a query seeing its own future, or not its own KV) breaks this.
    for prompt, cont in zip(calibration.prompts, calibration.continuations, strict=True):
        tr = trace(tiny_sm, prompt, cont, DraftConfig(max_draft_tokens=3))
        assert all(tr.matches) and len(tr.matches) == len(cont)
        assert all(0.0 < p <= 1.0 for p in tr.confidences)


def test_the_trace_leaves_the_shared_cache_as_it_found_it(tiny_sm, calibration):
    from skipsearch.engine.surrogate import full_cache

    prompt, cont = calibration.prompts[0], calibration.continuations[0]
    kv = full_cache(tiny_sm, prompt, cont)
    config = DraftConfig(skip_attn=(1, 2), skip_mlp=(2,))
    first = trace(tiny_sm, prompt, cont, config, cache=kv)
    assert tiny_sm.cache_lengths(kv) == (len(prompt) + len(cont),) * tiny_sm.num_layers
    assert trace(tiny_sm, prompt, cont, config, cache=kv) == first == trace(tiny_sm, prompt, cont, config)


def test_replay_charges_drafts_and_verifies_as_the_decoder_runs_them():
    tr = Trace(matches=(True,) * 6, confidences=(1.0,) * 6)
    r = replay(tr, DraftConfig(skip_mlp=(1,), max_draft_tokens=2, exit=NO_EXIT), _costs(0.5, (1.0, 1.5, 2.0)))
    # the prefill's token (1 step), then at t=1: 2 drafts at 0.5 + a 3-token verify at 2.0, emitting 3;
    # at t=4 only 1 draft fits before the end: 0.5 + a 2-token verify at 1.5, emitting 2
    assert (r.emitted, r.cycles, r.drafted, r.accepted) == (6, 2, 3, 3)
    assert r.cost == pytest.approx(1.0 + (2 * 0.5 + 2.0) + (0.5 + 1.5))


def test_replay_stops_at_the_first_mismatch_and_at_low_confidence():
    tr = Trace(matches=(True, False, True, True, True), confidences=(0.9, 0.9, 0.9, 0.2, 0.9))
    r = replay(tr, DraftConfig(skip_mlp=(1,), max_draft_tokens=4, exit=ExitRule(threshold=0.5, adaptive=False)),
               _costs(0.5, (1.0, 1.2, 1.4, 1.6, 1.8)))
    # t=0 is the prefill's token (1 step); cycle 1 at t=1: limit 3; t=1 mismatches, t=3 has conf 0.2 -> exit
    # after 3 drafts, accepts 0 -> emits 1, t=2; cycle 2 at t=2: limit 2; t=2 and t=3 match (conf 0.2 -> exit)
    # -> emits 3, t=5
    assert (r.emitted, r.cycles, r.drafted, r.accepted) == (5, 2, 5, 2)
    assert r.cost == pytest.approx(1.0 + (3 * 0.5 + 1.6) + (2 * 0.5 + 1.4))


def test_autoregressive_replay_costs_one_per_token():
    tr = Trace(matches=(False,) * 5, confidences=(0.5,) * 5)
    r = replay(tr, DraftConfig(max_draft_tokens=0), _costs(0.5, (1.0, 2.0)))
    assert r.emitted == 5 and r.cost == 5.0


def test_timed_measurement_holds_the_prediction_beside_it(tiny_sm, calibration):
    obj = ModelObjective(tiny_sm, calibration)
    m = obj.evaluate(Candidate("layer-skip", DraftConfig(skip_attn=(2,), max_draft_tokens=2)), kind="timed")
    assert m.kind == "timed" and m.speedup > 0 and m.predicted_speedup > 0
    assert m.tokens_per_s > 0 and m.baseline_tokens_per_s > 0 and 1.0 <= m.tau <= 3.0
    assert m.speedup == pytest.approx(m.tokens_per_s / m.baseline_tokens_per_s)
