"""int8 and int4 matrix products for a few rows of fp32 activations: C++ kernels of our own.

Why: on the CPUs measured (an AMD EPYC Zen 4 with AVX-512 and no AMX: the kernels study) no low-bit kernel
reachable through torch streams its weights at the memory limit, so an int8 or int4 draft saved little over fp16.
These kernels stream each packed weight byte once for all rows (``csrc/lowbit.cpp``: layout, vector units, threads).

- ``check_lowbit()``: build (once per torch, CPU and source; a minute) and load, or one ConfigError line;
- ``Int8WoLinear.from_linear`` / ``Int4WoLinear.from_linear``: quantized once, as the precision method's
  int8/int4 schemes quantize (torchao's numbers), packed, run by ``skipsearch::int8_wo_linear`` /
  ``skipsearch::int4_wo_linear`` (custom ops with shapes, so torch.compile keeps them in one graph);
- ``lowbit_linears`` / ``lowbit_model``: a module's or a model's Linears swapped for them (a draft copy); stand-ins
  that read one input (q, k, v; gate, up) keep their weights back to back and run as one product when compiled
  (``siblings.py``);
- ``Int8DqLinear`` / ``Int4DqLinear``: the same weights times activations rounded to int8 per block, on the CPU's
  VNNI dot products (``csrc/dq.cpp``); ``lowbit_linear`` picks them where ``int8_activations()`` (the CPU has
  AVX-512 VNNI), the weight-only ones elsewhere;
- ``F32PanelLinear``: a Linear's own fp32 weights in the same panels (``skipsearch::f32_panel_linear``), for the
  ``panel`` kernel's verify blocks: the product streams the weights once for all rows, as the low-bit ones do;
- ``exact_panel_linear``: the same, as the GGUF blocks (Q4_1, Q8_0) a converted model's fp32 weights are, where
  decoding them gives back every bit (``exact.py``): the fp32 panel product's output bit for bit, in fewer bytes.
- ``arena.pack``: a copy's stand-ins' packed weights moved into one block of memory asked for as huge pages, in
  the order its forward reads them (the precision drafts' copies, the ``panel`` kernel's block copy).

No torch at import: names load on first use, so the CLI can import this package lightly.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "check_lowbit": "build", "isas": "build", "use_isa": "build",
    "has_vnni": "build", "dq_paths": "build", "use_dq_path": "build",
    "Int8WoLinear": "modules", "Int4WoLinear": "modules", "F32PanelLinear": "modules", "exact_panel_linear": "exact",
    "Int8DqLinear": "modules", "Int4DqLinear": "modules", "int8_activations": "convert",
    "quantize_int8": "quant", "quantize_int4": "quant", "dequantize_int8": "quant", "dequantize_int4": "quant",
    "lowbit_linear": "convert", "lowbit_linears": "convert", "lowbit_model": "convert",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
