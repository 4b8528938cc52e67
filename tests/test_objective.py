"""The objective: cost model, teacher-forced traces, the replay, and the timed stage's checks."""

from __future__ import annotations

import pytest

from skipsearch.config import NO_EXIT, DraftConfig, ExitRule
from skipsearch.decoding import generate
from skipsearch.objective import (
    CostModel,
    LosslessnessError,
    ModelObjective,
    Trace,
    _interpolate,
    calibrate,
    measure_costs,
    replay,
    trace,
)

PROMPTS = ((3, 17, 5, 9, 22, 41), (7, 7, 30, 2))


@pytest.fixture(scope="module")
def calibration(tiny_sm):
    return calibrate(tiny_sm, PROMPTS, max_new_tokens=16)


def _costs(c: float, verify: tuple[float, ...], layers: int = 4) -> CostModel:
    """A cost model whose every draft config costs exactly ``c`` (all cost is fixed)."""
    return CostModel(step_seconds=1.0, attn_seconds=0.0, mlp_seconds=0.0, fixed_seconds=c,
                     verify_ratio=verify, num_layers=layers)


def test_interpolation_passes_through_the_measured_points():
    v = _interpolate([(1, 1.0), (2, 1.6), (4, 2.0), (9, 2.5)])
    assert len(v) == 9
    assert v[0] == 1.0 and v[1] == 1.6 and v[3] == 2.0 and v[8] == 2.5
    assert v[2] == pytest.approx(1.8) and v[5] == pytest.approx(2.2)


def test_measured_costs_are_sane(tiny_sm, calibration):
    costs = measure_costs(tiny_sm, calibration.prompts[0] + calibration.continuations[0], repeats=3)
    v = costs.verify_ratio
    assert v[0] == 1.0 and len(v) >= 9
    assert all(b >= a for a, b in zip(v, v[1:], strict=False))  # more tokens never cost less
    assert costs.step_seconds > 0 and costs.fixed_seconds >= 0
    assert costs.verify(12) >= v[-1]  # extrapolated past the measured range, still monotone
    everything = DraftConfig(skip_attn=tuple(range(4)), skip_mlp=tuple(range(4)))
    assert costs.draft_ratio(everything) <= costs.draft_ratio(DraftConfig(skip_attn=(1,))) <= costs.draft_ratio(
        DraftConfig())


def test_a_config_that_skips_nothing_matches_everywhere(tiny_sm, calibration):
    # With full-model context KV and nothing skipped, the draft *is* the full model: a wrong mask
    # (a query seeing its own future, or not its own KV) breaks this.
    for prompt, cont in zip(calibration.prompts, calibration.continuations, strict=True):
        tr = trace(tiny_sm, prompt, cont, DraftConfig(max_draft_tokens=3))
        assert all(tr.matches) and len(tr.matches) == len(cont)
        assert all(0.0 < p <= 1.0 for p in tr.confidences)


def test_the_trace_leaves_the_shared_cache_as_it_found_it(tiny_sm, calibration):
    from skipsearch.objective import full_cache

    prompt, cont = calibration.prompts[0], calibration.continuations[0]
    kv = full_cache(tiny_sm, prompt, cont)
    config = DraftConfig(skip_attn=(1, 2), skip_mlp=(2,))
    first = trace(tiny_sm, prompt, cont, config, cache=kv)
    assert tiny_sm.cache_lengths(kv) == (len(prompt) + len(cont),) * tiny_sm.num_layers
    assert trace(tiny_sm, prompt, cont, config, cache=kv) == first == trace(tiny_sm, prompt, cont, config)


def test_replay_charges_drafts_and_verifies_as_the_decoder_runs_them():
    tr = Trace(matches=(True,) * 6, confidences=(1.0,) * 6)
    r = replay(tr, DraftConfig(skip_mlp=(1,), max_draft_tokens=2, exit=NO_EXIT), _costs(0.5, (1.0, 1.5, 2.0)))
    # two cycles of (2 drafts at 0.5 + a 3-token verify at 2.0), each emitting 3 tokens
    assert (r.emitted, r.cycles, r.drafted, r.accepted) == (6, 2, 4, 4)
    assert r.cost == pytest.approx(6.0)


def test_replay_stops_at_the_first_mismatch_and_at_low_confidence():
    tr = Trace(matches=(True, False, True, True, True), confidences=(0.9, 0.9, 0.9, 0.2, 0.9))
    r = replay(tr, DraftConfig(skip_mlp=(1,), max_draft_tokens=4, exit=ExitRule(threshold=0.5, adaptive=False)),
               _costs(0.5, (1.0, 1.2, 1.4, 1.6, 1.8)))
    # cycle 1 at t=0: drafts 4 (all confident), accepts 1 -> emits 2, t=2
    # cycle 2 at t=2: limit 2; drafts t=2 (match), t=3 (match, conf 0.2 -> exit) -> emits 3, t=5
    assert (r.emitted, r.cycles, r.drafted, r.accepted) == (5, 2, 6, 3)
    assert r.cost == pytest.approx((4 * 0.5 + 1.8) + (2 * 0.5 + 1.4))


def test_autoregressive_replay_costs_one_per_token():
    tr = Trace(matches=(False,) * 5, confidences=(0.5,) * 5)
    r = replay(tr, DraftConfig(max_draft_tokens=0), _costs(0.5, (1.0, 2.0)))
    assert r.emitted == 5 and r.cost == 5.0


def test_timed_measurement_holds_the_prediction_beside_it(tiny_sm, calibration):
    obj = ModelObjective(tiny_sm, calibration)
    m = obj.evaluate(DraftConfig(skip_attn=(2,), max_draft_tokens=2), kind="timed")
    assert m.kind == "timed" and m.speedup > 0 and m.predicted_speedup > 0
    assert m.tokens_per_s > 0 and m.baseline_tokens_per_s > 0 and 1.0 <= m.tau <= 3.0
    assert m.speedup == pytest.approx(m.tokens_per_s / m.baseline_tokens_per_s)


def test_a_decoder_that_changes_the_output_is_caught(tiny_sm, calibration, monkeypatch):
    import skipsearch.objective as objective

    def broken(sm, prompt, *, drafter=None, **kw):
        result = generate(sm, prompt, drafter=drafter, **kw)
        if drafter is not None:  # corrupt the speculative side only
            result = type(result)((result.token_ids[0] + 1, *result.token_ids[1:]), result.stats)
        return result

    monkeypatch.setattr(objective, "generate", broken)
    with pytest.raises(LosslessnessError, match="differs from autoregressive"):
        ModelObjective(tiny_sm, calibration).evaluate(DraftConfig(skip_attn=(2,), max_draft_tokens=2), kind="timed")
