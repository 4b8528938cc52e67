"""The ``costs`` mapping of skipsearch's files: what one device charges for each piece of a decoding step, as a
cost file's ``costs`` section and a draft profile's ``measured.costs`` (``PlannedCosts``: the costs the profile
was planned with) hold it. The cost file around it (model, device, environment, measuring) is
``skipsearch.files.cost_profile``; its ``cost_model_of`` turns these figures into the objective's CostModel
(below).
``RooflineInfo`` is where modelled figures come from (``skipsearch.roofline``): a cost file's ``roofline`` block,
carried into the ``measured.costs`` of every profile planned with it, so a model is never taken for a measurement.

Reading validates every key, and every problem is one ``CostsError`` line naming the file. No torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from skipsearch.config import DraftConfig
from skipsearch.files.bounds import MAX_BATCH_SIZE
from skipsearch.files.errors import CostsError, ProfileError
from skipsearch.files.yamlio import mapping, plain, section

# A verify curve checked as a whole: v(1) about 1, and how far a median may dip from v(k) to v(k + 1).
VERIFY_ONE = (0.5, 1.5)
VERIFY_DIP = 0.8


@dataclass(frozen=True)
class SchemeCosts:
    """One precision-draft scheme's per-sublayer costs on this device (``skipsearch costs --schemes``), measured
    in the same interleaved rounds as a full step: re-planning a precision profile for this device reads them."""

    scheme: str  # a skipsearch.methods.precision scheme: fp16, int8, int4, fp8
    attn_seconds: float  # one layer's attention with its weights in the scheme
    mlp_seconds: float  # one layer's MLP in the scheme
    head_saving_seconds: float  # a step with the scheme's LM head, less one with the full head (< 0: slower)
    # the whole model in the scheme (every sublayer and the head) as the decoder runs that draft when a compiled
    # kernel verifies: compiled, one token (None: the draft runs eagerly, as its parts were timed)
    whole_seconds: float | None = None


@dataclass(frozen=True)
class RooflineInfo:
    """Where a roofline cost file's figures come from (``skipsearch costs --roofline``): a model of a device from
    its published (or probed, or given) bandwidth and throughput and the model's shapes, never a measurement."""

    device: str  # the device modelled, e.g. "NVIDIA H100 SXM5 80GB", or a description of one
    key: str | None = None  # its key in skipsearch.roofline's table (h100-sxm, ...), or cpu, or the given name
    bandwidth_gb_s: float | None = None  # peak memory bandwidth, GB/s (10^9 bytes)
    tflops: float | None = None  # peak dense throughput in the file's dtype, 10^12 FLOP/s
    efficiency: float | None = None  # achieved / peak bandwidth the figures were priced with
    efficiency_source: str | None = None  # fitted (where), given, or none
    launch_us: float | None = None  # the cost charged per kernel launched, microseconds
    figures_source: str | None = None  # the datasheet, "probed on this machine", or "given on the command line"
    shapes_source: str | None = None  # the config.json read, or the published architecture table's row

    def describe(self) -> str:
        """One line for people: what was modelled, from what."""
        parts = [f"{self.bandwidth_gb_s:g} GB/s" if self.bandwidth_gb_s else None,
                 f"efficiency {self.efficiency:g}" if self.efficiency is not None else None,
                 f"{self.tflops:g} TFLOPS" if self.tflops else None,
                 f"{self.launch_us:g} us per kernel" if self.launch_us is not None else None]
        figures = ", ".join(p for p in parts if p)
        return (f"a roofline model of {self.device}" + (f" ({figures})" if figures else "")
                + (f" from {self.figures_source}" if self.figures_source else ""))


