"""Kernels: what runs the full model's forwards (plain steps and verifies), chosen per device and thread count.

A *kernel* is an implementation of the same fp32 (or bf16/fp16) forward, not another model: which one runs
changes the speed and, through rounding, nothing else that greedy decoding can see (checked, not assumed:
``skipsearch costs`` compares the argmax of every timed block with the eager kernel's, and the tests and
``bench`` compare every output with HF greedy).

Each kernel is one module here that exports one ``KERNEL`` record (``base.KernelSpec``: its name and block sizes,
its device check, what it builds); what they share (the ``Kernel`` value files record, the runner a compiled
kernel builds and its report, parsing and checking) is in ``base.py``. Adding a kernel is its module plus one
``register(...)`` line below.

- ``eager`` (``eager.py``): HF's modeling code over a DynamicCache, on any device;
- ``inductor`` (``inductor.py``): ``torch.compile`` of the whole model over a StaticCache, a one-token graph and
  blocks of ``chunk`` tokens (``inductor-c4``), on CPUs;
- ``panel`` (``panel.py``): inductor's graphs, with every forward over more than one row (a verify block, a batch)
  on skipsearch's fp32 panel product (``lowbit``), which streams the weights once for all rows (``panel-c8``).

No torch at import: the CLI validates ``--kernel`` before anything loads.
"""

from __future__ import annotations

from skipsearch.kernels.base import (
    DEFAULT_CHUNK,
    REGISTRY,
    Kernel,
    KernelReport,
    KernelRunner,
    KernelSpec,
    check_kernel,
    choose_kernel,
    names,
    parse_kernel,
    register,
)

__all__ = ["DEFAULT_CHUNK", "EAGER", "REGISTRY", "Kernel", "KernelReport", "KernelRunner", "KernelSpec", "check_kernel",
           "choose_kernel", "names", "parse_kernel", "register"]

# The registry: one line per kernel (its module, then its record).
from skipsearch.kernels import eager; register(eager.KERNEL)  # noqa: E402, E702, I001
from skipsearch.kernels import inductor; register(inductor.KERNEL)  # noqa: E402, E702, I001
from skipsearch.kernels import panel; register(panel.KERNEL)  # noqa: E402, E702, I001
from skipsearch.kernels import cudagraph; register(cudagraph.KERNEL)  # noqa: E402, E702, I001

EAGER = Kernel()  # what runs when nothing is chosen: HF's own forward
