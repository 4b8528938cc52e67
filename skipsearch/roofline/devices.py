"""The devices a roofline prices: a small table of GPUs with their published peak figures and sources, the
efficiency each GPU family was calibrated to, the draft schemes' bytes per weight, and devices given by hand.

Peak figures are the vendor's: memory bandwidth in GB/s (10^9 bytes/s) and dense throughput per dtype in
TFLOPS (10^12/s; datasheets print Tensor Core figures "with sparsity", twice the dense ones, which are used
here). fp32 is the CUDA-core rate, which PyTorch's fp32 matrix products use unless TF32 is switched on.
A roofline is optimistic by construction, and the same optimism puts v(k) at about 1 for every k up to 13 (a
batch-1 verify stays memory-bound), which the kernels that ran the published rows did not reach
(studies/roofline-vs-published.md). ``CALIBRATED`` holds achieved / peak bandwidth per GPU family, fitted to
published decode speeds by ``scripts/roofline_calibration.py`` (the study says how well it predicts the speeds it
was not fitted on); ``tests/test_roofline.py`` checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from skipsearch.config import ConfigError


@dataclass(frozen=True)
class Device:
    """One device's peak figures and where they are published."""

    key: str  # what --roofline takes
    name: str
    kind: str  # "gpu" or "cpu"
    bandwidth_gb_s: float
    tflops: tuple[tuple[str, float], ...]  # (dtype, dense peak TFLOPS): float32, bfloat16, float16, fp8, int8
    family: str | None = None  # the calibration family (one efficiency per family)
    capability: str | None = None  # CUDA compute capability: fp8 needs 8.9
    source: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        return dict(self.tflops).get(dtype)

    @property
    def has_fp8(self) -> bool:
        if self.capability is None:
            return False
        major, minor = (int(x) for x in self.capability.split("."))
        return (major, minor) >= (8, 9)


_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100; Tensor Core figures printed with "
         "sparsity, halved here)")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)")
GPUS: dict[str, Device] = {d.key: d for d in (
    Device("h100-sxm", "NVIDIA H100 SXM5 80GB", "gpu", 3350.0,
           (("float32", 67.0), ("bfloat16", 989.4), ("float16", 989.4), ("fp8", 1978.9), ("int8", 1978.9)),
           "h100", "9.0", _H100),
    Device("h100-pcie", "NVIDIA H100 PCIe 80GB", "gpu", 2000.0,
           (("float32", 51.0), ("bfloat16", 756.5), ("float16", 756.5), ("fp8", 1513.0), ("int8", 1513.0)),
           "h100", "9.0", _H100),
    Device("h200", "NVIDIA H200 SXM 141GB", "gpu", 4800.0,
           (("float32", 67.0), ("bfloat16", 989.5), ("float16", 989.5), ("fp8", 1979.0), ("int8", 1979.0)),
           "h100", "9.0", "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200; Tensor Core "
           "figures printed with sparsity, halved here). The H100's chip with HBM3e: it takes the H100 family's "
           "fitted efficiency, which no published H200 row has checked"),
    Device("a100-80gb-sxm", "NVIDIA A100 80GB SXM4", "gpu", 2039.0,
           (("float32", 19.5), ("bfloat16", 312.0), ("float16", 312.0), ("int8", 624.0)), "a100", "8.0", _A100),
    Device("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", "gpu", 1935.0,
           (("float32", 19.5), ("bfloat16", 312.0), ("float16", 312.0), ("int8", 624.0)), "a100", "8.0", _A100),
    Device("a100-40gb", "NVIDIA A100 40GB", "gpu", 1555.0,
           (("float32", 19.5), ("bfloat16", 312.0), ("float16", 312.0), ("int8", 624.0)), "a100", "8.0", _A100),
    Device("l4", "NVIDIA L4 24GB", "gpu", 300.0,
           (("float32", 30.3), ("bfloat16", 121.0), ("float16", 121.0), ("fp8", 242.5), ("int8", 242.5)), "l4", "8.9",
           "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4; Tensor Core figures printed with "
           "sparsity, halved here)"),
    Device("rtx-4090", "NVIDIA GeForce RTX 4090", "gpu", 1008.0,
           (("float32", 82.6), ("bfloat16", 165.2), ("float16", 165.2), ("fp8", 330.3), ("int8", 660.6)), "rtx-4090",
           "8.9", "NVIDIA Ada GPU Architecture whitepaper, appendix table for the GeForce RTX 4090 (FP16/BF16 Tensor "
           "TFLOPS with FP32 accumulate)"),
    Device("rtx-a6000", "NVIDIA RTX A6000", "gpu", 768.0,
           (("float32", 38.7), ("bfloat16", 154.8), ("float16", 154.8), ("int8", 309.7)), "rtx-a6000", "8.6",
           "NVIDIA RTX A6000 datasheet (768 GB/s; 38.7 TFLOPS FP32; 309.7 TFLOPS Tensor with sparsity, halved here)"),
)}

