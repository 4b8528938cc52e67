"""``layer-skip``: the model drafts with some attention/MLP sublayers skipped (Draft&Verify).

The draft config (skip sets, K, the exit rule) is the method. Its one option is FR-Spec's trimmed
draft head (arXiv 2502.14856): with ``vocab_subset`` the draft computes logits only for the V' most
frequent tokens (``hidden @ W[subset].T`` after the final norm; every other token gets -inf), while
verification keeps the full head. Greedy output is therefore unchanged, and a sampled draft's q is
the softmax over the subset (zero elsewhere), so rejection sampling stays exact.

A profile carries the subset itself, so that it rebuilds the same head on any machine:
- ``vocab_subset``: V', the number of token ids;
- ``vocab_ids``: the ids, sorted, delta-encoded (the first id, then each gap), each number an
  unsigned LEB128 varint, the bytes zlib-compressed and base64-encoded (standard alphabet, one line);
- ``vocab_sha256``: the sha256 of the sorted ids written as decimal numbers joined by commas
  (``"0,1,5,..."``, ASCII), checked on every load.
The search builds the subset from token frequencies in its calibration data (``frequent_tokens``).

The drafter is ``decoding.LayerSkipDrafter``. The surrogate is ``objective``'s trace-and-replay; with a
trimmed head the traces run through that head and the replay charges the draft step less the head's
measured saving (``draft_costs``). Strategies ``tpe``, ``bayes`` and ``clasp`` search the skip sets
(``tpe`` is the entry); ``hybrid`` searches V' over a shortlist of skip sets.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import weakref
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods import Method, ParamsError, check_keys, int_param

SUBSET_KEYS = ("vocab_subset", "vocab_ids", "vocab_sha256")


# -- the subset's portable form --------------------------------------------------------------------
def subset_sha256(ids: Sequence[int]) -> str:
    """The checksum a profile keeps: sha256 of the sorted ids as comma-separated decimals."""
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()


def encode_ids(ids: Sequence[int]) -> str:
    """Sorted ids -> base64(zlib(LEB128 varints of the first id and the gaps))."""
    out, prev = bytearray(), 0
    for i, v in enumerate(ids):
        gap = v - prev if i else v
        while True:  # unsigned LEB128: 7 bits a byte, high bit set while more follow
            byte, gap = gap & 0x7F, gap >> 7
            out.append(byte | (0x80 if gap else 0))
            if not gap:
                break
        prev = v
    return base64.b64encode(zlib.compress(bytes(out), 9)).decode("ascii")


@functools.lru_cache(maxsize=64)
def decode_ids(text: str) -> tuple[int, ...]:
    """``encode_ids`` backwards; ValueError for anything that is not such a string."""
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, zlib.error, UnicodeEncodeError) as e:
        raise ValueError(str(e)) from None
    ids: list[int] = []
    value = shift = 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if ids and value == 0:
                raise ValueError("ids repeat")
            ids.append(ids[-1] + value if ids else value)
            value = shift = 0
    if shift:
        raise ValueError("the last varint is cut off")
    return tuple(ids)


def frequent_tokens(sequences: Iterable[Sequence[int]], size: int, vocab: int) -> tuple[int, ...]:
    """The ``size`` most frequent tokens of ``sequences``, sorted (FR-Spec's frequency-ranked subset).

    Ties, which are most of a large vocabulary when the data is a few calibration prompts, go to the
    lower id: byte-level BPE vocabularies number their merges in the order they were learned, which
    is by frequency in the tokenizer's own training corpus, so a low id is the better guess.
    """
    if not 1 <= size <= vocab:
        raise ParamsError(f"layer-skip: method_params.vocab_subset must be an integer in 1..{vocab}, got {size}")
    counts = Counter(t for seq in sequences for t in seq if 0 <= t < vocab)
    seen = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    chosen = set(seen)
    rest = (t for t in range(vocab) if t not in chosen)
    return tuple(sorted([*seen, *(next(rest) for _ in range(size - len(seen)))]))


# -- parameters -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerSkipParams:
    """A trimmed draft head, or none: all three keys, or none of them (see the module docstring)."""

    method: ClassVar[str] = "layer-skip"
    vocab_subset: int | None = None  # V': how many tokens the draft head covers; None: the full head
    vocab_ids: str | None = None  # the ids: base64(zlib(LEB128 gaps)), as ``encode_ids`` writes them
    vocab_sha256: str | None = None  # sha256 of the ids as comma-separated decimals

    def __post_init__(self) -> None:
        given = [k for k in SUBSET_KEYS if getattr(self, k) is not None]
        if not given:
            return
        if len(given) < len(SUBSET_KEYS):
            missing = next(k for k in SUBSET_KEYS if getattr(self, k) is None)
            raise ParamsError(f"{self.method}: method_params.{missing} is missing: a trimmed draft head needs "
                              f"{', '.join(SUBSET_KEYS)}")
        size = int_param(self.method, {"vocab_subset": self.vocab_subset}, "vocab_subset", low=1)
        if not isinstance(self.vocab_ids, str) or not isinstance(self.vocab_sha256, str):
            raise ParamsError(f"{self.method}: method_params.vocab_ids and vocab_sha256 must be strings")
        try:
            ids = decode_ids(self.vocab_ids)
        except ValueError as e:
            raise ParamsError(f"{self.method}: method_params.vocab_ids is not base64 of zlib-compressed LEB128 "
                              f"gaps ({str(e).splitlines()[0][:60]})") from None
        if len(ids) != size:
            raise ParamsError(f"{self.method}: method_params.vocab_ids holds {len(ids)} ids, but vocab_subset "
                              f"is {size}")
        if subset_sha256(ids) != self.vocab_sha256:
            raise ParamsError(f"{self.method}: method_params.vocab_sha256 does not match vocab_ids "
                              "(the subset was changed or cut)")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> LayerSkipParams:
        check_keys(cls.method, raw, cls)
        return cls(**{k: raw[k] for k in SUBSET_KEYS if k in raw})

    @classmethod
    def trimmed(cls, ids: Sequence[int]) -> LayerSkipParams:
        """The parameters of a draft head over token ``ids``."""
        ids = tuple(sorted(set(ids)))
        return cls(len(ids), encode_ids(ids), subset_sha256(ids))

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The trimmed head's token ids, sorted; None: the full head."""
        return decode_ids(self.vocab_ids) if self.vocab_ids is not None else None

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, getattr(self, k)) for k in SUBSET_KEYS if getattr(self, k) is not None)


