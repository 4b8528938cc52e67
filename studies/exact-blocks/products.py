"""smollm2-135m's linears (the LM head included) on each product the panel kernel can hold them in, at 1, 2, 4 and 8
rows: fp32 panels, bf16 (what a bf16 checkpoint's weights would be held as: here the model's weights rounded to bf16,
another model, for the time alone), Q4_1 (the linears) and Q8_0 (the head), each summed over all linears, the
products alternating in every round; median of ``--rounds``.

    .venv/bin/python studies/exact-blocks/products.py [--threads 2] [--rounds 11]     (alone on the machine)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=11)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch
    from torch import nn

    torch.set_num_threads(a.threads)
    from skipsearch.kernels.lowbit.exact import B16PanelLinear, exact_panel_linear, fit_bf16
    from skipsearch.kernels.lowbit.modules import F32PanelLinear
    from skipsearch.model.loader import load_model

    sm = load_model("smollm2-135m", device="cpu", dtype="float32")
    linears = [m for m in sm.hf.modules() if isinstance(m, nn.Linear)]
    forms = {
        "fp32 panels": [F32PanelLinear.from_linear(m) for m in linears],
        "bf16": [B16PanelLinear(fit_bf16(m.weight.bfloat16().float()), None) for m in linears],
        "exact blocks (Q4_1, head Q8_0)": [exact_panel_linear(m) for m in linears],
    }
    out = {"threads": a.threads, "rounds": a.rounds, "linears": len(linears),
           "mb": {k: round(sum(m.weight_bytes for m in v) / 1e6, 1) for k, v in forms.items()}, "ms": {}}
    with torch.no_grad():
        for rows in (1, 2, 4, 8):
            xs = [torch.randn(rows, m.in_features) for m in linears]
            times = {k: [] for k in forms}
            for r in range(a.rounds + 1):
                for k in (list(forms) if r % 2 else list(reversed(forms))):
                    t = time.perf_counter()
                    for m, x in zip(forms[k], xs, strict=True):
                        m(x)
                    if r:  # the first round warms
                        times[k].append(time.perf_counter() - t)
            out["ms"][rows] = {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
