"""Fractal's record and re-plan: whether its (n, w) draft pays under another device's costs.

The record (``record.FractalRecord``, made by ``surrogate.record``) is the draft's acceptance cycle by
cycle; a pass is priced from the cost file (``pass_ratio``). K is the draft's own w + n + 1, or 0: a shorter K
would shrink w, another draft, which the record does not cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from skipsearch.files.costs import Costs
from skipsearch.files.errors import CostsError, NoRecordError, ProfileError
from skipsearch.files.records import NO_HIT
from skipsearch.methods.base import Keeping, Kept, Record, Replanned, Replanning
from skipsearch.methods.fractal.params import FractalParams
from skipsearch.methods.fractal.record import FRACTAL_KEY, FractalRecord, fractal_from_dict, fractal_to_dict


def keep(k: Keeping) -> Kept:
    """One draft pass per decoding cycle over the calibration (``surrogate.record``)."""
    from skipsearch.methods.fractal.surrogate import record

    sm = k.objective.sm
    params = FractalParams.parse(k.candidate.plain_params(), draft=k.candidate.draft, num_layers=sm.num_layers)
    rec = record(sm, k.objective.cal, params, workload=k.workload, architecture=k.architecture)
    return Kept(((FRACTAL_KEY, fractal_to_dict(rec)),))


RECORD = Record(formats=((FRACTAL_KEY, fractal_from_dict),), build=keep)


def fractal_scheme(quantization: str, device: str, have: Sequence[str], recorded: str | None = None) -> str:
    """The compressed layers' scheme a fractal draft runs on ``device`` (a cost file's device): ``quantization``
    itself, or for auto what the drafter picks there (int8-dynamic on a CPU; on CUDA bnb-int8 where the cost file
    has it, as the drafter takes it where bitsandbytes is installed, else int8-weight-only). A device named
    neither way takes the ``recorded`` scheme, or the first fractal scheme the cost file has."""
    if quantization != "auto":
        return quantization
    if device.startswith("cpu"):
        return "int8-dynamic"
    if device.startswith("cuda"):
        return "bnb-int8" if "bnb-int8" in have else "int8-weight-only"
    options = [s for s in (recorded, "int8-dynamic", "int8-weight-only", "bnb-int8") if s]
    return next((s for s in options if s in have), options[0])


def compressed_ratio(costs: Costs, num_layers: int, scheme: str, *, source: str) -> float:
    """c_q: a one-token step through fractal's compressed copy in ``scheme`` over one full step, from a cost
    file's ``costs`` (the whole model in the scheme); a ``none`` scheme (the ablation) compresses nothing: 1.
    A cost file without the scheme is one line."""
    if scheme == "none":
        return 1.0
    sc = costs.scheme(scheme)
    if sc is None:
        raise CostsError(f"{source}: no costs for fractal's {scheme} layers: measure them with "
                         f"`skipsearch costs --schemes {scheme}`")
    return max(costs.whole_model_ratio(sc, num_layers), 0.0)


def pass_ratio(rec: FractalRecord, scheme: str, cq: float, costs) -> tuple[float, str]:
    """One fractal draft pass over one full step under ``costs`` (a surrogate.CostModel), and the note on how it
    is priced (fractal.surrogate): v(w + n + 1) · (1 + n · c_q), the n passes through the compressed copy at
    one-token cost (``cq``, ``compressed_ratio``) scaled by the full model's verify of the window."""
    k = rec.drafted
    note = (f"approximation: a fractal pass is priced as v({k}) x (1 + {rec.n} x {cq:.3f}), the {rec.n} passes "
            f"through the {scheme} copy at one-token cost scaled by the full model's v({k})")
    if scheme != rec.scheme:
        note += f"; its acceptance was recorded with {rec.scheme} layers"
    return costs.verify(k) * (1 + rec.n * cq), note


def replay_fractal(rec: FractalRecord, costs, c_pass: float):
    """The fractal draft's cycles replayed from the record by the engine's rules (ngram.replay_cycles); each cycle
    pays one pass (``c_pass`` steps) and v(drafted + 1). Acceptance is the record's (fractal.surrogate: the
    engine's own passes up to float rounding in the committed KV)."""
    from skipsearch.methods.ngram import cycle_measurement, replay_cycles

    cycles = []
    for seq in rec.positions():
        def propose(_seq, t, limit, seq=seq):
            if seq[t - 1] == NO_HIT:
                raise ProfileError(f"the fractal record has no cycle at position {t}, where its replay starts one")
            drafted = min(rec.drafted, limit)
            return FractalParams.method, drafted, min(seq[t - 1], drafted)
        cycles += replay_cycles((), range(len(seq) + 1), max_new_tokens=rec.max_new_tokens, propose=propose)
    passes = sum(1 for c in cycles if c[1])
    return cycle_measurement(cycles, verify=costs.verify, draft_steps=passes * c_pass, cost_ratio=c_pass)


def replan(job: Replanning) -> Replanned:
    """Whether the profile's (n, w) draft pays under the cost file, from its fractal record (acceptance) and its
    pass priced from the cost file (``pass_ratio``)."""
    profile, target = job.profile, job.target
    extra, layers = job.extra, profile.model.num_layers
    rec = fractal_from_dict(extra[FRACTAL_KEY], source=job.source) if FRACTAL_KEY in extra else None
    params = FractalParams.parse(profile.candidate.plain_params(), draft=profile.draft, num_layers=layers)
    positions = tuple(params.positions(layers))
    if rec is not None and (rec.n, rec.w, rec.layers) != (len(positions), params.w, positions):
        raise ProfileError(f"{job.source}: measured.{FRACTAL_KEY} was recorded for another fractal draft than the "
                           f"profile's (n, w or layers); run optimize again")
    job.check_costs((rec and rec.architecture) or job.weights_architecture)
    scheme = fractal_scheme(params.quantization, target.device, [s.scheme for s in target.costs.schemes],
                            rec.scheme if rec is not None else None)
    cq = compressed_ratio(target.costs, layers, scheme, source=job.costs_source)
    if rec is None:  # after the cost file's checks: a caller may trace the draft on the model next
        raise NoRecordError(f"{job.source}: keeps no fractal record (measured.{FRACTAL_KEY}): it was written before "
                            f"fractal profiles kept one, or by hand; plan traces its draft on the model "
                            f"(`skipsearch plan profile --profile`), or run optimize again")
    cm = target.cost_model()
    c, note = pass_ratio(rec, scheme, cq, cm)
    m = replay_fractal(rec, cm, c)
    best = replace(profile.draft, max_draft_tokens=rec.drafted)
    ships = best if m.speedup > 1.0 else replace(profile.draft, max_draft_tokens=0)
    return Replanned(ships, m, best, ((best, m),), note, column="the draft",
                     basis=f"its fractal record (n, w fixed: K = w + n + 1 = {rec.drafted}; c: one draft pass over "
                           f"one step)")


__all__ = ["RECORD", "compressed_ratio", "fractal_scheme", "keep", "pass_ratio", "replan", "replay_fractal"]
