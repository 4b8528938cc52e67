"""The batched engine: B prompts decoded together, plainly or speculatively, greedy only.

One cycle for the whole batch, as ``decoding.generate`` runs one for one sequence: a *batch drafter* proposes up to
k tokens per row (a row may get fewer, or none), the full model verifies every row in ONE forward of
[B, 1 + the longest proposal], and each row keeps its own accepted prefix plus the full model's token. With no
drafter it is plain batched greedy decoding, the reference the speculative output is checked against.

The cache. Rows of different prompt lengths and different acceptance share one HF ``DynamicCache`` whose *slots*
advance by the same count for every row in each forward; what a slot holds is per row:
- each row keeps its own position counter (``position_ids`` [B, T]), so rotary embeddings see the row's own
  positions whatever slot a token sits in;
- ``valid`` [B, S] says which slots each row attends to: its prompt (left-padded: the pads are never valid),
  its pending tokens and accepted drafts; a rejected draft's slot, a finished row's dummy slots and a shorter
  prompt's pads stay invalid forever (they are physically there, masked out, and cropped once every row's
  trailing slots are invalid);
- the 4D boolean mask [B, 1, T, S + T] is ``valid`` for the cached slots and causal within the new block.
  A query always sees its own slot, so a pad's or a finished row's query never attends to nothing (its
  softmax would be NaN, and a NaN value in a masked slot still poisons the others: 0 x NaN).
Draft forwards of a model draft run as batched [B, 1] steps (``BatchStep``) on top of the same cache; the engine
crops their KV before the verify, as ``decoding.generate`` does for one sequence.

Greedy identity: a draft token is kept only if it equals the full model's argmax at its position, so each row's
output is what plain batched greedy decodes, up to the float rounding of other forward shapes (a numerical tie).
A batch of one whose drafter has a one-sequence form (``BatchDrafter.single``) decodes through
``decoding.generate``: today's path and speed, the compiled kernel included. Batches of more run eager (a
compiled kernel in use is left out for them, said once on stderr): a compiled batched graph free of recompiles
is not built here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skipsearch import timing
from skipsearch.config import ConfigError, DraftConfig
from skipsearch.decoding import LayerSkipDrafter, generate
from skipsearch.draft import BatchDrafter
from skipsearch.models import SkippableModel


@dataclass(frozen=True)
class BatchStats:
    """What one ``generate_batch`` call did, summed over its rows."""

    batch_size: int
    k: int  # draft length asked per cycle (0: plain batched greedy)
    new_tokens: int  # summed over rows
    seconds: float  # the whole call, prefill included, from the one timer
    tokens_per_s: float  # aggregate: new_tokens / seconds
    verify_steps: int  # batched forwards of the full model after the prefill (one per cycle)
    draft_steps: int  # batched forwards of the draft model
    drafted_tokens: int  # summed over rows
    accepted_tokens: int  # draft tokens the full model kept, summed over rows


@dataclass(frozen=True)
class BatchResult:
    token_ids: tuple[tuple[int, ...], ...]  # per row, generated tokens only, EOS included if hit
    stats: BatchStats


class BatchRefused(ConfigError):
    """A batch that cannot be decoded, in one line: a method that cannot batch, sampling, a batch that does not
    fit memory."""


# -- the memory check -----------------------------------------------------------------------------
def available_memory(device: torch.device) -> int | None:
    """Bytes free for the batch's cache and logits on ``device``; None where it cannot be known."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def batch_bytes(sm: SkippableModel, *, batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int) -> int:
    """What a batch adds at most: its KV cache (every cycle may spend k+1 slots on one kept token) and one
    verify's float logits."""
    config = sm.hf.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    slots = prompt_tokens + max_new_tokens * (k + 1)
    kv = batch_size * slots * sm.num_layers * 2 * kv_heads * head_dim * sm.dtype.itemsize
    logits = batch_size * (k + 1) * config.vocab_size * 4
    return kv + logits


def check_fits(sm: SkippableModel, *, batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int) -> None:
    """Refuse, in one line and before anything runs, a batch whose cache and logits exceed the memory available
    (``prompt_tokens``: the longest prompt), naming the batch size that would fit."""
    free = available_memory(sm.device)
    if free is None:
        return
    need = batch_bytes(sm, batch_size=batch_size, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, k=k)
    if need <= free:
        return
    one = batch_bytes(sm, batch_size=1, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, k=k)
    fits = free // one
    fix = (f"a batch size of {fits} or less would fit" if fits >= 1
           else "not even one sequence fits: lower --max-new-tokens or shorten the prompts")
    raise BatchRefused(f"a batch of {batch_size} needs {need / 2**20:.0f} MiB for its KV cache and logits "
                       f"(longest prompt {prompt_tokens}, {max_new_tokens} new tokens, k {k}), but "
                       f"{free / 2**20:.0f} MiB are available on {sm.device}; {fix}")


