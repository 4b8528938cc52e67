"""``--engine vllm``: the JSON of vLLM's ``--speculative-config`` (``LLM(speculative_config=...)``), and for a
precision draft the draft model it names, as a quantized checkpoint directory.

Keys as vLLM 0.33.0 defines them (``vllm/config/speculative.py``, ``SpeculativeConfig``):
- a lookup: ``method: ngram`` with ``num_speculative_tokens`` (K), ``prompt_lookup_min`` and ``prompt_lookup_max``
  (the lookup's suffix lengths, longest tried first, as skipsearch's ``ngram``);
- an int8 or int4 copy of the model: ``method: draft_model`` with ``model`` (the export's ``draft-<scheme>``
  directory: the model's weights as a compressed-tensors checkpoint, ``ct_draft``), ``quantization:
  compressed-tensors`` and K.
What it cannot express:
- a hybrid's fallback: a server runs one draft method, so there is no lookup-then-draft-model;
- an fp16 copy: vLLM builds a draft model's config with the target's dtype (``dtype=target_model_config.dtype``),
  so a 16-bit copy of the served model runs as the served model;
- a draft exit threshold, skipped sublayers or a trimmed head on the copy (``ct_draft.copy_problem``);
- layer-skip, CLaSp, fractal and hierarchical drafts: no such method.

A profile's schedule (skipsearch.files.schedule) becomes ``num_speculative_tokens_per_batch_size``: inclusive ``[start,
end, k]`` ranges, as vLLM validates them (``validate_and_normalize_dynamic_sd_schedule``): a non-empty list, each
start and end >= 1, start <= end, k >= 0, sorted and non-overlapping, the first range starting at 1. vLLM fills a gap
between ranges, and every batch size past the last, with the K before it, and clamps each k to
``num_speculative_tokens`` (which must be > 0); a schedule runs K = 0 outside its ranges, so the export writes those
K = 0 ranges out (before the first, in gaps, and one after the last) and sets ``num_speculative_tokens`` to the
largest k.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from skipsearch.export import ct_draft
from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, ExportError, Gap, Written, plain, served_model, write_text
from skipsearch.files.engine_runs import EngineRun, vllm_config
from skipsearch.files.schedule import Schedule
from skipsearch.profile import Profile

CONFIG = "speculative_config.json"
# vLLM's own names for its speculative methods (``SpeculativeConfig.method``): vLLM's words, which a skipsearch
# method's name may happen to spell
METHODS = {"lookup": "ngram", "draft model": "draft_model"}
PER_BATCH = "num_speculative_tokens_per_batch_size"


def gap(profile: Profile) -> Gap | None:
    if profile.draft.max_draft_tokens == 0:
        return None
    s = sh.setting(profile)
    if s.lookup is not None and s.fallback is None:
        return None
    if s.lookup is not None:
        near = sh.lookup_only(profile)
        return Gap(f"a lookup with a {s.fallback} fallback (a vLLM server runs one draft method)", near,
                   describe(near))
    if s.draft_model is not None:
        return ct_draft.copy_gap(profile, describe)
    return Gap(f"{profile.method} drafts (no vLLM method drafts with the model's own layers)", plain(profile),
               describe(plain(profile)))


def batch_ranges(schedule: Schedule) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size`` of ``schedule``: its ranges with K = 0 written out where vLLM would
    otherwise carry a K forward (before the first range, in gaps, after the last), neighbours of one K merged."""
    out: list[list[int]] = []

    def add(start: int, end: int, k: int) -> None:
        if out and out[-1][2] == k and out[-1][1] + 1 == start:
            out[-1][1] = end
        else:
            out.append([start, end, k])

    nxt = 1
    for r in schedule.ranges:
        if r.start > nxt:
            add(nxt, r.start - 1, 0)
        add(r.start, r.end, r.k)
        nxt = r.end + 1
    if out[-1][2] != 0:  # vLLM carries the last K to every larger batch; the schedule runs 0 there
        add(nxt, nxt, 0)
    return out


def check_batch_ranges(entries: object, num_speculative_tokens: object) -> None:
    """vLLM 0.33's rules for ``num_speculative_tokens_per_batch_size`` beside ``num_speculative_tokens``; one
    ExportError line for a schedule vLLM would refuse or silently change."""
    what = PER_BATCH
    if not isinstance(entries, list) or not entries:
        raise ExportError(f"{what} must be a non-empty list of [start, end, k]")
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or \
            num_speculative_tokens < 1:
        raise ExportError(f"num_speculative_tokens must be an integer > 0 beside {what}, got {num_speculative_tokens}")
    before = 0
    for i, e in enumerate(entries):
        if not isinstance(e, list | tuple) or len(e) != 3 or any(isinstance(x, bool) or not isinstance(x, int)
                                                                for x in e):
            raise ExportError(f"{what}[{i}] must be three integers [start, end, k], got {e!r}")
        start, end, k = e
        if start < 1 or end < 1:
            raise ExportError(f"{what}[{i}]: batch sizes {start}..{end} must be positive")
        if start > end:
            raise ExportError(f"{what}[{i}]: start {start} is after end {end}")
        if k < 0:
            raise ExportError(f"{what}[{i}]: k must be >= 0, got {k}")
        if k > num_speculative_tokens:
            raise ExportError(f"{what}[{i}]: k {k} is above num_speculative_tokens {num_speculative_tokens} "
                              f"(vLLM would clamp it)")
        if start <= before:
            raise ExportError(f"{what}[{i}]: batch sizes {start}..{end} overlap or precede the range before; ranges "
                              f"must be sorted and must not overlap")
        before = end
    if entries[0][0] != 1:
        raise ExportError(f"{what} must start at batch size 1, got {entries[0][0]}")