@dataclass(frozen=True)
class Costs:
    """objective.CostModel's measured fields, in seconds (verify_ratio: one k-token forward / one step)."""

    step_seconds: float  # one autoregressive decoder cycle (one-token forward, logits read back): the unit
    attn_seconds: float  # one layer's attention
    mlp_seconds: float  # one layer's MLP
    fixed_seconds: float  # what skipping cannot remove: embedding, norms, LM head, per-forward overhead
    verify_ratio: tuple[float, ...]  # v(1), v(2), ...
    lm_head_seconds: float | None = None  # the LM head alone, for people: a part of fixed_seconds
    schemes: tuple[SchemeCosts, ...] = ()  # precision-draft schemes costed on this device
    # the full one-token step run eagerly, which attn/mlp/fixed split, when step_seconds is a compiled kernel's
    # step (skipsearch.kernels); None: step_seconds is that eager step
    eager_step_seconds: float | None = None

    @property
    def parts_seconds(self) -> float:
        """The eager step the per-sublayer costs split."""
        return self.eager_step_seconds if self.eager_step_seconds is not None else self.step_seconds

    def scheme(self, name: str) -> SchemeCosts | None:
        return next((s for s in self.schemes if s.scheme == name), None)

    def whole_model_ratio(self, s: SchemeCosts, num_layers: int) -> float:
        """A one-token step with every sublayer and the head in scheme ``s``, over the full step."""
        L = num_layers
        if s.whole_seconds is not None:  # the decoder runs it compiled: timed as such
            return s.whole_seconds / self.step_seconds
        whole = self.parts_seconds - L * (self.attn_seconds + self.mlp_seconds - s.attn_seconds - s.mlp_seconds)
        return (whole - s.head_saving_seconds) / self.step_seconds

    @property
    def overhead_seconds(self) -> float | None:
        """The fixed part that is not the LM head: embedding, norms, the framework's per-forward cost."""
        return None if self.lm_head_seconds is None else max(self.fixed_seconds - self.lm_head_seconds, 0.0)


def _err(source: str, problem: str) -> CostsError:
    return CostsError(f"{source}: {problem}")


def roofline_to_dict(r: RooflineInfo) -> dict:
    return plain(r)


def roofline_from_dict(raw: Any, *, path: str = "roofline", source: str = "<costs>") -> RooflineInfo:
    """Validate a roofline block (a cost file's ``roofline``, or a profile's ``measured.costs.roofline``)."""
    try:
        values = section(RooflineInfo, raw, path, source, error=CostsError, required=("device",))[0]
    except ProfileError as e:
        raise CostsError(str(e)) from None
    for key in ("bandwidth_gb_s", "tflops", "efficiency", "launch_us"):
        value = values.get(key)
        if value is not None and (not math.isfinite(value) or value < 0 or (key != "launch_us" and value == 0)):
            raise _err(source, f"{path}.{key} must be a finite number {'>= 0' if key == 'launch_us' else '> 0'}, "
                               f"got {value}")
    return RooflineInfo(**values)


def costs_to_dict(c: Costs) -> dict:
    out = {f.name: float(f"{getattr(c, f.name):.5g}") for f in fields(c)
           if f.name not in ("verify_ratio", "schemes") and getattr(c, f.name) is not None}  # noise is larger
    out["verify_ratio"] = [round(v, 4) for v in c.verify_ratio]
    if c.schemes:
        out["schemes"] = {s.scheme: {f.name: float(f"{getattr(s, f.name):.5g}") for f in fields(s)
                                     if f.name != "scheme" and getattr(s, f.name) is not None} for s in c.schemes}
    return plain(out)


def costs_from_dict(raw: Any, *, path: str = "costs", source: str = "<costs>") -> Costs:
    """Validate a ``costs`` mapping (a cost file's, or a profile's ``measured.costs``)."""
    raw = dict(mapping(raw, path, source, error=CostsError))
    curve = raw.pop("verify_ratio", None)
    schemes = _schemes_from_dict(raw.pop("schemes", {}), f"{path}.schemes", source)
    try:
        values = section(Costs, raw, path, source, error=CostsError,
                         required=("step_seconds", "attn_seconds", "mlp_seconds", "fixed_seconds"))[0]
    except ProfileError as e:
        raise CostsError(str(e)) from None
    for key, value in values.items():
        bound = "> 0" if key == "step_seconds" else ">= 0"
        if not math.isfinite(value) or value < 0 or (key == "step_seconds" and value == 0):
            raise _err(source, f"{path}.{key} must be a finite number of seconds {bound}, got {value}")
    if not isinstance(curve, (list, tuple)) or not curve:
        raise _err(source, f"{path}.verify_ratio must list v(1), v(2), ... (a k-token forward / one step)")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 for v in curve):
        raise _err(source, f"{path}.verify_ratio must hold positive numbers, got {str(list(curve))[:60]}")
    check_verify_curve(tuple(float(v) for v in curve), path=path, source=source)
    return Costs(**values, verify_ratio=tuple(float(v) for v in curve), schemes=schemes)


