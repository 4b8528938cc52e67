"""Add the other schemes' acceptance traces to a profile's precision record, with no new search and no timing.

A precision profile (or a hybrid with a precision fallback) written before precision records traced the draft in
more than its searched scheme keeps its fp16 traces only, and no GPU cost file prices fp16 (fbgemm's kernel is
CPU-only). This script loads the model, rebuilds the calibration the record names (its ``workload``: data set,
prompts, tokens; the profile's search seed), re-traces the profile's draft in its own scheme and in every other
scheme this device runs (``precision.replan.trace_record``: one teacher-forced forward per sequence and scheme),
and, only where the re-traced own-scheme traces are the kept ones exactly (the same calibration, the same
numerics), adds the others to the record as ``measured.precision_traces.other_schemes``. Everything else in the
profile stays as it was: its draft, K, kernel, method_params and measured figures; its ``measured.notes`` says
what was added and by which command.

    python scripts/retrace_precision.py profiles/smollm2-135m/cpu-float32-precision-chat.yaml [...]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from _common import script_model

from skipsearch import methods
from skipsearch.engine.calibration import SPLIT, calibrate_on, calibration_workload
from skipsearch.engine.measuring import architecture_of
from skipsearch.methods.precision import PRECISION_KEY, precision_from_dict, precision_to_dict
from skipsearch.methods.precision.replan import trace_record
from skipsearch.profile import load_profile, save_profile
from skipsearch.search.objective import ModelObjective

_WORKLOAD = re.compile(rf"^(\S+) \({SPLIT} split\), (\d+) prompts x (\d+) tokens$")


def precision_draft(profile):
    """The profile's precision draft as a candidate of its own method: its own, or its hybrid fallback's (the
    methods that keep a precision record trace it through ``Method.traces``)."""
    method = methods.get(profile.method)
    if method.traces is not None:
        return profile.candidate
    fallback = profile.candidate.plain_params().get("fallback")
    params = method.parse(profile.method_params, draft=profile.draft, num_layers=profile.model.num_layers)
    return params.fallback_candidate(profile.draft) if isinstance(fallback, str) else None


def retrace(path: str, sm, calibrations: dict, *, command: str) -> str:
    profile = load_profile(path, num_layers=sm.num_layers)
    extra = dict(profile.measured.extra) if profile.measured else {}
    if PRECISION_KEY not in extra:
        return f"{path}: keeps no precision record: nothing to add (plan profile --profile traces one)"
    kept = precision_from_dict(extra[PRECISION_KEY], source=path)
    if kept.others:
        return f"{path}: already traced in {', '.join(kept.schemes())}"
    found = _WORKLOAD.match(kept.workload or "")
    if found is None:
        raise SystemExit(f"{path}: the record's workload {kept.workload!r} names no calibration this script rebuilds")
    dataset, n_prompts, max_new_tokens = found.group(1), int(found.group(2)), int(found.group(3))
    seed = profile.search.seed if profile.search and profile.search.seed is not None else 0
    key = (dataset, n_prompts, max_new_tokens, seed)
    if key not in calibrations:
        calibrations[key] = ModelObjective(sm, calibrate_on(sm, dataset=dataset, n_prompts=n_prompts,
                                                            max_new_tokens=max_new_tokens, seed=seed))
    assert calibration_workload(dataset, n_prompts, max_new_tokens) == kept.workload
    cand = precision_draft(profile)
    new = trace_record(calibrations[key], cand, workload=kept.workload, architecture=architecture_of(sm))
    if new.traces != kept.traces:
        same = sum(a == b for a, b in zip(new.traces, kept.traces, strict=True))
        raise SystemExit(f"{path}: its {kept.scheme} draft re-traced here differs from its record on "
                         f"{len(kept.traces) - same} of {len(kept.traces)} sequences (another calibration or other "
                         f"numerics): the other schemes' traces would not line up with it; nothing written")
    record = dataclasses.replace(kept, others=new.others)
    added = ", ".join(o.scheme for o in new.others)
    said = (f"the {added} acceptance traces (measured.{PRECISION_KEY}.other_schemes, teacher-forced on "
            f"{str(sm.device)}, no timing) were added later by `{command}`, on the record's calibration, where the "
            f"re-traced {kept.scheme} traces equal the kept ones; the draft, K, kernel and measured figures are the "
            f"search's")
    notes = f"{profile.measured.notes.rstrip()}; {said}" if profile.measured.notes else said
    entries = tuple((k, precision_to_dict(record) if k == PRECISION_KEY else v) for k, v in profile.measured.extra)
    measured = dataclasses.replace(profile.measured, extra=entries, notes=notes)
    save_profile(dataclasses.replace(profile, measured=measured), path)
    return f"{path}: added {added} traces ({', '.join(f'{o.scheme} α {o.alpha():.3f}' for o in new.others)})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    sm = script_model(args.model, threads=args.threads, device="cpu", dtype="float32")
    calibrations: dict = {}
    for path in args.profiles:  # each profile's notes name the command that adds its traces alone (the same work)
        command = " ".join(["python scripts/retrace_precision.py", path,
                            *([f"--threads {args.threads}"] if args.threads else [])])
        print(retrace(path, sm, calibrations, command=command), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