def _scheduled(profile: Profile, cfg: dict) -> dict:
    """``cfg`` with the profile's schedule, checked; a schedule that never drafts is plain decoding."""
    schedule = profile.schedule
    if not cfg or schedule is None:
        return cfg
    entries = batch_ranges(schedule)
    top = max(k for _, _, k in entries)
    if top == 0:
        return {}
    cfg = {**cfg, "num_speculative_tokens": top, PER_BATCH: entries}
    check_batch_ranges(entries, top)
    return cfg


def config(profile: Profile, *, draft_path: str | None = None) -> dict:
    """The ``--speculative-config`` mapping; empty for plain decoding. ``draft_path``: where the draft checkpoint
    of a copy lies (default: its directory's name, as inside the export)."""
    if profile.draft.max_draft_tokens == 0:
        return {}
    lk, dm = sh.setting(profile).lookup, ct_draft.exported_copy(profile)
    if dm is not None:
        return _scheduled(profile, {"method": "draft_model", "model": draft_path or ct_draft.draft_dir(dm.scheme),
                                    "quantization": "compressed-tensors", "num_speculative_tokens": dm.k})
    if lk is None:
        return {}
    return _scheduled(profile, {"method": "ngram", "num_speculative_tokens": lk.k, "prompt_lookup_min": lk.min_n,
                                "prompt_lookup_max": lk.max_n})


def is_lookup(config: dict | None) -> bool:
    """Whether a ``--speculative-config`` mapping drafts by vLLM's prompt lookup."""
    return bool(config) and config.get("method") == METHODS["lookup"]


def nearest_config(profile: Profile) -> tuple[dict, bool]:
    """(the ``--speculative-config`` the profile's export writes, or the nearest setting's where vLLM cannot run the
    profile whole; whether it is that nearest). Empty: plain decoding."""
    missing = gap(profile)
    return config(missing.nearest if missing is not None else profile), missing is not None


def describe(profile: Profile) -> str:
    cfg = config(profile)
    return f"--speculative-config '{json.dumps(cfg)}'" if cfg else "no --speculative-config (plain decoding)"


def write(directory: Path, profile: Profile, model=None) -> Written:
    draft, info, notes = ct_draft.write_draft(directory, profile, model)
    cfg = config(profile, draft_path=draft)
    files = (write_text(directory, CONFIG, json.dumps(cfg, indent=2) + "\n"),)
    if draft is not None:
        files = (*files, Path(draft).name)
    target = shlex.quote(served_model(profile).hf)  # the hub id or directory vLLM loads, never skipsearch's alias
    usage = (f"vllm serve {target} --speculative-config \"$(cat {shlex.quote(str(directory / CONFIG))})\"" if cfg
             else f"vllm serve {target}")
    if cfg and draft is None:  # a lookup
        notes = ("vLLM's ngram proposer takes the latest earlier match of the longest suffix in "
                 "prompt_lookup_min..max, as skipsearch's lookup does; the predicted speedup is skipsearch's engine's",)
    if PER_BATCH in cfg:
        notes = (*notes, f"draft length per batch size from the profile's schedule ({profile.schedule.describe()}); "
                         f"num_speculative_tokens is its largest K")
    setting = {**cfg, "draft_checkpoint": info} if info else cfg
    return Written(files, setting, usage, notes)


def write_run(directory: Path, run: EngineRun, model=None) -> Written:
    """The config vLLM itself ran fastest (``skipsearch optimize --engine vllm``), its draft length per batch size
    as measured at each concurrency, written as the search served it."""
    cfg = vllm_config(run)
    file = write_text(directory, CONFIG, json.dumps(cfg, indent=2) + "\n")
    usage = f"vllm serve MODEL --speculative-config \"$(cat {shlex.quote(str(directory / CONFIG))})\""
    notes = [f"measured: {run.summary()}",
             f"MODEL is the checkpoint vLLM was timed with ({run.target})"]
    if PER_BATCH in cfg:
        notes.append(f"draft length per batch size as measured at each concurrency ({run.setting}); K = 0 past the "
                     "largest concurrency measured")
    return Written((file,), {**cfg, "measured_setting": run.setting}, usage, tuple(notes))


ENGINE = Engine(name="vllm", describe=describe, gap=gap, write=write, write_run=write_run,
                checked="against a schema of vLLM 0.33.0's SpeculativeConfig kept in the tests; lookups and their "
                        "draft length per batch size served by vLLM's CPU build 0.32.0 (optimize --engine vllm, "
                        "bench --peers vllm); the draft checkpoint decompressed with compressed-tensors and loaded "
                        "by transformers")

__all__ = ["CONFIG", "ENGINE", "METHODS", "PER_BATCH", "batch_ranges", "check_batch_ranges", "config", "describe",
           "gap", "is_lookup", "nearest_config", "write", "write_run"]
