"""The schemes' reduced-precision Linear modules (a copy of an ``nn.Linear``, a fused gated MLP) and the check that a
device has their kernels.

No fake quantization: every module here stores its weights in the scheme's format and runs the
scheme's own low-precision kernel at each call (fbgemm's fp16-weight GEMM on CPU; skipsearch's own int8/int4
kernels on an x86-64 CPU where they build, ``skipsearch.kernels.lowbit``, with int8 activations where the CPU has
AVX-512 VNNI; torchao's weight-only kernels elsewhere). Measured speeds per device are in the README (Precision drafts).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import logging
import warnings
import weakref

import torch
from torch import nn

from skipsearch.config import ConfigError
from skipsearch.kernels.lowbit import check_lowbit, lowbit_linears
from skipsearch.kernels.lowbit.convert import SCHEMES as LOWBIT_SCHEMES
from skipsearch.kernels.lowbit.modules import LowbitLinear
from skipsearch.methods.precision.params import SCHEMES

# torch marks the fbgemm fp16 entry points deprecated (with torch.ao.quantization); they remain the
# fastest fp16-weight kernel on x86 CPUs that we measured (README), so the notice is kept out of users' way:
# it is a warn-once, so packing and one warm-up call inside ``_quiet`` consume it.
_DEPRECATED = r"fbgemm_(pack_gemm_matrix_fp16|linear_fp16_weight_fp32_activation) is deprecated"


def check_scheme(scheme: str, device: str | torch.device) -> None:
    """Raise a one-line ConfigError unless ``device`` has real kernels for ``scheme``."""
    spec = SCHEMES.get(scheme)
    if spec is None:
        raise ConfigError(f"unknown precision scheme {scheme!r:.40}: use {', '.join(SCHEMES)}")
    dev = torch.device(device)
    if dev.type not in spec.devices:
        where = " or ".join(d.upper() for d in spec.devices)
        better = "fp16 on a CPU" if dev.type == "cpu" else "int8 or int4 on a GPU"
        raise ConfigError(f"precision scheme {scheme} has no kernel on {dev.type}: it runs on {where}; use {better}")
    if scheme == "fp16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ConfigError("precision scheme fp16 needs fbgemm (an x86-64 CPU build of torch); use int8 here")
    if scheme in ("int8", "int4", "fp8") and not runs_lowbit(scheme, dev.type) \
            and importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"precision scheme {scheme} needs torchao: pip install torchao")
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        if spec.min_capability and (major, minor) < spec.min_capability:
            need = ".".join(map(str, spec.min_capability))
            raise ConfigError(f"precision scheme {scheme} needs compute capability {need}+ (Hopper, Ada); "
                              f"{torch.cuda.get_device_name(dev)} has {major}.{minor}: use int8")
        if scheme == "int4" and importlib.util.find_spec("mslk") is None:
            raise ConfigError("precision scheme int4 on CUDA needs torchao's int4 kernel package: pip install mslk")


class Fp16Linear(nn.Module):
    """fp16 weights packed once for fbgemm; fp32 activations in and out (fp32 accumulation)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.weight_bytes = weight.numel() * 2
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_DEPRECATED)
            self.packed = torch.fbgemm_pack_gemm_matrix_fp16(weight)  # opaque, out x in fp16
            self.key = next(_KEYS)  # how a compiled graph names it (inductor would copy the opaque tensor itself)
            _PACKED[self.key] = self
            with torch.inference_mode():
                self.forward(torch.zeros(1, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype is torch.float32 else x.float()  # the draft of an fp32 model: no casts on the hot path
        if torch.compiler.is_compiling():  # traced (a compiled draft): through the op that tells inductor its shape
            out = torch.ops.skipsearch.fp16_linear(x32, self.key, self.bias, self.out_features)
        else:
            out = torch.fbgemm_linear_fp16_weight_fp32_activation(x32, self.packed, self.bias)
        return out if x.dtype is torch.float32 else out.to(x.dtype)


# fbgemm's fp16-weight GEMM as a custom op, so that torch.compile can trace a draft made of Fp16Linear stand-ins.
# The packed weight is an opaque fbgemm object that inductor would copy into a plain tensor (and fbgemm then
# refuses), so the graph names it by key and the op looks it up; the op tells inductor only its output's shape.
_PACKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # key -> Fp16Linear
_KEYS = itertools.count()


@torch.library.custom_op("skipsearch::fp16_linear", mutates_args=())
def _fp16_linear(x: torch.Tensor, key: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return torch.fbgemm_linear_fp16_weight_fp32_activation(x, _PACKED[key].packed, bias)


@_fp16_linear.register_fake
def _(x: torch.Tensor, key: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class FusedGatedMLP(nn.Module):
    """A gated MLP (Llama, Mistral, Qwen2: ``down(act(gate(x)) * up(x))``) as two reduced-precision GEMMs: gate
    and up stacked into one weight, so a draft step runs one kernel call and one module call fewer per layer.
    The same maths as the model's MLP, with its own activation; only the weights' precision differs."""

    def __init__(self, mlp: nn.Module, convert) -> None:
        super().__init__()
        gate, up = mlp.gate_proj, mlp.up_proj
        # uninitialised (``skip_init``): its weights are copied in below, and a random init of them took 0.4 s of
        # every process that builds a draft of smollm2-135m's 30 layers
        stacked = nn.utils.skip_init(nn.Linear, gate.in_features, gate.out_features + up.out_features,
                                     bias=gate.bias is not None, device=gate.weight.device, dtype=gate.weight.dtype)
        with torch.no_grad():
            stacked.weight.copy_(torch.cat([gate.weight, up.weight]))  # [2I, H]
            if gate.bias is not None:
                stacked.bias.copy_(torch.cat([gate.bias, up.bias]))
        self.gate_up, self.down_proj = convert(stacked), convert(copy.deepcopy(mlp.down_proj))
        self.act_fn, self.split = mlp.act_fn, gate.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)  # [..., 2I]
        return self.down_proj(self.act_fn(gate_up[..., : self.split]) * gate_up[..., self.split:])


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
        and callable(getattr(module, "act_fn", None))


def _torchao_config(scheme: str, device_type: str):
    # torchao logs a line per optional CUDA extension it cannot load on a CPU machine: keep them out of users' way
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import (
        Float8WeightOnlyConfig,
        Int4WeightOnlyConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
    )
    from torchao.quantization.granularity import PerGroup

    if scheme == "int8":
        return Int8WeightOnlyConfig()
    if scheme == "int4":
        if device_type == "cuda":
            return Int4WeightOnlyConfig(group_size=128)
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    if scheme == "fp8":
        return Float8WeightOnlyConfig()
    raise ConfigError(f"precision scheme {scheme} is not a torchao scheme")


def runs_lowbit(scheme: str, device_type: str) -> bool:
    """Whether ``scheme`` runs on skipsearch's own kernels here (int8 and int4 on an x86-64 CPU where they build:
    ``skipsearch.kernels.lowbit``); elsewhere torchao's kernels run it. Both hold the same weights (torchao's
    scales, bit for bit). On a CPU with AVX-512 VNNI ours also round the activations to int8 per block of 32
    (``kernels.lowbit.convert.int8_activations``), so a draft's tokens may differ from torchao's in a few places."""
    if device_type != "cpu" or scheme not in LOWBIT_SCHEMES:
        return False
    try:
        check_lowbit()
    except ConfigError:
        return False
    return True


def quantize_module(module: nn.Module, scheme: str) -> nn.Module:
    """A copy of ``module`` whose every ``nn.Linear`` holds its weights in ``scheme`` and runs its kernel.

    The copy keeps everything else (norms, rotary, ``layer_idx``): it is a drop-in stand-in. An int8 target's
    linears are read as the fp32 weights they multiply by (``fp32_linears``): the copy is the int8 target's."""
    from skipsearch.kernels.lowbit.convert import fp32_linears

    module = fp32_linears(module)
    if _is_gated_mlp(module):
        return FusedGatedMLP(module, lambda linear: quantize_module(linear, scheme))
    if runs_lowbit(scheme, next(module.parameters()).device.type):
        return lowbit_linears(module, scheme)
    out = copy.deepcopy(module)
    if scheme == "fp16":
        targets = [out] if isinstance(out, nn.Linear) else []
        names = [name for name, child in out.named_modules() if isinstance(child, nn.Linear)]
        if targets:
            return Fp16Linear(out)
        for name in names:
            parent_name, _, attr = name.rpartition(".")
            parent = out.get_submodule(parent_name) if parent_name else out
            setattr(parent, attr, Fp16Linear(getattr(parent, attr)))
        return out
    from torchao.quantization import quantize_

    device = next(out.parameters()).device
    quantize_(out, _torchao_config(scheme, device.type))
    return out


def weight_bytes(module: nn.Module) -> int:
    """Bytes the module's weights occupy as stored (packed fp16, torchao tensors, plain tensors)."""
    total = 0
    seen: set[int] = set()
    for m in module.modules():
        if isinstance(m, (Fp16Linear, LowbitLinear)):  # packed weights: opaque, or buffers
            total += m.weight_bytes + (m.bias.numel() * 4 if m.bias is not None else 0)
            continue
        for p in m.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            inner = getattr(p, "__tensor_flatten__", None)
            if inner is not None:  # a torchao tensor subclass: add up the tensors it is made of
                names, _ = p.__tensor_flatten__()
                total += sum(getattr(p, n).numel() * getattr(p, n).element_size() for n in names)
            else:
                total += p.numel() * p.element_size()
    return total
