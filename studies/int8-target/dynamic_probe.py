"""The int8-dynamic prototype's product (``int8-dynamic.patch``: ``skipsearch::int8_dyn_linear``) against torchao's
own ``Int8DynamicActivationInt8WeightConfig`` linear, bit for bit: on every path the build has (AVX-512 VNNI, AVX2,
plain C++), for 5 shapes (biases, a 49,152-row head) at 1 to 13 rows, and each row alone against the same row in a
block. Prints the paths and the number of mismatches.

    git apply studies/int8-target/int8-dynamic.patch     (on 69bebba, in a worktree)
    .venv/bin/python studies/int8-target/dynamic_probe.py
"""

from __future__ import annotations

import warnings

import torch


def main() -> None:
    warnings.filterwarnings("ignore")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    from skipsearch.kernels.lowbit import Int8DynLinear, check_lowbit, dyn_paths, use_dyn_path

    check_lowbit()
    print(dyn_paths())
    torch.manual_seed(0)
    bad = 0
    for k, n, bias in ((576, 1536, False), (1536, 576, False), (64, 33, True), (576, 49152, False), (36, 70, True)):
        lin = torch.nn.Linear(k, n, bias=bias)
        mod = Int8DynLinear.from_linear(lin)
        ref = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias))
        ref[0].load_state_dict(lin.state_dict())
        quantize_(ref, Int8DynamicActivationInt8WeightConfig())
        for m in (1, 2, 3, 7, 13):
            x = torch.randn(m, k) * torch.rand(m, 1) * 5
            with torch.no_grad():
                y_ref = ref(x)
            for path in dyn_paths():
                use_dyn_path(path)
                y = mod(x)
                if not torch.equal(y, y_ref):
                    bad += 1
                    print("mismatch", k, n, bias, m, path, (y - y_ref).abs().max().item())
                if not torch.equal(torch.cat([mod(x[i:i + 1]) for i in range(m)]), y):
                    bad += 1
                    print("a row alone differs", k, n, bias, m, path)
    print("mismatches:", bad)


if __name__ == "__main__":
    main()
