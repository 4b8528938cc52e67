"""Is a greedy output the model's greedy output? Exact where the dtype allows it, honest where it cannot.

Greedy speculative decoding keeps a draft token only if it is the full model's argmax, so in exact
arithmetic its output equals plain greedy decoding token for token. In a 16-bit float it need not:
a verify pass over k+1 tokens runs the same reductions (matmuls, attention, norms) in other shapes
than k+1 one-token steps, the kernels block and order them differently, and the rounded logits come
out a few units in the last place (ulps) apart. Where the model's top two logits are that close, a
near-tie, either token is the argmax of *some* faithful evaluation of the model, and the outputs part.

The check, for one prompt and one method's output ``tokens`` against the reference output (HF greedy):

1. ``tokens == reference``: **identical**. No forward is run: this is the exact promise, and in fp32
   it is the only one (the tolerance there is 0, so any other output is *different* unless two logits
   are exactly equal).
2. Otherwise the reference model is teacher-forced over prompt + ``tokens`` in ONE forward, in the
   model's own dtype, and EVERY generated position j is checked, not only those before the first
   divergence: once a method takes the other side of a tie, its continuation legitimately follows
   its own prefix, and teacher forcing over its own output judges each token given that prefix.
   At each j, margin_j = logit[argmax] - logit[tokens[j]] must be <= ``tie_tolerance``; at the
   first divergence d the reference's token must be within it too (both sides of a tie).
3. **equal up to numerical ties (n tokens)** when every position passes; n counts the divergence and
   the later positions whose token is not the argmax (a near-tie the method took). **different** at
   the first position outside tolerance, with its margin and the tolerance, otherwise.

The tolerance. ``tie_tolerance(dtype, x) = TIE_ULPS[dtype] * ulp(x)``, with ulp(x) =
``finfo(dtype).eps * 2**floor(log2|x|)`` the spacing of the dtype's numbers at the larger of the two
logits compared (the argmax's, nearly always). The factor is 8 for bfloat16 and float16:
- the two ways of evaluating the model each round every logit once more at the end, half an ulp for
  each of the two logits in a margin: up to 2 ulps of the margin between the two evaluations from
  the last rounding alone;
- on top of that, the last hidden state reaches the LM head along different roundings; its
  element-wise errors (half an ulp each) enter every logit through a reduction over the hidden size,
  where they partly cancel. That part has no useful closed-form bound, so it was measured with
  ``margin_drift``: one forward over the whole output against the output fed back in blocks of 1 to 9
  tokens over a KV cache (a verify pass's shapes), on smollm2-135m, 8 held-out prompts x 48 tokens x
  4 block schedules (1,536 positions). On a Xeon with AVX-512, bfloat16: 827 positions moved 0 ulps,
  645 by 1, 57 by 2, 6 by 3, 1 by 4; float16: 813, 619, 89, 14 and 1 by 4. The tail falls about
  tenfold per ulp. On an AMD EPYC with AVX2, a precision draft's verify blocks moved one margin by 5 ulps
  (the CI run of 2026-11-23), so 4 ulps, the factor before that run, was too tight;
- 8 puts three ulps, about a thousandfold in that tail, above the largest drift seen. It is still
  tight: in bfloat16 at logits of 16 to 32, 8 ulps are 1.0, while a wrong token (a decoder bug) usually
  sits several logits below the argmax. A token changed with a clear margin is *different*
  (``tests/test_equivalence.py`` plants one). The GPU evidence kit (``scripts/gpu_bench.sh``)
  measures the drift again on the GPU and reports it.
float32 and float64 get 0: there the project promises identical output, and keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from skipsearch.model.skippable import SkippableModel

IDENTICAL = "identical"
TIES = "equal up to numerical ties"
DIFFERENT = "different"
VERDICTS = (IDENTICAL, TIES, DIFFERENT)  # best first

# Ulps of the larger logit by which two tokens' logits may differ and still be a tie (module docstring).
TIE_ULPS: dict[torch.dtype, int] = {torch.bfloat16: 8, torch.float16: 8}


def ulp(dtype: torch.dtype, x: float) -> float:
    """The spacing of ``dtype``'s numbers at |x| (for |x| in [2^e, 2^(e+1)): eps * 2^e)."""
    info = torch.finfo(dtype)
    x = max(abs(float(x)), info.tiny)  # subnormals and 0: the smallest normal spacing
    return info.eps * 2.0 ** math.floor(math.log2(x))


