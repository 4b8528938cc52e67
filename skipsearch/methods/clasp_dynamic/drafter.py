"""``clasp-dynamic``'s drafter: layer-skip drafting whose skip set CLaSp's DP re-plans every LOI verify steps."""

from __future__ import annotations

import torch

from skipsearch.config import DraftConfig
from skipsearch.engine import timing
from skipsearch.engine.decoding import Draft, Drafter, LayerSkipDrafter
from skipsearch.methods.clasp_dynamic.dp import ModelLayers, dp_skip_sets
from skipsearch.methods.clasp_dynamic.params import DynamicParams, config_for, skippable
from skipsearch.model.skippable import SkippableModel


class ClaspDynamicDrafter(Drafter):
    """Drafts like LayerSkipDrafter (K, adaptive exit) and re-plans its skip set every LOI verify steps.

    The engine hands it the verify pass's hidden states of the last accepted token (``verified``);
    the DP runs on them against the current KV cache. The draft set only ever depends on tokens
    already verified, so greedy output is the full model's and rejection sampling stays exact.
    """

    wants_hidden_states = True  # decoding.generate: call verified() after each verify step

    def __init__(self, params: DynamicParams, draft: DraftConfig, *, num_layers: int, batched: bool = True) -> None:
        self.params = params
        self.allowed = skippable(num_layers, params.protect_ends)
        self.batched = batched
        self.inner = LayerSkipDrafter(draft)  # the draft's K, exit rule and adaptive γ persist across re-plans
        self.since = None  # verify steps since the last DP run; None before the first
        self.dp_runs = 0
        self.dp_seconds = 0.0
        self.changes = 0

    @property
    def threshold(self) -> float | None:
        return self.inner.threshold

    @property
    def config(self) -> DraftConfig:
        return self.inner.config

    def draft(self, sm, cache, *, pending, start, limit, sampling, generator) -> Draft:
        return self.inner.draft(sm, cache, pending=pending, start=start, limit=limit, sampling=sampling,
                                generator=generator)

    def observe(self, drafted: int, accepted: int) -> None:
        self.inner.observe(drafted, accepted)

    def verified(self, sm: SkippableModel, cache, *, hidden: torch.Tensor, position: int) -> None:
        """``hidden`` [L+1, H]: the last accepted token's states in the verify pass, at ``position``."""
        self.since = 0 if self.since is None else self.since + 1
        if self.since % self.params.loi:
            return
        t0 = timing.now(sm.device)
        layers = ModelLayers(sm, [cache], [torch.tensor([position])], sublayer=self.params.sublayer)
        result = dp_skip_sets(hidden.unsqueeze(1), layers.run, max_skips=self.params.num_skips,
                              allowed=self.allowed, skip=layers.skip, batched=self.batched)
        new = config_for(self.params.sublayer, result.skip_sets[-1], self.inner.config)
        self.changes += new != self.inner.config
        self.inner.config = new
        self.dp_runs += 1
        self.dp_seconds += timing.now(sm.device) - t0

    def report(self) -> tuple[tuple[str, float], ...]:
        return (("dp_runs", float(self.dp_runs)), ("dp_seconds", self.dp_seconds),
                ("skip_set_changes", float(self.changes)))
