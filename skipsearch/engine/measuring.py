"""Measuring a cost file on a loaded model (``skipsearch costs``): the step, the sublayers, the fixed part and
v(k) through ``surrogate.measure_costs`` at optimize's calibration context, each draft scheme's costs, the batched
grid, and which compiled kernel is fastest here and agrees with the eager step. The file's format, which needs no
torch and no model, is ``skipsearch.files.cost_profile``; this module is what writes one from a model, and what
checks that a cost file fits a loaded model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from skipsearch.config import ConfigError
from skipsearch.files.cost_profile import (
    VERIFY_SIZES,
    CostKernel,
    CostModelRef,
    CostProfile,
    CostRun,
    check_costs_model,
    check_costs_whole,
    costs_from_model,
)
from skipsearch.files.costs import BatchCosts, BatchedCosts, CostModel
from skipsearch.files.errors import CostsError
from skipsearch.hardware import Environment
from skipsearch.kernels import EAGER, REGISTRY, Kernel, check_kernel, parse_kernel
from skipsearch.model.target import NATIVE

if TYPE_CHECKING:
    from skipsearch.model.skippable import SkippableModel

_log = logging.getLogger(__name__)


# -- which model a cost file fits ----------------------------------------------------------------------------
def architecture_of(sm: SkippableModel) -> str:
    """The layout half of the model's weights fingerprint: tensor names and shapes."""
    return sm.weights_fingerprint.split("-")[0]


def check_costs_for(cp: CostProfile, sm: SkippableModel, *, source: str) -> None:
    check_costs_model(cp, num_layers=sm.num_layers, architecture=architecture_of(sm), fingerprint=sm.fingerprint,
                      source=source, what=f"model {sm.name}", target_precision=sm.target_precision)


