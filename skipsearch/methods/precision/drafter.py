"""The precision drafter: the layer-skip draft loop, run on the model's reduced-precision stand-ins."""

from __future__ import annotations

from skipsearch.config import DraftConfig
from skipsearch.engine.decoding import LayerSkipDrafter
from skipsearch.methods.precision.copy import QuantizedCopy, draft_head
from skipsearch.methods.precision.params import PrecisionParams


class PrecisionDrafter(LayerSkipDrafter):
    """Drafts with some sublayers skipped (the draft config), some quantized, some full (the params).

    Draft-only KV goes into the engine's cache and is cropped by it, as for layer-skip: the quantized
    attention reads the full model's KV for the context and never re-runs the prompt. On a compiled kernel
    (``SkippableModel.use_kernel``) the draft steps run a compiled graph of the draft model too."""

    def __init__(self, config: DraftConfig, params: PrecisionParams, qcopy: QuantizedCopy, sm) -> None:
        super().__init__(config, head=draft_head(sm, qcopy, params))
        self.stand_ins = qcopy.stand_ins(*params.roles(config, sm.num_layers))

    def warm(self, sm) -> None:
        """On a compiled kernel, one draft token on a two-token context: inductor compiles the draft's graph."""
        if not sm.kernel.compiled:
            return
        import torch

        from skipsearch.config import GREEDY

        cache = sm.decode_cache(4)
        sm.forward(torch.zeros(2, dtype=torch.long), start=0, cache=cache)
        self.draft(sm, cache, pending=0, start=2, limit=1, sampling=GREEDY, generator=None)
        sm.crop(cache, 0)

    def draft(self, sm, cache, **kwargs):
        # the draft model is fixed for the whole decode: on a compiled kernel it runs its own compiled graph
        with sm.substituted(**self.stand_ins), sm.compiled_draft():
            return super().draft(sm, cache, **kwargs)