def _schemes_from_dict(raw: Any, path: str, source: str) -> tuple[SchemeCosts, ...]:
    out = []
    for name, entry in mapping(raw, path, source, error=CostsError).items():
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", name):
            raise _err(source, f"{path} must be keyed by scheme names (fp16, int8, int8-dynamic, ...), "
                               f"got {str(name)[:40]!r}")
        try:
            values = section(SchemeCosts, {"scheme": name, **dict(mapping(entry, f"{path}.{name}", source,
                                                                          error=CostsError))},
                             f"{path}.{name}", source, error=CostsError,
                             required=("attn_seconds", "mlp_seconds", "head_saving_seconds"))[0]
        except ProfileError as e:
            raise CostsError(str(e)) from None
        if values.get("whole_seconds") is not None and not (math.isfinite(values["whole_seconds"])
                                                             and values["whole_seconds"] > 0):
            raise _err(source, f"{path}.{name}.whole_seconds must be a finite number of seconds > 0, "
                               f"got {values['whole_seconds']}")
        for key in ("attn_seconds", "mlp_seconds", "head_saving_seconds"):
            value = values[key]
            if not math.isfinite(value) or (key != "head_saving_seconds" and value < 0):
                raise _err(source, f"{path}.{name}.{key} must be a finite number of seconds"
                                   f"{'' if key == 'head_saving_seconds' else ' >= 0'}, got {value}")
        out.append(SchemeCosts(**values))
    return tuple(out)


def check_verify_curve(curve: Sequence[float], *, path: str = "costs", source: str = "<costs>") -> None:
    """v(k) as a whole: v(1) is one step (about 1), and a longer forward never costs much less than a shorter
    one (medians may dip a little; a dip past VERIFY_DIP is a broken file, not noise)."""
    if not VERIFY_ONE[0] <= curve[0] <= VERIFY_ONE[1]:
        raise _err(source, f"{path}.verify_ratio starts at v(1) = {curve[0]:.4g}: a one-token forward is one step, "
                           f"about 1")
    for k in range(1, len(curve)):
        if curve[k] < curve[k - 1] * VERIFY_DIP:
            raise _err(source, f"{path}.verify_ratio falls from v({k}) = {curve[k - 1]:.4g} to v({k + 1}) = "
                               f"{curve[k]:.4g}: a longer forward cannot cost that much less")


# -- a cost file's batched grid: v(k, B) and c(B) per batch size ----------------------------------------------


@dataclass(frozen=True)
class BatchCosts:
    """One batch size B of the grid: what a forward of B rows costs, in seconds."""

    batch_size: int
    verify_seconds: tuple[float, ...]  # one forward of B x T tokens, for each T of BatchedCosts.tokens
    draft_seconds: tuple[tuple[str, float], ...] = ()  # (scheme, one whole-model draft step of B x 1 tokens)


@dataclass(frozen=True)
class BatchedCosts:
    """A cost file's ``batched`` section (``skipsearch costs --batch-sizes``): per batch size B, the full model's
    forward over B x T tokens at each T (v(K, B) is T = K + 1; plain batched decoding's step v(0, B) is T = 1), and
    per draft scheme the cost file prices, a one-token step of the whole model in that scheme at B (c(B))."""

    tokens: tuple[int, ...]  # the T each row's verify_seconds is timed at, ascending, starting at 1
    rows: tuple[BatchCosts, ...]  # ascending batch sizes
    kernel: str = "eager"  # what the forwards ran through (batched forwards are measured eagerly)
    context_tokens: int | None = None  # the KV length of every row

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(r.batch_size for r in self.rows)

    def row(self, batch_size: int) -> BatchCosts:
        return next(r for r in self.rows if r.batch_size == batch_size)

    def forward(self, batch_size: int, t: int) -> float:
        """A forward of ``batch_size`` x ``t`` tokens, seconds: linear between the timed T, and past the last
        along its last segment (as the single-sequence v(k))."""
        v, ts = self.row(batch_size).verify_seconds, self.tokens
        if t <= ts[0]:
            return v[0]
        for i in range(1, len(ts)):
            if t <= ts[i]:
                return v[i - 1] + (v[i] - v[i - 1]) * (t - ts[i - 1]) / (ts[i] - ts[i - 1])
        if len(ts) == 1:
            return v[0] * t
        slope = (v[-1] - v[-2]) / (ts[-1] - ts[-2])
        return v[-1] + slope * (t - ts[-1])

    def step(self, batch_size: int) -> float:
        """v(0, B): one step of plain batched decoding (B x 1 tokens)."""
        return self.forward(batch_size, 1)

    def verify(self, k: int, batch_size: int) -> float:
        """v(k, B): the verify of k drafted tokens per row (B x (k + 1) tokens)."""
        return self.forward(batch_size, k + 1)

    def draft(self, scheme: str, batch_size: int) -> float | None:
        """c(B) of ``scheme`` in seconds; None where the grid has no such scheme."""
        return dict(self.row(batch_size).draft_seconds).get(scheme)


