"""CLaSp (Chen et al., 2025): choose the layers a draft skips by dynamic programming on hidden states.

The DP (Algorithm 1, §3.4). ``g(i, j)`` is the best hidden state after the first i layers with j
of them skipped; ``g(i, 0)`` is the full model's ``h_i``. Moving to layer i+1 a state either skips
layer i (from ``g(i, j-1)``) or runs it (from ``g(i, j)``), whichever lands nearer ``h_{i+1}`` by
cosine similarity. Backtracking from ``g(L, m)`` gives a skip set of m layers, for every m <= M
from one run. The DP is approximate (§3.5: a state's future depends on more than the state), so
``brute_force`` enumerates the exact answer on small ranges to check it.

All j-states go through a layer in one ``SkippableModel.run_layer`` call, as a sequence over the
shared KV cache with a mask (§3.6); ``batched=False`` runs the paper's naive double loop instead.

Three granularities ("sublayer"): ``layer`` skips whole layers, as the paper does; ``attn`` and
``mlp`` skip only that sublayer of a chosen layer (the other still runs), so their "skip"
transition is a layer with one sublayer swapped out rather than the identity.

Two uses:
- static (strategies/clasp.py): the DP over many calibration tokens at once, one shared decision
  per (i, j) by the mean cosine over tokens, gives a skip set for every M;
- dynamic (``ClaspDynamicDrafter``, profile method ``clasp-dynamic``): every LOI verify steps the
  DP re-runs on the verify pass's hidden states of the last accepted token, and drafting goes on
  with the new set. Output stays lossless: the full model verifies whatever the draft proposes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from skipsearch.methods.clasp_dynamic.params import SUBLAYERS
from skipsearch.model.skippable import SkippableModel

# (layer, states [S, N, H]) -> [S, N, H]: one decoder layer (or a layer with a sublayer skipped) on S
# stacked candidate states for the same N tokens.
LayerFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DPResult:
    """The DP's answer for every number of skips m = 0..max_skips (fewer if too few layers may go)."""

    skip_sets: tuple[tuple[int, ...], ...]  # index m: the m layers the DP skips
    similarity: tuple[float, ...]  # index m: mean cosine of g(L, m) with h_L over the tokens
    layer_calls: int  # calls of the layer function: L per transition kind batched, L*M naive


@dataclass(frozen=True)
class ClaspSkipSets:
    """The DP's skip set for every M, per granularity: ``skip_sets[k][m]`` for ``sublayers[k]``.

    What the static strategy sweeps (strategies/clasp.py); ``static_skip_sets`` makes one from a model.
    """

    sublayers: tuple[str, ...]  # "layer", "attn", "mlp"
    skip_sets: tuple[tuple[tuple[int, ...], ...], ...]  # [granularity][m]: m layers, m = 0..max
    similarity: tuple[tuple[float, ...], ...] = ()  # [granularity][m]: the DP's mean cosine with h_L
    source: str = "dp"  # "dp" (from a model) or "depth-prior" (the strategy's model-free stand-in)

    def sets(self, sublayer: str) -> tuple[tuple[int, ...], ...]:
        return self.skip_sets[self.sublayers.index(sublayer)]


@dataclass(frozen=True)
class BruteForce:
    """Every m-subset of the allowed layers, evaluated exactly: the best, and the spread."""

    best_set: tuple[int, ...]
    best: float  # mean cosine with h_L of the best subset
    mean: float  # over all subsets: what a random choice gets on average
    worst: float
    subsets: int