# -- measuring ---------------------------------------------------------------------------------------------
def calibration_context(sm: SkippableModel, *, dataset: str = "mtbench", max_new_tokens: int = 64,
                        seed: int = 0) -> tuple[int, ...]:
    """optimize's cost context: the first calibration prompt and the first half of its greedy continuation
    (ModelObjective.costs measures at exactly this length), so that a cost file and a search agree."""
    from skipsearch.engine.calibration import calibrate_on

    cal = calibrate_on(sm, dataset=dataset, n_prompts=1, max_new_tokens=max(max_new_tokens // 2, 1), seed=seed)
    return (*cal.prompts[0], *cal.continuations[0][: max_new_tokens // 2])


def measure_cost_profile(sm: SkippableModel, context: Sequence[int], *, repeats: int = 9,
                         verify_sizes: Sequence[int] = VERIFY_SIZES, command: str | None = None,
                         kernel: str | None = None) -> CostProfile:
    """This device's cost profile: ``objective.measure_costs`` (the objective's own measurement, not a
    copy) at ``context``, and the LM head alone through the harness's interleaved timer, for people.

    ``kernel`` (skipsearch.kernels; None: what ``sm`` runs now) is built first. ``auto`` times every registered
    compiled kernel this machine can run (``fastest_kernels``, each at its default block) and keeps the one whose
    plain step is the fastest, of those faster than the eager step timed in the same rounds and agreeing with it
    (a compiled kernel that changes a greedy choice is refused), else eager; each timing is logged."""
    if kernel is not None:
        if kernel == "auto":
            return _fastest(sm, context, repeats=repeats, verify_sizes=verify_sizes, command=command)
        sm.use_kernel(parse_kernel(kernel), capacity=len(context) + max(verify_sizes) + 1)
    import torch

    from skipsearch.engine import timing
    from skipsearch.engine.harness import time_interleaved

    t0 = timing.now(sm.device)
    if sm.kernel.compiled:
        check_kernel_agrees(sm, context)
    cm, repeats = _measured_whole(sm, context, verify_sizes=verify_sizes, repeats=repeats)  # repeats: as timed
    hidden = torch.zeros(1, 1, sm.hf.config.hidden_size, dtype=sm.dtype, device=sm.device)  # [1, 1, H]

    def head() -> None:
        with torch.inference_mode():
            sm.lm_head(hidden).argmax(-1)  # [1, 1]

    lm_head = time_interleaved({"lm_head": head}, rounds=repeats, device=sm.device, warmup=3)["lm_head"].median
    return CostProfile(
        model=CostModelRef(sm.name, sm.num_layers, architecture_of(sm), sm.fingerprint,
                           None if sm.target_precision == NATIVE else sm.target_precision),
        device=str(sm.device), dtype=sm.dtype_name, costs=costs_from_model(cm, lm_head_seconds=min(lm_head,
                                                                                                   cm.fixed_seconds)),
        environment=Environment.current(str(sm.device), placement=getattr(sm, "placement", None)),
        run=CostRun(context_tokens=len(context), repeats=repeats, threads=torch.get_num_threads(),
                    seconds=round(timing.now(sm.device) - t0, 1), command=command),
        kernel=kernel_of(sm),
    )


def _measured_whole(sm: SkippableModel, context: Sequence[int], *, verify_sizes: Sequence[int], repeats: int,
                    tries: int = 3) -> tuple[CostModel, int]:
    """``surrogate.measure_costs`` and the samples it took: timed again with more rounds (2n + 1) while its
    sublayers do not fit the step they split (``check_costs_whole``, the check every cost file passes). One
    descheduled sample among few carries a median: a busy machine once split a step 12.5 times over, and the save
    refused the file after minutes of timing. Still apart after ``tries`` timings is a one-line CostsError."""
    from skipsearch.engine.surrogate import measure_costs

    for attempt in range(1, tries + 1):
        cm = measure_costs(sm, context, verify_sizes=verify_sizes, repeats=repeats)
        try:
            check_costs_whole(costs_from_model(cm), sm.num_layers, source=f"the costs timed on {sm.name}")
            return cm, repeats
        except CostsError as exc:
            problem = exc
        if attempt < tries:
            repeats = 2 * repeats + 1
            _log.warning("%s: timing again with %d samples", problem, repeats)
    raise CostsError(f"{problem}, in each of {tries} timings: is something else running? Time again on an idle "
                     "machine, or with more --samples")


def measure_batched(sm: SkippableModel, context: Sequence[int], batch_sizes: Sequence[int], *, repeats: int = 9,
                    tokens: Sequence[int] = VERIFY_SIZES,
                    drafts: Mapping[str, Callable[[], AbstractContextManager[None]]] | None = None) -> BatchedCosts:
    """The batched grid: at each batch size B, one full-model forward of B x T tokens after ``context`` (B identical
    rows of it), all rows' logits read back as a verifier reads them, for each T of ``tokens`` (T = 1 is plain
    batched decoding's step, T = K + 1 a K-token draft's verify; on a compiled kernel each block's edges as well,
    ``surrogate.timed_verify_sizes``); and for each scheme of ``drafts`` (scheme -> a
    factory of contexts in which the model's forward is that scheme's whole-model draft, its method's:
    ``methods.scheme_draft``) the same B x 1 forward inside that context, its c(B).

    Each batch size runs as ``decode`` runs it, on the kernel ``sm`` runs (its label is the grid's ``kernel``): a
    batch of one on one sequence's cache (``decode_cache``, a draft step inside ``compiled_draft`` as the precision
    drafter runs it), a larger batch on its row cache (``batch_cache``: with a compiled kernel, that batch size's
    graphs, compiled here first, minutes each for a real model). Every (B, T) and every (B, scheme) is timed in the
    same interleaved rounds (``harness.time_interleaved``), medians, so c(B) / v(0, B) is a ratio of one round's
    timings. A scheme left out of ``drafts`` has no c(B): the planner grows such a draft with B as the full step
    grows (``schedule.cycle_speedup``)."""
    import torch

    from skipsearch.engine.harness import time_interleaved
    from skipsearch.engine.surrogate import timed_verify_sizes

    # a batch verifies in [B, chunk] blocks too: each block's edges are timed, or a line drawn across an edge
    # prices the sizes below it as if they ran a second block
    tokens = timed_verify_sizes(tokens, sm.kernel.chunk if sm.kernel.compiled else 1)
    drafts = dict(drafts or {})
    n = len(context)
    caches = {}
    with torch.inference_mode():
        for b in batch_sizes:  # 1. the prompt, once per batch size, on the cache that batch size decodes in
            if b == 1:
                caches[b] = sm.decode_cache(n + max(tokens))
                sm.forward(torch.tensor(list(context)), start=0, cache=caches[b], last_only=True)
            else:
                caches[b] = sm.batch_cache(b, n + max(tokens))
                sm.forward_rows(torch.tensor([list(context)] * b), positions=torch.arange(n).expand(b, n),
                                cache=caches[b], last=[n - 1] * b)

    def forward(b: int, t: int, draft: Callable[[], AbstractContextManager[None]] | None = None):
        ids = torch.tensor([(list(context) * t)[:t]] * b, device=sm.device)  # [B, T]
        positions = torch.arange(n, n + t, device=sm.device).expand(b, t)  # [B, T]

        def once() -> None:  # 2. one verify-sized forward (or draft step), every row's logits read back
            with torch.inference_mode():
                with draft() if draft is not None else contextlib.nullcontext():
                    if b == 1:  # one sequence: its KV is cut back to the context after
                        with sm.compiled_draft() if draft is not None else contextlib.nullcontext():
                            sm.forward(ids[0], start=n, cache=caches[b]).argmax(-1).tolist()  # [T]
                        sm.crop(caches[b], n)
                    else:  # a row cache: the next call writes the same slots again, nothing to cut
                        sm.forward_rows(ids, positions=positions, cache=caches[b]).argmax(-1).tolist()  # [B, T]

        return once

    calls = {f"{b}x{t}": forward(b, t) for b in batch_sizes for t in tokens}
    calls |= {f"{b}:{scheme}": forward(b, 1, draft) for b in batch_sizes for scheme, draft in drafts.items()}
    timed = time_interleaved(calls, rounds=repeats, device=sm.device, warmup=2)
    rows = tuple(BatchCosts(b, tuple(timed[f"{b}x{t}"].median for t in tokens),
                            tuple((scheme, timed[f"{b}:{scheme}"].median) for scheme in drafts))
                 for b in batch_sizes)
    return BatchedCosts(tuple(tokens), rows, kernel=sm.kernel.label, context_tokens=n)


def fastest_kernels(device: str) -> tuple[Kernel, ...]:
    """``--kernel fastest``'s candidates: every registered compiled kernel ``device`` can run, at its default block,
    in the registry's order."""
    found = []
    for name, spec in REGISTRY.items():
        if not spec.compiled:
            continue
        candidate = parse_kernel(name)
        try:
            check_kernel(candidate, device)
        except ConfigError:
            continue
        found.append(candidate)
    return tuple(found)


def _fastest(sm: SkippableModel, context: Sequence[int], *, repeats: int, verify_sizes: Sequence[int],
             command: str | None) -> CostProfile:
    """Each of ``fastest_kernels`` built and its costs measured in turn (a kernel that changes a greedy choice is
    logged and passed over); the fastest plain step of those faster than eager wins, else eager. The winner is
    what ``sm`` runs afterwards."""
    timed: dict[Kernel, CostProfile] = {}
    for candidate in fastest_kernels(str(sm.device)):
        sm.use_kernel(candidate, capacity=len(context) + max(verify_sizes) + 1)
        try:
            cp = measure_cost_profile(sm, context, repeats=repeats, verify_sizes=verify_sizes, command=command)
        except ConfigError as exc:  # it changes a greedy choice here: not a candidate
            _log.warning("kernel %s passed over: %s", candidate.label, exc)
            continue
        timed[candidate] = cp
        _log.info("kernel %s: step %.2f ms, eager step %.2f ms in the same rounds", candidate.label,
                  cp.costs.step_seconds * 1e3, cp.costs.parts_seconds * 1e3)
    faster = {k: cp for k, cp in timed.items() if cp.costs.step_seconds < cp.costs.parts_seconds}
    if not faster:
        sm.use_kernel(EAGER, capacity=0)  # none is faster here (or none runs): the eager kernel it is
        _log.info("kernel fastest: eager (%s)", "no compiled kernel runs here" if not timed else
                  "no compiled kernel's step beat eager's")
        return measure_cost_profile(sm, context, repeats=repeats, verify_sizes=verify_sizes, command=command)
    best = min(faster, key=lambda k: faster[k].costs.step_seconds)
    _log.info("kernel fastest: %s, of %s", best.label, ", ".join(k.label for k in timed))
    if sm.kernel != best:  # another was built after it: build it again (kept graphs load)
        sm.use_kernel(best, capacity=len(context) + max(verify_sizes) + 1)
    return faster[best]


def kernel_of(sm: SkippableModel) -> CostKernel:
    """The CostKernel of what ``sm`` runs now (``SkippableModel.use_kernel``)."""
    report = sm.kernel_report
    return CostKernel(sm.kernel.label, "compiled" if sm.kernel.compiled else "eager",
                      report.compile_seconds if report is not None else None, _draft_activations(sm))


def _draft_activations(sm: SkippableModel) -> str | None:
    """What the int8/int4 schemes' products take on this CPU (``kernels.lowbit.convert.int8_activations``), or
    None where skipsearch's low-bit products do not run (not a CPU, or they cannot be built here)."""
    if sm.device.type != "cpu":
        return None
    from skipsearch.kernels.lowbit import check_lowbit, int8_activations

    try:
        check_lowbit()
    except ConfigError:
        return None
    return "int8 activations" if int8_activations() else "fp32 activations"


def check_kernel_agrees(sm: SkippableModel, context: Sequence[int], *, tokens: int = 32) -> int:
    """The compiled kernel's greedy choices against the eager kernel's, teacher-forcing the last ``tokens`` of
    ``context`` in verify-sized blocks through each: the number of positions compared. A kernel rounds
    differently (other GEMMs), so its logits differ in the last bits; where that changes an argmax here it is
    refused in one ConfigError line, since a verify on it would no longer reproduce plain greedy decoding. In bf16
    and fp16 a choice that differs only where eager's top two are a numerical tie (``equivalence.tie_tolerance``)
    passes, as it does in the bench's verdicts."""
    import torch

    from skipsearch.engine.equivalence import tie_tolerance

    tail = min(tokens, len(context) - 1)
    head, rest = list(context[:-tail]), list(context[-tail:])
    block = max(sm.kernel.chunk, 1)
    logits = {}
    for name in ("kernel", "eager"):
        cache = sm.decode_cache(len(context)) if name == "kernel" else sm.new_cache()
        sm.forward(torch.tensor(head, device=sm.device), start=0, cache=cache)
        out, n = [], len(head)
        for b in range(0, tail, block):
            ids = rest[b:b + block]
            out.append(sm.forward(torch.tensor(ids, device=sm.device), start=n, cache=cache).float())
            n += len(ids)
        logits[name] = torch.cat(out)  # [tail, V]
    mine, eager = logits["kernel"].argmax(-1), logits["eager"]
    best = eager.max(-1).values
    gap = (best - eager.gather(-1, mine.unsqueeze(-1)).squeeze(-1)).tolist()
    differ = sum(g > tie_tolerance(sm.dtype, b) for g, b in zip(gap, best.tolist(), strict=True))
    if differ:
        raise ConfigError(f"kernel {sm.kernel.label} changes the greedy choice at {differ} of {tail} positions here "
                          "against the eager kernel: its rounding would break identical output; use --kernel eager")
    return tail


__all__ = ["architecture_of", "calibration_context", "check_costs_for", "check_kernel_agrees", "fastest_kernels",
           "kernel_of", "measure_batched", "measure_cost_profile"]
