"""Candidate -> Measurement, two ways: timed (the truth) and a cheap surrogate (the predictor).

Timed: decode the calibration prompts with the runtime decoder (decoding.generate, the engine
``decode`` runs), interleaved prompt by prompt with the autoregressive baseline in the same
process so machine drift cancels; speedup = baseline seconds / config seconds.

Surrogate: the candidate's method's own ``predict`` (skipsearch.methods), from the calibration data,
the measured cost model and cycle replay that skipsearch.engine.surrogate holds for every method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from skipsearch import methods
from skipsearch.config import Candidate, ConfigError
from skipsearch.engine import timing
from skipsearch.engine.decoding import Drafter
from skipsearch.engine.equivalence import lossless_check
from skipsearch.engine.harness import LosslessnessError as LosslessnessError  # raised by its output check; re-exported
from skipsearch.engine.harness import (
    engine_method,
    first_outputs,
    method_seconds,
    ours_autoregressive,
    run_rounds,
)
from skipsearch.engine.surrogate import COST_ROUNDS, Calibration, CostModel, full_cache, measure_costs
from skipsearch.engine.surrogate import replay_all as replay_all  # noqa: F401 (old import path, until callers move)
from skipsearch.engine.surrogate import trace as trace  # noqa: F401 (old import path, until callers move)
from skipsearch.measure import Kind, Measurement
from skipsearch.model.skippable import SkippableModel


class ModelObjective:
    """The real objective: surrogate and timed evaluations of candidates on one model and calibration set.

    The surrogate is the candidate's method's own ``predict`` (skipsearch.methods); timing decodes with
    the method's drafter through the one engine and harness, whatever the method.
    """

    def __init__(self, sm: SkippableModel, calibration: Calibration, *, repeats: int = 1) -> None:
        self.sm = sm
        self.cal = calibration
        self.repeats = repeats
        self._costs: CostModel | None = None
        self._full: list | None = None  # full-model KV per calibration sequence, built once

    @property
    def cost_rounds(self) -> int:
        """Rounds of every cost the surrogates time here: ``repeats`` times the surrogate's own
        (``surrogate.COST_ROUNDS``), so that raising a search's repeats on a machine whose timings swing steadies
        its cost model as it steadies its timings."""
        return COST_ROUNDS * self.repeats

    @property
    def costs(self) -> CostModel:
        """The cost model, measured on first use (a few seconds on a small CPU model)."""
        if self._costs is None:
            self._costs = measure_costs(self.sm, self.cal.cost_context, repeats=self.cost_rounds)
        return self._costs

    @property
    def measured_costs(self) -> CostModel | None:
        """The cost model if it was measured already; never measures (e.g. on the way out of a Ctrl-C)."""
        return self._costs

    def evaluate(self, candidate: Candidate, *, kind: Kind) -> Measurement:
        if kind == "surrogate":
            self._check(candidate)
            return self.predict(candidate)
        return self.time(candidate)

    def _check(self, candidate: Candidate) -> None:
        """A candidate this model can run: its layers exist, and its draft suits the target's precision."""
        candidate.draft.check_layers(self.sm.num_layers)
        methods.check_target(candidate, getattr(self.sm, "target_precision", "native"), source="the candidate")

    def predict(self, candidate: Candidate) -> Measurement:
        method = methods.get(candidate.method)
        if method.predict is None:
            raise ConfigError(f"method '{method.name}' has no surrogate: its candidates can only be timed")
        return method.predict(self, candidate)

    def full_caches(self) -> list:
        """Full-model KV of every calibration sequence (prompt + continuation): what draft queries read.
        Built once; ``trace`` crops its own additions off again, so every surrogate shares them."""
        if self._full is None:
            pairs = zip(self.cal.prompts, self.cal.continuations, strict=True)
            self._full = [full_cache(self.sm, p, c) for p, c in pairs]
        return self._full

    def time(self, candidate: Candidate) -> Measurement:
        """Decode every calibration prompt with the candidate and autoregressively, interleaved.

        The method's prediction, where it has one, is made first and kept beside the measurement: the timing is
        the last thing done, so nothing runs between the harness's figures and the Measurement they fill."""
        return self.time_all([candidate])[0]

    def time_all(self, candidates: Sequence[Candidate]) -> list[Measurement]:
        """Time ``candidates`` together: every calibration prompt decoded by each of them and autoregressively,
        interleaved prompt by prompt in one harness run, so the baseline is decoded once for all of them (a
        shortlist of three costs four decodings of the calibration, not six). Each speedup is over that one
        baseline. One candidate's failure fails the run (the caller times them one by one then)."""
        t0 = timing.now(self.sm.device)
        for candidate in candidates:
            self._check(candidate)
        predicted = [self.predict(c) if methods.get(c.method).predict is not None else None for c in candidates]
        makers = [(str(c), lambda _prompt, c=c: methods.build_drafter(c, self.sm)) for c in candidates]
        timed = time_drafters(self.sm, self.cal.prompts, makers, max_new_tokens=self.cal.max_new_tokens,
                              repeats=self.repeats)
        seconds = (timing.now(self.sm.device) - t0) / len(candidates)  # the run's time, shared
        out = []
        for (m, _), p in zip(timed, predicted, strict=True):
            if p is not None:
                m = replace(m, predicted_speedup=p.speedup, alpha=p.alpha, cost_ratio=p.cost_ratio)
            out.append(replace(m, seconds=seconds))
        return out


