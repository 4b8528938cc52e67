"""Exports: a draft profile as the configuration of the engine a user decodes with (``skipsearch export``).

One module per engine, each behind one small interface (``Engine``):
- ``hf``: a ``custom_generate`` directory for transformers' ``model.generate`` (runs skipsearch's own engine
  inside it: ``hf_runtime``), so every profile is expressible there;
- ``vllm``: the JSON of ``--speculative-config`` (vLLM 0.33 ``SpeculativeConfig``);
- ``sglang``: a ``--config`` YAML of SGLang 0.5.23's ``speculative_*`` server arguments;
- ``llamacpp``: ``llama-server`` flags, and the draft model as a GGUF at the profile's scheme (``gguf_draft``).

An engine says what it cannot express (``Gap``) and names the nearest setting it can run as a profile of its
own; ``skipsearch.api.export`` prices that with the profile's record, refuses or (``--nearest``) writes it.
Every export directory holds ``export.yaml`` (``manifest``): the profile, the model's fingerprints, the hardware
and the speedup it came from, and the setting written; a directory is replaced whole or not at all
(``files.yamlio.replace_dir``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
    needs_weights: Callable[[Profile], bool] = field(default=lambda _p: False)


def engines() -> dict[str, Engine]:
    """The engines ``skipsearch export --engine`` takes, by name."""
    from skipsearch.export import hf, llamacpp, sglang, vllm

    return {e.name: e for e in (hf.ENGINE, vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE)}


def get_engine(name: str) -> Engine:
    known = engines()
    if name not in known:
        raise ExportError(f"unknown engine {name!r:.40}: use {', '.join(known)}")
    return known[name]


def plain(profile: Profile) -> Profile:
    """The profile with drafting off: plain decoding, which every engine runs."""
    from dataclasses import replace

    return replace(profile, draft=replace(profile.draft, max_draft_tokens=0))


def write_text(directory: Path, name: str, text: str) -> str:
    """One file of an export, written atomically; returns its name relative to ``directory``."""
    from skipsearch.files.yamlio import write_atomic

    write_atomic(directory / name, text)
    return name


__all__ = ["MANIFEST", "MANIFEST_SCHEMA", "Engine", "ExportError", "Gap", "Written", "engines", "get_engine",
           "plain", "write_text"]
