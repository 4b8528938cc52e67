"""The one decoding engine: autoregressive and self-speculative, greedy and sampled.

``generate`` is what ``skipsearch decode`` runs, what ``bench`` times and what the search
objective times. One loop serves every method: a *drafter* proposes tokens (or none), the full
model verifies them in one forward, and the accepted prefix plus one token from the full model
is emitted. With no drafter it is plain autoregressive decoding.

Losslessness:
- greedy: a draft token is kept only if it equals the full model's argmax at its position,
  so the output is the full model's greedy output whatever the draft proposes;
- sampling: Leviathan et al. / Chen et al. rejection sampling on the *same processed*
  distributions (temperature, top-k, top-p applied to both p and q): accept d with probability
  min(1, p(d)/q(d)), else draw from norm(max(0, p − q)); a fresh uniform for every decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from skipsearch.config import GREEDY, DraftConfig, SamplingParams
from skipsearch.engine import timing
from skipsearch.engine.draft import Draft, Drafter
from skipsearch.model.skippable import SkippableModel

TokenCallback = Callable[[Sequence[int]], None]


@dataclass(frozen=True)
class DecodeStats:
    """What one ``generate`` call did. Times are wall seconds from the one timer."""

    prompt_tokens: int
    new_tokens: int
    seconds: float  # prefill + decode, the user-visible latency
    tokens_per_s: float  # new_tokens / seconds
    prefill_seconds: float
    draft_seconds: float
    verify_seconds: float
    draft_steps: int  # forwards of the draft model
    verify_steps: int  # forwards of the full model after prefill (one per cycle)
    drafted_tokens: int
    accepted_tokens: int  # draft tokens the full model kept
    tau: float  # mean tokens emitted per verify step, counting the full model's own token
    acceptance_rate: float | None  # accepted / drafted; None when nothing was drafted
    final_threshold: float | None  # the draft-exit γ at the end (adaptive exit moves it)
    # Method-specific figures a drafter reports (name, value), e.g. per-level acceptance or the
    # seconds spent re-planning its skip set; () for drafters that report nothing.
    drafter_stats: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class DecodeResult:
    token_ids: tuple[int, ...]  # generated tokens only (no prompt), EOS included if hit
    stats: DecodeStats


# -- sampling helpers ---------------------------------------------------------------------------
def process_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Logits [..., V] -> probabilities [..., V] after temperature, top-k, then top-p (HF's order)."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token once the mass *before* it already reaches top_p; the first always stays
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def one_hot_probs(tokens: Sequence[int], sm: SkippableModel) -> torch.Tensor:
    """q for a deterministic draft (e.g. prompt lookup): one row per token, all mass on it. [k, V]"""
    vocab = sm.vocab_size
    q = torch.zeros(len(tokens), vocab, device=sm.device)  # [k, V]
    q[torch.arange(len(tokens)), torch.tensor(list(tokens))] = 1.0
    return q


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` [V]."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _uniform(generator: torch.Generator, device: torch.device) -> float:
    return float(torch.rand((), generator=generator, device=device).item())


def accept_greedy(drafted: Sequence[int], logits: torch.Tensor) -> tuple[int, int]:
    """Greedy acceptance of ``drafted`` against ``logits`` [k+1, V] (the verifier's, after each prefix):
    (number of leading drafts equal to the verifier's argmax, the verifier's own token after them)."""
    target = logits.argmax(-1).tolist()  # the verifier's choice after each prefix
    a = 0
    while a < len(drafted) and drafted[a] == target[a]:
        a += 1
    return a, target[a]


def rejection_sample(
    logits: torch.Tensor, draft: Draft, sampling: SamplingParams, generator: torch.Generator
) -> tuple[int, int]:
    """Leviathan / Chen rejection sampling of ``draft`` against ``logits`` [k+1, V] (the verifier's, after each
    prefix): (number of draft tokens accepted, the token the verifier adds)."""
    p = process_logits(logits, sampling)  # [k+1, V]
    k = len(draft.tokens)
    for i in range(k):
        d = draft.tokens[i]
        q = draft.probs[i]  # [V]
        p_d, q_d = float(p[i, d]), float(q[d])
        if q_d > 0 and _uniform(generator, p.device) < min(1.0, p_d / q_d):
            continue
        residual = (p[i] - q).clamp_min(0.0)  # [V]
        mass = float(residual.sum())
        # p == q on the support leaves no residual; p itself is then the right distribution.
        return i, draw(residual / mass if mass > 0 else p[i], generator)
    return k, draw(p[k], generator)


# -- the layer-skip drafter -------------------------------------------------------------------------
class LayerSkipDrafter(Drafter):
    """Drafts with the same model, some sublayers skipped (Draft&Verify), with adaptive exit.

    ``head`` (``sm.subset_head``) replaces the LM head while drafting, e.g. FR-Spec's trimmed head
    over the most frequent tokens; verification always runs the full head."""

    def __init__(self, config: DraftConfig, *, head: torch.nn.Module | None = None) -> None:
        self.config = config
        self.head = head
        rule = config.exit
        self.gamma = rule.threshold
        self._ar: float | None = None  # running acceptance rate; None before the first verify

    @property
    def threshold(self) -> float | None:
        return self.gamma

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        need_conf = self.gamma > 0.0 or self.config.exit.adaptive
        token = pending
        with sm.drafting(self.config), sm.draft_head(self.head):
            for j in range(min(limit, self.config.max_draft_tokens)):
                logits = sm.forward(torch.tensor([token]), start=start + j, cache=cache, last_only=True)[-1]  # [V]
                if sampling.greedy:
                    if need_conf:
                        conf, idx = logits.softmax(-1).max(-1)
                        token, confidence = int(idx), float(conf)
                    else:
                        token, confidence = int(logits.argmax()), 1.0
                else:
                    q = process_logits(logits, sampling)  # [V]
                    qs.append(q)
                    token = draw(q, generator)
                    confidence = float(q.max())
                tokens.append(token)
                # Draft&Verify keeps the low-confidence token and stops after it (Alg. 3, l. 4-7).
                if confidence < self.gamma:
                    break
        return Draft(tuple(tokens), torch.stack(qs) if qs else None)

    def observe(self, drafted: int, accepted: int) -> None:
        rule = self.config.exit
        if not rule.adaptive or drafted == 0:
            return
        ar_e = accepted / drafted
        # β1 = 0 at the first stage: AR starts at the first observed rate.
        self._ar = ar_e if self._ar is None else rule.beta1 * self._ar + (1 - rule.beta1) * ar_e
        nudged = self.gamma + rule.step if self._ar <= rule.target_acceptance else self.gamma - rule.step
        self.gamma = min(1.0, max(0.0, rule.beta2 * self.gamma + (1 - rule.beta2) * nudged))


def make_drafter(config: DraftConfig | None) -> Drafter | None:
    if config is None or config.is_autoregressive:
        return None
    return LayerSkipDrafter(config)


# -- the engine ------------------------------------------------------------------------------------
def _stop(new: list[int], pending: int, eos: set[int], *, room: int) -> tuple[list[int], int]:
    """A cycle's new tokens cut at the first EOS (kept, as HF does; it becomes the pending token) and at ``room``
    tokens, the most max_new_tokens leaves."""
    for i, tok in enumerate(new):
        if tok in eos:
            new, pending = new[: i + 1], tok
            break
    return new[:room], pending


class _Tally:
    """What ``generate``'s cycles add up to, for its DecodeStats."""

    def __init__(self) -> None:
        self.draft_seconds = self.verify_seconds = 0.0
        self.draft_steps = self.verify_steps = self.drafted = self.accepted = 0
        self.emitted: list[int] = []

    def cycle(self, *, drafted: int, accepted: int, emitted: int, draft_seconds: float,
              verify_seconds: float, draft_steps: int) -> None:
        """One draft + verify cycle: ``drafted`` tokens proposed in ``draft_steps`` forwards of a draft model
        (``Draft.steps``: none for a lookup), ``accepted`` of them kept by the verifier, ``emitted`` output. Accepted
        drafts past a cut EOS are not output, so not in tau either."""
        self.draft_steps += draft_steps
        self.verify_steps += 1
        self.drafted += drafted
        self.accepted += min(accepted, emitted)
        self.emitted.append(emitted)
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

    def stats(self, prompt_tokens: int, new_tokens: int, total: float, prefill: float,
              drafter: Drafter | None) -> DecodeStats:
        return DecodeStats(
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            seconds=total,
            tokens_per_s=new_tokens / total if total > 0 else 0.0,
            prefill_seconds=prefill,
            draft_seconds=self.draft_seconds,
            verify_seconds=self.verify_seconds,
            draft_steps=self.draft_steps,
            verify_steps=self.verify_steps,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
            tau=sum(self.emitted) / len(self.emitted) if self.emitted else 1.0,
            acceptance_rate=self.accepted / self.drafted if self.drafted else None,
            final_threshold=drafter.threshold if drafter is not None else None,
            drafter_stats=tuple(drafter.report()) if drafter is not None else (),
        )


def _check_request(prompt_ids: Sequence[int], max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if not prompt_ids:
        raise ValueError("the prompt is empty")


def _verify(sm: SkippableModel, cache, pending: int, draft: Draft, *, start: int, wants_hidden: bool,
            sampling: SamplingParams, generator: torch.Generator,
            drafted: bool = True) -> tuple[int, int, torch.Tensor | None]:
    """One verify cycle's forward and choice: the draft's partial-model KV dropped (``drafted``: there is a
    drafter, which may have written some), ``pending`` and the drafts run through the full model at ``start``,
    and how many drafts it accepts with the token it emits after them (greedy, or by rejection sampling); with
    ``wants_hidden``, the forward's hidden states too."""
    if drafted:
        sm.crop(cache, start)
    verify_ids = torch.tensor([pending, *draft.tokens])
    hidden = None
    if wants_hidden:
        logits, hidden = sm.forward_hidden(verify_ids, start=start, cache=cache)  # [k+1, V], [L+1, k+1, H]
    else:
        logits = sm.forward(verify_ids, start=start, cache=cache)  # [k+1, V]
    if sampling.greedy:
        return (*accept_greedy(draft.tokens, logits), hidden)
    return (*rejection_sample(logits, draft, sampling, generator), hidden)


def generate(
    sm: SkippableModel,
    prompt_ids: Sequence[int],
    *,
    config: DraftConfig | None = None,
    drafter: Drafter | None = None,
    sampling: SamplingParams = GREEDY,
    max_new_tokens: int = 64,
    eos_token_ids: Sequence[int] | None = None,
    seed: int = 0,
    on_tokens: TokenCallback | None = None,
) -> DecodeResult:
    """Decode up to ``max_new_tokens`` after ``prompt_ids``.

    ``config`` builds the layer-skip drafter; ``drafter`` supplies any other draft source.
    With neither (or ``max_draft_tokens == 0``) this is plain autoregressive decoding.
    ``on_tokens`` receives each batch of newly emitted tokens (for streaming).
    """
    _check_request(prompt_ids, max_new_tokens)
    if drafter is None:
        drafter = make_drafter(config)
    max_k = config.max_draft_tokens if config is not None else (1 << 30)
    wants_hidden = drafter is not None and drafter.wants_hidden_states  # only then does verify keep hidden states
    wants_tokens = drafter is not None and drafter.wants_tokens
    eos = set(sm.eos_token_ids if eos_token_ids is None else eos_token_ids)
    device = sm.device
    generator = torch.Generator(device=device).manual_seed(seed)

    t_start = timing.now(device)
    # the kernel's cache: a DynamicCache, or the compiled kernel's StaticCache rewound to empty
    cache = sm.decode_cache(len(prompt_ids) + max_new_tokens)
    # 0. prefill with the full model; its last logits give the first token.
    logits = sm.forward(torch.tensor(list(prompt_ids)), start=0, cache=cache, last_only=True)  # [1, V]
    pending = int(logits[-1].argmax()) if sampling.greedy else draw(process_logits(logits[-1], sampling), generator)
    n = len(prompt_ids)  # cache holds positions [0, n); `pending` will sit at position n
    out = [pending]
    seq = [*prompt_ids, pending]  # the whole sequence, for drafters that read it (wants_tokens)
    if on_tokens:
        on_tokens([pending])
    t_prefill = timing.now(device)
    tally = _Tally()

    while len(out) < max_new_tokens and pending not in eos:
        # Draft at most enough tokens that the cycle cannot overshoot max_new_tokens.
        limit = min(max_k, max_new_tokens - len(out) - 1)
        # 1. draft
        t0 = timing.now(device)
        if drafter is not None and limit > 0:
            extra = {"history": seq} if wants_tokens else {}
            draft = drafter.draft(
                sm, cache, pending=pending, start=n, limit=limit, sampling=sampling, generator=generator, **extra
            )
        else:
            draft = Draft((), None)
        k = len(draft.tokens)
        t1 = timing.now(device)
        # 2. verify in one full forward, 3. accept / resample
        a, bonus, hidden = _verify(sm, cache, pending, draft, start=n, wants_hidden=wants_hidden, sampling=sampling,
                                   generator=generator, drafted=drafter is not None)
        new = [*draft.tokens[:a], bonus]
        # 4. crop the rejected positions: keep pending + the a accepted drafts (the verify wrote all k + 1)
        if a < k:
            sm.crop(cache, n + 1 + a)
        n += 1 + a
        pending = new[-1]
        if drafter is not None and k:
            drafter.observe(k, a)
        new, pending = _stop(new, pending, eos, room=max_new_tokens - len(out))
        out.extend(new)
        seq.extend(new)
        if on_tokens:
            on_tokens(new)
        tally.cycle(drafted=k, accepted=a, emitted=len(new), draft_seconds=t1 - t0,
                    verify_seconds=timing.now(device) - t1, draft_steps=draft.steps)
        # 5. a drafter that re-plans from the verify pass sees the last kept token's hidden states
        if wants_hidden and len(out) < max_new_tokens and pending not in eos:
            drafter.verified(sm, cache, hidden=hidden[:, a], position=n - 1)

    total = timing.now(device) - t_start
    return DecodeResult(tuple(out), tally.stats(len(prompt_ids), len(out), total, t_prefill - t_start, drafter))


# -- the reference ---------------------------------------------------------------------------------
def hf_generate(sm: SkippableModel, prompt_ids: Sequence[int], *, max_new_tokens: int, **kwargs) -> tuple[int, ...]:
    """HF ``generate`` on the same model: the reference that greedy output must equal."""
    ids = torch.tensor([list(prompt_ids)], device=sm.device)
    kwargs.setdefault("do_sample", False)
    with torch.inference_mode():
        out = sm.hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            pad_token_id=sm.eos_token_ids[0] if sm.eos_token_ids else None, **kwargs,
        )
    return tuple(out[0, ids.shape[1]:].tolist())