def time_drafter(
    sm: SkippableModel, prompts: Sequence[Sequence[int]], make_drafter: Callable[[Sequence[int]], Drafter | None], *,
    max_new_tokens: int, repeats: int = 1, label: str = "draft",
) -> tuple[Measurement, float]:
    """Decode ``prompts`` with fresh drafters and autoregressively, interleaved by the one harness.

    Returns the timed Measurement and accepted draft tokens per verification. ``make_drafter``
    gets each prompt (a drafter without a KV cache needs it). Greedy outputs must be identical:
    our autoregressive loop is the reference, and a difference raises ``LosslessnessError``.
    """
    return time_drafters(sm, prompts, [(label, make_drafter)], max_new_tokens=max_new_tokens, repeats=repeats)[0]


def time_drafters(
    sm: SkippableModel, prompts: Sequence[Sequence[int]],
    makers: Sequence[tuple[str, Callable[[Sequence[int]], Drafter | None]]], *, max_new_tokens: int,
    repeats: int = 1,
) -> list[tuple[Measurement, float]]:
    """``time_drafter`` for several drafters at once (``(label, make_drafter)`` each): one autoregressive
    baseline, every drafter interleaved with it prompt by prompt; one (Measurement, accepted per verification)
    each, in order."""
    t0 = timing.now(sm.device)
    base = ours_autoregressive(sm, name="autoregressive")  # the baseline and the reference
    specs = []
    for label, make in makers:
        name = label if label != base.name else f"{label} (draft)"
        while name in {base.name, *(s.name for s in specs)}:
            name += "'"
        specs.append(engine_method(sm, name, make, setting=label))
    # a short warm-up (8 tokens) keeps each timed trial of a search cheap
    runs = run_rounds([base, *specs], prompts, max_new_tokens=max_new_tokens, device=sm.device, repeats=repeats,
                      warmup_tokens=8, reference=base.name, strict=True, same=lossless_check(sm))
    seconds = method_seconds(runs)
    base_total = seconds[base.name]
    out = []
    for spec in specs:
        spec_total = seconds[spec.name]
        outs = first_outputs(runs, spec.name)
        tokens = sum(len(o.token_ids) for o in outs)
        drafted = sum(o.drafted or 0 for o in outs)
        accepted = sum(o.accepted or 0 for o in outs)
        verify_steps = sum(o.verify_steps or 0 for o in outs)
        m = Measurement(
            kind="timed",
            speedup=base_total / spec_total,
            tokens_per_s=tokens / spec_total,
            baseline_tokens_per_s=tokens / base_total,
            # the prefill's token is not a verification's
            tau=(tokens - len(prompts)) / verify_steps if verify_steps else 1.0,
            acceptance_rate=accepted / drafted if drafted else None,
            seconds=timing.now(sm.device) - t0,
        )
        out.append((m, accepted / verify_steps if verify_steps else 0.0))
    return out
