"""A profile's schema versions and the steps that take a file of any earlier version to this one, so that every
file that ever loaded still loads; and the baselines a measured speedup can name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skipsearch.files.errors import ProfileError
from skipsearch.files.yamlio import mapping
from skipsearch.files.yamlio import short as _short

# Schema versions. Bump SCHEMA_VERSION whenever a key changes shape or meaning, and add a step
# to _UPGRADES that takes a dict of the previous version to the new one, so old files still load.
#   1: first version: schema_version, model, method, draft (skip_attn, skip_mlp,
#      max_draft_tokens, exit), optional measured, environment, search, method_params.
#   2: new optional keys (a version-1 file is a valid version-2 file, so _v1_to_v2 changes nothing):
#      - model.weights_fingerprint: a hash of the weights themselves, which check_model trusts over
#        model.fingerprint (architecture and --model string), kept beside it for upgrade
#      - environment.device, environment.device_choice: the device the model ran on and how
#        --device/--dtype auto were resolved
#      - measured.acceptance: the traces (per-position match bit and top probability, per calibration
#        sequence) of the shortlisted layer-skip skip sets, and measured.costs: the cost profile the
#        profile was planned with; what `plan --profile --costs` re-plans from (skipsearch.files.records
#        validates both, here and where they are read)
#   3: measured.baseline is one of BASELINES, no longer free text: optimize wrote "skipsearch autoregressive, same
#      process, interleaved" and bench --write-measured "hf-greedy (transformers generate, ...)", and only that
#      prose told a speedup over our own loop from one over HF greedy. _v2_to_v3 maps the texts skipsearch wrote
#      (and close hand-written ones) to their value; any other text moves to measured.baseline_text, unvalidated,
#      so that every file that loaded before still loads.
#   4: optional top-level ``kernel``: the kernel (skipsearch.kernels: eager, inductor-c4, ...) the profile was timed or
#      planned with, which ``decode`` and ``bench`` run it through unless told otherwise; a version-3 file names none
#      and decodes on the eager kernel, as before (_v3_to_v4 changes nothing).
#   5: optional top-level ``schedule`` (files.schedule): a draft length per batch-size range, planned from a cost
#      file's batched grid; a version-4 file has none and runs its own K at every batch size (_v4_to_v5 changes
#      nothing).
#   6: optional ``model.precision`` (model/target.py): the target's precision, ``int8`` for a profile made for the
#      model's int8 weight-only target; absent (every version-5 file) or ``native``: the checkpoint's weights in
#      model.dtype, as before (_v5_to_v6 changes nothing).
SCHEMA_VERSION = 6

# What a measured speedup is relative to (Measured.baseline): the value, and what it means for people.
BASELINE_OURS_AR = "skipsearch-ar"
BASELINE_HF_GREEDY = "hf-greedy"
BASELINE_PREDICTED = "predicted"
BASELINES: dict[str, str] = {
    BASELINE_OURS_AR: "skipsearch's own autoregressive loop, timed in the same process, interleaved",
    BASELINE_HF_GREEDY: "HF transformers generate(do_sample=False), timed in the same bench run",
    BASELINE_PREDICTED: "not timed: the cost model's prediction over skipsearch's own autoregressive loop",
}
# The free text of schema 1 and 2 (lower-cased prefixes) -> the baseline it names.
_OLD_BASELINES = (
    ("skipsearch-ar", BASELINE_OURS_AR), ("skipsearch autoregressive", BASELINE_OURS_AR),
    ("skipsearch-autoregressive", BASELINE_OURS_AR), ("hf-greedy", BASELINE_HF_GREEDY),
    ("hf greedy", BASELINE_HF_GREEDY), ("cost-model prediction", BASELINE_PREDICTED),
    ("planner prediction", BASELINE_PREDICTED), ("predicted", BASELINE_PREDICTED),
)
OLD_BASELINE_KEY = "baseline_text"  # measured.<key>: a schema-1/2 baseline text that names none of BASELINES


def _v1_to_v2(raw: dict) -> dict:
    return dict(raw)  # version 2 (and 4 from 3, 5 from 4, 6 from 5) only adds optional keys


def _old_baseline(text: str) -> str | None:
    """The value of BASELINES a schema-1/2 baseline text names, or None."""
    folded = " ".join(text.lower().split())
    return next((value for prefix, value in _OLD_BASELINES if folded.startswith(prefix)), None)


def _v2_to_v3(raw: dict) -> dict:
    out = dict(raw)
    if not isinstance(out.get("measured"), dict):  # absent; or not a mapping, which is refused as before
        return out
    measured = out["measured"] = dict(out["measured"])
    text = measured.get("baseline")
    if isinstance(text, str):  # a value that is not text is refused as before
        value = _old_baseline(text)
        if value is not None:
            measured["baseline"] = value
        else:
            del measured["baseline"]
            if text.strip():
                measured.setdefault(OLD_BASELINE_KEY, text)
    before = measured.get("before_bench")  # what bench --write-measured moved aside names its baseline too
    if isinstance(before, dict) and isinstance(before.get("baseline"), str) and _old_baseline(before["baseline"]):
        measured["before_bench"] = {**before, "baseline": _old_baseline(before["baseline"])}
    return out


# version v -> one returning v+1
_UPGRADES: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v1_to_v2, 4: _v1_to_v2, 5: _v1_to_v2}


def _err(source: str, problem: str) -> ProfileError:  # the profile's one-line error; document.py raises it too
    return ProfileError(f"{source}: {problem}")


def _mapping(value: Any, path: str, source: str) -> dict:
    return mapping(value, path, source, error=ProfileError)


def upgrade(raw: dict, *, source: str = "<profile>") -> dict:
    """Take a profile dict of any schema version this release knows to the current version."""
    version = _mapping(raw, "the profile", source).get("schema_version")
    if version is None:
        raise _err(source, "missing required key schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        readable = "1" if SCHEMA_VERSION == 1 else f"1..{SCHEMA_VERSION}"
        shown = version if type(version) is int else _short(version)
        raise _err(source, f"unknown schema_version {shown} (this skipsearch reads {readable})")
    out = dict(raw)  # the caller's dict stays as it was
    while version < SCHEMA_VERSION:
        out, version = _UPGRADES[version](out), version + 1
    out["schema_version"] = SCHEMA_VERSION
    return out
