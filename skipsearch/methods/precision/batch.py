"""The precision draft for the batched engine: the batched layer-skip draft loop on the reduced-precision stand-ins."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from skipsearch.batched import LayerSkipBatchDrafter
from skipsearch.config import DraftConfig
from skipsearch.methods.precision.copy import QuantizedCopy, draft_head
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
