"""What a custom op costs to call from a compiled graph's C++ wrapper: ``aoti_torch_call_dispatcher`` (how the
``panel`` kernel's graphs call skipsearch's products: by name, boxed) against a typed operator handle looked up
once, per call, on a tiny product (K = N = 32: the call alone) and on a layer's q/k/v product (K 576, N 960, its
weights in cache). Built with torch's cpp_extension.load_inline.

    .venv/bin/python studies/int8-target/dispatch_cost.py        (alone on the machine)
"""

from __future__ import annotations

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <chrono>

double via_shim(at::Tensor x, at::Tensor w, at::Tensor s, int64_t n, int64_t iters) {
  auto* hx = reinterpret_cast<AtenTensorHandle>(new at::Tensor(x));
  auto* hw = reinterpret_cast<AtenTensorHandle>(new at::Tensor(w));
  auto* hs = reinterpret_cast<AtenTensorHandle>(new at::Tensor(s));
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {  // as the generated wrapper does: new handles, the call, the output freed
    AtenTensorHandle ax, aw, as;
    aoti_torch_new_tensor_handle(hx, &ax);
    aoti_torch_new_tensor_handle(hw, &aw);
    aoti_torch_new_tensor_handle(hs, &as);
    std::array<StableIValue, 5> v{torch::stable::detail::from(ax), torch::stable::detail::from(aw),
                                  torch::stable::detail::from(as), torch::stable::detail::from(std::nullopt),
                                  torch::stable::detail::from(n)};
    aoti_torch_call_dispatcher("skipsearch::int8_wo_linear", "", v.data());
    aoti_torch_delete_tensor_object(torch::stable::detail::to<AtenTensorHandle>(v[0]));
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / iters;
}

double via_typed(at::Tensor x, at::Tensor w, at::Tensor s, int64_t n, int64_t iters) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("skipsearch::int8_wo_linear", "").typed<
      at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t)>();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) op.call(x, w, s, std::nullopt, n);
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / iters;
}
"""


def main() -> None:
    from skipsearch.kernels.lowbit.build import check_lowbit

    torch.set_num_threads(2)
    check_lowbit()  # skipsearch's ops registered
    m = load_inline("skipsearch_dispatch_cost", cpp_sources=SOURCE, functions=["via_shim", "via_typed"],
                    extra_cflags=["-O2"])
    for K, N, iters in ((32, 32, 20000), (576, 960, 2000)):
        x, s = torch.randn(1, K), torch.rand(N)
        w = torch.randint(-127, 127, (N // 32, K, 32), dtype=torch.int8)
        for _ in range(2):
            a, b = m.via_shim(x, w, s, N, iters), m.via_typed(x, w, s, N, iters)
            print(f"K={K} N={N}: aoti_torch_call_dispatcher {a * 1e6:.2f} us/call, typed handle {b * 1e6:.2f} us/call")


if __name__ == "__main__":
    main()
