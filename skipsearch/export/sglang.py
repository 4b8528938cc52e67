"""``--engine sglang``: a ``--config`` YAML of SGLang's speculative server arguments.

Keys as SGLang 0.5.23 defines them (``sglang/srt/arg_groups/fields/spec.py``). The YAML's keys are the flags'
names without ``--`` (``speculative-algorithm``): ``server_args_config_parser.py`` turns each key into ``--key`` as
written, so the ``_`` spelling of the dataclass fields is rejected as an unknown argument (checked by parsing an
export with SGLang's own ``prepare_server_args``). SGLang has no prompt lookup: its ``NGRAM`` algorithm drafts from a
trie of the tokens of every request it has served (``speculative_ngram_*``), with no setting for the suffix
lengths. So a lookup profile is never exact there; the nearest setting is ``NGRAM`` with a single chain
(BFS breadth 1) of K draft tokens after the last verified one (``speculative_num_draft_tokens`` K + 1). A
precision draft, a hybrid's fallback and layer-skip drafts are not expressible, as for vLLM (``vllm.py``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, plain, write_text
from skipsearch.profile import Profile

CONFIG = "sglang.yaml"


def gap(profile: Profile) -> Gap | None:
    if profile.draft.max_draft_tokens == 0:
        return None
    s = sh.setting(profile)
    lk = s.lookup
    if lk is not None:
        near = sh.lookup_only(profile)
        what = f"prompt lookup with suffix lengths {lk.min_n}..{lk.max_n}"
        what += f" and a {s.fallback} fallback" if s.fallback else ""
        return Gap(f"{what} (SGLang's NGRAM drafts from a trie over all requests; it has no lookup lengths)", near,
                   describe(near))
    if s.draft_model is not None:
        return Gap("a reduced-precision copy of the model as its draft (SGLang runs a draft model in the target's "
                   "dtype; this export writes no quantized checkpoint yet)", plain(profile), describe(plain(profile)))
    return Gap(f"{profile.method} drafts (no SGLang algorithm drafts with the model's own layers)", plain(profile),
               describe(plain(profile)))


def config(profile: Profile) -> dict:
    lk = sh.setting(profile).lookup
    if profile.draft.max_draft_tokens == 0 or lk is None:
        return {}
    return {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": lk.k + 1,
            "speculative_ngram_min_bfs_breadth": 1, "speculative_ngram_max_bfs_breadth": 1}


def describe(profile: Profile) -> str:
    cfg = config(profile)
    if not cfg:
        return "no speculative algorithm (plain decoding)"
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cfg.items())


def write(directory: Path, profile: Profile, model=None) -> Written:
    cfg = config(profile)
    body = yaml.safe_dump({k.replace("_", "-"): v for k, v in cfg.items()}, sort_keys=False) if cfg else "{}\n"
    files = (write_text(directory, CONFIG, body),)
    notes = ("SGLang's NGRAM trie is filled by every request it serves, not only this one's text; the predicted "
             "speedup is prompt lookup's in skipsearch's engine",) if cfg else ()
    return Written(files, cfg, f"python -m sglang.launch_server --model-path MODEL --config {directory / CONFIG}",
                   notes)


ENGINE = Engine(name="sglang", describe=describe, gap=gap, write=write,
                checked="parsed with SGLang 0.5.23's own ServerArgs where it installs, else against a schema kept in "
                        "the tests")

__all__ = ["CONFIG", "ENGINE", "config", "describe", "gap", "write"]