# Achieved / peak memory bandwidth per GPU family and the cost of one kernel launch, fitted together by
# scripts/roofline_calibration.py to the published decode speeds in scripts/roofline_published.yaml (one launch cost
# for every row, one efficiency per family: studies/roofline-vs-published.md, which also gives them per
# implementation). A family with no published row takes FALLBACK_EFFICIENCY, and its file says it is not calibrated.
# A CPU roofline measures its own launch cost instead (skipsearch.roofline.probe).
CALIBRATED: dict[str, float] = {"a100": 0.58, "h100": 0.53, "rtx-4090": 0.86, "rtx-a6000": 0.8}
FALLBACK_EFFICIENCY = 0.69  # the mean of CALIBRATED's families, rounded: for a GPU nothing calibrated
DEFAULT_LAUNCH_US = 3.25  # microseconds per kernel launched
CALIBRATION_SOURCE = ("fitted to published decode speeds (scripts/roofline_calibration.py, "
                      "studies/roofline-vs-published.md)")

# Bytes per weight of each draft scheme's stored format, scales included (skipsearch.methods.precision.params and
# methods.fractal name the kernels): int8 one byte (one scale per output row: negligible); int4 half a byte plus a
# bf16 scale and zero point per group (groups of 128 on CUDA, tinygemm; of 32 on the CPU); fp8 one byte.
# A scheme with no kernel on the device is not priced (fp16 drafts run on a CPU only), as a measured file could not
# hold it either: re-planning a CPU-made fp16 draft for a GPU is refused in one line. bnb-int8 (LLM.int8()) is left
# out of GPU files: its kernels run far from their bytes (Draft&Verify's Table 12:
# 113 ms a token in LLM.int8()'s fp8 against 32.4 ms in bf16), so a price by bytes would mislead.
SCHEME_BYTES: dict[str, dict[str, float]] = {
    "gpu": {"int8": 1.0, "int4": 0.5 + 4 / 128, "fp8": 1.0, "int8-weight-only": 1.0},
    "cpu": {"fp16": 2.0, "int8": 1.0, "int4": 0.5 + 4 / 32, "int8-dynamic": 1.0},
}
DEFAULT_SCHEMES = {"gpu": ("int8", "int4", "fp8", "int8-weight-only"), "cpu": ("fp16", "int8", "int4", "int8-dynamic")}

FIGURE_FLAGS = "--bandwidth GB/S --tflops TFLOPS"


def known() -> str:
    return ", ".join(GPUS)


def gpu(key: str, *, given: bool = False) -> Device | None:
    """The table's device ``key``; an unknown key is one line naming the known ones and the flags that give a
    device's figures by hand (``given``: the figures are given, so an unknown key names a new device)."""
    found = GPUS.get(key.lower())
    if found is None and not given:
        raise ConfigError(f"unknown GPU '{key}' for --roofline: known are {known()}, and cpu (this machine, its "
                          f"bandwidth probed); give any other device's figures with {FIGURE_FLAGS}")
    return found


def efficiency_of(device: Device) -> tuple[float, str]:
    """The efficiency a device is priced with by default, and where it comes from."""
    if device.family in CALIBRATED:
        return CALIBRATED[device.family], f"{CALIBRATION_SOURCE}: {device.family} family"
    return FALLBACK_EFFICIENCY, (f"not calibrated: no published decode speed for the {device.family or device.key} "
                                 f"family; the calibrated families' mean")


__all__ = ["CALIBRATED", "CALIBRATION_SOURCE", "DEFAULT_LAUNCH_US", "DEFAULT_SCHEMES", "FALLBACK_EFFICIENCY",
           "FIGURE_FLAGS", "GPUS", "SCHEME_BYTES", "Device", "efficiency_of", "gpu", "known"]
