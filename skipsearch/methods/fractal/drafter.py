"""FractalLLM: an 8-bit copy of the model, embedded between its own layers, drafts many tokens at once.

The method is §3.2 of ``shared/papers/fractal-llm.txt``. One *draft pass* runs the full-precision
decoder over the pending token followed by ``w`` draft slots. Before each of the ``n`` *fractal
layers* p (0-based: the original layer the fractal layer sits in front of), the hidden states h
entering layer p take a detour through the compressed copy:

1. h runs through the compressed *upper* layers p..L-1, the compressed final norm and LM head;
   the argmax at the last prefix row and at every slot row gives one token per row;
2. the prefix plus those tokens is re-embedded with the compressed embedding and run through the
   compressed *lower* layers 0..p-1, giving ĥ;
3. merge: the draft-slot rows of h are replaced by ĥ's; the prefix rows of h are kept as they are;
then the original layer p continues on the merged rows. After the last layer, the full model's
own norm and LM head read the last prefix row and the slots: those tokens are the draft, which
the engine verifies with one plain full forward, as for every other method (decoding.generate).

The paper leaves these points open; this module's reading, each covered by tests/test_fractal.py:
- *Positions.* Row r of the upper pass predicts the token at position r+1 (ordinary next-token
  shift). The last prefix row's token lands in the first slot, slot j's in slot j+1, and the last
  slot's in a new slot after it: each fractal layer adds one slot, so the window grows from
  w to w+n slots and the final LM head yields w+n+1 draft tokens, the paper's count.
- *The new slot.* A slot added at fractal layer p has no original hidden state below p; its row
  comes from ĥ alone (the merge replaces every slot row, so it has one to take).
- *Prefix rows.* "Prefix" means the committed tokens and the pending token. Their rows in h are
  never replaced, so the pending token's row stays the full model's own and the first draft token
  is the full model's next token: it is always accepted (up to float noise, which verification
  catches anyway).
- *Initial slots.* The paper's "special tokens without contextual information" are the embedding
  of ``slot_token``; by default (None) the mean of the input embedding table, a vector that is no
  particular token.
- *Layer positions.* n evenly spaced with gap L/n (Appendix D), 1-based layer round(j·L/n) for
  j = 1..n, i.e. 0-based p_j = round(j·L/n) − 1: for L = 28, n = 7 that is before every 4th layer,
  the last one in front of the final layer. A profile may list its own positions instead.
- *KV cache* (the paper ran without one; its Limitations ask for one). With the cache, every layer
  of the pass, original or compressed, attends to the full model's committed KV for the prefix
  (a read-only view, kv_cache.PrefixKV) and computes only the window's rows: the compressed layer p
  is a copy of layer p, so the full model's KV is what its own would approximate. Without the
  cache (``kv_cache=False``, as in the paper) the whole sequence runs through every layer each
  pass, and the compressed lower layers recompute the prefix from the re-embedded tokens; only
  their slot rows are kept. Verification always uses the engine's cache.
- *Sampling.* The draft exposes distributions: with temperature > 0 each draft token is sampled
  from the processed final logits of its row (q), and the engine's rejection rule keeps the output
  distribution exact. The rows are computed before any draft token is sampled, so each token is
  drawn from exactly its q. The fractal layers' internal choices stay argmax, as in the paper.
- *Limit.* Near max_new_tokens the engine allows fewer tokens; w shrinks (to 0 at least) so that
  no pass drafts much more than can be used.

The compressed copy and its quantization schemes are in compressed.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from skipsearch.config import ConfigError, SamplingParams
from skipsearch.engine.decoding import Draft, Drafter, process_logits
from skipsearch.methods.fractal.compressed import CompressedModel, compressed_model
from skipsearch.methods.fractal.params import FractalParams
from skipsearch.model.skippable import SkippableModel


# -- the draft pass --------------------------------------------------------------------------------------
def merge(h: torch.Tensor, h_hat: torch.Tensor, keep: int) -> torch.Tensor:
    """h's first ``keep`` rows (the prefix, untouched) followed by ĥ's draft-slot rows.

    h: [keep + s, H]; h_hat: [keep + s + 1, H] (one slot more) -> [keep + s + 1, H].
    """
    return torch.cat([h[:keep], h_hat[keep:]], dim=0)


def fractal_layer(
    sm: SkippableModel, cm: CompressedModel, h: torch.Tensor, prefix_ids: torch.Tensor, p: int, *,
    frame, context, keep: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One fractal layer in front of original layer ``p``: returns (merged h with one more slot, tokens).

    h: [keep + s, H], the hidden states entering layer p; prefix_ids: [keep], the window's prefix tokens.
    """
    # 1. compressed upper layers p..L-1, compressed norm + LM head; argmax at the last prefix row and the slots
    upper = sm.run_layers(h, cm.layers[p:], frame=frame, context=context)  # [keep + s, H]
    tokens = cm.lm_head(cm.norm(upper[keep - 1:])).argmax(-1)  # [s + 1]: for positions of rows keep..keep+s
    # 2. re-embed prefix + new tokens with the compressed embedding; compressed lower layers 0..p-1
    ids = torch.cat([prefix_ids, tokens])  # [keep + s + 1]
    h_hat = sm.run_layers(cm.embedding(ids), cm.layers[:p], frame=frame, context=context)  # [keep + s + 1, H]
    # 3. merge: only the draft slots take ĥ; the prefix rows stay the full model's
    return merge(h, h_hat, keep), tokens