# -- the batch's cache --------------------------------------------------------------------------------
class BatchStep:
    """The batch's cache, its valid slots and each row's position: builds every forward's positions and mask.

    A drafter calls it as ``step(tokens)``: one batched one-token forward of the model as it stands (inside the
    drafter's contexts), each row's token at its next draft position, attending to its valid slots and its own
    earlier draft tokens; returns logits [B, V]. The engine crops those draft slots before the verify."""

    def __init__(self, sm: SkippableModel, cache, valid: torch.Tensor, positions: list[int]) -> None:
        self.sm, self.cache = sm, cache
        self.valid = valid  # [B, S] bool: the slots each row attends to
        self.positions = positions  # per row: the position of its pending token (the next verify's first)
        self.drafted = 0  # draft steps since the last verify (their slots are cropped before it)
        self.steps = 0  # draft forwards in all

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def block(self, ids: torch.Tensor, *, start: Sequence[int], extra: int = 0, real: torch.Tensor | None = None,
              last_only: bool = False) -> torch.Tensor:
        """Run ``ids`` [B, T] at positions start[i].. over the valid slots, ``extra`` more slots (this cycle's draft
        slots, which every row sees), then causally within the block: to the block's earlier slots that are
        ``real`` [B, T] (default all; the prefill's pads are not) and always to its own. Logits [B, T, V]."""
        B, T = ids.shape
        device = self.sm.device
        positions = torch.tensor(start, device=device).view(B, 1) + torch.arange(T, device=device)  # [B, T]
        seen = torch.cat([self.valid, torch.ones(B, extra, dtype=torch.bool, device=device)], dim=1)  # [B, S']
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()  # [T, T]
        own = causal & real[:, None, :] if real is not None else causal.expand(B, T, T)  # [B, T, T]
        own = own | torch.eye(T, dtype=torch.bool, device=device)
        mask = torch.cat([seen[:, None, :].expand(B, T, -1), own], dim=2)  # [B, T, S'+T]
        return self.sm.forward_rows(ids, positions=positions, mask=mask[:, None], cache=self.cache,
                                    last_only=last_only)

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(list(tokens), device=self.sm.device).view(-1, 1)  # [B, 1]
        start = [p + self.drafted for p in self.positions]
        logits = self.block(ids, start=start, extra=self.drafted)[:, -1]  # [B, V]
        self.drafted += 1
        self.steps += 1
        return logits

    def crop_drafts(self) -> None:
        """Drop the draft-only KV (every layer back to the valid slots' count)."""
        self.sm.crop(self.cache, self.slots)
        self.drafted = 0

    def append(self, kept: torch.Tensor) -> None:
        """Add the verify block's slots, ``kept`` [B, T] bool (which of them each row goes on attending to), and
        crop the trailing slots no row keeps."""
        valid = torch.cat([self.valid, kept], dim=1)  # [B, S+T]
        used = valid.any(dim=0).nonzero()
        length = int(used[-1]) + 1 if used.numel() else 0
        self.sm.crop(self.cache, length)
        self.valid = valid[:, :length]


