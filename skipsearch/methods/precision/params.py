"""``precision`` parameters and schemes: light, no torch at import.

A precision draft is the model itself with every sublayer in one of three roles while drafting:
- *skipped*: in the draft config's ``skip_attn`` / ``skip_mlp`` (as layer-skip);
- *full*: in ``method_params.full_attn`` / ``full_mlp``: the model's own weights;
- *quantized*: every other sublayer, and the LM head when ``quant_head``: a copy of its weights in
  ``scheme``, run by that scheme's real low-precision kernel.
The draft head may also be trimmed to the V' most frequent tokens (FR-Spec), with layer-skip's keys
``vocab_subset``, ``vocab_ids`` and ``vocab_sha256`` (see ``skipsearch.methods.layer_skip``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from skipsearch.config import DraftConfig
from skipsearch.methods.base import ParamsError, check_keys, choice_param, layers_param
from skipsearch.methods.layer_skip import SUBSET_KEYS, LayerSkipParams


@dataclass(frozen=True)
class Scheme:
    """A weight format for the draft's copy, the kernels that run it, and where they exist."""

    name: str
    devices: tuple[str, ...]  # device types whose kernels exist ("cpu", "cuda")
    weight_bits: int  # bits per stored weight (scales and packing aside)
    kernel: dict[str, str]  # device type -> the kernel that runs it, for people
    min_capability: tuple[int, int] | None = None  # CUDA compute capability the kernel needs


SCHEMES: dict[str, Scheme] = {
    s.name: s for s in (
        # fbgemm's fp16-weight GEMM: fp16 weights packed once, fp32 activations and accumulation. The draft
        # of an fp32 model. On CUDA a bf16/fp16 model is already 16-bit, so this scheme saves nothing there.
        Scheme("fp16", ("cpu",), 16,
               {"cpu": "fbgemm fp16-weight GEMM (torch.fbgemm_linear_fp16_weight_fp32_activation)"}),
        # int8 weights with one scale per output row, activations unquantized (torchao's weight-only int8).
        # On an x86-64 CPU: skipsearch's own kernel (skipsearch.kernels.lowbit; torchao's where it cannot build).
        Scheme("int8", ("cpu", "cuda"), 8,
               {"cpu": "skipsearch::int8_wo_linear (fp32 activations; else torchao Int8WeightOnlyConfig)",
                "cuda": "torchao Int8WeightOnlyConfig"}),
        # int4 weights in groups with scales (and zero points), activations unquantized.
        Scheme("int4", ("cpu", "cuda"), 4, {"cpu": "skipsearch::int4_wo_linear, groups of 32 (else torchao "
                                                    "IntxWeightOnlyConfig(int4, groups of 32))",
                                             "cuda": "torchao Int4WeightOnlyConfig (tinygemm, groups of 128)"}),
        # fp8 (e4m3) weights: Hopper and Ada have the instructions.
        Scheme("fp8", ("cuda",), 8, {"cuda": "torchao Float8WeightOnlyConfig"}, min_capability=(8, 9)),
    )
}


def device_scheme(device: Any) -> str:
    """The scheme a device drafts in when none is asked for: fp16 on a CPU (fbgemm's kernel), int8 on a GPU."""
    return "fp16" if str(device).split(":")[0] == "cpu" else "int8"


@dataclass(frozen=True)
class PrecisionParams:
    """What a precision profile fixes (its ``method_params``)."""

    method: ClassVar[str] = "precision"
    scheme: str = "fp16"  # one of SCHEMES: the weight format of the draft's quantized sublayers
    full_attn: tuple[int, ...] = ()  # layers whose attention the draft runs at full precision
    full_mlp: tuple[int, ...] = ()  # layers whose MLP the draft runs at full precision
    quant_head: bool = True  # the draft's LM head runs quantized too (it is ~20% of a small model's weights)
    vocab_subset: int | None = None  # V' of a trimmed draft head; None: every token
    vocab_ids: str | None = None  # the subset's ids, as layer-skip encodes them
    vocab_sha256: str | None = None

    def __post_init__(self) -> None:
        try:
            LayerSkipParams(self.vocab_subset, self.vocab_ids, self.vocab_sha256)  # all three keys or none, ids checked
        except ParamsError as e:
            raise ParamsError(str(e).replace(f"{LayerSkipParams.method}:", f"{self.method}:", 1)) from None
        if self.scheme not in SCHEMES:
            shown = self.scheme if isinstance(self.scheme, str) else type(self.scheme).__name__
            raise ParamsError(f"precision: unknown method_params.scheme {shown!r:.40}: use {', '.join(SCHEMES)}")
        if not isinstance(self.quant_head, bool):
            raise ParamsError("precision: method_params.quant_head must be true or false")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> PrecisionParams:
        check_keys(cls.method, raw, cls, required=("scheme",))
        scheme = choice_param(cls.method, raw, "scheme", "fp16", tuple(SCHEMES))
        params = cls(scheme=scheme, full_attn=layers_param(cls.method, raw.get("full_attn"), "full_attn", num_layers),
                     full_mlp=layers_param(cls.method, raw.get("full_mlp"), "full_mlp", num_layers),
                     quant_head=raw.get("quant_head", True), **{k: raw[k] for k in SUBSET_KEYS if k in raw})
        pairs = (("attn", params.full_attn, draft.skip_attn), ("mlp", params.full_mlp, draft.skip_mlp))
        for key, full, skipped in pairs:
            both = sorted(set(full) & set(skipped))
            if both:
                raise ParamsError(f"precision: layer {both[0]} is in both draft.skip_{key} and "
                                  f"method_params.full_{key}: a sublayer is skipped, full or quantized, not two")
        return params

    @property
    def head_subset(self) -> LayerSkipParams:
        """The trimmed draft head's keys, as layer-skip's params (all None: the full vocabulary)."""
        return LayerSkipParams(self.vocab_subset, self.vocab_ids, self.vocab_sha256)

    def roles(self, draft: DraftConfig, num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The layers whose attention, and whose MLP, the draft runs quantized."""
        attn = tuple(i for i in range(num_layers) if i not in draft.skip_attn and i not in self.full_attn)
        mlp = tuple(i for i in range(num_layers) if i not in draft.skip_mlp and i not in self.full_mlp)
        return attn, mlp

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        out: list[tuple[str, Any]] = [("scheme", self.scheme), ("quant_head", self.quant_head)]
        if self.full_attn:
            out.append(("full_attn", list(self.full_attn)))
        if self.full_mlp:
            out.append(("full_mlp", list(self.full_mlp)))
        return (*out, *self.head_subset.to_pairs())