@torch.inference_mode()
def draft_pass(
    sm: SkippableModel, cm: CompressedModel, prefix_ids: Sequence[int], *, start: int, cache, positions: Sequence[int],
    w: int, slot: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None = None,
    record: list | None = None,
) -> Draft:
    """One fractal draft pass: w + n + 1 tokens after the prefix, and their q when sampling.

    With ``cache`` (full-model KV for positions [0, start)), ``prefix_ids`` is just the pending
    token at position ``start``; without it, ``prefix_ids`` is the whole sequence 0..start.
    ``record``, if given, receives the hidden states entering each original layer, then the last.
    """
    base = start if cache is not None else 0  # position of the window's first row
    keep = start - base + 1  # prefix rows in the window: the pending token and, without a cache, all before it
    if len(prefix_ids) != keep:
        raise ValueError(f"the draft window's prefix has {len(prefix_ids)} tokens, expected {keep}")
    context = sm.prefix_kv(cache, start) if cache is not None else None
    frame = sm.frame(start=base, length=keep + w + len(positions))
    ids = torch.tensor(list(prefix_ids), device=sm.device)  # [keep]
    h = torch.cat([sm.embedding(ids), slot.expand(w, -1)])  # [keep + w, H]
    fractal_at = set(positions)
    for p, layer in enumerate(sm.layers):
        if p in fractal_at:
            h, _ = fractal_layer(sm, cm, h, ids, p, frame=frame, context=context, keep=keep)
        if record is not None:
            record.append(h)
        h = sm.run_layers(h, [layer], frame=frame, context=context)  # [keep + s, H]
    if record is not None:
        record.append(h)
    # 4. the full model's own norm + LM head at the last prefix row and every slot
    logits = sm.lm_head(sm.final_norm(h[keep - 1:])).float()  # [w + n + 1, V]
    if sampling.greedy:
        return Draft(tuple(logits.argmax(-1).tolist()), None)
    q = process_logits(logits, sampling)  # [w + n + 1, V]
    tokens = torch.multinomial(q, 1, generator=generator).view(-1)  # one draw from each row's own q
    return Draft(tuple(tokens.tolist()), q)


class FractalDrafter(Drafter):
    """The engine's Drafter for FractalLLM: one draft pass per verify step, no exit threshold."""

    def __init__(
        self, sm: SkippableModel, params: FractalParams, *, max_draft_tokens: int | None = None,
        kv_cache: bool = True, prompt_ids: Sequence[int] | None = None,
    ) -> None:
        self.params = params
        self.positions = params.positions(sm.num_layers)
        self.cm = compressed_model(sm, params.quantization)
        self.max_draft_tokens = params.max_draft_tokens if max_draft_tokens is None else max_draft_tokens
        self.kv_cache = kv_cache
        if not kv_cache and prompt_ids is None:
            raise ConfigError("fractal drafting without a KV cache recomputes the prefix, so it needs prompt_ids")
        # Without a cache the drafter keeps the sequence itself: the prompt, then each cycle's pending
        # token and the drafts the engine accepted (read off the next call's start).
        self._history = list(prompt_ids) if prompt_ids is not None else []
        self._last: tuple[int, int, tuple[int, ...]] | None = None  # (start, pending, draft) of the last call
        vocab = sm.embedding.weight.shape[0]
        st = params.slot_token
        if st is not None and st >= vocab:
            raise ConfigError(f"fractal slot_token {st} is not in the model's vocabulary (0..{vocab - 1})")
        with torch.inference_mode():
            table = sm.embedding.weight
            self.slot = (table[st] if st is not None else table.mean(0)).detach().unsqueeze(0)  # [1, H]
        self.passes = 0
        self.drafted = 0
        self.accepted = 0

    def _prefix(self, start: int, pending: int) -> list[int]:
        if self.kv_cache:
            return [pending]
        if self._last is not None:
            last_start, last_pending, last_draft = self._last
            accepted = start - last_start - 1
            self._history[last_start:] = [last_pending, *last_draft[:accepted]]
        if len(self._history) != start:
            raise RuntimeError(f"fractal drafter lost track of the sequence: {len(self._history)} tokens, "
                               f"the engine is at position {start}")
        return [*self._history, pending]

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        limit = min(limit, self.max_draft_tokens)
        n = len(self.positions)
        w = max(0, min(self.params.w, limit - n - 1))  # no slots beyond what the limit lets through
        draft = draft_pass(
            sm, self.cm, self._prefix(start, pending), start=start, cache=cache if self.kv_cache else None,
            positions=self.positions, w=w, slot=self.slot, sampling=sampling, generator=generator,
        )
        self.passes += 1
        tokens = draft.tokens[:limit]
        self._last = (start, pending, tokens)
        return Draft(tokens, None if draft.probs is None else draft.probs[:limit])

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def report(self) -> tuple[tuple[str, float], ...]:
        return (("fractal_n", float(len(self.positions))), ("fractal_w", float(self.params.w)),
                ("draft_passes", float(self.passes)), ("compressed_mb", self.cm.nbytes / 2**20))