# -- a model draft, batched ---------------------------------------------------------------------------
class LayerSkipBatchDrafter(BatchDrafter):
    """The layer-skip draft loop (``decoding.LayerSkipDrafter``) for a batch: [B, 1] steps of the model with the
    config's sublayers skipped and ``head`` as its LM head. A row stops at its limit, at K, or (the exit rule)
    after a token whose confidence is under its own γ, which adapts per row as the one-sequence drafter's does.
    A row with a limit of 0 drafts nothing (a hybrid's lookup hit); the model runs only if some row drafts."""

    def __init__(self, config: DraftConfig, *, head: torch.nn.Module | None = None) -> None:
        self.config = config
        self.head = head
        self.rows: list[LayerSkipDrafter] = []  # per row: its γ and running acceptance (the one-sequence rule)

    def begin(self, rows: int) -> None:
        self.rows = [LayerSkipDrafter(self.config) for _ in range(rows)]

    def contexts(self, sm: SkippableModel):
        """The model as it drafts (a subclass adds its stand-ins)."""
        return sm.drafting(self.config)

    def draft(self, sm, step, *, pending, limits, **kwargs) -> tuple[tuple[int, ...], ...]:
        B = len(pending)
        left = [min(limit, self.config.max_draft_tokens) for limit in limits]  # tokens each row may still draft
        tokens: list[list[int]] = [[] for _ in range(B)]
        if not any(left):
            return tuple(() for _ in range(B))
        gammas = torch.tensor([row.gamma for row in self.rows], device=sm.device)  # [B]
        need_conf = bool((gammas > 0).any()) or self.config.exit.adaptive
        current = list(pending)
        with self.contexts(sm), sm.draft_head(self.head):
            while any(left):
                logits = step(current)  # [B, V]
                if need_conf:
                    conf, idx = logits.softmax(-1).max(-1)  # [B], [B]
                    stop = (conf < gammas).tolist()
                else:
                    idx, stop = logits.argmax(-1), [False] * B
                for i, token in enumerate(idx.tolist()):
                    if left[i]:
                        tokens[i].append(token)
                        current[i] = token
                        # Draft&Verify keeps the low-confidence token and stops after it
                        left[i] = 0 if stop[i] else left[i] - 1
        return tuple(tuple(t) for t in tokens)

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for row, d, a in zip(self.rows, drafted, accepted, strict=True):
            if d:
                row.observe(d, a)


# -- the engine ---------------------------------------------------------------------------------------
_said_eager: set[int] = set()  # models already told (once) that their batches run eager


def generate_batch(sm: SkippableModel, prompts: Sequence[Sequence[int]], *, drafter: BatchDrafter | None = None,
                   k: int = 0, max_new_tokens: int, eos_token_ids: Sequence[int] | None = None,
                   check_memory: bool = True) -> BatchResult:
    """Decode ``prompts`` together, greedy: each row up to ``max_new_tokens`` (EOS kept, as HF does).

    ``drafter`` proposes up to ``k`` tokens per row each cycle; None (or k 0) is plain batched greedy. The batch is
    checked against the memory available first (``check_fits``). A batch of one whose drafter has a one-sequence
    form runs ``decoding.generate`` (the compiled kernel included); larger batches run eager."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("a batch needs at least one prompt, and no prompt may be empty")
    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    if drafter is None:
        k = 0
    if check_memory:
        check_fits(sm, batch_size=len(prompts), prompt_tokens=max(len(p) for p in prompts),
                   max_new_tokens=max_new_tokens, k=k)
    single = drafter.single() if drafter is not None and k else None
    if len(prompts) == 1 and (drafter is None or not k or single is not None):
        return _one(sm, prompts[0], drafter=single, k=k, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
    if len(prompts) > 1 and sm.kernel.compiled and id(sm) not in _said_eager:
        _said_eager.add(id(sm))
        print(f"note: batched decoding runs eager; the compiled kernel {sm.kernel.label} serves batches of one only",
              file=sys.stderr)
    return decode_rows(sm, prompts, drafter=drafter if k else None, k=k, max_new_tokens=max_new_tokens,
                       eos_token_ids=eos_token_ids)


def _one(sm, prompt, *, drafter, k, max_new_tokens, eos_token_ids) -> BatchResult:
    """A batch of one through ``decoding.generate``, its stats as a batch's."""
    config = DraftConfig(max_draft_tokens=k) if k else None
    res = generate(sm, prompt, config=config, drafter=drafter, max_new_tokens=max_new_tokens,
                   eos_token_ids=eos_token_ids)
    s = res.stats
    return BatchResult((res.token_ids,), BatchStats(
        batch_size=1, k=k, new_tokens=s.new_tokens, seconds=s.seconds, tokens_per_s=s.tokens_per_s,
        verify_steps=s.verify_steps, draft_steps=s.draft_steps, drafted_tokens=s.drafted_tokens,
        accepted_tokens=s.accepted_tokens))