def tie_tolerance(dtype: torch.dtype, x: float, *, ulps: int | None = None) -> float:
    """Largest logit gap to the argmax that is a numerical tie at a logit of magnitude |x|."""
    factor = TIE_ULPS.get(dtype, 0) if ulps is None else ulps
    return factor * ulp(dtype, x) if factor else 0.0


def tolerance_rule(dtype: torch.dtype | str) -> str:
    """The tie tolerance of ``dtype`` in words, for reports."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    name = str(dtype).removeprefix("torch.")
    ulps = TIE_ULPS.get(dtype, 0)
    if not ulps:
        return f"tolerance 0 in {name}: only exactly equal logits tie"
    return f"at most {ulps} ulps of {name} at the larger logit's magnitude"


@dataclass(frozen=True)
class Verdict:
    """One output against the reference output, judged by the teacher-forced model."""

    kind: str  # IDENTICAL, TIES or DIFFERENT
    tokens: int  # generated tokens checked
    dtype: str  # the model's dtype, which sets the tolerance
    ties: tuple[int, ...] = ()  # positions decided by a numerical tie: the divergence, then later non-argmax picks
    divergence: int | None = None  # first position where the output differs from the reference
    position: int | None = None  # DIFFERENT: the first position outside tolerance
    margin: float | None = None  # there: logit[argmax] - logit[the token]
    tolerance: float | None = None  # there: tie_tolerance at that logit
    reason: str = ""  # DIFFERENT: what was outside tolerance, in words

    @property
    def ok(self) -> bool:
        """Identical or equal up to ties: a speed figure for this output means something."""
        return self.kind != DIFFERENT

    @property
    def tie_tokens(self) -> int:
        return len(self.ties)

    def describe(self) -> str:
        if self.kind == IDENTICAL:
            return IDENTICAL
        if self.kind == TIES:
            n = self.tie_tokens
            return f"{TIES} ({n} token{'' if n == 1 else 's'}, first at {self.divergence}; {self.dtype})"
        return f"{DIFFERENT} at token {self.position}: {self.reason}"

    def to_dict(self) -> dict:
        return {**asdict(self), "ties": list(self.ties), "ok": self.ok, "text": self.describe()}


def judge(
    logits: torch.Tensor, tokens: Sequence[int], reference: Sequence[int], *, dtype: torch.dtype,
    ulps: int | None = None,
) -> Verdict:
    """The verdict from teacher-forced logits: ``logits[j]`` [V] predicts ``tokens[j]`` from the prompt and
    ``tokens[:j]`` (``teacher_forced_logits``). ``dtype`` is the model's (the logits' resolution)."""
    tokens, reference = tuple(tokens), tuple(reference)
    name = str(dtype).removeprefix("torch.")
    if tokens == reference:
        return Verdict(IDENTICAL, len(tokens), name)
    if logits.shape[0] != len(tokens):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(tokens)} tokens")
    d = next((j for j, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b),
             min(len(tokens), len(reference)))
    x = logits.double()  # [n, V]: exact differences of the dtype's values
    top, best = x.max(-1)  # [n], [n]
    mine = x.gather(-1, torch.tensor(tokens, device=x.device).view(-1, 1)).squeeze(-1)  # [n]
    ties: list[int] = []

    def bad(j: int, margin: float, tol: float, whose: str) -> Verdict:
        reason = (f"{whose} token {tokens[j] if whose == 'its' else reference[j]} is {margin:.4g} below the "
                  f"argmax {int(best[j])} (tie tolerance {tol:.4g} in {name})")
        return Verdict(DIFFERENT, len(tokens), name, tuple(ties), d, j, margin, tol, reason)

    for j in range(len(tokens)):
        margin = float(top[j] - mine[j])
        tol = tie_tolerance(dtype, max(abs(float(top[j])), abs(float(mine[j]))), ulps=ulps)
        if margin > tol:
            return bad(j, margin, tol, "its")
        if j == d and d < len(reference):
            # both sides of the divergence must be within a tie of the top
            ref = float(x[j, reference[j]])
            ref_margin = float(top[j]) - ref
            ref_tol = tie_tolerance(dtype, max(abs(float(top[j])), abs(ref)), ulps=ulps)
            if ref_margin > ref_tol:
                return bad(j, ref_margin, ref_tol, "the reference's")
            ties.append(j)
        elif j > d and margin > 0:
            ties.append(j)
    if d >= len(tokens) or d >= len(reference):  # one output is a strict prefix of the other
        return Verdict(DIFFERENT, len(tokens), name, tuple(ties), d, d, None, None,
                       f"{len(tokens)} tokens where the reference has {len(reference)}")
    return Verdict(TIES, len(tokens), name, tuple(ties), d)


@torch.inference_mode()
def teacher_forced_logits(sm: SkippableModel, prompt_ids: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """The full model's logits for every generated position, in ONE forward over prompt + ``tokens``
    (the last token is only predicted, never fed). [len(tokens), V], in the model's dtype."""
    ids = torch.tensor([[*prompt_ids, *tokens[:-1]]], device=sm.device)  # [1, P + n - 1]
    out = sm.hf(input_ids=ids, use_cache=False, logits_to_keep=len(tokens))
    return out.logits[0]  # [n, V]: the positions that predict tokens[0..n-1]