def _cosine(states: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of cos(state, target): states [S, N, H], target [N, H] -> [S]."""
    return F.cosine_similarity(states.float(), target.float().unsqueeze(0), dim=-1).mean(-1)


def _apply(fn: LayerFn | None, layer: int, states: torch.Tensor, batched: bool) -> torch.Tensor:
    if fn is None:  # a whole skipped layer adds nothing to the residual stream
        return states
    if batched or states.shape[0] <= 1:
        return fn(layer, states)
    return torch.cat([fn(layer, states[s : s + 1]) for s in range(states.shape[0])])


def dp_skip_sets(targets: torch.Tensor, run: LayerFn, *, max_skips: int, allowed: Sequence[int],
                 skip: LayerFn | None = None, batched: bool = True) -> DPResult:
    """Algorithm 1. ``targets`` [L+1, N, H]: the full model's hidden states (embeddings first) of N
    tokens; ``run`` applies a layer; ``skip`` a layer with its chosen sublayer skipped (None: the
    whole layer, the identity). Only layers in ``allowed`` may be skipped."""
    L = targets.shape[0] - 1
    allowed_set = {i for i in allowed if 0 <= i < L}
    calls = 0
    g = targets[0].unsqueeze(0)  # states at level 0: only j = 0, [1, N, H]
    choices: list[list[bool]] = []  # choices[i][j-1]: state j after layer i came from skipping layer i
    for i in range(L):
        x = targets[i + 1]  # [N, H]
        prev_cap = g.shape[0] - 1
        cap = min(prev_cap + (i in allowed_set), max_skips)
        # 1. run layer i on g(i, 1..prev_cap); skip it from g(i, 0..cap-1)
        ran = _apply(run, i, g[1 : min(prev_cap, cap) + 1], batched) if prev_cap and cap else g[:0]
        calls += (1 if batched else ran.shape[0]) if ran.shape[0] else 0
        skipped = g[:0]
        if i in allowed_set and cap:
            skipped = _apply(skip, i, g[:cap], batched)
            calls += (1 if batched else cap) if skip is not None else 0
        # 2. keep whichever lands nearer h_{i+1}; a tie keeps the layer
        new, took = [x.unsqueeze(0)], []
        sim_ran = _cosine(ran, x) if ran.shape[0] else None
        sim_skip = _cosine(skipped, x) if skipped.shape[0] else None
        for j in range(1, cap + 1):
            can_run, can_skip = j <= ran.shape[0], j <= skipped.shape[0]
            use_skip = can_skip and (not can_run or bool(sim_skip[j - 1] > sim_ran[j - 1]))
            new.append((skipped[j - 1] if use_skip else ran[j - 1]).unsqueeze(0))
            took.append(use_skip)
        g = torch.cat(new)  # [cap+1, N, H]
        choices.append(took)
    # 3. backtrack from g(L, m) for every m the DP reached
    sets = []
    for m in range(g.shape[0]):
        j, out = m, []
        for i in range(L - 1, -1, -1):
            if j and choices[i][j - 1]:
                out.append(i)
                j -= 1
        sets.append(tuple(sorted(out)))
    sims = _cosine(g, targets[L]).tolist()
    return DPResult(tuple(sets), tuple(float(s) for s in sims), calls)


def final_similarity(targets: torch.Tensor, run: LayerFn, skip_set: Sequence[int],
                     skip: LayerFn | None = None) -> float:
    """Mean cosine with h_L of the state reached by skipping ``skip_set``: an exact forward."""
    state = targets[0].unsqueeze(0)
    for i in range(targets.shape[0] - 1):
        state = _apply(skip, i, state, True) if i in skip_set else run(i, state)
    return float(_cosine(state, targets[-1])[0])


def brute_force(targets: torch.Tensor, run: LayerFn, *, num_skips: int, allowed: Sequence[int],
                skip: LayerFn | None = None, chunk: int = 256) -> BruteForce:
    """Every ``num_skips``-subset of ``allowed``, layer by layer: the partial states of all subsets
    that share a prefix of decisions go through each layer together."""
    L = targets.shape[0] - 1
    allowed_set = sorted({i for i in allowed if 0 <= i < L})
    if not 0 <= num_skips <= len(allowed_set):
        raise ValueError(f"num_skips must be in 0..{len(allowed_set)}, got {num_skips}")
    paths: list[tuple[int, ...]] = [()]
    states = targets[0].unsqueeze(0)  # [P, N, H], one per path
    for i in range(L):
        left_after = sum(1 for a in allowed_set if a > i)
        keep_rows, keep_paths, skip_rows, skip_paths = [], [], [], []
        for r, path in enumerate(paths):
            # a path continues only if it can still end with exactly num_skips skips
            if len(path) + left_after >= num_skips:
                keep_rows.append(r)
                keep_paths.append(path)
            if i in allowed_set and len(path) < num_skips:
                skip_rows.append(r)
                skip_paths.append((*path, i))
        parts = []
        for rows, fn in ((keep_rows, run), (skip_rows, skip)):
            if rows:
                block = states[rows]
                if fn is not None:
                    block = torch.cat([fn(i, block[s : s + chunk]) for s in range(0, block.shape[0], chunk)])
                parts.append(block)
        states, paths = torch.cat(parts), keep_paths + skip_paths
    sims = _cosine(states, targets[L])  # [P]
    best = int(torch.argmax(sims))
    return BruteForce(paths[best], float(sims[best]), float(sims.mean()), float(sims.min()), len(paths))


# -- the model side: targets and layer functions over the full-model KV ----------------------------


class ModelLayers:
    """Layer functions for ``dp_skip_sets`` on a real model: the N tokens are spread over one or
    more sequences, each with its full-model KV cache, and every candidate state of a token attends
    to its sequence's context before that token (as the token's draft step would)."""

    def __init__(self, sm: SkippableModel, caches: Sequence, positions: Sequence[torch.Tensor], *,
                 sublayer: str = "layer", max_queries: int = 4096) -> None:
        if sublayer not in SUBLAYERS:
            raise ValueError(f"sublayer must be one of {', '.join(SUBLAYERS)}, got {sublayer!r}")
        self.sm = sm
        self.caches = list(caches)
        self.positions = [p.view(-1) for p in positions]
        self.sublayer = sublayer
        self.max_queries = max_queries  # one run_layer call's queries at most, to bound the mask's size

    def _call(self, i: int, states: torch.Tensor, skip: str | None) -> torch.Tensor:
        S = states.shape[0]
        out, offset = [], 0
        for cache, pos in zip(self.caches, self.positions, strict=True):
            n = pos.numel()
            block = states[:, offset : offset + n]  # [S, n, H]
            per_call = max(1, self.max_queries // n)
            rows = []
            for s in range(0, S, per_call):
                part = block[s : s + per_call]  # [s', n, H]
                flat = part.reshape(-1, part.shape[-1])  # [s'·n, H]: state-major, tokens inside
                res = self.sm.run_layer(i, flat, pos.repeat(part.shape[0]), cache, skip=skip)
                rows.append(res.view(part.shape))
            out.append(torch.cat(rows))
            offset += n
        return torch.cat(out, dim=1)  # [S, N, H]

    def run(self, i: int, states: torch.Tensor) -> torch.Tensor:
        return self._call(i, states, None)

    @property
    def skip(self) -> LayerFn | None:
        if self.sublayer == "layer":
            return None
        return lambda i, states: self._call(i, states, self.sublayer)


def sequence_targets(sm: SkippableModel, sequences: Sequence[Sequence[int]], starts: Sequence[int], *,
                     tokens_per_sequence: int) -> tuple[torch.Tensor, list, list[torch.Tensor]]:
    """Full-model hidden states of up to ``tokens_per_sequence`` tokens (evenly spaced) from
    position ``start`` on in each sequence: (targets [L+1, N, H], KV caches, positions per sequence)."""
    parts, caches, positions = [], [], []
    for seq, start in zip(sequences, starts, strict=True):
        cache = sm.new_cache()
        _, hidden = sm.forward_hidden(torch.tensor(list(seq)), start=0, cache=cache)  # [L+1, T, H]
        span = len(seq) - start
        if span <= 0:
            continue
        n = min(tokens_per_sequence, span)
        pos = torch.tensor(sorted({start + (k * span) // n for k in range(n)}))
        parts.append(hidden[:, pos.to(hidden.device)])
        caches.append(cache)
        positions.append(pos)
    if not parts:
        raise ValueError("no tokens to run the DP on")
    return torch.cat(parts, dim=1), caches, positions


def static_skip_sets(sm: SkippableModel, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *,
                allowed: Sequence[int], limits: dict[str, int], tokens_per_sequence: int = 16) -> ClaspSkipSets:
    """Static CLaSp: one DP per granularity over the calibration tokens, one shared decision per
    (i, j) by the mean cosine over all of them. ``limits``: granularity -> the largest M wanted.

    The tokens are the draft steps' queries: positions P-1 .. P+T-2 of prompt + continuation, each
    attending to the full-model KV before it, as when drafting after a verify.
    """
    pairs = [(p, c) for p, c in zip(prompts, continuations, strict=True) if c]
    targets, caches, positions = sequence_targets(sm, [[*p, *c[:-1]] for p, c in pairs], [len(p) - 1 for p, _ in pairs],
                                                  tokens_per_sequence=tokens_per_sequence)
    subs, sets, sims = [], [], []
    for sub, limit in limits.items():
        layers = ModelLayers(sm, caches, positions, sublayer=sub)
        result = dp_skip_sets(targets, layers.run, max_skips=limit, allowed=allowed, skip=layers.skip)
        subs.append(sub)
        sets.append(result.skip_sets)
        sims.append(result.similarity)
    return ClaspSkipSets(tuple(subs), tuple(sets), tuple(sims), source="dp")


# -- the brute-force check used by tests and the report ---------------------------------------------


def approximation_check(targets: torch.Tensor, layers: ModelLayers, *, sub_range: Sequence[int],
                        num_skips: Sequence[int]) -> list[dict]:
    """For each m: the DP's and brute force's best m-subset of ``sub_range`` (the other layers always
    run) and their cosine with h_L, plus the mean over all subsets (a random choice)."""
    dp = dp_skip_sets(targets, layers.run, max_skips=max(num_skips), allowed=sub_range, skip=layers.skip)
    rows = []
    for m in num_skips:
        bf = brute_force(targets, layers.run, num_skips=m, allowed=sub_range, skip=layers.skip)
        rows.append({"m": m, "dp_set": dp.skip_sets[m], "dp": dp.similarity[m], "brute_set": bf.best_set,
                     "brute": bf.best, "random_mean": bf.mean, "worst": bf.worst, "subsets": bf.subsets,
                     "same_set": dp.skip_sets[m] == bf.best_set})
    return rows
