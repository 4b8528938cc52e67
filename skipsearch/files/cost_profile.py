"""Cost profiles: what one device charges for each piece of a decoding step, measured once and kept apart.

A draft profile's speedup belongs to the machine that timed it. What the surrogate needs from that
machine is small: one full step, one attention and one MLP sublayer, the fixed remainder (embedding,
norms, LM head, per-forward overhead) and the verify curve v(k). ``skipsearch costs`` measures exactly
that with ``objective.measure_costs`` (the objective's own measurement, at optimize's calibration
context) and writes it here as a small versioned YAML file. Acceptance, which belongs to the model, the
skip set and the workload, is kept in the draft profile (each method's record: skipsearch.search.replan), so that
``plan --profile x.yaml --costs costs/<device>.yaml`` re-plans a profile for another device, and
``optimize --study S --costs ... --budget 0`` re-ranks a study, with no new search.

Reading validates every key, and every problem is one line naming the file (``CostsError``, a
``ProfileError``, so the CLI prints it and exits 2). A cost file is refused for a model with another
layer count or another architecture: its per-sublayer costs would describe other layers.
This module needs no torch until a cost model is built or measured.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from skipsearch.config import NATIVE, PRECISIONS, ConfigError, DraftConfig
from skipsearch.files.costs import (
    BatchedCosts,
    CostModel,
    Costs,
    PlannedCosts,
    RooflineInfo,
    batched_from_dict,
    batched_to_dict,
    costs_from_dict,
    costs_to_dict,
    roofline_from_dict,
    roofline_to_dict,
)
from skipsearch.files.errors import CostsError, ProfileError
from skipsearch.files.targets import COSTS, misplaced
from skipsearch.files.yamlio import Dumper, plain, read_yaml, section, write_atomic
from skipsearch.hardware import Environment
from skipsearch.kernels import parse_kernel

_log = logging.getLogger(__name__)

# Schema versions of cost files (as in profile.py: bump on any change of shape or meaning, add an upgrade).
#   1: first version: schema_version, model {name, num_layers, architecture, fingerprint}, device, dtype,
#      environment (a profile's environment keys), run {context_tokens, repeats, threads, seconds, command},
#      costs {step_seconds, attn_seconds, mlp_seconds, fixed_seconds, lm_head_seconds, verify_ratio}.
#      Added since, optional, so every earlier file reads as it was: source (measured, the default, or
#      roofline) and roofline {device, key, bandwidth_gb_s, tflops, efficiency, efficiency_source, launch_us,
#      figures_source, shapes_source} (skipsearch.roofline: figures modelled, not timed). A reader older than
#      them refuses a roofline file by its unknown key, so no skipsearch takes one for a measured file.
#   2: optional ``kernel`` {verify, drafts, compile_seconds}: which kernel (skipsearch.kernels) the step and v(k)
#      were timed through and whether drafts ran compiled; costs.eager_step_seconds (the eager step the
#      per-sublayer parts split, when the step is a compiled kernel's) and costs.schemes.<s>.whole_seconds (the
#      compiled whole-model draft). A version-1 file is a version-2 file timed with the eager kernel.
#   3: optional ``batched`` {kernel, context_tokens, tokens, rows: [{batch_size, verify_seconds, draft_seconds}]}
#      (``costs --batch-sizes``, and every roofline file): per batch size B, a forward of B x T tokens at each T and
#      each draft scheme's one-token step at B (files.costs.BatchedCosts), what the schedule planner reads
#      (skipsearch.files.schedule). A version-2 file is a version-3 file without the grid. draft_seconds is optional per
#      row: the first measured grids had none (c(B) was modelled by roofline files only), and the planner grows a
#      draft with no c(B) as the full step (its schedule's basis says so).
#      Added since, optional: model.precision (the target the step, the sublayers and v(k) were timed on, as a
#      profile's model.precision: skipsearch.model.target; ``costs --target-precision int8``), written only where it
#      is not native, so every earlier file reads as a native target's. A reader older than it refuses an int8
#      target's file by its unknown key.
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)  # the grid a roofline file models when no --batch-sizes is given
VERIFY_SIZES = (1, 2, 3, 4, 6, 9, 13)  # v(k) is timed at these k (13: a K = 12 draft's verify), interpolated between
_HEADER = "# skipsearch cost profile"
_TOP_KEYS = ("schema_version", "source", "model", "device", "dtype", "environment", "run", "roofline", "kernel",
             "costs", "batched")
MEASURED, ROOFLINE = "measured", "roofline"  # a cost file's source: timed here, or modelled


# A cost file checked as a whole: the sublayers' sum over the step (the measurement derives fixed from the
# one-token forward, the step is the cycle with its read-back: close, but a tiny model's noisy medians reach 2x;
# far outside this is a broken or hand-edited file). Its v(k) is checked by files.costs.check_verify_curve.
SUBLAYERS_FIT = (0.05, 4.0)


@dataclass(frozen=True)
class CostModelRef:
    """The model the costs were measured on."""

    name: str
    num_layers: int
    # tensor names and shapes (the layout half of checkpoints.weights_fingerprint): the same architecture
    # costs the same whatever its weights, so a fine-tune reuses its base model's cost file
    architecture: str | None = None
    fingerprint: str | None = None  # models.arch_fingerprint (architecture and --model string), as profiles hold
    # the target the costs were timed on (skipsearch.model.target): None is native, the checkpoint's weights; int8
    # steps stream a quarter of the bytes, so a profile re-plans only with its own target's costs
    precision: str | None = None


@dataclass(frozen=True)
class CostRun:
    """How the costs were measured."""

    context_tokens: int | None = None  # the KV length the steps ran at
    repeats: int | None = None  # samples per quantity (medians)
    threads: int | None = None  # torch intra-op threads: costs on a CPU depend on them
    seconds: float | None = None  # wall time of the measurement
    command: str | None = None
    # "random:seed=N" where the model was its architecture with random weights (``costs --random-weights``): its
    # costs stand for the real model's, its acceptance does not; None: the checkpoint's own weights
    weights: str | None = None


@dataclass(frozen=True)
class CostKernel:
    """Which kernel (skipsearch.kernels) the costs were timed through."""

    verify: str = "eager"  # the full model's forwards: the step and v(k), e.g. inductor-c4
    drafts: str = "eager"  # "compiled" where drafts that compile (precision's) ran compiled, else eager
    compile_seconds: float | None = None  # building the compiled kernel, in that process
    # what the int8/int4 drafts' products took on a CPU: "int8 activations" (skipsearch's VNNI products) or
    # "fp32 activations" (its weight-only ones); None where neither ran (another device, no build, an older file)
    draft_activations: str | None = None


@dataclass(frozen=True)
class CostProfile:
    model: CostModelRef
    device: str
    dtype: str
    costs: Costs
    environment: Environment | None = None
    run: CostRun | None = None
    roofline: RooflineInfo | None = None  # set: the figures are a roofline model (skipsearch.roofline), not timed
    kernel: CostKernel = CostKernel()
    batched: BatchedCosts | None = None  # v(k, B) and c(B) per batch size (``costs --batch-sizes``); None: none
    schema_version: int = SCHEMA_VERSION

    @property
    def target_precision(self) -> str:
        """The target the costs were timed on (``model.target``): native unless the file names another."""
        return self.model.precision or NATIVE

    @property
    def source(self) -> str:
        """``roofline`` when the figures are modelled, ``measured`` when they were timed."""
        return ROOFLINE if self.roofline is not None else MEASURED

    def cost_model(self) -> CostModel:
        return cost_model_of(self.costs, self.model.num_layers)

    def describe(self) -> str:
        """A few lines for people: where, what one step costs, and how it splits."""
        c, L = self.costs, self.model.num_layers
        share = lambda s: f"{s * 1e3:.3f} ms ({s / c.step_seconds:.1%} of a step)"  # noqa: E731
        lines = [f"{self.model.name} ({L} layers) on {self.device}, {self.dtype}"
                 + (f", the {self.target_precision} target" if self.target_precision != NATIVE else "")
                 + (f", {self.run.threads} thread(s)" if self.run and self.run.threads else "")]
        if self.run is not None and self.run.weights is not None:
            lines.append(f"weights: {self.run.weights} (the architecture's costs, not its acceptance)")
        if self.roofline is not None:
            lines.append(f"not measured: {self.roofline.describe()}")
        else:
            lines.append(f"kernel: verify {self.kernel.verify}, drafts {self.kernel.drafts}"
                         + (f" (compiled in {self.kernel.compile_seconds:.0f} s)" if self.kernel.compile_seconds
                            else "")
                         + (f"; int8/int4 drafts on {self.kernel.draft_activations}"
                            if self.kernel.draft_activations else ""))
        lines += [f"step: {c.step_seconds * 1e3:.3f} ms", f"attention x {L}: {share(L * c.attn_seconds)}",
                  f"MLP x {L}: {share(L * c.mlp_seconds)}",
                  f"fixed (LM head, embedding, overhead): {share(c.fixed_seconds)}"]
        if c.lm_head_seconds is not None:
            lines.append(f"  of which LM head: {share(c.lm_head_seconds)}, the rest: {share(c.overhead_seconds)}")
        lines.append("v(k): " + ", ".join(f"{v:.2f}" for v in c.verify_ratio))
        lines.append(f"c of a draft that skips nothing: {self.cost_model().draft_ratio(DraftConfig()):.3f}")
        if self.batched is not None:
            lines += describe_batched(self.batched)
        for s in c.schemes:  # c of a draft with every sublayer and the head in the scheme
            lines.append(f"scheme {s.scheme}: attention x {L}: {share(L * s.attn_seconds)}, MLP x {L}: "
                         f"{share(L * s.mlp_seconds)}, head saves {s.head_saving_seconds * 1e3:.3f} ms; c of the "
                         f"whole model in {s.scheme}: {c.whole_model_ratio(s, L):.3f}")
        return "\n".join(lines)


# -- to and from dicts -------------------------------------------------------------------------------------
def _err(source: str, problem: str) -> CostsError:
    return CostsError(f"{source}: {problem}")


def cost_model_of(costs: Costs, num_layers: int) -> CostModel:
    """The objective's CostModel of a file's costs, which ``objective.replay`` charges drafts and verifies with."""
    return CostModel(costs.step_seconds, costs.attn_seconds, costs.mlp_seconds, costs.fixed_seconds,
                     costs.verify_ratio, num_layers, eager_step_seconds=costs.eager_step_seconds)


def costs_from_model(cm: CostModel, *, lm_head_seconds: float | None = None) -> Costs:
    """The serialisable half of a CostModel (its extras, costed for the planner only, are left out)."""
    return Costs(cm.step_seconds, cm.attn_seconds, cm.mlp_seconds, cm.fixed_seconds, tuple(cm.verify_ratio),
                 lm_head_seconds, eager_step_seconds=cm.eager_step_seconds)


def check_costs_whole(c: Costs, num_layers: int, *, path: str = "costs", source: str = "<costs>") -> None:
    """The per-sublayer costs must fit inside the step they split: L·(attn + mlp) + fixed is about step_seconds."""
    parts = num_layers * (c.attn_seconds + c.mlp_seconds) + c.fixed_seconds
    ratio = parts / c.parts_seconds
    if not math.isfinite(parts) or not SUBLAYERS_FIT[0] <= ratio <= SUBLAYERS_FIT[1]:
        raise _err(source, f"{path}: {num_layers} x (attn_seconds + mlp_seconds) + fixed_seconds = {parts:.4g} s "
                           f"does not fit the step of {c.parts_seconds:.4g} s it splits ({ratio:.3g} of it)")


def cost_profile_to_dict(cp: CostProfile) -> dict:
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    if cp.roofline is not None:  # a measured file is written as it always was
        out["source"] = ROOFLINE
    out.update({"model": plain(cp.model), "device": cp.device, "dtype": cp.dtype})
    for key in ("environment", "run"):
        if getattr(cp, key) is not None:
            out[key] = plain(getattr(cp, key))
    if cp.roofline is not None:
        out["roofline"] = roofline_to_dict(cp.roofline)
    if cp.kernel != CostKernel():
        out["kernel"] = {k: v for k, v in plain(cp.kernel).items() if v is not None}
    out["costs"] = costs_to_dict(cp.costs)
    if cp.batched is not None:
        out["batched"] = batched_to_dict(cp.batched)
    return out


def cost_profile_from_dict(raw: Any, *, source: str = "<costs>") -> CostProfile:
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise _err(source, f"expected a YAML mapping at the top level, got {got}")
    if problem := misplaced(raw, COSTS):  # a draft profile or an export's manifest, given as a cost file
        raise _err(source, problem)
    version = raw.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        raise _err(source, "missing required key schema_version" if version is None else
                   f"unknown schema_version {str(version)[:20]} (this skipsearch reads cost files of version "
                   f"{' and '.join(map(str, READABLE_VERSIONS))})")
    for key in raw:
        if key not in _TOP_KEYS:
            raise _err(source, f"unknown top-level key {str(key)[:40]!r} (known: {', '.join(_TOP_KEYS)})")
    for key in ("model", "device", "dtype", "costs"):
        if raw.get(key) is None:
            raise _err(source, f"missing required key {key}")
    try:
        model = CostModelRef(**section(CostModelRef, raw["model"], "model", source, error=CostsError,
                                       required=("name", "num_layers"))[0])
        environment = (Environment(**section(Environment, raw["environment"], "environment", source,
                                             error=CostsError)[0])
                       if raw.get("environment") is not None else None)
        run = (CostRun(**section(CostRun, raw["run"], "run", source, error=CostsError,
                                 nonnegative=("context_tokens", "repeats", "threads", "seconds"))[0])
               if raw.get("run") is not None else None)
        kernel = (CostKernel(**section(CostKernel, raw["kernel"], "kernel", source, error=CostsError,
                                       nonnegative=("compile_seconds",))[0])
                  if raw.get("kernel") is not None else CostKernel())
    except ProfileError as e:
        raise CostsError(str(e)) from None
    if model.num_layers < 1:
        raise _err(source, f"model.num_layers must be >= 1, got {model.num_layers}")
    if model.precision is not None and model.precision not in PRECISIONS:
        raise _err(source, f"model.precision must be one of {', '.join(PRECISIONS)}, got "
                           f"{str(model.precision)[:40]!r}")
    for key in ("device", "dtype"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise _err(source, f"{key} must be a non-empty string, got {str(raw[key])[:40]!r}")
    kind = raw.get("source", MEASURED)
    if kind not in (MEASURED, ROOFLINE):
        raise _err(source, f"source must be {MEASURED} or {ROOFLINE}, got {str(kind)[:40]!r}")
    if (kind == ROOFLINE) != (raw.get("roofline") is not None):
        raise _err(source, "a roofline cost file has source: roofline and a roofline block, both or neither")
    roofline = roofline_from_dict(raw["roofline"], source=source) if kind == ROOFLINE else None
    costs = costs_from_dict(raw["costs"], source=source)
    check_costs_whole(costs, model.num_layers, source=source)
    _check_kernel_names(kernel, source)
    batched = batched_from_dict(raw["batched"], source=source) if raw.get("batched") is not None else None
    if batched is not None and 1 not in batched.batch_sizes:
        raise _err(source, "batched.rows must include batch size 1: a draft's growth with the batch is taken from it")
    return CostProfile(model=model, device=raw["device"], dtype=raw["dtype"], costs=costs, environment=environment,
                       run=run, roofline=roofline, kernel=kernel, batched=batched)


def describe_batched(b: BatchedCosts) -> list[str]:
    """For people: per batch size, plain batched decoding's step and v(k, B) / v(0, B) at the timed k."""
    ks = [t - 1 for t in b.tokens if t > 1]
    lines = [f"batched ({b.kernel}" + (f", {b.context_tokens} cached positions per row" if b.context_tokens else "")
             + f"): v(k, B) / v(0, B) at k = {', '.join(map(str, ks))}"]
    for r in b.rows:
        step = b.step(r.batch_size)
        drafts = "".join(f", c({s}) {v / step:.3f}" for s, v in r.draft_seconds)
        lines.append(f"  B {r.batch_size}: step {step * 1e3:.3f} ms; "
                     + ", ".join(f"{b.verify(k, r.batch_size) / step:.2f}" for k in ks) + drafts)
    return lines