def batched_to_dict(b: BatchedCosts) -> dict:
    out: dict[str, Any] = {"kernel": b.kernel}
    if b.context_tokens is not None:
        out["context_tokens"] = b.context_tokens
    out["tokens"] = list(b.tokens)
    out["rows"] = []
    for r in b.rows:
        row: dict[str, Any] = {"batch_size": r.batch_size,
                               "verify_seconds": [float(f"{v:.5g}") for v in r.verify_seconds]}
        if r.draft_seconds:
            row["draft_seconds"] = {s: float(f"{v:.5g}") for s, v in r.draft_seconds}
        out["rows"].append(row)
    return out


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _seconds(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and value > 0)


def batched_from_dict(raw: Any, *, path: str = "batched", source: str = "<costs>") -> BatchedCosts:
    """Validate a cost file's ``batched`` section; every problem is one CostsError line."""
    raw = dict(mapping(raw, path, source, error=CostsError))
    known = ("kernel", "context_tokens", "tokens", "rows")
    for key in raw:
        if key not in known:
            raise _err(source, f"{path}: unknown key {str(key)[:40]!r} (known: {', '.join(known)})")
    kernel = raw.get("kernel", "eager")
    if not isinstance(kernel, str) or not kernel.strip():
        raise _err(source, f"{path}.kernel must name a kernel (eager, inductor-c4, ...), got {str(kernel)[:40]!r}")
    context = raw.get("context_tokens")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 0):
        raise _err(source, f"{path}.context_tokens must be an integer >= 0, got {str(context)[:40]!r}")
    tokens = raw.get("tokens")
    if (not isinstance(tokens, list) or not tokens or not all(_positive_int(t) for t in tokens)
            or tokens[0] != 1 or any(b <= a for a, b in zip(tokens, tokens[1:], strict=False))):
        raise _err(source, f"{path}.tokens must list ascending integers T from 1 (a forward of B x T tokens), got "
                           f"{str(tokens)[:60]}")
    listed = raw.get("rows")
    if not isinstance(listed, list) or not listed:
        raise _err(source, f"{path}.rows must list at least one batch size's costs")
    rows: list[BatchCosts] = []
    for i, entry in enumerate(listed):
        where = f"{path}.rows[{i}]"
        entry = dict(mapping(entry, where, source, error=CostsError))
        for key in entry:
            if key not in ("batch_size", "verify_seconds", "draft_seconds"):
                raise _err(source, f"{where}: unknown key {str(key)[:40]!r} (known: batch_size, verify_seconds, "
                                   f"draft_seconds)")
        b = entry.get("batch_size")
        if not _positive_int(b) or b > MAX_BATCH_SIZE:
            raise _err(source, f"{where}.batch_size must be an integer in 1..{MAX_BATCH_SIZE}, got {str(b)[:40]}")
        if rows and b <= rows[-1].batch_size:
            raise _err(source, f"{where}.batch_size {b} must be above the row before it ({rows[-1].batch_size}): "
                               f"rows ascend by batch size")
        verify = entry.get("verify_seconds")
        if not isinstance(verify, list) or len(verify) != len(tokens) or not all(_seconds(v) for v in verify):
            raise _err(source, f"{where}.verify_seconds must hold {len(tokens)} positive numbers of seconds (one per "
                               f"T of {path}.tokens), got {str(verify)[:60]}")
        drafts = mapping(entry.get("draft_seconds") or {}, f"{where}.draft_seconds", source, error=CostsError)
        for scheme, value in drafts.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,39}", scheme):
                raise _err(source, f"{where}.draft_seconds must be keyed by scheme names, got {scheme[:40]!r}")
            if not _seconds(value):
                raise _err(source, f"{where}.draft_seconds.{scheme} must be a positive number of seconds, got "
                                   f"{str(value)[:40]}")
        rows.append(BatchCosts(b, tuple(float(v) for v in verify), tuple((s, float(v)) for s, v in drafts.items())))
    return BatchedCosts(tuple(tokens), tuple(rows), kernel=kernel, context_tokens=context)


# -- a draft profile's measured.costs: the cost profile it was planned with ---------------------------------
COSTS_KEY = "costs"


