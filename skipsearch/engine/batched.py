"""The batched engine: B prompts decoded together, plainly or speculatively, greedy only.

One cycle for the whole batch, as ``decoding.generate`` runs one for one sequence: a *batch drafter* proposes up to
k tokens per row (a row may get fewer, or none), the full model verifies every row in ONE forward of
[B, 1 + the longest proposal], and each row keeps its own accepted prefix plus the full model's token. With no
drafter it is plain batched greedy decoding, the reference the speculative output is checked against.

The cache. Rows of different prompt lengths and different acceptance share one ``kv_cache.row_cache``: a static
cache of B x S slots in which each row writes its token at position p to slot p, and each query attends to its
own row's slots up to its own position (``kv_cache.row_mask``). Every row keeps its own position counter, so
rotary embeddings and the mask follow the row, whatever the other rows did. Nothing needs cropping or
bookkeeping: a rejected draft's slot, a shorter prompt's pad (prompts are right-padded) and a finished row's
dummies lie past the row's position, masked, until the row's next real token at that position overwrites them.
Draft forwards of a model draft run as batched [B, 1] steps (``BatchStep``) at the row's next draft positions, on
the same cache; the verify then writes over them.

Greedy identity: a draft token is kept only if it equals the full model's argmax at its position, so each row's
output is what plain batched greedy decodes, up to the float rounding of other forward shapes (a numerical tie).
A batch of one whose drafter has a one-sequence form (``BatchDrafter.single``) decodes through
``decoding.generate``. With a compiled kernel the full model's forwards after the prompt run its batched graphs
(one per batch size and block width, compiled on the first batch of that size; the shapes are fixed, so nothing
recompiles across prompt lengths, draft lengths and acceptance); the prompt and the drafts' partial models run
eagerly on the same cache, as for one sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.engine import timing
from skipsearch.engine.decoding import LayerSkipDrafter, generate
from skipsearch.engine.draft import BatchDrafter
from skipsearch.model.skippable import SkippableModel


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


def batch_slots(*, prompt_tokens: int, max_new_tokens: int, k: int) -> int:
    """Slots per row of a batch's cache: the longest prompt, the new tokens, and a last cycle's k drafts past them."""
    return prompt_tokens + max_new_tokens + k + 1


def batch_bytes(sm: SkippableModel, *, batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int) -> int:
    """What a batch adds at most: its KV cache (``batch_slots`` per row, whatever the acceptance) and one verify's
    float logits."""
    config = sm.hf.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    slots = batch_slots(prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, k=k)
    kv = batch_size * slots * sm.num_layers * 2 * kv_heads * head_dim * sm.dtype.itemsize
    logits = batch_size * (k + 1) * config.vocab_size * 4
    return kv + logits


def check_fits(sm: SkippableModel, *, batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int,
               graphs: int | None = None) -> None:
    """Refuse, in one line and before anything runs, a batch whose cache and logits exceed the memory available
    (``prompt_tokens``: the longest prompt), naming the batch size that would fit. On a compiled kernel a batch size
    not yet compiled also needs its graphs' memory (``graphs``; by default ``SkippableModel.graph_bytes``: as much as
    the kernel's last compile took)."""
    free = available_memory(sm.device)
    if free is None:
        return
    graphs = sm.graph_bytes(batch_size) if graphs is None else graphs
    need = batch_bytes(sm, batch_size=batch_size, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, k=k)
    if need + graphs <= free:
        return
    one = batch_bytes(sm, batch_size=1, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, k=k)
    fits = (free - graphs) // one
    fix = (f"a batch size of {fits} or less would fit" if fits >= 1 else
           "the compiled graphs of a new batch size do not fit: decode with --kernel eager" if graphs else
           "not even one sequence fits: lower --max-new-tokens or shorten the prompts")
    what = (f"{need / 2**20:.0f} MiB for its KV cache and logits" if not graphs else
            f"{(need + graphs) / 2**20:.0f} MiB for its KV cache and logits and its compiled graphs "
            f"({graphs / 2**20:.0f} MiB, as much as the kernel's last compile took)")
    raise BatchRefused(f"a batch of {batch_size} needs {what} (longest prompt {prompt_tokens}, {max_new_tokens} new "
                       f"tokens, k {k}), but {free / 2**20:.0f} MiB are available on {sm.device}; {fix}")


