"""What every surrogate reads: the calibration data, the measured cost model and cycle replay.

A surrogate predicts a candidate's speedup without timing it, from three measured ingredients:
1. A trace per calibration sequence (``trace``): the full model's greedy continuation is teacher-forced
   through the draft config in ONE forward. Each draft query attends to the *full-model* KV of every
   earlier position (as in real drafting, where the context was verified by the full model) and to its
   own draft KV, through a custom 4-D mask over [full KV | draft KV]. At each position we read whether
   the draft's argmax equals the full model's token ("matchness", SWIFT) and the draft's top
   probability (for the exit rule).
2. Costs (``measure_costs``), measured once with the one timer: a full single-token step, the per-layer
   cost of attention and of the MLP, the fixed remainder (embedding, LM head, loop), so a config's draft
   cost ratio c = (fixed + kept sublayers) / full step; and the verify curve v(k), the cost of one
   forward over k tokens relative to one step.
3. The replay (``replay``) walks each trace as the decoder would: draft until K tokens or the top
   probability falls below γ (adaptive γ updated exactly as the decoder does), accept the leading
   matches, emit one more, charge k·c + v(k+1). Predicted speedup = tokens emitted / cost, where one
   autoregressive token costs 1.
The approximation: within one draft block, later drafts attend to earlier *draft* KV in reality but to
full KV in the trace. The timed stage holds the prediction to account.

Methods import this module, never ``objective``: it sits below both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from skipsearch.config import NO_EXIT, ConfigError, DraftConfig, ExitRule, Trace
from skipsearch.engine.decoding import LayerSkipDrafter, generate
from skipsearch.engine.harness import time_interleaved
from skipsearch.files.costs import CostModel, DraftCost, SchemeCosts
from skipsearch.measure import Measurement
from skipsearch.model.skippable import SkippableModel

# Rounds of every cost the surrogate times (``harness.time_interleaved``), a search's ``repeats`` times over: a
# machine's memory bandwidth can swing from one second to the next (19-43 GB/s on a shared Zen 4,
# studies/search-gap.md), and a one-token step with it, so the ratios of a few seconds' rounds swing too; more
# rounds sample more of the swing.
COST_ROUNDS = 9


@dataclass(frozen=True)
class SchemeCost:
    """One weight format's per-sublayer costs, timed in the same interleaved rounds as the full step
    (``measure_stand_ins``): a precision draft's copy, or a fractal draft's compressed layers."""

    scheme: str
    step_seconds: float  # the full one-token step these were timed against (median)
    attn_seconds: float  # one layer's attention in the scheme
    mlp_seconds: float  # one layer's MLP in the scheme
    full_attn_seconds: float  # one layer's attention at full precision, same rounds
    full_mlp_seconds: float
    head_saving_seconds: float  # a step with the scheme's head, less a step with the full head
    # The parts above are eager timings (their sum is ``step_seconds``). A draft's c is its seconds over the
    # decoder's unit, one plain step through the kernel that verifies (``SkippableModel.kernel``): None, the
    # eager step itself. With a compiled kernel the whole-model draft in the scheme (every sublayer and the head)
    # also runs compiled: ``whole_seconds`` is that step, which re-prices the eager arithmetic (None: eager draft).
    unit_seconds: float | None = None
    whole_seconds: float | None = None

    @property
    def unit(self) -> float:
        return self.unit_seconds if self.unit_seconds is not None else self.step_seconds

    def kept(self) -> SchemeCosts:
        """What a cost file (or a profile's measured.costs) keeps of it: the rest is the file's own step."""
        return SchemeCosts(self.scheme, self.attn_seconds, self.mlp_seconds, self.head_saving_seconds,
                           self.whole_seconds)


def _one_step(sm: SkippableModel, token: torch.Tensor, n: int, cache, skip: DraftConfig | None) -> None:
    """One decoding step after ``n`` cached positions (last-position logits only), with ``skip``'s sublayers
    skipped where given; the cache is cropped back to ``n`` after it."""
    with sm.drafting(skip) if skip is not None else contextlib.nullcontext():
        sm.forward(token, start=n, cache=cache, last_only=True)
    sm.crop(cache, n)


@contextlib.contextmanager
def whole_draft(sm: SkippableModel, copy) -> Iterator[None]:
    """``sm`` as the whole-model draft in ``copy``'s scheme (every attention, MLP and the head ``copy``'s stand-ins),
    its one-token steps compiled (``compiled_draft``): what ``measure_stand_ins`` times as ``whole``, and what a
    search builds beside the process before it (``methods.precision.build_drafts_aside``)."""
    every = tuple(range(sm.num_layers))
    with sm.substituted(**copy.stand_ins(every, every)), sm.draft_head(copy.head), sm.compiled_draft():
        yield


def measure_stand_ins(sm: SkippableModel, context: Sequence[int], copy, *, repeats: int = COST_ROUNDS,
                      compiled_whole: bool = False) -> SchemeCost:
    """Time one-token steps of the full model, with every attention / MLP / the head replaced by ``copy``'s
    stand-ins (``copy.scheme``, ``copy.stand_ins(attn_layers, mlp_layers)``, ``copy.head``), and with every
    attention / MLP skipped, interleaved by the one harness; medians. These run eagerly on a DynamicCache, so
    their differences split a step into its parts. On a compiled kernel the same rounds also time the decoder's
    unit (a plain step through the kernel) and, with ``compiled_whole`` (a draft that ``compiled_draft`` runs,
    as precision's), the whole-model draft in the scheme as the decoder runs it: compiled, on the kernel's cache."""
    every = tuple(range(sm.num_layers))
    cache = full_cache(sm, context, ())
    n, token = len(context), torch.tensor([context[-1]])

    def step(*, attn=(), mlp=(), head=False, skip: DraftConfig | None = None):
        def once():
            with sm.substituted(**copy.stand_ins(attn, mlp)), sm.draft_head(copy.head if head else None):
                _one_step(sm, token, n, cache, skip)
        return once

    calls = {"full": step(), "q_attn": step(attn=every), "q_mlp": step(mlp=every), "q_head": step(head=True),
             "no_attn": step(skip=DraftConfig(skip_attn=every)), "no_mlp": step(skip=DraftConfig(skip_mlp=every))}
    compiled = sm.kernel.compiled
    if compiled:
        kcache = _kernel_cache(sm, context, 2)
        calls["unit"] = lambda: _one_step(sm, token, n, kcache, None)
        if compiled_whole:
            def whole() -> None:
                with whole_draft(sm, copy):
                    _one_step(sm, token, n, kcache, None)
            calls["whole"] = whole
    med = {k: t.median for k, t in time_interleaved(calls, rounds=repeats, device=sm.device, warmup=3).items()}
    L = sm.num_layers
    return SchemeCost(
        copy.scheme, med["full"],
        attn_seconds=max(med["q_attn"] - med["no_attn"], 0.0) / L,
        mlp_seconds=max(med["q_mlp"] - med["no_mlp"], 0.0) / L,
        full_attn_seconds=max(med["full"] - med["no_attn"], 0.0) / L,
        full_mlp_seconds=max(med["full"] - med["no_mlp"], 0.0) / L,
        head_saving_seconds=med["full"] - med["q_head"],
        unit_seconds=med.get("unit"), whole_seconds=med.get("whole"),
    )


def measure_head_saving(sm: SkippableModel, context: Sequence[int], head, *, repeats: int = COST_ROUNDS) -> float:
    """Seconds a draft ``head`` (a trimmed or quantized LM head) saves a one-token step against the full head: the
    two steps run eagerly on a DynamicCache at ``context``'s length, interleaved by the one harness, medians.
    Negative where the head saves nothing and the noise says so: the caller decides whether to clip it."""
    step = _step_call(sm, context, full_cache(sm, context, ()), None)

    def with_head(h):
        def once():
            with sm.draft_head(h):
                step()
        return once

    timed = time_interleaved({"full": with_head(None), "trimmed": with_head(head)}, rounds=repeats, device=sm.device,
                             warmup=3)
    return timed["full"].median - timed["trimmed"].median


def _kernel_cache(sm: SkippableModel, context: Sequence[int], extra: int):
    """The kernel's decode cache holding ``context`` (prefilled eagerly, as the decoder does), room for ``extra``."""
    kcache = sm.decode_cache(len(context) + extra)
    sm.forward(torch.tensor(list(context)), start=0, cache=kcache)
    return kcache


@dataclass(frozen=True)
class Calibration:
    """What the objective evaluates on: prompts and the full model's greedy continuations."""

    prompts: tuple[tuple[int, ...], ...]
    continuations: tuple[tuple[int, ...], ...]
    max_new_tokens: int

    @property
    def cost_context(self) -> tuple[int, ...]:
        """The context costs are measured at: the first prompt and half its continuation (a typical length)."""
        return self.prompts[0] + self.continuations[0][: self.max_new_tokens // 2]


def calibrate(sm: SkippableModel, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> Calibration:
    conts = tuple(generate(sm, p, max_new_tokens=max_new_tokens).token_ids for p in prompts)
    return Calibration(tuple(tuple(p) for p in prompts), conts, max_new_tokens)


def timed_verify_sizes(sizes: Sequence[int], chunk: int) -> list[int]:
    """The k at which ``measure_costs`` times v(k) (and ``costs.measure_batched`` its forwards of B x T tokens):
    ``sizes``, 1, and on a kernel that verifies in blocks of ``chunk`` tokens each block's edges (a full block and
    one token more) up to the largest size. Its v(k) is a staircase, flat inside a block and a step up past its
    edge, so a line drawn between sizes on either side of an edge prices the sizes below it too high: on panel-c8,
    v(7) and v(8) read 1.72 and 2.05 between v(6) = 1.40 and v(9) = 2.38, where one 8-token block costs about what
    v(6) does."""
    top = max(sizes, default=1)
    edges = {e for b in range(chunk, top + 1, chunk) for e in (b, b + 1) if e <= top} if chunk > 1 else set()
    return sorted({1, *sizes, *edges})


def _step_call(sm: SkippableModel, context: Sequence[int], cache, config: DraftConfig | None) -> Callable[[], None]:
    """One decoding step after ``context`` (last-position logits only), with ``config``'s sublayers skipped."""
    token, n = torch.tensor([context[-1]]), len(context)

    def once():
        _one_step(sm, token, n, cache, config)

    return once


def _verify_call(sm: SkippableModel, context: Sequence[int], k: int, cache,
                 config: DraftConfig | None) -> Callable[[], None]:
    """A k-token forward after ``context`` as a verifier runs it: all k rows of logits, argmax read back, then the
    cache cropped back; through the full model (on the kernel's cache), or a draft ``config`` (eager)."""
    ids, n = torch.tensor((list(context) * k)[:k]), len(context)

    def once():
        if config is None:
            sm.forward(ids, start=n, cache=cache).argmax(-1).tolist()
        else:
            with sm.drafting(config):
                sm.forward(ids, start=n, cache=cache).argmax(-1).tolist()
        sm.crop(cache, n)

    return once


def measure_costs(
    sm: SkippableModel, context: Sequence[int], *, verify_sizes: Sequence[int] = (1, 2, 3, 4, 6, 9),
    repeats: int = COST_ROUNDS,
    extra: Mapping[str, DraftConfig] | None = None, extra_verify_sizes: Mapping[str, Sequence[int]] | None = None,
) -> CostModel:
    """Time the sublayers and the verify curve at ``context``'s length, with the one timer.

    Every quantity is sampled round-robin (``harness.time_interleaved``: order rotated every round),
    ``repeats`` times over, and summarised by its median: interleaving spreads machine drift and
    contention evenly over all of them, so the *ratios* the model is built from hold even on a busy
    machine, and the median is the typical cost the decoder will pay (a minimum would flatter the
    draft, which runs many small forwards).
    v(k) is measured at ``verify_sizes`` (and, on a compiled kernel, at the edges of its blocks:
    ``timed_verify_sizes``) and interpolated linearly between them, kept
    non-decreasing. It is not affine: on CPU a one-token forward runs matrix-vector kernels and
    k >= 2 runs matrix-matrix ones, so v(2) jumps and the curve flattens after it.

    ``extra`` draft configs are costed in the same rounds, so that their ratios to the full step are
    like for like: each one's single-token draft step, and its k-token forwards at
    ``extra_verify_sizes[name]`` (what a draft level that verifies another's drafts runs, as M_q does
    in hierarchical decoding), as a curve relative to its own step. They come back in ``extras``.
    """
    compiled = sm.kernel.compiled
    verify_sizes = timed_verify_sizes(verify_sizes, sm.kernel.chunk if compiled else 1)
    extra = dict(extra or {})
    extra_sizes = {name: sorted({1, *(extra_verify_sizes or {}).get(name, ())}) for name in extra}
    unknown = set(extra_verify_sizes or {}) - set(extra)
    if unknown:
        raise ConfigError(f"extra_verify_sizes names configs not in extra: {', '.join(sorted(unknown))}")
    cache = full_cache(sm, context, ())
    L = sm.num_layers
    every = tuple(range(L))
    # the parts (full, no_attn, no_mlp and the extra drafts) run eagerly on a DynamicCache; the verify curve and the
    # unit through the decoder's kernel, on its cache (the same one unless a compiled kernel runs)
    vcache = _kernel_cache(sm, context, max(verify_sizes)) if compiled else cache

    def step(config: DraftConfig | None):
        return _step_call(sm, context, cache, config)

    def verify(k: int, config: DraftConfig | None = None):
        return _verify_call(sm, context, k, vcache if config is None else cache, config)

    calls = {"full": step(None), "no_attn": step(DraftConfig(skip_attn=every)),
             "no_mlp": step(DraftConfig(skip_mlp=every))}
    calls.update({f"v{k}": verify(k) for k in verify_sizes})
    for name, config in extra.items():
        calls[f"extra {name} 1"] = step(config)
        calls.update({f"extra {name} {k}": verify(k, config) for k in extra_sizes[name] if k > 1})
    # three untimed calls each first: they pay allocation and dispatch set-up
    med = {name: t.median for name, t in time_interleaved(calls, rounds=repeats, device=sm.device, warmup=3).items()}
    full = med["full"]
    attn = max(full - med["no_attn"], 0.0) / L
    mlp = max(full - med["no_mlp"], 0.0) / L
    fixed = max(full - L * (attn + mlp), 0.0)
    # The unit is the decoder's autoregressive cycle (a one-token verify: logits read back), so
    # that c and v(k) are ratios to exactly what one plain-decoding token costs.
    unit = med["v1"]
    extras = []
    for name in extra:
        own = med[f"extra {name} 1"]
        extras.append(DraftCost(name, own, _curve(extra_sizes[name], lambda k, name=name: med[f"extra {name} {k}"],
                                                  own)))
    return CostModel(unit, attn, mlp, fixed, _curve(verify_sizes, lambda k: med[f"v{k}"], unit), L, tuple(extras),
                     eager_step_seconds=full if compiled else None)


def _curve(sizes: Sequence[int], seconds: Callable[[int], float], unit: float) -> tuple[float, ...]:
    """Forward cost over k tokens relative to ``unit`` (the k = 1 cost) for k = 1..max(sizes): measured
    at ``sizes`` (ascending, from 1), kept non-decreasing against noise (a forward over more tokens
    never costs less), interpolated in between."""
    points, top = [], 1.0
    for k in sizes:
        top = max(top, seconds(k) / unit)
        points.append((k, top))
    return interpolate(points)


def interpolate(points: Sequence[tuple[int, float]]) -> tuple[float, ...]:
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
            **sm.cache_kwargs(cache), use_cache=True,
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


def draft_block(tr: Trace, t: int, limit: int, gamma: float) -> tuple[int, int]:
    """One draft block walked over a trace from position ``t``, as the decoder drafts it: at most ``limit`` tokens,
    stopping after the first whose confidence falls below ``gamma``; (drafted, accepted: the leading matches)."""
    k = a = 0
    leading = True
    while k < limit:
        match, confidence = tr.matches[t + k], tr.confidences[t + k]
        k += 1
        leading = leading and match
        a += leading
        if confidence < gamma:
            break
    return k, a


def replay(tr: Trace, config: DraftConfig, costs: CostModel) -> Replay:
    """Walk one trace as the decoder would (K, exit rule, adaptive γ) and add up tokens and cost."""
    if config.is_autoregressive:
        n = len(tr.matches)
        return Replay(n, float(n), 0, 0, n)
    c = costs.draft_ratio(config)
    drafter = LayerSkipDrafter(config)  # its γ update is the decoder's own
    n = len(tr.matches)
    if n == 0:
        return Replay(0, 0.0, 0, 0, 0)
    # The first token is the prefill's, the full model's own in plain and speculative decoding alike
    # (one step each): drafting starts after it, as in decoding.generate.
    t = emitted = 1
    drafted = accepted = cycles = 0
    cost = 1.0
    while t < n:
        k, a = draft_block(tr, t, min(config.max_draft_tokens, n - t - 1), drafter.gamma)
        cost += k * c + costs.verify(k + 1)
        emitted += a + 1
        t += a + 1
        drafted += k
        accepted += a
        cycles += 1
        if k:
            drafter.observe(k, a)
    return Replay(emitted, cost, drafted, accepted, cycles)


def replay_all(traces: Sequence[Trace], config: DraftConfig, costs: CostModel) -> Measurement:
    """The surrogate's Measurement from traces: replay each one and pool tokens and cost. Traces belong to the
    model and skip set, costs to the device, so this re-runs anywhere (re-planning: skipsearch.search.replan)."""
    runs = [replay(tr, config, costs) for tr in traces]
    emitted = sum(r.emitted for r in runs)
    cost = sum(r.cost for r in runs)
    drafted = sum(r.drafted for r in runs)
    accepted = sum(r.accepted for r in runs)
    matches = [m for tr in traces for m in tr.matches]
    speedup = emitted / cost if cost else 1.0
    return Measurement(
        kind="surrogate", speedup=speedup, predicted_speedup=speedup,
        tau=emitted / max(sum(r.cycles for r in runs), 1), acceptance_rate=accepted / drafted if drafted else None,
        alpha=sum(matches) / len(matches) if matches else None, cost_ratio=costs.draft_ratio(config),
    )


# -- a skip set's traces: made once on the model, replayed under any costs -------------------------------------
K_VALUES = (1, 2, 3, 4, 6, 8)  # SearchSpace's default choices of K
# the exit rules re-planning tries: none, and a fixed or adaptive threshold γ0 = 0.1 .. 0.9 (replays are cheap)
EXIT_RULES = (NO_EXIT, *(ExitRule(threshold=t / 10, adaptive=a) for a in (True, False) for t in range(1, 10)))


def trace_skip_sets(sm: SkippableModel, cal: Calibration, configs: Sequence[DraftConfig], *,
                    on_progress: Callable[[int, int], None] | None = None) -> dict[tuple, tuple[Trace, ...]]:
    """Traces of each distinct skip set among ``configs``, keyed by (skip_attn, skip_mlp). The full-model KV of
    each calibration sequence is built once and shared by every skip set (``trace`` crops its own)."""
    keys = list(dict.fromkeys((c.skip_attn, c.skip_mlp) for c in configs))
    rows = [(p, c) for p, c in zip(cal.prompts, cal.continuations, strict=True) if c]
    caches = [full_cache(sm, p, c) for p, c in rows]
    out = {}
    for i, key in enumerate(keys):
        config = DraftConfig(*key)
        out[key] = tuple(trace(sm, p, c, config, cache=kv) for (p, c), kv in zip(rows, caches, strict=True))
        if on_progress:
            on_progress(i + 1, len(keys))
    return out


def aligned(traces: Sequence[Trace], cal: Calibration) -> tuple[Trace, ...]:
    """``traces`` (one per calibration sequence with a continuation, as ``trace_skip_sets`` makes them) lined up
    with every calibration sequence, an empty trace where a continuation is empty (as a lookup record keeps them)."""
    it = iter(traces)
    return tuple(next(it) if cont else Trace((), ()) for cont in cal.continuations)


def replan_skip_set(traces: Sequence[Trace], skip: tuple, costs: CostModel, *, k_values: Sequence[int] = K_VALUES,
                    exit_rules: Sequence[ExitRule] = EXIT_RULES,
                    also: Sequence[DraftConfig] = ()) -> tuple[DraftConfig, Measurement]:
    """The K and exit rule that the replay predicts fastest for this skip set under ``costs``, of the grid and
    ``also`` (e.g. the config as searched). Ties go to the smaller K, then to the earlier exit rule."""
    configs = [DraftConfig(skip[0], skip[1], k, e) for k in sorted(k_values) for e in exit_rules]
    # ``also`` adds drafts only: a profile that ships plain decoding (K = 0) is not an option to weigh against them
    configs += [c for c in also if (c.skip_attn, c.skip_mlp) == tuple(skip) and c not in configs
                and not c.is_autoregressive]
    scored = [(replay_all(traces, c, costs), c) for c in configs]
    best = max(scored, key=lambda mc: mc[0].speedup)  # max keeps the first of equals
    return best[1], best[0]


__all__ = ["COST_ROUNDS", "EXIT_RULES", "K_VALUES", "Calibration", "CostModel", "DraftCost", "Replay", "SchemeCost",
           "aligned", "calibrate", "draft_block", "full_cache", "interpolate", "measure_costs", "measure_head_saving",
           "measure_stand_ins", "replan_skip_set", "replay", "replay_all", "trace", "trace_skip_sets", "whole_draft"]
