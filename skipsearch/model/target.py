"""The target's precision: which model drafts are verified against, and so which model's greedy output a profile
reproduces token for token.

- ``native``: the checkpoint's weights in the dtype the model loads in (``--dtype``: fp32 on a CPU, bf16 or fp16
  where asked). Every profile before schema 6 is one.
- ``int8``: every ``nn.Linear`` of the model (the LM head included; the embeddings and norms stay fp32) as int8
  weights with one scale per output row, times fp32 activations, summed in fp32. These are the numbers of
  torchao's ``Int8WeightOnlyConfig`` (``kernels/lowbit/quant.py``, compared bit for bit with torchao's own in the
  tests), so an HF user reproduces the target with ``torchao.quantization.quantize_(model,
  Int8WeightOnlyConfig())``: the same weights, sums in another order, greedy output equal up to near-ties. It runs
  skipsearch's int8 weight-only products (``skipsearch::int8_wo_linear``), which stream each weight byte once, on
  x86-64 CPUs; a step streams about a quarter of an fp32 step's bytes.

A draft is lossless with respect to whichever target verifies it, so lookups and layer skips of the int8 model
draft for it as they do for the fp32 one, and a precision draft copies the int8 target's weights (q * s, exact) into
its own scheme (an int4 copy streams half the bytes). What copies rows of the fp32 head (a trimmed head) or builds
compressed layers from fp32 weights (fractal) is refused: the int8 target does not hold them.

No torch at import: the CLI checks ``--target-precision`` before anything loads.
"""

from __future__ import annotations

from skipsearch.config import INT8, NATIVE, PRECISIONS, ConfigError

SUMMARY = {
    NATIVE: "the checkpoint's weights in the dtype the model loads in",
    INT8: "int8 weight-only (one scale per output row, as torchao's Int8WeightOnlyConfig), fp32 activations, CPU",
}


def check_precision(precision: str, *, device: str | None = None, dtype: str | None = None) -> None:
    """One ConfigError line where ``precision`` is unknown, or cannot run on ``device`` in ``dtype`` (both resolved:
    ``cpu``, ``float32``; None: not known yet)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown target precision {precision!r:.40}: use {', '.join(PRECISIONS)}")
    if precision == NATIVE:
        return
    if device is not None and not device.startswith("cpu"):
        raise ConfigError(f"the {precision} target runs skipsearch's int8 CPU products; this model is placed on "
                          f"{device}: pass --device cpu, or --target-precision {NATIVE}")
    if dtype is not None and dtype not in ("float32", "auto"):
        raise ConfigError(f"the {precision} target takes fp32 activations; --dtype {dtype} is refused with it "
                          f"(pass --dtype float32, or leave --dtype out)")


def quantize_target(model, precision: str) -> None:
    """Make ``model`` (an HF causal LM on the CPU, fp32) the ``precision`` target, in place: for int8, every
    ``nn.Linear``, the LM head included, swapped for ``Int8WoLinear`` (its weights quantized once and packed; the
    fp32 copies dropped with the modules). A tied LM head is untied by the swap: the embedding keeps its fp32
    weights, as torchao's ``quantize_`` leaves it."""
    check_precision(precision)
    if precision == NATIVE:
        return
    from skipsearch.kernels.lowbit import Int8WoLinear, check_lowbit
    from skipsearch.kernels.lowbit.convert import swap_linears

    check_lowbit()  # one line where the products cannot be built here
    swap_linears(model, Int8WoLinear.from_linear)


__all__ = ["INT8", "NATIVE", "PRECISIONS", "SUMMARY", "check_precision", "quantize_target"]