# -- the trimmed head, built once per model and subset ------------------------------------------------
_HEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {sha256: head}
_HEADS_KEPT = 8  # per model: a search tries a few sizes; each head is a V' x H copy of the LM head's rows


def subset_head(sm, params: LayerSkipParams):
    """The trimmed draft head ``params`` describe, for ``sm`` (None: the full head); built once and kept."""
    ids = params.token_ids
    if ids is None:
        return None
    import torch

    vocab = sm.lm_head.weight.shape[0]
    if ids[-1] >= vocab:
        raise ParamsError(f"{params.method}: method_params.vocab_ids has token {ids[-1]}, but the model's "
                          f"vocabulary has {vocab} tokens (0..{vocab - 1})")
    heads = _HEADS.setdefault(sm, {})
    head = heads.get(params.vocab_sha256)
    if head is None:
        while len(heads) >= _HEADS_KEPT:
            heads.pop(next(iter(heads)))
        head = heads[params.vocab_sha256] = sm.subset_head(torch.tensor(ids))
    return head


def _drafter(candidate: Candidate, sm):
    from skipsearch.decoding import LayerSkipDrafter

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    candidate.draft.check_layers(sm.num_layers)
    if candidate.draft.is_autoregressive:
        return None
    return LayerSkipDrafter(candidate.draft, head=subset_head(sm, params))


