"""Roofline cost files: a device's costs modelled from a model's shapes and the device's peak figures, with
nothing timed (``skipsearch costs --roofline GPU --model M``), so a profile made on one machine can be re-planned
for a GPU nobody here has (``plan --profile P --costs C``).

- ``shapes``: the model's shapes, from its config.json (no weights) or a table of published architectures;
- ``arithmetic``: bytes and FLOPs per piece, each priced max(bytes / bandwidth, FLOPs / throughput) + launches;
- ``devices``: the GPU table and its sources, the calibrated efficiencies, the draft schemes' bytes;
- ``probe``: this CPU's bandwidth, throughput and launch cost, measured through the one timer.

The file says ``source: roofline`` and carries its figures and their sources, and every command that uses one
says in one line that its figures are a model, not a measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from skipsearch.config import ConfigError
from skipsearch.files.cost_profile import DEFAULT_BATCH_SIZES, CostModelRef, CostProfile, CostRun
from skipsearch.files.costs import RooflineInfo
from skipsearch.roofline import devices
from skipsearch.roofline.arithmetic import DTYPE_BYTES, Machine, batched_of, costs_of
from skipsearch.roofline.devices import DEFAULT_LAUNCH_US, GPUS, Device
from skipsearch.roofline.shapes import ARCHITECTURES, Shapes, resolve_shapes

DEFAULT_CONTEXT = 512  # KV-cache positions the step is priced at, when --context-tokens is not given
CPU = "cpu"


def _given_device(key: str, bandwidth_gb_s: float | None, tflops: float | None, dtype: str) -> Device:
    """A device named on the command line with its figures (both needed)."""
    if bandwidth_gb_s is None or tflops is None:
        raise ConfigError(f"unknown GPU '{key}' for --roofline: known are {devices.known()}, and cpu; a device "
                          f"given by hand needs both of {devices.FIGURE_FLAGS}")
    return Device(key, key, "gpu", bandwidth_gb_s, ((dtype, tflops),), source="given on the command line")


def _check_figures(**figures: float | None) -> None:
    for flag, value in figures.items():
        if value is not None and not (value > 0 and value < float("inf")):
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive number, got {value}")


def _scheme_names(kind: str, schemes: Sequence[str] | None) -> tuple[str, ...]:
    """The draft schemes to price: those asked for, each one skipsearch runs on a ``kind`` device, else the
    device kind's defaults."""
    scheme_bytes = devices.SCHEME_BYTES[kind]
    names = tuple(schemes) if schemes is not None else devices.DEFAULT_SCHEMES[kind]
    for name in names:
        if name not in scheme_bytes:
            raise ConfigError(f"a {kind} roofline prices the draft schemes skipsearch runs on a {kind}: "
                              f"{', '.join(scheme_bytes)}; not {name}")
    return names


def _efficiency(table: Device, efficiency: float | None, *, on_cpu: bool) -> tuple[float, str]:
    """Achieved / peak bandwidth and where it comes from: given, 1 on a CPU (its probe measures achieved
    bandwidth), else the GPU family's calibrated value."""
    if on_cpu:
        return efficiency or 1.0, ("given" if efficiency else "1: the probe's copy is already achieved bandwidth")
    if efficiency is not None:
        return efficiency, "given"
    return devices.efficiency_of(table)


