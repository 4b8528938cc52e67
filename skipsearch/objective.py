"""DraftConfig -> Measurement, two ways: timed (the truth) and a cheap surrogate (the predictor).

Timed: decode the calibration prompts with the runtime decoder (decoding.generate, the engine
``decode`` runs), interleaved prompt by prompt with the autoregressive baseline in the same
process so machine drift cancels; speedup = baseline seconds / config seconds.

Surrogate: three measured ingredients and one replay.
1. A trace per calibration sequence: the full model's greedy continuation is teacher-forced
   through the draft config in ONE forward. Each draft query attends to the *full-model* KV
   of every earlier position (as in real drafting, where the context was verified by the full
   model) and to its own draft KV, through a custom 4-D mask over [full KV | draft KV]. At each
   position we read whether the draft's argmax equals the full model's token ("matchness",
   SWIFT) and the draft's top probability (for the exit rule).
2. Costs, measured once with the one timer: a full single-token step, the per-layer cost of
   attention and of the MLP, the fixed remainder (embedding, LM head, loop), so a config's
   draft cost ratio c = (fixed + kept sublayers) / full step; and the verify curve v(k), the
   cost of one forward over k tokens relative to one step.
3. The replay walks each trace as the decoder would: draft until K tokens or the top
   probability falls below γ (adaptive γ updated exactly as the decoder does), accept the
   leading matches, emit one more, charge k·c + v(k+1). Predicted speedup = tokens emitted /
   cost, where one autoregressive token costs 1.
The approximation: within one draft block, later drafts attend to earlier *draft* KV in reality
but to full KV in the trace. The timed stage holds the prediction to account.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from skipsearch import timing
from skipsearch.config import DraftConfig
from skipsearch.decoding import Drafter, LayerSkipDrafter, generate, make_drafter
from skipsearch.measure import Kind, Measurement
from skipsearch.models import SkippableModel


class LosslessnessError(RuntimeError):
    """A config's greedy output differed from autoregressive output: a decoder bug, never expected."""


@dataclass(frozen=True)
class CostModel:
    """Measured costs, in seconds and as ratios to one full autoregressive step."""

    step_seconds: float  # one autoregressive decoder cycle (one-token full forward + argmax) at calibration length
    attn_seconds: float  # one layer's attention, inside that step
    mlp_seconds: float  # one layer's MLP
    fixed_seconds: float  # the rest: embedding, norms, LM head, framework overhead
    verify_ratio: tuple[float, ...]  # v(k) for k = 1..len: one forward over k tokens / one step
    num_layers: int

    def draft_ratio(self, config: DraftConfig) -> float:
        """c: one draft step of ``config`` relative to one full step."""
        kept_attn = self.num_layers - len(config.skip_attn)
        kept_mlp = self.num_layers - len(config.skip_mlp)
        seconds = self.fixed_seconds + kept_attn * self.attn_seconds + kept_mlp * self.mlp_seconds
        return max(seconds, 0.0) / self.step_seconds

    def verify(self, k: int) -> float:
        """v(k), extrapolated linearly past the measured range."""
        v = self.verify_ratio
        if k <= len(v):
            return v[k - 1]
        slope = (v[-1] - v[0]) / max(len(v) - 1, 1)
        return v[-1] + slope * (k - len(v))


@dataclass(frozen=True)
class Trace:
    """Per-position agreement of a draft config with the full model on one sequence."""

    matches: tuple[bool, ...]
    confidences: tuple[float, ...]
    predictions: tuple[int, ...] = ()  # the draft's argmax at each position (compare two drafts with it)


@dataclass(frozen=True)
class Calibration:
    """What the objective evaluates on: prompts and the full model's greedy continuations."""

    prompts: tuple[tuple[int, ...], ...]
    continuations: tuple[tuple[int, ...], ...]
    max_new_tokens: int


