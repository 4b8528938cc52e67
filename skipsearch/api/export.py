"""``skipsearch export`` as a library function: a profile as the configuration of the engine a user decodes with.

``export_profile`` reads the profile, re-plans it for ``--costs`` (through ``planning.replan_profile_file``, here
and nowhere else in the exporters), asks the engine what it cannot express, prices the nearest setting it can run
from the profile's own record, and either refuses in one line or (``nearest``) writes that setting. The export
directory is written whole or not at all, with its manifest ``export.yaml``: the profile it came from (path and
sha256), the model's fingerprints, the hardware, the speedup (measured, or predicted and from what) and the
setting. Returns an ``Exported``; printing is the caller's.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from skipsearch.config import ConfigError
from skipsearch.export import MANIFEST, MANIFEST_SCHEMA, ExportError, Written, get_engine
from skipsearch.export import shapes as sh
from skipsearch.files.errors import ProfileError
from skipsearch.files.targets import EXPORT, check_target
from skipsearch.methods.ngram import LOOKUP_KEY
from skipsearch.model.target import NATIVE
from skipsearch.profile import BASELINES, Profile, engine_run, load_profile, profile_to_dict


@dataclass(frozen=True)
class Speedup:
    value: float | None
    kind: str  # "measured" or "predicted"
    baseline: str | None  # one of profile.BASELINES
    source: str  # where the figure comes from, for people


@dataclass(frozen=True)
class Exported:
    engine: str
    out: Path
    setting: str  # the engine's setting, one line
    written: Written
    speedup: Speedup
    nearest: str | None  # the line saying what the engine could not express (None: exact)
    manifest: dict[str, Any]


# For a profile made for the int8 target (model.precision int8): what each engine runs as its 8-bit model.
TARGET_NOTES = {
    "llama.cpp": "the profile was made for the int8 target (int8 weights, one scale per row); llama.cpp's nearest is "
                 "the model at Q8_0 (one scale per block of 32 weights): convert it with convert_hf_to_gguf.py "
                 "--outtype q8_0 and give that as the target. Its output is the Q8_0 model's, not the int8 target's",
    "hf": "the profile was made for the int8 target: quantize_(model, Int8WeightOnlyConfig()) (torchao) before "
          "generate, so that the drafts are verified by the model they were chosen for",
    "": "the profile was made for the int8 target (int8 weights, one scale per row, 16- or 32-bit activations): "
        "serve a W8A16 checkpoint of the model (compressed-tensors, int8 weights per channel), which this export "
        "does not write; with the full-precision checkpoint the output is lossless but the speed is not the "
        "profile's",
}


def export_profile(profile: str, *, engine: str, out: str | os.PathLike, costs: str | None = None,
                   nearest: bool = False, force: bool = False, allow_slower: bool = False) -> Exported:
    """Export the profile at ``profile`` for ``engine`` into the directory ``out`` (see the module docstring)."""
    eng = get_engine(engine)
    out = Path(out)
    prof = original = load_profile(profile)
    check_target(out, EXPORT, replace=force)  # the one overwrite rule: an export replaces only an export
    # 0. what the engine itself measured (optimize --engine): its fastest setting, or a refusal where nothing beat
    # its plain decoding (an export must not ship a loss it knows of)
    run = engine_run(original, eng.name)
    if run is not None and run.ships_plain and not allow_slower:
        raise ExportError(f"{profile}: {run.summary()}. Serve the model with {eng.name}'s plain decoding; "
                          "--allow-slower writes this profile's own setting anyway")
    measured = run is not None and run.replaces_own and eng.write_run is not None
    # 1. K for the target: the profile's own, or re-planned for the target's cost file
    if costs:
        prof = _replan(prof, costs=costs, source=profile)
    speed = _speedup(prof, costs=costs)
    if run is not None and not run.ships_plain:
        speed = Speedup(run.speedup, "measured", f"{eng.name}-plain",
                        f"timed by {eng.name} itself against its plain decoding ({run.hardware})")
    # 2. what the engine cannot express: one line, and the nearest setting it runs instead
    line = None
    gap = None if measured else eng.gap(prof)
    if gap is not None:
        near, near_speed = _priced(gap.nearest, costs=costs, source=profile)
        shown = f"no predicted speedup: {near_speed.source}" if near_speed.value is None else (
            f"predicted {near_speed.value:.2f}x over skipsearch's autoregressive loop, {near_speed.source}")
        line = f"{profile}: {engine} cannot express {gap.what}; nearest it runs: {eng.describe(near)} ({shown})"
        if not nearest:
            raise ExportError(f"{line}; --nearest writes it")
        prof, speed = near, near_speed
    # 3. the files, written whole or not at all
    from skipsearch.files.yamlio import replace_dir

    loader = _Loader(profile, prof)

    def build(stage: Path) -> tuple[Written, dict]:
        written = eng.write_run(stage, run, loader) if measured else eng.write(stage, prof, loader)
        if run is None and eng.write_run is not None:
            written = replace(written, notes=(*written.notes, f"not timed on {eng.name}: `skipsearch optimize "
                                              f"--engine {eng.name} --profile {profile}` times it there"))
        elif run is not None and run.ships_plain:  # --allow-slower: the manifest keeps what the engine measured
            written = replace(written, notes=(*written.notes, f"written with --allow-slower: {run.summary()}"))
        if original.model.target_precision != NATIVE:  # the engine's own 8-bit model, named
            written = replace(written, notes=(*written.notes, TARGET_NOTES.get(eng.name, TARGET_NOTES[""])))
        _relocate_files(written, stage, out)
        written = _relocated(written, stage, out)
        manifest = _manifest(eng.name, profile, original, prof, speed, written, line, costs=costs)
        body = yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True, width=120)
        (stage / MANIFEST).write_text(f"# skipsearch export (schema v{MANIFEST_SCHEMA})\n{body}")
        return written, manifest

    try:
        written, manifest = replace_dir(out, build)
    except OSError as e:
        raise ExportError(f"{out}: cannot write the export: {e.strerror or e}") from None
    setting = (" ".join(written.setting.get("flags", ())) or run.setting) if measured else eng.describe(prof)
    return Exported(eng.name, out, setting, written, speed, line, manifest)


def _relocated(written: Written, stage: Path, out: Path) -> Written:
    """What an engine wrote in the staging directory, its paths named as they will be once it is in place."""
    def moved(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(str(stage), str(out))
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(moved(v) for v in value)
        return value

    return Written(written.files, moved(written.setting), moved(written.usage), written.notes)


def _relocate_files(written: Written, stage: Path, out: Path) -> None:
    """The engine's text files name paths in the staging directory (a draft's path in a config): name them as they
    will be once it is in place."""
    from skipsearch.files.yamlio import write_atomic

    for name in written.files:
        path = stage / name
        if path.is_file() and path.suffix in (".json", ".txt", ".yaml", ".md", ".py"):
            text = path.read_text(encoding="utf-8")
            if str(stage) in text:
                write_atomic(path, text.replace(str(stage), str(out)))


def _replan(prof: Profile, *, costs: str | None, source: str) -> Profile:
    """``prof`` re-planned for the cost file ``costs`` (None: the costs it kept): the one call into re-planning.
    The profile goes through a file because the API re-plans files."""
    from skipsearch.api.planning import replan_profile_file
    from skipsearch.profile import save_profile

    with tempfile.TemporaryDirectory(prefix="skipsearch-export-") as tmp:
        path = Path(tmp) / "profile.yaml"
        save_profile(prof, path)
        outcome = replan_profile_file(str(path), costs=costs)
    if outcome.profile is None:
        raise ProfileError(f"{source}: re-planning gave no profile")
    return outcome.profile


def _speedup(prof: Profile, *, costs: str | None) -> Speedup:
    m = prof.measured
    if prof.draft.max_draft_tokens == 0:
        return Speedup(1.0, "predicted", "predicted", "plain decoding")
    if m is not None and m.speedup is not None and m.baseline != "predicted" and not costs:
        return Speedup(m.speedup, "measured", m.baseline, f"timed by {m.source or 'skipsearch'}")
    value = m.predicted_speedup if m is not None and m.predicted_speedup is not None else (
        m.speedup if m is not None else None)
    where = f"re-planned for {costs}" if costs else "the profile's prediction"
    return Speedup(value, "predicted", "predicted", where if value is not None else "not recorded")


def _priced(near: Profile, *, costs: str | None, source: str) -> tuple[Profile, Speedup]:
    """The nearest setting with K re-planned from the profile's record and its predicted speedup; plain decoding is
    1.00x by definition; a setting the record does not cover keeps its K and has no prediction."""
    if near.draft.max_draft_tokens == 0:
        return near, Speedup(1.0, "predicted", "predicted", "plain decoding")
    extra = dict(near.measured.extra) if near.measured else {}
    if sh.lookup_alone(near) and LOOKUP_KEY in extra:
        try:
            planned = _replan(near, costs=costs, source=source)
        except (ProfileError, ConfigError):
            planned = None
        if planned is not None and planned.measured is not None and planned.measured.predicted_speedup is not None:
            # a lookup that pays at no K keeps the profile's K (the engine still runs it) and the best K's figure
            ships = planned if planned.draft.max_draft_tokens else near
            what = "from the profile's lookup record" + ("" if planned.draft.max_draft_tokens else
                                                          ", at its best K; no K pays")
            return ships, Speedup(planned.measured.predicted_speedup, "predicted", "predicted", what)
    return near, Speedup(None, "predicted", None, "the profile's record does not cover it")


class _Loader:
    """The model whose weights an engine writes a draft copy of, loaded on first use and checked against the
    profile as ``decode`` checks it; returns (adapter, checkpoint directory)."""

    def __init__(self, path: str, prof: Profile) -> None:
        self.path, self.prof, self.loaded = path, prof, None

    def __call__(self):
        if self.loaded is None:
            from skipsearch.api.loading import open_model
            from skipsearch.checkpoints import find_checkpoint

            sm, _ = open_model(profile=self.path, device="cpu", dtype="float32")
            checkpoint = find_checkpoint(self.prof.model.name).path
            if sm.target_precision != NATIVE:  # an engine's draft files are written from fp32 weights
                from skipsearch.bench.llamacpp_ggufs import gguf_source

                sm = gguf_source(sm, checkpoint)
            self.loaded = (sm, checkpoint)
        return self.loaded


def _manifest(engine: str, path: str, original: Profile, prof: Profile, speed: Speedup, written: Written,
              line: str | None, *, costs: str | None) -> dict[str, Any]:
    """What the export came from and what it holds. ``prof`` is what was written: ``original`` itself, re-planned
    for ``costs``, or the nearest setting the engine runs."""
    raw = Path(path).read_bytes()
    env = prof.environment
    hardware = {k: getattr(env, k) for k in ("cpu_model", "cpu_capability", "threads", "gpu_name", "gpu_capability",
                                             "device")} if env is not None else {}
    data = profile_to_dict(prof)
    return {
        "schema_version": MANIFEST_SCHEMA,
        "engine": engine,
        "profile": {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(), "method": original.method,
                    "max_draft_tokens": original.draft.max_draft_tokens},
        "written": {"method": prof.method, "draft": data["draft"], "method_params": data.get("method_params", {})},
        "model": {k: v for k, v in data["model"].items()},
        "hardware": {k: v for k, v in hardware.items() if v is not None} or "not recorded in the profile",
        "costs": costs,
        "speedup": {"value": None if speed.value is None else round(speed.value, 4), "kind": speed.kind,
                    "baseline": speed.baseline, "baseline_means": BASELINES.get(speed.baseline or ""),
                    "source": speed.source},
        "setting": written.setting,
        "exact": line is None,
        "nearest": line,
        "usage": written.usage,
        "notes": list(written.notes),
        "files": [*written.files, MANIFEST],
    }


__all__ = ["Exported", "Speedup", "export_profile"]
