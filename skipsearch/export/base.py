"""What every exporter shares: the ``Engine`` record, ``Gap`` (what an engine cannot express), ``Written`` (what
it wrote), the export's one-line error and the manifest's name and version."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skipsearch.config import ConfigError
from skipsearch.profile import Profile

MANIFEST = "export.yaml"
MANIFEST_SCHEMA = 1  # 1: first version (engine, profile, model, hardware, speedup, setting, files, notes)


class ExportError(ConfigError):
    """An export that cannot be written as asked. One line."""


@dataclass(frozen=True)
class Gap:
    """What an engine cannot express in a profile, and the nearest setting it runs instead."""

    what: str  # what the engine lacks, e.g. "layer-skip drafts (skip sets)"
    nearest: Profile  # the nearest profile it expresses exactly (max_draft_tokens 0: plain decoding)
    nearest_text: str  # that setting in the engine's words


@dataclass(frozen=True)
class Written:
    """What an engine wrote into an export directory."""

    files: tuple[str, ...]  # paths relative to the directory
    setting: dict[str, Any]  # the engine's own keys and values, as the manifest records them
    usage: str  # the command or code that uses it
    notes: tuple[str, ...] = ()  # approximations the engine makes, for people


# (directory, profile, model loader) -> Written; the loader gives the SkippableModel whose weights a draft copy
# is written from (loaded only when an engine needs weights)
Writer = Callable[..., Written]


@dataclass(frozen=True)
class Engine:
    name: str
    describe: Callable[[Profile], str]  # the setting a profile becomes, in the engine's words (one line)
    gap: Callable[[Profile], Gap | None]  # None: the engine expresses the profile
    write: Writer
    checked: str = ""  # how its exports were validated here (README)


def plain(profile: Profile) -> Profile:
    """The profile with drafting off: plain decoding, which every engine runs."""
    from dataclasses import replace

    return replace(profile, draft=replace(profile.draft, max_draft_tokens=0))


def batch_one_note(profile: Profile, engine: str) -> tuple[str, ...]:
    """The one line an engine that decodes one sequence at a time writes for a profile with a schedule."""
    if profile.schedule is None:
        return ()
    return (f"{engine} runs batch 1 here with the profile's K = {profile.draft.max_draft_tokens}; the profile's "
            f"draft length per batch size ({profile.schedule.describe()}) is not exported",)


def write_text(directory: Path, name: str, text: str) -> str:
    """One file of an export, written atomically; returns its name relative to ``directory``."""
    from skipsearch.files.yamlio import write_atomic

    write_atomic(directory / name, text)
    return name


__all__ = ["MANIFEST", "MANIFEST_SCHEMA", "Engine", "ExportError", "Gap", "Written", "batch_one_note", "plain",
           "write_text"]
