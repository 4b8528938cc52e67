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

from skipsearch.export import hf, llamacpp, sglang, vllm
from skipsearch.export.base import (
    MANIFEST,
    MANIFEST_SCHEMA,
    Engine,
    ExportError,
    Gap,
    Written,
    plain,
    write_text,
)


def engines() -> dict[str, Engine]:
    """The engines ``skipsearch export --engine`` takes, by name (looked up on each call, so a test may swap one)."""
    return {e.name: e for e in (hf.ENGINE, vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE)}


def get_engine(name: str) -> Engine:
    known = engines()
    if name not in known:
        raise ExportError(f"unknown engine {name!r:.40}: use {', '.join(known)}")
    return known[name]


__all__ = ["MANIFEST", "MANIFEST_SCHEMA", "Engine", "ExportError", "Gap", "Written", "engines",
           "get_engine", "plain", "write_text"]
