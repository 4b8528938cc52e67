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
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from skipsearch.export import ct_draft
from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, plain, served_model, write_text
from skipsearch.profile import Profile

CONFIG = "speculative_config.json"


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


def config(profile: Profile, *, draft_path: str | None = None) -> dict:
    """The ``--speculative-config`` mapping; empty for plain decoding. ``draft_path``: where the draft checkpoint
    of a copy lies (default: its directory's name, as inside the export)."""
    if profile.draft.max_draft_tokens == 0:
        return {}
    lk, dm = sh.setting(profile).lookup, ct_draft.exported_copy(profile)
    if dm is not None:
        return {"method": "draft_model", "model": draft_path or ct_draft.draft_dir(dm.scheme),
                "quantization": "compressed-tensors", "num_speculative_tokens": dm.k}
    if lk is None:
        return {}
    return {"method": "ngram", "num_speculative_tokens": lk.k, "prompt_lookup_min": lk.min_n,
            "prompt_lookup_max": lk.max_n}


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
    setting = {**cfg, "draft_checkpoint": info} if info else cfg
    return Written(files, setting, usage, notes)


ENGINE = Engine(name="vllm", describe=describe, gap=gap, write=write,
                checked="against a schema of vLLM 0.33.0's SpeculativeConfig kept in the tests (no CPU wheel); the "
                        "draft checkpoint decompressed with compressed-tensors and loaded by transformers")

__all__ = ["CONFIG", "ENGINE", "config", "describe", "gap", "write"]
