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

The package holds the params (``params.py``), the drafter and trimmed head (``drafter.py``; the drafter
class itself is the engine's ``decoding.LayerSkipDrafter``, which ``generate(config=...)`` builds) and the
surrogate (``surrogate.py``): trace-and-replay over skipsearch.engine.surrogate; with a trimmed head the traces
run through that head and the replay charges the draft step less the head's measured saving. Its record
(``record.py``): the traces of the shortlisted skip sets; its re-plan (``replan.py``) replays them under another
device's costs. As a hybrid's fallback it drafts alone, and its traces (``Method.traces``) are replayed there.
Strategies ``tpe``, ``bayes`` and ``clasp`` search the skip sets (``tpe`` is the entry); ``hybrid``
searches V' over a shortlist of skip sets.
"""

from __future__ import annotations

from skipsearch.config import Candidate, DraftConfig
from skipsearch.methods.base import Method, Traced, Tracing
from skipsearch.methods.layer_skip.params import (
    SUBSET_KEYS,
    LayerSkipParams,
    decode_ids,
    encode_ids,
    frequent_tokens,
    subset_sha256,
)
from skipsearch.methods.layer_skip.record import (
    ACCEPTANCE_KEY,
    MAX_KEPT,
    AcceptanceRecord,
    SkipSetTraces,
    acceptance_from_dict,
    acceptance_to_dict,
    record_acceptance,
)
from skipsearch.methods.layer_skip.replan import RECORD, keep_draft, read_draft, replan


def _drafter(candidate: Candidate, sm):
    from skipsearch.methods.layer_skip.drafter import LayerSkipDrafter, subset_head

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=sm.num_layers)
    candidate.draft.check_layers(sm.num_layers)
    if candidate.draft.is_autoregressive:
        return None
    return LayerSkipDrafter(candidate.draft, head=subset_head(sm, params))


def _predict(objective, candidate: Candidate):
    from skipsearch.methods.layer_skip.surrogate import predict

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    return predict(objective, candidate, params)


def _traces(objective, candidate: Candidate) -> Traced:
    """The draft's traces through its skips and head, and its c less what a trimmed head saves (its surrogate's)."""
    from skipsearch.methods.layer_skip.surrogate import draft_costs, draft_traces

    params = METHOD.parse(candidate.params, draft=candidate.draft, num_layers=objective.sm.num_layers)
    c = draft_costs(objective, params).draft_ratio(candidate.draft)
    return Traced(tuple(draft_traces(objective, candidate.draft, params)), c)


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
    record=RECORD,
    replan=replan,
    drafts_alone=True,
    copies_weights=lambda candidate: bool(candidate.plain_params().get("vocab_subset")),  # a trimmed head
    traces=Tracing(measure=_traces, keep=keep_draft, read=read_draft),
)


# The drafter (drafter.py) and the surrogate (surrogate.py) load torch: import them from their modules.
__all__ = ["ACCEPTANCE_KEY", "MAX_KEPT", "METHOD", "SUBSET_KEYS", "AcceptanceRecord", "LayerSkipParams",
           "SkipSetTraces", "acceptance_from_dict", "acceptance_to_dict", "decode_ids", "encode_ids", "frequent_tokens",
           "record_acceptance", "subset_sha256"]