def roofline_cost_profile(*, device: str, model: str = "smollm2-135m", dtype: str = "auto",
                          bandwidth_gb_s: float | None = None, tflops: float | None = None,
                          efficiency: float | None = None, launch_us: float | None = None,
                          context_tokens: int | None = None, schemes: Sequence[str] | None = None,
                          repeats: int = 9, command: str | None = None,
                          batch_sizes: Sequence[int] | None = None) -> CostProfile:
    """A roofline cost profile of ``model`` on ``device`` (a key of ``devices.GPUS``, ``cpu`` for this CPU with its
    figures probed, or any name with ``bandwidth_gb_s`` and ``tflops`` given). Figures given override the table's
    or the probe's. ``batch_sizes``: the batched grid it models (default ``costs.DEFAULT_BATCH_SIZES``). Every bad
    input is one ConfigError (or ModelError) line, before anything is probed."""
    _check_figures(bandwidth=bandwidth_gb_s, tflops=tflops, efficiency=efficiency)
    if launch_us is not None and not 0 <= launch_us < float("inf"):
        raise ConfigError(f"--launch-us must be a number >= 0, got {launch_us}")
    if context_tokens is not None and context_tokens < 0:
        raise ConfigError(f"--context-tokens must be >= 0, got {context_tokens}")
    # 1. the device: the table's, this CPU's, or one given by hand (an unknown name without figures is one line)
    key = device.strip().lower()
    on_cpu = key == CPU
    table = None if on_cpu else devices.gpu(key, given=bandwidth_gb_s is not None and tflops is not None)
    kind = "cpu" if on_cpu else "gpu"
    dtype = ("float32" if on_cpu else "bfloat16") if dtype == "auto" else dtype
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype} for a roofline: use {', '.join(DTYPE_BYTES)} (or auto)")
    scheme_bytes = devices.SCHEME_BYTES[kind]
    names = _scheme_names(kind, schemes)
    # 2. the model's shapes (config only) before anything is probed
    shapes = resolve_shapes(model)
    if table is None and not on_cpu:
        table = _given_device(key, bandwidth_gb_s, tflops, dtype)
    # 3. the figures
    probed = None
    if on_cpu and (bandwidth_gb_s is None or tflops is None or launch_us is None):
        from skipsearch.engine import timing
        from skipsearch.roofline.probe import probe_cpu

        t0 = timing.now()
        probed = probe_cpu(dtype=dtype, repeats=repeats)
        probe_seconds = round(timing.now() - t0, 1)  # the probe's wall time, for the run block
    if on_cpu:
        from skipsearch.hardware import probe

        name = probe("cpu").cpu_model or "this CPU"
        table = Device(CPU, name, "cpu", bandwidth_gb_s or probed.bandwidth_gb_s,
                       ((dtype, tflops or probed.tflops),),
                       source="probed on this machine" if probed else "given on the command line")
    given = [flag for flag, v in (("bandwidth", bandwidth_gb_s), ("tflops", tflops)) if v is not None]
    bandwidth = bandwidth_gb_s or table.bandwidth_gb_s
    peak = tflops or table.peak_tflops(dtype)
    if peak is None:
        raise ConfigError(f"{table.name} has no {dtype} throughput in the table: give it with --tflops, or pick "
                          f"another --dtype ({', '.join(d for d, _ in table.tflops if d in DTYPE_BYTES)})")
    eff, eff_source = _efficiency(table, efficiency, on_cpu=on_cpu)
    launch = launch_us if launch_us is not None else (probed.launch_us if probed else DEFAULT_LAUNCH_US)
    if not on_cpu and "fp8" in names and not table.has_fp8:
        names = tuple(n for n in names if n != "fp8")  # fp8 needs compute capability 8.9 (Ada, Hopper)
    # 4. the arithmetic
    context = DEFAULT_CONTEXT if context_tokens is None else context_tokens
    machine = Machine(bandwidth * 1e9 * eff, peak * 1e12, launch * 1e-6)
    costs = costs_of(shapes, machine, context=context, act_bytes=DTYPE_BYTES[dtype],
                     schemes={n: scheme_bytes[n] for n in names})
    batched = batched_of(shapes, machine, context=context, act_bytes=DTYPE_BYTES[dtype],
                         batch_sizes=DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes,
                         schemes={n: scheme_bytes[n] for n in names})
    figures = table.source + (f"; {' and '.join(given)} given on the command line" if given and table.source
                              and not table.source.startswith("given") else "")
    info = RooflineInfo(device=table.name, key=table.key, bandwidth_gb_s=round(bandwidth, 3),
                        tflops=round(peak, 4), efficiency=round(eff, 4), efficiency_source=eff_source,
                        launch_us=round(launch, 4), figures_source=figures, shapes_source=shapes.source)
    return CostProfile(
        model=CostModelRef(shapes.name, shapes.num_layers, shapes.architecture, shapes.fingerprint),
        device=CPU if on_cpu else "cuda", dtype=dtype, costs=costs, environment=_environment(table, on_cpu),
        run=CostRun(context_tokens=context, repeats=probed.repeats if probed else None,
                    threads=probed.threads if probed else None, seconds=probe_seconds if probed else None,
                    command=command),
        roofline=info, batched=batched)


def _environment(device: Device, on_cpu: bool):
    """The environment a roofline file names: this machine for a CPU probed here, else the GPU modelled."""
    from skipsearch.profile import Environment

    here = Environment.current("cpu")
    if on_cpu:
        return here
    return dataclasses.replace(here, device="cuda", device_name=device.name, device_choice=None, cpu_model=None,
                               cpu_capability=None, threads=None, gpu_name=device.name,
                               gpu_capability=device.capability)


def default_path(cp: CostProfile) -> Path:
    """costs/roofline-<device key>-<dtype>.yaml"""
    key = cp.roofline.key if cp.roofline and cp.roofline.key else cp.device
    return Path("costs") / f"roofline-{key}-{cp.dtype}.yaml"


def shapes_of(model: str) -> Shapes:
    """``--model``'s shapes, as the roofline reads them (for people and scripts)."""
    return resolve_shapes(model)


__all__ = ["ARCHITECTURES", "CPU", "DEFAULT_CONTEXT", "GPUS", "default_path", "roofline_cost_profile", "shapes_of"]