# -- the surrogate ------------------------------------------------------------------------------------
@dataclass
class _Memo:
    full: list  # full-model KV per calibration sequence
    traces: dict  # (skip_attn, skip_mlp, subset sha256 or None) -> [Trace]
    savings: dict  # subset sha256 -> seconds the trimmed head saves per draft step


_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # objective -> _Memo


def _memo(objective) -> _Memo:
    memo = _MEMOS.get(objective)
    if memo is None:
        memo = _MEMOS[objective] = _Memo(objective.full_caches(), {}, {})
    return memo


def draft_traces(objective, config: DraftConfig, params: LayerSkipParams = LayerSkipParams()) -> list:
    """``objective.trace`` of every calibration sequence through ``config``'s skips and ``params``' draft
    head, computed once per objective. Entry i of a trace is the draft's guess at continuation[i], with
    the full model's context before it."""
    from skipsearch.objective import trace

    memo = _memo(objective)
    key = (config.skip_attn, config.skip_mlp, params.vocab_sha256)
    if key not in memo.traces:
        sm = objective.sm
        rows = zip(objective.cal.prompts, objective.cal.continuations, memo.full, strict=True)
        with sm.draft_head(subset_head(sm, params)):
            memo.traces[key] = [trace(sm, p, c, config, cache=kv) for p, c, kv in rows]
    return memo.traces[key]


def draft_costs(objective, params: LayerSkipParams):
    """The objective's cost model, with the draft step's fixed part less what ``params``' trimmed head saves.

    The saving is timed once per subset: a one-token step of the full model with the full head and with
    the trimmed one, interleaved by the one harness (medians), as ``measure_costs`` times its parts."""
    costs = objective.costs
    if params.vocab_sha256 is None:
        return costs
    memo = _memo(objective)
    if params.vocab_sha256 not in memo.savings:
        import torch

        from skipsearch.harness import time_interleaved

        sm, cal = objective.sm, objective.cal
        context = cal.prompts[0] + cal.continuations[0][: cal.max_new_tokens // 2]
        cache = sm.new_cache()
        sm.forward(torch.tensor(list(context)), start=0, cache=cache)
        n, token = len(context), torch.tensor([context[-1]])

        def step(head):
            def once():  # one draft-style step: last-position logits only
                with sm.draft_head(head):
                    sm.forward(token, start=n, cache=cache, last_only=True)
                sm.crop(cache, n)
            return once

        calls = {"full": step(None), "trimmed": step(subset_head(sm, params))}
        med = {k: t.median for k, t in time_interleaved(calls, rounds=9, device=sm.device, warmup=3).items()}
        memo.savings[params.vocab_sha256] = max(med["full"] - med["trimmed"], 0.0)
    return replace(costs, fixed_seconds=max(costs.fixed_seconds - memo.savings[params.vocab_sha256], 0.0))


def _predict(objective, candidate: Candidate):
    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    if params.vocab_subset is None:
        return objective.predict_layer_skip(candidate.draft)  # trace each calibration sequence, replay the decoder
    from skipsearch import timing
    from skipsearch.objective import replay_all

    # As predict_layer_skip, through the trimmed head and with its cheaper draft step.
    t0 = timing.now(objective.sm.device)
    config, costs = candidate.draft, draft_costs(objective, params)
    traces = [tr for tr in draft_traces(objective, config, params) if tr.matches]
    return replace(replay_all(traces, config, costs), seconds=timing.now(objective.sm.device) - t0)


def _example(num_layers: int) -> Candidate:
    mid = num_layers // 2
    return Candidate(LayerSkipParams.method, DraftConfig(skip_attn=(mid,), skip_mlp=(mid,), max_draft_tokens=3))


METHOD = Method(
    name=LayerSkipParams.method,
    summary="the model itself with some attention/MLP sublayers skipped (Draft&Verify), optionally a trimmed head",
    params=LayerSkipParams,
    drafter=_drafter,
    example=_example,
    strategy="tpe",
    predict=_predict,
)
