"""``--engine vllm``: the JSON of vLLM's ``--speculative-config`` (``LLM(speculative_config=...)``).

Keys as vLLM 0.33.0 defines them (``vllm/config/speculative.py``, ``SpeculativeConfig``): ``method: ngram`` with
``num_speculative_tokens`` (K), ``prompt_lookup_min`` and ``prompt_lookup_max`` (the lookup's suffix lengths,
longest tried first, as skipsearch's ``ngram``). What it cannot express:
- a hybrid's fallback: a server runs one draft method, so there is no lookup-then-draft-model;
- a precision draft: vLLM builds a draft model's config with the target's dtype (``dtype=target_model_config.
  dtype``), so a 16-bit copy of the served model runs as the served model; a quantized draft needs a quantized
  checkpoint, which this export does not write yet;
- layer-skip, CLaSp, fractal and hierarchical drafts: no such method.
"""

from __future__ import annotations

import json
from pathlib import Path

from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, plain, write_text
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
        scheme = s.draft_model.scheme
        why = ("a 16-bit copy of the model as its draft (vLLM runs a draft model in the target's dtype)"
               if scheme == "fp16" else f"a {scheme} copy of the model as its draft (this export writes no quantized "
                                       "vLLM checkpoint yet)")
        return Gap(why, plain(profile), describe(plain(profile)))
    return Gap(f"{profile.method} drafts (no vLLM method drafts with the model's own layers)", plain(profile),
               describe(plain(profile)))


def config(profile: Profile) -> dict:
    """The ``--speculative-config`` mapping; empty for plain decoding."""
    lk = sh.setting(profile).lookup
    if profile.draft.max_draft_tokens == 0 or lk is None:
        return {}
    return {"method": "ngram", "num_speculative_tokens": lk.k, "prompt_lookup_min": lk.min_n,
            "prompt_lookup_max": lk.max_n}


def describe(profile: Profile) -> str:
    cfg = config(profile)
    return f"--speculative-config '{json.dumps(cfg)}'" if cfg else "no --speculative-config (plain decoding)"


def write(directory: Path, profile: Profile, model=None) -> Written:
    cfg = config(profile)
    files = (write_text(directory, CONFIG, json.dumps(cfg, indent=2) + "\n"),)
    usage = (f"vllm serve {profile.model.name} --speculative-config \"$(cat {directory / CONFIG})\"" if cfg
             else f"vllm serve {profile.model.name}")
    notes = ("vLLM's ngram proposer takes the latest earlier match of the longest suffix in "
             "prompt_lookup_min..max, as skipsearch's lookup does; the predicted speedup is skipsearch's engine's",
             ) if cfg else ()
    return Written(files, cfg, usage, notes)


ENGINE = Engine(name="vllm", describe=describe, gap=gap, write=write,
                checked="against a schema of vLLM 0.33.0's SpeculativeConfig kept in the tests (no CPU wheel)")

__all__ = ["CONFIG", "ENGINE", "config", "describe", "gap", "write"]
