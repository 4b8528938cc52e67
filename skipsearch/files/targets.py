"""The one overwrite rule for every file a command writes: profiles, cost files, exports, reports and plots.

A file that exists at an output path is replaced only when it is the same kind of file (a profile over a profile, a
cost file over a cost file, an export over an export) and the command was asked to replace it (``--force``, or what
the command documents as its ask: ``bench --write-measured`` for the profiles it updates). Otherwise the command
stops in one line, before any work, and the file is kept. An empty file holds nothing to lose and is written over.

The kind of what is there is read from its content (a header, a title, schema keys, a PNG signature), never from its
name: a profile named ``costs.yaml`` is a profile.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from skipsearch.files.errors import TargetError
from skipsearch.files.yamlio import OneLineError, read_yaml

# The kinds, and what a message calls each.
PROFILE, COSTS, EXPORT = "profile", "costs", "export"
BENCH_REPORT, BENCH_JSON, PLAN_REPORT, PLOT = "bench-report", "bench-json", "plan-report", "plot"
NOUNS = {PROFILE: "skipsearch profile", COSTS: "skipsearch cost file", EXPORT: "skipsearch export",
         BENCH_REPORT: "skipsearch bench report", BENCH_JSON: "skipsearch bench JSON report",
         PLAN_REPORT: "skipsearch plan report", PLOT: "PNG plot"}

# What each writer puts first (tests/test_files.py checks each against the writer's own output).
PROFILE_HEADER = "# skipsearch draft profile"  # save_profile
COSTS_HEADER = "# skipsearch cost profile"  # costs.save_costs
EXPORT_MANIFEST = "export.yaml"  # export.MANIFEST: the file an export directory holds
BENCH_TITLE = "# skipsearch bench:"  # bench.report.render_markdown
BENCH_JSON_FORMAT = '"format": "skipsearch-bench"'  # bench.report.report_json, the document's first key
PLAN_TITLES = ("# Hierarchical ", "# Re-planned profile")  # plan's reports, in each of its modes
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_HEAD = 4096  # bytes read to tell a kind by its header


def kind_of(path: str | os.PathLike) -> str | None:
    """The kind of skipsearch file (or export directory) at ``path``, read from its content; None: not one of
    skipsearch's (or unreadable)."""
    path = Path(path)
    if path.is_dir():
        return EXPORT if (path / EXPORT_MANIFEST).is_file() else None
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return None
    if head.startswith(PNG_SIGNATURE):
        return PLOT
    text = head.decode("utf-8", "replace")
    first = text.split("\n", 1)[0]
    for kind, marks in ((PROFILE, (PROFILE_HEADER,)), (COSTS, (COSTS_HEADER,)), (BENCH_REPORT, (BENCH_TITLE,)),
                        (PLAN_REPORT, PLAN_TITLES)):
        if first.startswith(marks):
            return kind
    if text.lstrip().startswith("{") and BENCH_JSON_FORMAT in text[:256]:
        return BENCH_JSON
    try:  # a hand-written profile or cost file has no header: its top-level keys tell
        raw = read_yaml(path, str(path))
    except OneLineError:
        return None
    return document_kind(raw)


def document_kind(raw: object) -> str | None:
    """The kind of a parsed skipsearch YAML document, from its top-level keys: a profile, an export's manifest
    (``export.yaml``, whose ``costs`` key names a cost file) or a cost file; None: none of them."""
    if isinstance(raw, dict) and "schema_version" in raw:
        if "method" in raw or "draft" in raw:
            return PROFILE
        if "engine" in raw and "setting" in raw:
            return EXPORT
        if "costs" in raw:
            return COSTS
    return None


_INSTEAD = {PROFILE: "draft profiles go to --profile", COSTS: "cost files (`skipsearch costs` writes them) go to "
            "--costs", EXPORT: "the profile it exported is profile.yaml beside it"}


def misplaced(raw: object, want: str) -> str | None:
    """Where a parsed document is plainly another kind than ``want`` (a cost file read as a profile), the one-line
    problem to raise, naming what it is and where it goes; else None (the reader's own checks go on)."""
    kind = document_kind(raw)
    if kind is None or kind == want:
        return None
    what = f"{NOUNS[EXPORT]}'s manifest" if kind == EXPORT else NOUNS[kind]
    return f"this is a {what}, not a {NOUNS[want]}: {_INSTEAD[kind]}"


def check_target(path: str | os.PathLike, kind: str, *, replace: bool = False, flag: str = "--force") -> Path:
    """Refuse, in one line (TargetError), a path the command could not or must not write a ``kind`` file to.

    Checked: every existing ancestor is a directory and the nearest is writable (a file is written beside its target
    and renamed); what is at the target, if anything, is a regular file (a directory for an export), writable, and,
    unless empty, of the same kind, which is replaced only with ``replace`` (the command's ``flag`` says so). A
    read-only target is refused even for root, who could replace it: its write bits were taken away on purpose.
    """
    target, source = Path(path), str(path)
    try:
        _check(target, kind, replace=replace, flag=flag)
    except OSError as e:  # e.g. a folder on the way that may not even be looked into
        raise TargetError(f"{source}: cannot write here: {e.strerror or e}") from None
    return target


def _check(target: Path, kind: str, *, replace: bool, flag: str) -> None:
    def refuse(problem: str) -> TargetError:
        return TargetError(f"{target}: {problem}")

    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:  # the first folder that exists
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise refuse(f"cannot write here: {ancestor} is not a directory")
    if not _writable(ancestor, directory=True):
        raise refuse(f"cannot write here: directory {ancestor} is not writable")
    if not target.exists() and not target.is_symlink():
        return
    noun = NOUNS[kind]
    if kind == EXPORT:
        if target.is_symlink() or not target.is_dir():
            raise refuse("exists and is not a directory; give a directory for the export")
        if not any(target.iterdir()):
            return
    else:
        if target.is_dir():
            raise refuse("is a directory; give a file path")
        if not target.is_file():
            raise refuse("exists and is not a regular file; refusing to replace it")
        if not _writable(target, directory=False):
            raise refuse("exists and is read-only (or immutable); refusing to replace it")
        if target.stat().st_size == 0:
            return
    found = kind_of(target)
    if found != kind:
        if found is not None:
            held = f"holds a {NOUNS[found]}, not a {noun}"
        else:
            held = f"is a directory that holds no {noun}" if kind == EXPORT else f"is not a {noun}"
        raise refuse(f"{held}; refusing to replace it: give another path")
    if not replace:
        raise refuse(f"holds a {noun} already; {flag} replaces it")


def _writable(path: Path, *, directory: bool) -> bool:
    # os.access alone says yes to root for anything; the mode bits say what the owner meant, and a
    # real open (which writes nothing) catches what neither sees: immutable files, read-only mounts.
    try:
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)) or not path.stat().st_mode & 0o222:
            return False
        if directory:
            fd, probe = tempfile.mkstemp(prefix=".skipsearch-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # no O_CREAT, no O_TRUNC: the bytes stay
    except OSError:
        return False
    return True


__all__ = ["BENCH_JSON", "BENCH_REPORT", "COSTS", "EXPORT", "NOUNS", "PLAN_REPORT", "PLOT", "PROFILE",
           "PROFILE_HEADER", "check_target", "kind_of"]