def _check_kernel_names(k: CostKernel, source: str) -> None:
    try:
        parse_kernel(k.verify)
    except ConfigError as e:
        raise _err(source, f"kernel.verify: {e}") from None
    if k.drafts not in ("eager", "compiled"):
        raise _err(source, f"kernel.drafts must be eager or compiled, got {str(k.drafts)[:40]!r}")


def planned_costs_of(cp: CostProfile, *, source: str) -> PlannedCosts:
    return PlannedCosts(cp.costs, cp.device, cp.dtype, source, cp.run.threads if cp.run else None, cp.roofline)


# -- files -------------------------------------------------------------------------------------------------
def load_costs(path: str | os.PathLike) -> CostProfile:
    """Read and validate a cost file; every problem is one CostsError line."""
    source = str(path)
    raw = read_yaml(path, source, error=CostsError, what="cost file")
    return cost_profile_from_dict(raw, source=source)


def save_costs(cp: CostProfile, path: str | os.PathLike) -> Path:
    """Validate, then write atomically (a temporary file, fsynced, renamed over the target)."""
    path, source = Path(path), str(path)
    data = cost_profile_to_dict(cp)
    cost_profile_from_dict(data, source=source)  # an invalid cost file never reaches disk
    body = f"{_HEADER} (schema v{SCHEMA_VERSION})\n" + yaml.dump(data, Dumper=Dumper, sort_keys=False,
                                                                  allow_unicode=True)
    try:
        return write_atomic(path, body)
    except OSError as e:
        raise _err(source, f"cannot write: {e.strerror or e}") from None


