"""The precision draft for the batched engine: the batched layer-skip draft loop on the reduced-precision stand-ins."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from skipsearch.config import DraftConfig
from skipsearch.engine.batched import LayerSkipBatchDrafter
from skipsearch.methods.precision.copy import QuantizedCopy, draft_head, quantized_copy
from skipsearch.methods.precision.drafter import PrecisionDrafter
from skipsearch.methods.precision.params import PrecisionParams


class PrecisionBatchDrafter(LayerSkipBatchDrafter):
    """``PrecisionDrafter`` for a batch: [B, 1] draft steps with the quantized sublayers and head swapped in, the
    draft config's sublayers skipped. Its draft KV goes into the batch's cache, which the engine crops; the steps
    run eager (the batched engine's forwards always do)."""

    def __init__(self, config: DraftConfig, params: PrecisionParams, qcopy: QuantizedCopy, sm) -> None:
        super().__init__(config, head=draft_head(sm, qcopy, params))
        self.params, self.qcopy, self.sm = params, qcopy, sm
        self.stand_ins = qcopy.stand_ins(*params.roles(config, sm.num_layers))

    @contextlib.contextmanager
    def contexts(self, sm) -> Iterator[None]:
        with sm.substituted(**self.stand_ins), super().contexts(sm):
            yield

    def single(self) -> PrecisionDrafter:
        return PrecisionDrafter(self.config, self.params, self.qcopy, self.sm)


def whole_draft(sm, scheme: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The whole model in ``scheme`` as ``PrecisionBatchDrafter`` drafts with it (every sublayer's stand-in and the
    scheme's head, nothing skipped), for ``Method.scheme_draft``: a factory of contexts inside which the model's
    forward is that draft step. The quantized copy is built here, once, so no context times its building."""
    drafter = PrecisionBatchDrafter(DraftConfig(max_draft_tokens=1), PrecisionParams(scheme=scheme),
                                    quantized_copy(sm, scheme), sm)

    @contextlib.contextmanager
    def drafting() -> Iterator[None]:
        with drafter.contexts(sm), sm.draft_head(drafter.head):
            yield

    return drafting
