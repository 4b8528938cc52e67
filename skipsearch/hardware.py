"""The hardware a figure was measured on, and whether this machine is the same.

Speedups, the cost model's c and v(k), and a chosen K belong to the machine that timed them: another
CPU (another ISA level, another core count) or GPU changes them. Profiles and cost files record
``probe()``'s answer in their ``environment``; ``decode``, ``bench`` and ``plan`` compare it with
this machine's and say so in one line when it differs, pointing at ``skipsearch plan --costs``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from dataclasses import dataclass
from typing import Any

FIELDS = ("cpu_model", "cpu_capability", "threads", "gpu_name", "gpu_capability")  # environment keys


@dataclass(frozen=True)
class Hardware:
    cpu_model: str | None = None  # /proc/cpuinfo's "model name", else platform's processor
    cpu_capability: str | None = None  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, DEFAULT, ...
    threads: int | None = None  # torch intra-op threads
    gpu_name: str | None = None  # CUDA only
    gpu_capability: str | None = None  # CUDA only: "8.0", "9.0", ...

    @property
    def gpu(self) -> bool:
        return self.gpu_name is not None

    @property
    def known(self) -> bool:
        return self.gpu_name is not None or self.cpu_model is not None or self.cpu_capability is not None

    def identity(self) -> tuple:
        """What decides whether figures carry over: the GPU on CUDA, else CPU model, ISA level and threads."""
        if self.gpu:
            return ("gpu", self.gpu_name, self.gpu_capability)
        return ("cpu", self.cpu_model, self.cpu_capability, self.threads)

    def describe(self) -> str:
        if self.gpu:
            return f"{self.gpu_name} (compute capability {self.gpu_capability or '?'})"
        threads = f", {self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        return f"{self.cpu_model or 'an unnamed CPU'} ({self.cpu_capability or 'ISA unknown'}{threads})"

    def to_environment(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FIELDS}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


@functools.cache
def cpu_signature() -> str:
    """A short name for this exact CPU, for keying compiled code that may only run on it: its family and model
    numbers and a hash of its vendor, model name and instruction-set flags (/proc/cpuinfo), e.g.
    ``f25m17-3fa09c2e``. Two CPUs that print the same model name ("AMD EPYC" under some hypervisors) but
    differ in ISA get different signatures. Best effort: "<machine>-<hash of platform>" where nothing is readable.
    Read once a process: the CPU does not change under it."""
    import hashlib

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not key:
                    break  # the first processor's block is enough
                fields.setdefault(key, " ".join(value.split()))
    except OSError:
        pass
    seen = [fields.get(k, "") for k in ("vendor_id", "cpu family", "model", "model name", "flags", "Features")]
    digest = hashlib.sha256("\n".join(seen or [platform.platform()]).encode()).hexdigest()[:8]
    family, model = fields.get("cpu family"), fields.get("model")
    if family and model and family.isdigit() and model.isdigit():
        return f"f{family}m{model}-{digest}"
    if not any(seen):
        digest = hashlib.sha256(f"{platform.machine()} {platform.processor()}".encode()).hexdigest()[:8]
    return f"{platform.machine() or 'cpu'}-{digest}"


def probe(device: str = "cpu") -> Hardware:
    """This machine, as a profile or cost file made here on ``device`` would record it. Best effort: a
    field that cannot be read is None, never an error."""
    try:
        import torch
    except ImportError:  # reading files never needs torch
        return Hardware(cpu_model=_cpu_model(), threads=os.cpu_count())
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        capability = None
    gpu_name = gpu_capability = None
    if str(device).startswith("cuda") or device == "auto":
        try:
            if torch.cuda.is_available():
                index = str(device).partition(":")[2]
                dev = int(index) if index.isdigit() else torch.cuda.current_device()
                gpu_name = torch.cuda.get_device_name(dev)
                gpu_capability = "{}.{}".format(*torch.cuda.get_device_capability(dev))
        except Exception:
            gpu_name = gpu_capability = None
    return Hardware(cpu_model=_cpu_model(), cpu_capability=capability, threads=torch.get_num_threads(),
                    gpu_name=gpu_name, gpu_capability=gpu_capability)


def machine_key(device: str = "cpu") -> str:
    """Which machine a timing belongs to, as a study records it on each timed trial: the GPU on CUDA, else this
    exact CPU (``cpu_signature``: family, model and ISA) and the thread count. A search that resumes a study times
    again what another machine timed (search/study/shipping.py)."""
    here = probe(device)
    if here.gpu:
        return f"{here.gpu_name} (compute capability {here.gpu_capability})"
    return f"{cpu_signature()}, {here.threads} thread{'s' if here.threads != 1 else ''}"


def recorded(environment: Any) -> Hardware | None:
    """The hardware an ``Environment`` (a profile's or cost file's) names, or None when the file predates
    the fields (or has no environment)."""
    if environment is None:
        return None
    hw = Hardware(**{k: getattr(environment, k, None) for k in FIELDS})
    return hw if hw.known else None


def mismatch(environment: Any, here: Hardware, *, what: str, replan: str) -> str | None:
    """One line when ``environment`` (of the file ``what``) was measured on other hardware than ``here``,
    or on hardware it does not name; None when it matches. ``replan``: the command that re-plans it."""
    then = recorded(environment)
    advice = f"its figures may not hold here; re-plan with `{replan}`"
    if then is None:
        return f"{what}: measured on unknown hardware (the file predates hardware records); this machine is " \
               f"{here.describe()}: {advice}"
    if then.identity() == here.identity():
        return None
    return f"{what}: measured on {then.describe()}; this machine is {here.describe()}: {advice}"


# -- the environment a profile or cost file records --------------------------------------------------------
@dataclass(frozen=True)
class Environment:
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    skipsearch: str | None = None
    device_name: str | None = None
    device: str | None = None  # cpu, cuda, cuda:N, or auto (the layers spread over several GPUs)
    device_choice: str | None = None  # how --device and --dtype were resolved, e.g. "device auto: no CUDA device; ..."
    # the hardware the figures were measured on (skipsearch.hardware; absent in files written before them)
    cpu_model: str | None = None  # /proc/cpuinfo's model name
    cpu_capability: str | None = None  # torch's CPU capability (ISA level): AVX2, AVX512, DEFAULT, ...
    threads: int | None = None  # torch intra-op threads
    gpu_name: str | None = None  # CUDA only
    gpu_capability: str | None = None  # CUDA only, e.g. "9.0"

    @classmethod
    def current(cls, device: str = "cpu", *, placement: Any = None) -> Environment:
        """This machine. ``placement``: the loaded model's (``SkippableModel.placement``), recorded
        with its reason; without it only ``device`` is."""
        versions = {name: _version(name) for name in ("torch", "transformers", "skipsearch")}
        where = getattr(placement, "device", None) or device
        return cls(python=platform.python_version(), device_name=_device_name(device), device=where,
                   device_choice=getattr(placement, "reason", None), **versions,
                   **probe(str(where)).to_environment())


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return platform.processor() or "cpu"
    try:
        import torch  # here, so that reading and writing profiles never needs torch

        return torch.cuda.get_device_name(device)
    except Exception:  # provenance is best-effort: a missing driver must not fail a run
        return None
