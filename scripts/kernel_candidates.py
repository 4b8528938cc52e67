"""Candidate CPU kernels for the draft's and the verify's matrix products, side by side, on the real model's linears.

Every nn.Linear of the model (30 layers' q, k, v, o, gate, up, down and the LM head: all the weights a step
streams) is converted to each candidate, and a k-row product goes through all of them in turn, as a decoding
step does. Median of ``--repeats`` calls after a warm-up, through the project's one timer, at the thread count
given; relative to the fp32 eager product of the same rows. The byte ratio is the stored weights' bytes over
fp32's. Attention, norms and the rest of a step are left out: this ranks kernels for the linears only.
Usage: python scripts/kernel_candidates.py --threads 1 --out studies/kernel-candidates-1t.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch
from torch import nn

from skipsearch.engine import timing
from skipsearch.hardware import probe
from skipsearch.methods.precision.linears import quantize_module, weight_bytes
from skipsearch.model.loader import load_model


def _linears(sm) -> list[nn.Linear]:
    return [m for m in sm.hf.modules() if isinstance(m, nn.Linear)]


class _Int8Pack(nn.Module):
    """Per-channel int8 weights through ``aten._weight_int8pack_mm`` with bf16 activations: the kernel inductor's
    weight-only-int8 pattern lowers to on a CPU."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        self.register_buffer("q", torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale)


def _dynamic_int8(linear: nn.Linear) -> nn.Module:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    return quantize_dynamic(nn.Sequential(linear), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)[0]


def _bf16(linear: nn.Linear) -> nn.Module:
    out = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, dtype=torch.bfloat16)
    out.load_state_dict(linear.state_dict())
    return out


# name -> (convert one fp32 linear, activation dtype)
CANDIDATES = {
    "fp32 eager (MKL)": (lambda lin: lin, torch.float32),
    "fp16 weights, fp32 activations (fbgemm, the fp16 scheme)": (lambda lin: quantize_module(lin, "fp16"),
                                                                  torch.float32),
    "int8 dynamic, per channel (fbgemm, fractal's int8-dynamic)": (_dynamic_int8, torch.float32),
    "bf16 weights and activations (oneDNN)": (_bf16, torch.bfloat16),
    "int8 weight-only, bf16 activations (aten._weight_int8pack_mm)": (_Int8Pack, torch.bfloat16),
    "int8 weight-only (torchao Int8WeightOnlyConfig, the int8 scheme)": (lambda lin: quantize_module(lin, "int8"),
                                                                         torch.float32),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sm = load_model(a.model, device="cpu", dtype="float32")
    base = _linears(sm)
    fp32_bytes = sum(lin.weight.numel() * 4 for lin in base)
    rows = [int(r) for r in a.rows.split(",")]
    results, ref = [], {}
    with torch.inference_mode():
        for name, (convert, act) in CANDIDATES.items():
            try:
                mods = [convert(lin) for lin in base]
            except Exception as e:  # a candidate this machine cannot build is reported, not fatal
                results.append({"kernel": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"})
                continue
            ratio = sum(weight_bytes(m) for m in mods) / fp32_bytes
            row = {"kernel": name, "byte_ratio": round(ratio, 3), "ms": {}, "vs_fp32": {}}
            for k in rows:
                xs = {d: torch.randn(k, d, dtype=act) for d in {lin.in_features for lin in base}}

                def step(mods=mods, xs=xs):
                    for lin, m in zip(base, mods, strict=True):
                        m(xs[lin.in_features])

                t, _ = timing.time_call(step, repeats=a.repeats, warmup=2)
                row["ms"][k] = round(t.median * 1e3, 3)
                if name.startswith("fp32"):
                    ref[k] = t.median
                row["vs_fp32"][k] = round(t.median / ref[k], 3) if k in ref else None
            results.append(row)
            print(json.dumps(row), flush=True)
            del mods
    here = probe("cpu")
    out = {"command": " ".join(["python", *sys.argv]), "model": a.model, "threads": a.threads,
           "torch": torch.__version__, "cpu": here.describe(), "python": platform.python_version(),
           "what": "all of the model's nn.Linear weights, one k-row product each, median ms", "results": results}
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