def calibrate(sm: SkippableModel, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> Calibration:
    conts = tuple(generate(sm, p, max_new_tokens=max_new_tokens).token_ids for p in prompts)
    return Calibration(tuple(tuple(p) for p in prompts), conts, max_new_tokens)


def measure_costs(
    sm: SkippableModel, context: Sequence[int], *, verify_sizes: Sequence[int] = (1, 2, 3, 4, 6, 9), repeats: int = 9
) -> CostModel:
    """Time the sublayers and the verify curve at ``context``'s length, with the one timer.

    Every quantity is sampled round-robin, ``repeats`` times over, and summarised by its median:
    interleaving spreads machine drift and contention evenly over all of them, so the *ratios*
    the model is built from hold even on a busy machine, and the median is the typical cost the
    decoder will pay (a minimum would flatter the draft, which runs many small forwards).
    v(k) is measured at ``verify_sizes`` and interpolated linearly between them, kept
    non-decreasing. It is not affine: on CPU a one-token forward runs matrix-vector kernels and
    k >= 2 runs matrix-matrix ones, so v(2) jumps and the curve flattens after it.
    """
    verify_sizes = sorted({1, *verify_sizes})
    cache = sm.new_cache()
    sm.forward(torch.tensor(list(context)), start=0, cache=cache)
    n = len(context)
    L = sm.num_layers
    every = tuple(range(L))

    def step(config: DraftConfig | None):
        token = torch.tensor([context[-1]])

        def once():
            if config is None:
                sm.forward(token, start=n, cache=cache, last_only=True)
            else:
                with sm.drafting(config):
                    sm.forward(token, start=n, cache=cache, last_only=True)
            sm.crop(cache, n)

        return once

    def verify(k: int):
        ids = torch.tensor((list(context) * k)[:k])

        def once():  # as the decoder verifies: all k rows of logits, argmax read back
            sm.forward(ids, start=n, cache=cache).argmax(-1).tolist()
            sm.crop(cache, n)

        return once

    calls = {"full": step(None), "no_attn": step(DraftConfig(skip_attn=every)),
             "no_mlp": step(DraftConfig(skip_mlp=every))}
    calls.update({f"v{k}": verify(k) for k in verify_sizes})
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm-up: first calls pay allocation and dispatch set-up
        timing.time_call(fn, device=sm.device, repeats=1, warmup=2)
    for _ in range(repeats):
        for name, fn in calls.items():
            samples[name].append(timing.time_call(fn, device=sm.device, repeats=1, warmup=0)[0].best)
    med = {name: statistics.median(v) for name, v in samples.items()}
    full = med["full"]
    attn = max(full - med["no_attn"], 0.0) / L
    mlp = max(full - med["no_mlp"], 0.0) / L
    fixed = max(full - L * (attn + mlp), 0.0)
    # The unit is the decoder's autoregressive cycle (a one-token verify: logits read back), so
    # that c and v(k) are ratios to exactly what one plain-decoding token costs.
    unit = med["v1"]
    points, top = [], 1.0
    for k in verify_sizes:
        top = max(top, med[f"v{k}"] / unit)  # a forward over more tokens never costs less
        points.append((k, top))
    return CostModel(unit, attn, mlp, fixed, _interpolate(points), L)


def _interpolate(points: Sequence[tuple[int, float]]) -> tuple[float, ...]:
    """v(1..K_max) by linear interpolation between measured (k, v) points, k ascending from 1."""
    out = []
    for (k0, v0), (k1, v1) in zip(points, points[1:], strict=False):
        out.extend(v0 + (v1 - v0) * (k - k0) / (k1 - k0) for k in range(k0, k1))
    out.append(points[-1][1])
    return tuple(out)


def full_cache(sm: SkippableModel, prompt: Sequence[int], continuation: Sequence[int]):
    """Full-model KV for prompt + continuation: the context every draft query reads."""
    cache = sm.new_cache()
    sm.forward(torch.tensor([*prompt, *continuation]), start=0, cache=cache)
    return cache


def trace(
    sm: SkippableModel, prompt: Sequence[int], continuation: Sequence[int], config: DraftConfig, *, cache=None
) -> Trace:
    """Teacher-force ``continuation`` through the draft config with full-model context KV.

    ``cache`` (from ``full_cache``) is reused across configs: the draft's appended KV is
    cropped off again before returning.
    """
    P, T = len(prompt), len(continuation)
    seq = torch.tensor([*prompt, *continuation])
    if cache is None:
        cache = full_cache(sm, prompt, continuation)
    # Draft queries are the tokens at positions P-1 .. P+T-2; query i predicts continuation[i].
    queries = seq[P - 1 : P + T - 1]
    q_pos = torch.arange(P - 1, P + T - 1)  # [T]
    full_pos = torch.arange(P + T)  # [P+T]
    # mask: [1, 1, T, (P+T) + T]; True = attend. Full KV strictly before the query's position,
    # plus the query's own draft KV (diagonal of the appended block).
    see_full = full_pos.unsqueeze(0) < q_pos.unsqueeze(1)  # [T, P+T]
    see_self = torch.eye(T, dtype=torch.bool)  # [T, T]
    mask = torch.cat([see_full, see_self], dim=1)[None, None].to(sm.device)
    ids = queries.view(1, -1).to(sm.device)
    with torch.inference_mode(), sm.drafting(config):
        out = sm.hf(
            input_ids=ids, position_ids=q_pos.view(1, -1).to(sm.device), attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )
    sm.crop(cache, P + T)  # drop the draft KV; the full-model context stays for the next config
    probs = out.logits[0].float().softmax(-1)  # [T, V]
    conf, pred = probs.max(-1)  # [T], [T]
    target = torch.tensor(list(continuation), device=pred.device)
    return Trace(tuple((pred == target).tolist()), tuple(conf.tolist()), tuple(pred.tolist()))


@dataclass(frozen=True)
class Replay:
    emitted: int
    cost: float  # in full single-token steps
    drafted: int
    accepted: int
    cycles: int


def replay(tr: Trace, config: DraftConfig, costs: CostModel) -> Replay:
    """Walk one trace as the decoder would (K, exit rule, adaptive γ) and add up tokens and cost."""
    if config.is_autoregressive:
        n = len(tr.matches)
        return Replay(n, float(n), 0, 0, n)
    c = costs.draft_ratio(config)
    drafter = LayerSkipDrafter(config)  # its γ update is the decoder's own
    t = emitted = drafted = accepted = cycles = 0
    cost = 0.0
    n = len(tr.matches)
    while t < n:
        limit = min(config.max_draft_tokens, n - t - 1)
        k = a = 0
        leading = True
        while k < limit:
            match, confidence = tr.matches[t + k], tr.confidences[t + k]
            k += 1
            if leading and match:
                a += 1
            else:
                leading = False
            if confidence < drafter.gamma:
                break
        cost += k * c + costs.verify(k + 1)
        emitted += a + 1
        t += a + 1
        drafted += k
        accepted += a
        cycles += 1
        if k:
            drafter.observe(k, a)
    return Replay(emitted, cost, drafted, accepted, cycles)


class ModelObjective:
    """The real objective: surrogate and timed evaluations on one model and calibration set."""

    def __init__(self, sm: SkippableModel, calibration: Calibration, *, repeats: int = 1) -> None:
        self.sm = sm
        self.cal = calibration
        self.repeats = repeats
        self._costs: CostModel | None = None
        self._full: list | None = None  # full-model KV per calibration sequence, built once

    @property
    def costs(self) -> CostModel:
        if self._costs is None:
            context = self.cal.prompts[0] + self.cal.continuations[0][: self.cal.max_new_tokens // 2]
            self._costs = measure_costs(self.sm, context)
        return self._costs

    def evaluate(self, config: DraftConfig, *, kind: Kind) -> Measurement:
        config.check_layers(self.sm.num_layers)
        if kind == "surrogate":
            return self.predict(config)
        return self.time(config)

    def predict(self, config: DraftConfig) -> Measurement:
        t0 = timing.now(self.sm.device)
        costs = self.costs
        if self._full is None:
            pairs = zip(self.cal.prompts, self.cal.continuations, strict=True)
            self._full = [full_cache(self.sm, p, c) for p, c in pairs]
        rows = zip(self.cal.prompts, self.cal.continuations, self._full, strict=True)
        traces = [trace(self.sm, p, c, config, cache=kv) for p, c, kv in rows if c]
        runs = [replay(tr, config, costs) for tr in traces]
        emitted = sum(r.emitted for r in runs)
        cost = sum(r.cost for r in runs)
        drafted = sum(r.drafted for r in runs)
        accepted = sum(r.accepted for r in runs)
        matches = [m for tr in traces for m in tr.matches]
        speedup = emitted / cost if cost else 1.0
        return Measurement(
            kind="surrogate",
            speedup=speedup,
            predicted_speedup=speedup,
            tau=emitted / max(sum(r.cycles for r in runs), 1),
            acceptance_rate=accepted / drafted if drafted else None,
            alpha=sum(matches) / len(matches) if matches else None,
            cost_ratio=costs.draft_ratio(config),
            seconds=timing.now(self.sm.device) - t0,
        )

    def time(self, config: DraftConfig) -> Measurement:
        """Decode every calibration prompt with ``config`` and autoregressively, interleaved."""
        t0 = timing.now(self.sm.device)
        m, _ = time_drafter(self.sm, self.cal.prompts, lambda _prompt: make_drafter(config),
                            max_new_tokens=self.cal.max_new_tokens, repeats=self.repeats, label=str(config))
        predicted = self.predict(config)
        return replace(m, predicted_speedup=predicted.speedup, alpha=predicted.alpha,
                       cost_ratio=predicted.cost_ratio, seconds=timing.now(self.sm.device) - t0)


def time_drafter(
    sm: SkippableModel, prompts: Sequence[Sequence[int]], make_drafter: Callable[[Sequence[int]], Drafter | None], *,
    max_new_tokens: int, repeats: int = 1, label: str = "draft",
) -> tuple[Measurement, float]:
    """Decode ``prompts`` with fresh drafters and autoregressively, interleaved, with the one timer.

    Returns the timed Measurement and accepted draft tokens per verification. ``make_drafter``
    gets each prompt (a drafter without a KV cache needs it). Greedy outputs must be identical.
    """
    t0 = timing.now(sm.device)
    warm = prompts[0]  # first-call effects (allocator, packed kernels) must not land on one side
    generate(sm, warm, max_new_tokens=min(max_new_tokens, 8))
    generate(sm, warm, drafter=make_drafter(warm), max_new_tokens=min(max_new_tokens, 8))
    base_s, spec_s = [], []
    tokens = drafted = accepted = verify_steps = 0
    for i, prompt in enumerate(prompts):
        base_runs, spec_runs = [], []
        for r in range(repeats):
            for side in (("base", "spec") if (i + r) % 2 == 0 else ("spec", "base")):
                drafter = make_drafter(prompt) if side == "spec" else None
                result = generate(sm, prompt, drafter=drafter, max_new_tokens=max_new_tokens)
                (spec_runs if side == "spec" else base_runs).append(result)
        if any(s.token_ids != b.token_ids for s, b in zip(spec_runs, base_runs, strict=True)):
            raise LosslessnessError(f"greedy output differs from autoregressive decoding ({label})")
        base_s.append(statistics.median(b.stats.seconds for b in base_runs))
        spec_s.append(statistics.median(s.stats.seconds for s in spec_runs))
        st = spec_runs[0].stats
        tokens += st.new_tokens
        drafted += st.drafted_tokens
        accepted += st.accepted_tokens
        verify_steps += st.verify_steps
    base_total, spec_total = sum(base_s), sum(spec_s)
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
    return m, accepted / verify_steps if verify_steps else 0.0