# -- which model a cost file fits --------------------------------------------------------------------------
def check_costs_model(cp: CostProfile, *, num_layers: int, architecture: str | None = None,
                      fingerprint: str | None = None, source: str = "<costs>", what: str = "this model",
                      target_precision: str = NATIVE) -> None:
    """Refuse, in one line, a cost file measured on another model: another depth, (where both sides know it)
    another architecture, or another target precision (an int8 step streams a quarter of an fp32 step's bytes).
    Only the architecture counts, not the weights: a fine-tune costs what its base model costs."""
    ours, made = cp.model, "modelled for" if cp.roofline is not None else "measured on"
    if num_layers != ours.num_layers:
        raise _err(source, f"cost file was {made} {ours.name} ({ours.num_layers} layers); {what} has "
                           f"{num_layers} layers: measure its costs with skipsearch costs")
    if architecture and ours.architecture and architecture != ours.architecture:
        raise _err(source, f"cost file was {made} {ours.name}, another architecture than {what}'s "
                           f"({ours.architecture} vs {architecture}): measure its costs with skipsearch costs")
    compared = architecture and ours.architecture
    if not compared and fingerprint and ours.fingerprint and fingerprint != ours.fingerprint:
        raise _err(source, f"cost file was {made} {ours.name} (fingerprint {ours.fingerprint}), not "
                           f"{made.split()[-1]} {what} (fingerprint {fingerprint}): measure its costs with skipsearch "
                           f"costs")
    check_costs_target(cp, target_precision, source=source, what=what)


def check_costs_target(cp: CostProfile, target_precision: str, *, source: str = "<costs>",
                       what: str = "this model") -> None:
    """Refuse, in one line, a cost file timed on another target precision than ``target_precision``: an int8 step
    streams a quarter of an fp32 step's bytes, so its costs price another model. Needs no model: checked first."""
    if cp.target_precision != target_precision:
        made = "modelled for" if cp.roofline is not None else "measured on"
        raise _err(source, f"cost file was {made} {cp.model.name}'s {cp.target_precision} target; {what} is the "
                           f"{target_precision} target: measure its costs with skipsearch costs --target-precision "
                           f"{target_precision}")


__all__ = ["DEFAULT_BATCH_SIZES", "MEASURED", "ROOFLINE", "SCHEMA_VERSION", "CostKernel", "CostModelRef",
           "CostProfile", "CostRun", "check_costs_model", "check_costs_target", "check_costs_whole", "cost_model_of",
           "cost_profile_from_dict", "cost_profile_to_dict", "costs_from_model", "describe_batched", "load_costs",
           "planned_costs_of", "save_costs"]