# -- the batch's cache --------------------------------------------------------------------------------
class BatchStep:
    """The batch's cache and each row's position: runs every forward of the batch.

    A drafter calls it as ``step(tokens)``: one batched one-token forward of the model as it stands (inside the
    drafter's contexts), each row's token at its next draft position, attending to its own earlier slots (its
    committed tokens and this cycle's drafts); returns logits [B, V]. The verify then writes over the drafts."""

    def __init__(self, sm: SkippableModel, cache, positions: list[int]) -> None:
        self.sm, self.cache = sm, cache
        self.positions = positions  # per row: the position of its pending token (the next verify's first)
        self.drafted = 0  # draft steps since the last verify
        self.steps = 0  # draft forwards in all

    def block(self, ids: torch.Tensor, *, start: Sequence[int], last: list[int] | None = None) -> torch.Tensor:
        """Run ``ids`` [B, T] at positions start[i].. : logits [B, T, V] (with ``last``, [B, V] at those indices)."""
        B, T = ids.shape
        positions = torch.tensor(start).view(B, 1) + torch.arange(T)  # [B, T]
        return self.sm.forward_rows(ids, positions=positions, cache=self.cache, last=last)

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(list(tokens)).view(-1, 1)  # [B, 1]
        logits = self.block(ids, start=[p + self.drafted for p in self.positions])[:, -1]  # [B, V]
        self.drafted += 1
        self.steps += 1
        return logits

    def verify(self, ids: torch.Tensor) -> torch.Tensor:
        """The full model over ``ids`` [B, W] from each row's pending position (over this cycle's drafts)."""
        self.drafted = 0
        return self.block(ids, start=self.positions)


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
def generate_batch(sm: SkippableModel, prompts: Sequence[Sequence[int]], *, drafter: BatchDrafter | None = None,
                   k: int = 0, max_new_tokens: int, eos_token_ids: Sequence[int] | None = None,
                   check_memory: bool = True) -> BatchResult:
    """Decode ``prompts`` together, greedy: each row up to ``max_new_tokens`` (EOS kept, as HF does).

    ``drafter`` proposes up to ``k`` tokens per row each cycle; None (or k 0) is plain batched greedy. The batch is
    checked against the memory available first (``check_fits``). A batch of one whose drafter has a one-sequence
    form runs ``decoding.generate``; larger batches run the batched loop (``decode_rows``)."""
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
    """The batched loop itself, for any batch size (``generate_batch`` checks memory and sends a batch of one to
    ``decoding.generate``; tests call this to check the loop at B = 1 too)."""
    eos = set(sm.eos_token_ids if eos_token_ids is None else eos_token_ids)
    device = sm.device
    B = len(prompts)
    if drafter is not None:
        drafter.begin(B)
    wants_tokens = drafter is not None and drafter.wants_tokens

    t_start = timing.now(device)
    # 0. prefill, right-padded: row i's prompt at positions 0.., its pads after it (masked, then overwritten)
    length = max(len(p) for p in prompts)
    slots = batch_slots(prompt_tokens=length, max_new_tokens=max_new_tokens, k=k if drafter is not None else 0)
    step = BatchStep(sm, sm.batch_cache(B, slots), [0] * B)
    ids = torch.tensor([list(p) + [p[-1]] * (length - len(p)) for p in prompts])  # [B, L]
    logits = step.block(ids, start=[0] * B, last=[len(p) - 1 for p in prompts])  # [B, V]
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
        # 2. verify every row in one full forward of [B, W], over the drafts' slots
        width = 1 + max(len(p) for p in proposals)
        # a row with fewer proposals (or a finished row) is padded with its pending token: a dummy, never kept
        block = [[pending[i], *proposals[i], *[pending[i]] * (width - 1 - len(proposals[i]))] for i in range(B)]
        logits = step.verify(torch.tensor(block))  # [B, W, V]
        verify_steps += 1
        target = logits.argmax(-1).tolist()  # [B][W]: the full model's choice after each prefix
        # 3. accept: each row its own leading matches, plus the full model's token after them
        took = [0] * B
        for i in range(B):
            if done[i]:
                continue
            a = 0
            while a < len(proposals[i]) and proposals[i][a] == target[i][a]:
                a += 1
            new = [*proposals[i][:a], target[i][a]]
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
        if drafter is not None and any(proposals):
            drafter.observe([len(p) for p in proposals], took)

    total = timing.now(device) - t_start
    new_tokens = sum(len(o) for o in out)
    return BatchResult(tuple(tuple(o) for o in out), BatchStats(
        batch_size=B, k=k if drafter is not None else 0, new_tokens=new_tokens, seconds=total,
        tokens_per_s=new_tokens / total if total > 0 else 0.0, verify_steps=verify_steps, draft_steps=step.steps,
        drafted_tokens=drafted, accepted_tokens=accepted))


__all__ = ["BatchRefused", "BatchResult", "BatchStats", "BatchStep", "LayerSkipBatchDrafter", "available_memory",
           "batch_bytes", "batch_slots", "check_fits", "decode_rows", "generate_batch"]