def decode_rows(sm: SkippableModel, prompts: Sequence[Sequence[int]], *, drafter: BatchDrafter | None = None,
                k: int = 0, max_new_tokens: int, eos_token_ids: Sequence[int] | None = None) -> BatchResult:
    """The batched loop itself, eager, for any batch size (``generate_batch`` checks memory and sends a batch of
    one to ``decoding.generate``; tests call this to check the loop at B = 1 too)."""
    eos = set(sm.eos_token_ids if eos_token_ids is None else eos_token_ids)
    device = sm.device
    B = len(prompts)
    if drafter is not None:
        drafter.begin(B)
    wants_tokens = drafter is not None and drafter.wants_tokens

    t_start = timing.now(device)
    # 0. prefill, left-padded so that every row's last prompt token is the block's last (one row of logits each)
    length = max(len(p) for p in prompts)
    pad = [length - len(p) for p in prompts]
    ids = torch.tensor([[p[0]] * n + list(p) for p, n in zip(prompts, pad, strict=True)], device=device)  # [B, L]
    cache = sm.new_cache()
    step = BatchStep(sm, cache, torch.zeros(B, 0, dtype=torch.bool, device=device), [0] * B)
    real = torch.arange(length, device=device).unsqueeze(0) >= torch.tensor(pad, device=device).view(B, 1)  # [B, L]
    # no real token ever sees a pad; a pad's query sees only itself (finite, and never read)
    logits = step.block(ids, start=[-n for n in pad], real=real, last_only=True)[:, -1]  # [B, V]
    step.append(real)
    pending = logits.argmax(-1).tolist()
    step.positions = [len(p) for p in prompts]  # `pending` sits at position len(prompt)
    out = [[t] for t in pending]
    seqs = [[*p, t] for p, t in zip(prompts, pending, strict=True)]  # the whole sequences, for wants_tokens
    done = [t in eos or max_new_tokens <= 1 for t in pending]
    verify_steps = drafted = accepted = 0

    while not all(done):
        # 1. draft: up to k per row, none for a finished row or one at its last token
        limits = [0 if done[i] else min(k, max_new_tokens - len(out[i]) - 1) for i in range(B)]
        proposals: tuple[tuple[int, ...], ...] = tuple(() for _ in range(B))
        if drafter is not None and any(limits):
            extra = {"history": seqs} if wants_tokens else {}
            got = drafter.draft(sm, step, pending=list(pending), limits=limits, **extra)
            # a row's draft is capped at its own limit (what it really proposed is what counts)
            proposals = tuple(tuple(int(t) for t in got[i][: limits[i]]) for i in range(B))
        # 2. verify every row in one full forward of [B, W]; first drop the draft's KV
        step.crop_drafts()
        width = 1 + max(len(p) for p in proposals)
        # a row with fewer proposals (or a finished row) is padded with its pending token: a dummy, never kept
        block = [[pending[i], *proposals[i], *[pending[i]] * (width - 1 - len(proposals[i]))] for i in range(B)]
        logits = step.block(torch.tensor(block, device=device), start=step.positions)  # [B, W, V]
        verify_steps += 1
        target = logits.argmax(-1).tolist()  # [B][W]: the full model's choice after each prefix
        # 3. accept: each row its own leading matches, plus the full model's token after them
        kept = torch.zeros(B, width, dtype=torch.bool, device=device)  # [B, W]
        took = [0] * B
        for i in range(B):
            if done[i]:
                continue
            a = 0
            while a < len(proposals[i]) and proposals[i][a] == target[i][a]:
                a += 1
            new = [*proposals[i][:a], target[i][a]]
            kept[i, : 1 + a] = True  # pending + the a accepted drafts stay; the rest of the block never will
            step.positions[i] += 1 + a
            pending[i] = new[-1]
            for j, tok in enumerate(new):  # stop at EOS (kept) and at max_new_tokens
                if tok in eos:
                    new = new[: j + 1]
                    pending[i] = tok
                    break
            new = new[: max_new_tokens - len(out[i])]
            drafted += len(proposals[i])
            accepted += min(a, len(new))
            took[i] = a
            out[i].extend(new)
            seqs[i].extend(new)
            done[i] = pending[i] in eos or len(out[i]) >= max_new_tokens
        # 4. keep each row's kept slots; crop the trailing slots no row keeps
        step.append(kept)
        if drafter is not None and any(proposals):
            drafter.observe([len(p) for p in proposals], took)

    total = timing.now(device) - t_start
    new_tokens = sum(len(o) for o in out)
    return BatchResult(tuple(tuple(o) for o in out), BatchStats(
        batch_size=B, k=k if drafter is not None else 0, new_tokens=new_tokens, seconds=total,
        tokens_per_s=new_tokens / total if total > 0 else 0.0, verify_steps=verify_steps, draft_steps=step.steps,
        drafted_tokens=drafted, accepted_tokens=accepted))


__all__ = ["BatchRefused", "BatchResult", "BatchStats", "BatchStep", "LayerSkipBatchDrafter", "available_memory",
           "batch_bytes", "check_fits", "decode_rows", "generate_batch"]