@dataclass(frozen=True)
class PlannedCosts:
    """A profile's ``measured.costs``: the cost profile it was planned with, and where that came from."""

    costs: Costs
    device: str | None = None
    dtype: str | None = None
    source: str | None = None  # "measured by optimize", or the cost file's path
    threads: int | None = None
    roofline: RooflineInfo | None = None  # the costs are a roofline model (a roofline cost file's), not measured


_PROVENANCE = ("device", "dtype", "source", "threads")


def planned_costs_to_dict(pc: PlannedCosts) -> dict:
    head = {k: getattr(pc, k) for k in _PROVENANCE if getattr(pc, k) is not None}
    if pc.roofline is not None:
        head["roofline"] = roofline_to_dict(pc.roofline)
    return {**head, **costs_to_dict(pc.costs)}


def planned_costs_from_dict(raw: Any, *, source: str = "<profile>") -> PlannedCosts:
    path = f"measured.{COSTS_KEY}"
    raw = dict(mapping(raw, path, source, error=CostsError))
    head = {k: raw.pop(k) for k in _PROVENANCE if k in raw}
    for key, value in head.items():
        if value is not None and not isinstance(value, int if key == "threads" else str):
            raise _err(source, f"{path}.{key} must be {'an integer' if key == 'threads' else 'a string'}")
    roofline = raw.pop("roofline", None)
    if roofline is not None:
        head["roofline"] = roofline_from_dict(roofline, path=f"{path}.roofline", source=source)
    return PlannedCosts(costs_from_dict(raw, path=path, source=source), **head)


__all__ = ["COSTS_KEY", "VERIFY_DIP", "VERIFY_ONE", "BatchCosts", "BatchedCosts", "Costs", "PlannedCosts",
           "RooflineInfo", "SchemeCosts", "batched_from_dict", "batched_to_dict", "check_verify_curve",
           "costs_from_dict", "costs_to_dict", "planned_costs_from_dict", "planned_costs_to_dict",
           "roofline_from_dict", "roofline_to_dict"]


# -- the objective's cost model: the figures as ratios to one full step --------------------------------------
@dataclass(frozen=True)
class DraftCost:
    """One extra draft config, timed in the same rounds as the full step (``measure_costs(extra=...)``)."""

    name: str
    step_seconds: float  # one single-token step with the config's sublayers skipped (median)
    verify_ratio: tuple[float, ...]  # k = 1..len: one k-token forward of the config / its own step


@dataclass(frozen=True)
class CostModel:
    """Measured costs, in seconds and as ratios to one full autoregressive step."""

    step_seconds: float  # one autoregressive decoder cycle (one-token full forward + argmax) at calibration length
    attn_seconds: float  # one layer's attention, inside that step
    mlp_seconds: float  # one layer's MLP
    fixed_seconds: float  # the rest: embedding, norms, LM head, framework overhead
    verify_ratio: tuple[float, ...]  # v(k) for k = 1..len: one forward over k tokens / one step
    num_layers: int
    extras: tuple[DraftCost, ...] = ()  # the ``extra`` configs, costed in the same rounds
    # The full one-token step run eagerly, which attn/mlp/fixed split (drafts that run part of the model run
    # eagerly): None when it is the step itself. With a compiled kernel step_seconds (the unit every ratio is
    # relative to) is a plain step through that kernel, and this is the eager one.
    eager_step_seconds: float | None = None

    def extra(self, name: str) -> DraftCost:
        """The measured costs of the extra config ``name``."""
        found = next((e for e in self.extras if e.name == name), None)
        if found is None:
            raise KeyError(f"no extra config '{name}' was costed (have: {', '.join(e.name for e in self.extras)})")
        return found

    def draft_ratio(self, config: DraftConfig) -> float:
        """c: one draft step of ``config`` relative to one full step."""
        kept_attn = self.num_layers - len(config.skip_attn)
        kept_mlp = self.num_layers - len(config.skip_mlp)
        seconds = self.fixed_seconds + kept_attn * self.attn_seconds + kept_mlp * self.mlp_seconds
        return max(seconds, 0.0) / self.step_seconds

    def verify(self, k: int) -> float:
        """v(k), extrapolated linearly past the measured range."""
        v = self.verify_ratio
        if k <= len(v):
            return v[k - 1]
        slope = (v[-1] - v[0]) / max(len(v) - 1, 1)
        return v[-1] + slope * (k - len(v))
