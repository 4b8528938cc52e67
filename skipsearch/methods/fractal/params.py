"""``fractal``'s parameters and the quantization scheme a device runs (no torch)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from skipsearch.config import ConfigError, DraftConfig
from skipsearch.methods.base import ParamsError, check_keys, int_param

SCHEMES = ("int8-dynamic", "int8-weight-only", "bnb-int8", "none")
MAX_W = 64  # a sanity bound: every slot costs attention and MLP rows in n+1 passes


@dataclass(frozen=True)
class FractalParams:
    """What a fractal profile fixes (its ``method_params``)."""

    method: ClassVar[str] = "fractal"
    n: int = 3  # number of fractal layers
    w: int = 3  # draft window: slots appended before the first fractal layer
    layers: tuple[int, ...] = ()  # 0-based layer each fractal layer sits in front of; () = evenly spaced
    quantization: str = "auto"  # one of SCHEMES, or auto
    slot_token: int | None = None  # token id whose embedding fills the initial slots; None = mean embedding

    def __post_init__(self) -> None:
        raw = {"n": self.n, "w": self.w}
        int_param(self.method, raw, "n", low=1)
        int_param(self.method, raw, "w", low=1, high=MAX_W)
        layers = tuple(self.layers)
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in layers):
            raise ParamsError(f"fractal: method_params.layers must be 0-based layer indices (integers >= 0), "
                              f"got {list(layers)}")
        if layers and (len(layers) != self.n or list(layers) != sorted(set(layers))):
            raise ParamsError(f"fractal: method_params.layers must list n = {self.n} distinct indices in "
                              f"increasing order, got {list(layers)}")
        object.__setattr__(self, "layers", layers)
        if self.quantization not in (*SCHEMES, "auto"):
            raise ParamsError(f"fractal: unknown method_params.quantization {self.quantization!r:.40}: "
                              f"use auto, {', '.join(SCHEMES)}")
        if self.slot_token is not None:
            int_param(self.method, {"slot_token": self.slot_token}, "slot_token", low=0)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, draft: DraftConfig, num_layers: int) -> FractalParams:
        check_keys(cls.method, raw, cls, required=("n", "w"))
        layers = raw.get("layers") or ()
        if not isinstance(layers, (list, tuple)):
            raise ParamsError("fractal: method_params.layers must be a list of layer indices")
        quantization = raw.get("quantization", "auto")
        if not isinstance(quantization, str):
            raise ParamsError("fractal: method_params.quantization must be a string")
        params = cls(n=raw["n"], w=raw["w"], layers=tuple(layers), quantization=quantization,
                     slot_token=raw.get("slot_token"))
        params.positions(num_layers)
        return params

    @property
    def max_draft_tokens(self) -> int:
        return self.w + self.n + 1

    def positions(self, num_layers: int) -> tuple[int, ...]:
        """The 0-based layers the fractal layers sit in front of, checked against the model."""
        if self.n > num_layers:
            raise ParamsError(f"fractal: method_params.n = {self.n} is more than the model's {num_layers} layers")
        if self.layers:
            if self.layers[-1] >= num_layers:
                raise ParamsError(f"fractal: method_params.layers has layer {self.layers[-1]}, but the model has "
                                  f"{num_layers} layers (0..{num_layers - 1})")
            return self.layers
        return even_positions(self.n, num_layers)

    def to_pairs(self) -> tuple[tuple[str, Any], ...]:
        out = [("n", self.n), ("w", self.w), ("quantization", self.quantization)]
        if self.layers:
            out.append(("layers", list(self.layers)))
        if self.slot_token is not None:
            out.append(("slot_token", self.slot_token))
        return tuple(out)

    def to_method_params(self, num_layers: int, device: str = "cpu") -> tuple[tuple[str, Any], ...]:
        """The profile's method_params: positions and the quantization scheme written out in full."""
        out = [("n", self.n), ("w", self.w), ("layers", list(self.positions(num_layers))),
               ("quantization", resolve_scheme(self.quantization, device))]
        if self.slot_token is not None:
            out.append(("slot_token", self.slot_token))
        return tuple(out)


def even_positions(n: int, num_layers: int) -> tuple[int, ...]:
    """n layers with gap L/n: 1-based round(j·L/n) for j = 1..n, as 0-based indices."""
    return tuple(int(round(j * num_layers / n)) - 1 for j in range(1, n + 1))


def resolve_scheme(scheme: str, device: Any) -> str:
    """``auto`` made concrete for a device; an explicit scheme is checked against it."""
    kind = str(device).split(":")[0]  # a torch.device or its name: "cuda:0" -> "cuda"
    if scheme == "auto":
        if kind == "cpu":
            return "int8-dynamic"
        if kind == "cuda" and importlib.util.find_spec("bitsandbytes") is not None:
            return "bnb-int8"
        return "int8-weight-only"
    if scheme == "int8-dynamic" and kind != "cpu":
        raise ConfigError(f"fractal quantization int8-dynamic runs on CPU only, not {kind}: use int8-weight-only")
    if scheme == "bnb-int8":
        if kind != "cuda":
            raise ConfigError("fractal quantization bnb-int8 needs a CUDA device")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("fractal quantization bnb-int8 needs bitsandbytes: pip install bitsandbytes")
    return scheme