def check(
    sm: SkippableModel, prompt_ids: Sequence[int], tokens: Sequence[int], reference: Sequence[int], *,
    ulps: int | None = None,
) -> Verdict:
    """``tokens`` (a method's greedy output after ``prompt_ids``) against ``reference`` (HF greedy's)."""
    tokens, reference = tuple(tokens), tuple(reference)
    if tokens == reference:
        return Verdict(IDENTICAL, len(tokens), sm.dtype_name)
    if not tokens:
        return Verdict(DIFFERENT, 0, sm.dtype_name, (), 0, 0, None, None,
                       f"no tokens where the reference has {len(reference)}")
    return judge(teacher_forced_logits(sm, prompt_ids, tokens), tokens, reference, dtype=sm.dtype, ulps=ulps)


def check_against_hf(sm: SkippableModel, prompt_ids: Sequence[int], tokens: Sequence[int], *,
                     max_new_tokens: int) -> Verdict:
    """``check`` against HF greedy, decoded here (``decode --check``)."""
    from skipsearch.engine.decoding import hf_generate

    return check(sm, prompt_ids, tokens, hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens))


def lossless_check(sm: SkippableModel) -> Callable[[Sequence[int], Sequence[int], Sequence[int]], bool] | None:
    """For the harness's strict check (``run_rounds(same=...)``): None in fp32, where outputs must be
    identical; in bf16/fp16, an output that differs from the reference's only at numerical ties passes."""
    if sm.dtype == torch.float32:
        return None
    return lambda prompt_ids, tokens, reference: check(sm, prompt_ids, tokens, reference).ok


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    """The least equal of several verdicts (e.g. over repeats), the first such on a draw."""
    return max(verdicts, key=lambda v: VERDICTS.index(v.kind))


# -- the evidence for TIE_ULPS ---------------------------------------------------------------------
@torch.inference_mode()
def margin_drift(sm: SkippableModel, prompt_ids: Sequence[int], tokens: Sequence[int], *,
                 blockings: Sequence[Sequence[int]] = ((),), forced: torch.Tensor | None = None) -> tuple[float, ...]:
    """Per generated position, how far the top-2 logit margin moves between one forward over the whole
    output and the output fed back over a KV cache in blocks (token counts, repeated as needed; ``()``: one-token
    steps), in ulps of the larger logit, for each of ``blockings`` in turn (the prompt is prefilled once for all).
    What ``TIE_ULPS`` must cover. ``forced``: that one forward's logits where the caller has them
    (``teacher_forced_logits`` of the same tokens)."""
    import copy

    if forced is None:
        forced = teacher_forced_logits(sm, prompt_ids, tokens)
    one = forced.double()  # [n, V]
    top2 = one.topk(2, dim=-1).indices  # [n, 2]
    a, b = top2[:, 0:1], top2[:, 1:2]
    prefilled = sm.new_cache()
    first = sm.forward(torch.tensor(list(prompt_ids)), start=0, cache=prefilled, last_only=True)[-1:]
    out: list[float] = []
    for n, blocks in enumerate(blockings):
        cache = prefilled if n == len(blockings) - 1 else copy.deepcopy(prefilled)
        rows = [first]
        rest, sizes, i = list(tokens[:-1]), list(blocks) or [1], 0
        while rest:
            size, i = max(1, sizes[i % len(sizes)]), i + 1
            rows.append(sm.forward(torch.tensor(rest[:size]), start=len(prompt_ids) + len(tokens) - 1 - len(rest),
                                   cache=cache))
            rest = rest[size:]
        step = torch.cat(rows).double()  # [n, V]; forward upcasts the dtype's values exactly
        moved = ((one.gather(-1, a) - one.gather(-1, b)) - (step.gather(-1, a) - step.gather(-1, b))).abs().squeeze(-1)
        out += [float(m) / ulp(sm.dtype, float(one[j, a[j]])) for j, m in enumerate(moved)]
    return tuple(out)
