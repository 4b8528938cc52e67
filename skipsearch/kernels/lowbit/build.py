"""Building and loading the low-bit kernels' C++ extension (the products of ``csrc/lowbit.cpp`` and the attention of
``csrc/attention.cpp``), once per torch version, CPU and source.

The extension is compiled by ``torch.utils.cpp_extension`` with the C++ compiler that inductor's CPU backend
already needs (``$CXX``, else ``c++``), at ``-O3 -march=native``: it is built on the machine that runs it, for
that machine's vector unit. Its directory, under ``~/.cache/skipsearch/lowbit/``, is named by the torch
version and a hash of the CPU's flags, the compiler, the flags and the sources, so another CPU (a shared home
directory), another compiler or an edited source builds anew instead of loading a binary built for another.

A machine that cannot build it (no compiler, no ninja, not x86-64, a compiler error) gets one ConfigError
line, with the compiler's first error line; the failure is remembered for the process.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from pathlib import Path

from skipsearch.config import ConfigError

SOURCES = tuple(Path(__file__).resolve().parent / "csrc" / name for name in ("lowbit.cpp", "dq.cpp", "attention.cpp"))
NAME = "skipsearch_lowbit"
CFLAGS = ("-O3", "-march=native", "-fopenmp")  # -fopenmp: at::parallel_for is OpenMP in torch's CPU builds
LDFLAGS = ("-fopenmp",)
X86_64 = ("x86_64", "amd64")

_STATE: dict[str, object] = {}  # "ok": True once loaded; "error": the ConfigError line of a failed build


def compiler() -> str:
    """The compiler cpp_extension calls: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX") or "c++"


def cpu_flags() -> str:
    """The CPU's feature flags (Linux: /proc/cpuinfo), else what ``platform`` says of the processor."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def build_dir() -> Path:
    """Where this torch, CPU, compiler and source build (``~/.cache/skipsearch/lowbit/torch-<v>-<hash>``)."""
    import torch

    from skipsearch.kept import cache_dir

    key = hashlib.sha256("\n".join((cpu_flags(), compiler(), " ".join(CFLAGS + LDFLAGS),
                                    *(hashlib.sha256(s.read_bytes()).hexdigest() for s in SOURCES))).encode()
                         ).hexdigest()[:16]
    return cache_dir() / "lowbit" / f"torch-{torch.__version__.replace('+', '-')}-{key}"


def first_error(text: str) -> str:
    """The line of a build log that says what went wrong: the compiler's first ``error``, else ninja's
    ``FAILED``, else the first line."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    for want in (lambda s: "error:" in s.lower() and "error building extension" not in s.lower(),
                 lambda s: s.startswith("FAILED"), lambda s: True):
        for line in lines:
            if want(line):
                return line[:300]
    return "no output"


def check_lowbit() -> None:
    """Build (first call, a minute or so) and load the extension; a one-line ConfigError where it cannot."""
    if _STATE.get("ok"):
        return
    if "error" in _STATE:
        raise ConfigError(str(_STATE["error"]))
    try:
        _load()
    except ConfigError as exc:
        _STATE["error"] = str(exc)
        raise
    _STATE["ok"] = True


def _refuse(reason: str) -> ConfigError:
    return ConfigError(f"the int8/int4 weight-only CPU kernels cannot be built here: {reason}")


def _load() -> None:
    machine = platform.machine().lower()
    if machine not in X86_64:
        raise _refuse(f"they are written for x86-64 CPUs, and this one is {machine or 'unknown'}")
    if shutil.which(compiler()) is None:
        raise _refuse(f"no C++ compiler ({compiler()!r}; set $CXX to g++ or clang++)")
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    if not cpp_extension.is_ninja_available():
        raise _refuse("torch builds extensions with ninja, which is not installed (pip install ninja)")
    directory = build_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(f"cannot write its build folder {directory}: {exc.strerror or exc}; set SKIPSEARCH_CACHE to "
                      "a writable folder") from None
    try:
        cpp_extension.load(NAME, [str(s) for s in SOURCES], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                           build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as exc:  # the compiler's or ninja's failure, with the build log in its message
        raise _refuse(f"{compiler()} failed: {first_error(exc)}") from None
    _register_fakes()


def _put_ninja_on_path() -> None:
    """torch finds ninja on PATH; the PyPI package (a dependency) installs it beside the interpreter, which a venv's
    python run by its path (``.venv/bin/python``) does not put on PATH."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _register_fakes() -> None:
    """Shapes for torch.compile: each product returns x's leading dimensions by n, in fp32; the attention q's
    shape, contiguous."""
    import torch

    @torch.library.register_fake("skipsearch::int8_wo_linear")
    def _(x, w, scale, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::int4_wo_linear")
    def _(x, w, scales, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::f32_panel_linear")
    def _(x, w, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::q4_1_panel_linear")
    def _(x, codes, dm, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::q8_0_panel_linear")
    def _(x, codes, d, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::bf16_panel_linear")
    def _(x, codes, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::int8_dq_linear")
    def _(x, w, scale, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::int4_dq_linear")
    def _(x, w, scales, bias, n):
        return x.new_empty((*x.shape[:-1], n))

    @torch.library.register_fake("skipsearch::gqa_attention")
    def _(q, k, v, mask, scale):
        return q.new_empty(q.shape)


def isas() -> list[str]:
    """The vector paths compiled into this build, widest (the one that runs) first: avx512, avx2, scalar."""
    import torch

    check_lowbit()
    return list(torch.ops.skipsearch.lowbit_isas())


def use_isa(name: str) -> str:
    """Run the ops on the compiled path ``name`` from now on (tests check every path); returns the previous."""
    import torch

    check_lowbit()
    return str(torch.ops.skipsearch.lowbit_use_isa(name))


def dq_paths() -> list[str]:
    """The paths of the int8-activation products (``csrc/dq.cpp``) in this build, the one that runs first:
    avx512-vnni where the CPU has AVX-512 VNNI, and scalar (plain C++, the tests' reference)."""
    import torch

    check_lowbit()
    return list(torch.ops.skipsearch.dq_paths())


def has_vnni() -> bool:
    """Whether the int8-activation products run on VNNI dot products here (else they are plain C++, slower than the
    weight-only products, and the schemes keep those)."""
    return dq_paths()[0] != "scalar"


def use_dq_path(name: str) -> str:
    """Run the int8-activation products on ``name`` from now on (tests check both); returns the previous."""
    import torch

    check_lowbit()
    return str(torch.ops.skipsearch.dq_use_path(name))
