"""What re-planning a fractal draft for another device reads: its acceptance record, and its pass's cost.

The fractal strategy times every point (no surrogate ranks its candidates), but a fractal *profile* must still
say, on another device, whether its draft pays there. Its two halves:
- acceptance (``record``): the calibration's greedy continuations walked cycle by cycle as the engine decodes
  them, one draft pass per cycle from the committed prefix (the full model's KV) and the pending token; the
  leading matches of what it drafts against the full model's output (record.FractalRecord). That is
  what the engine's cycles accept, with one difference: the record's passes read the KV of one
  teacher-forced forward, the engine's the KV its verify forwards wrote. Those differ by float rounding, which
  the fractal layers' own argmax choices now and then turn into another draft token. It belongs to the model
  and the workload, not to the device's speed.
- cost (``pass_ratio``): a pass runs the full model over the w + n + 1 window rows, priced as the cost file's
  verify v(w + n + 1), and n passes through the compressed copy (the upper layers from each fractal layer on,
  then the lower ones: one whole compressed model), each priced as a one-token step in the compressed scheme
  (the cost file's per-sublayer costs of that scheme) times the same v(w + n + 1). The row scaling is the
  approximation, and the report says so.
``skipsearch costs --schemes int8-dynamic`` (or int8-weight-only, bnb-int8) measures the compressed layers'
costs, by the same timing as a precision scheme's (``surrogate.measure_stand_ins``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skipsearch.config import GREEDY, ConfigError
from skipsearch.engine.surrogate import Calibration, full_cache, measure_stand_ins
from skipsearch.files.records import NO_HIT
from skipsearch.methods.fractal.compressed import CompressedModel, compressed_model
from skipsearch.methods.fractal.drafter import FractalDrafter, draft_pass
from skipsearch.methods.fractal.params import FractalParams, resolve_scheme
from skipsearch.methods.fractal.record import FractalRecord


@dataclass(frozen=True)
class _StandIns:
    """The compressed copy's attention, MLP and head as stand-ins for the model's own (measure_stand_ins)."""

    cm: CompressedModel

    @property
    def scheme(self) -> str:
        return self.cm.scheme

    @property
    def head(self):
        return self.cm.lm_head

    def stand_ins(self, attn_layers, mlp_layers) -> dict[str, dict[int, Any]]:
        return {"attn": {i: self.cm.layers[i].self_attn for i in attn_layers},
                "mlp": {i: self.cm.layers[i].mlp for i in mlp_layers}}


def measure_scheme_costs(sm, context: Sequence[int], schemes: Sequence[str], *, repeats: int = 9) -> tuple:
    """The compressed layers' per-sublayer costs in each scheme (``skipsearch costs --schemes int8-dynamic``)."""
    out = []
    for scheme in schemes:
        if scheme == "none":
            raise ConfigError("fractal scheme none is the model itself: it has no costs of its own to measure")
        out.append(measure_stand_ins(sm, context, _StandIns(compressed_model(sm, resolve_scheme(scheme, sm.device))),
                                     repeats=repeats))
    return tuple(out)


@torch.inference_mode()
def record(sm, cal: Calibration, params: FractalParams, *, workload: str | None = None,
           architecture: str | None = None) -> FractalRecord:
    """The fractal record of ``params``' draft over the calibration. K is the draft's own (w + n + 1), so the
    positions the engine's cycles start at follow from what they accept: each sequence is walked cycle by cycle
    as ``decoding.generate`` runs it (near the end w shrinks, as the drafter shrinks it), one greedy draft pass
    per cycle, as many passes as decoding makes; positions no cycle starts at are NO_HIT."""
    drafter = FractalDrafter(sm, params)
    n, k = len(drafter.positions), params.max_draft_tokens
    out = []
    for prompt, cont in zip(cal.prompts, cal.continuations, strict=True):
        data = bytearray([NO_HIT] * max(len(cont) - 1, 0))
        cache = full_cache(sm, prompt, cont) if len(cont) > 1 else None
        t = 1
        while t < len(cont):  # the engine's cycle rules (ngram.replay_cycles reads them back)
            limit = min(cal.max_new_tokens - t - 1, k)
            if limit <= 0:
                break
            # the pending token cont[t - 1] sits at position len(prompt) + t - 1
            draft = draft_pass(sm, drafter.cm, [cont[t - 1]], start=len(prompt) + t - 1, cache=cache,
                               positions=drafter.positions, w=max(0, min(params.w, limit - n - 1)),
                               slot=drafter.slot, sampling=GREEDY)
            matched = 0
            for tok, want in zip(draft.tokens[:limit], cont[t:], strict=False):
                if tok != want:
                    break
                matched += 1
            data[t - 1] = matched
            t += matched if t + matched == len(cont) else matched + 1
        out.append(base64.b64encode(bytes(data)).decode("ascii"))
    return FractalRecord(drafter.cm.scheme, n, params.w, tuple(drafter.positions), k, cal.max_new_tokens,
                         tuple(out), workload, architecture)


__all__ = ["measure_scheme_costs", "record"]
