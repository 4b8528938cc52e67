"""``--engine sglang``: a ``--config`` YAML of SGLang's speculative server arguments.

Keys as SGLang 0.5.23 defines them (``sglang/srt/arg_groups/fields/spec.py``). The YAML's keys are the flags'
names without ``--`` (``speculative-algorithm``): ``server_args_config_parser.py`` turns each key into ``--key`` as
written, so the ``_`` spelling of the dataclass fields is rejected as an unknown argument (checked by parsing an
export with SGLang's own ``prepare_server_args``). SGLang has no prompt lookup: its ``NGRAM`` algorithm drafts from a
trie of the tokens of every request it has served (``speculative_ngram_*``), with no setting for the suffix
lengths. So a lookup profile is never exact there; the nearest setting is ``NGRAM`` with a single chain
(BFS breadth 1) of K draft tokens after the last verified one (``speculative_num_draft_tokens`` K + 1). An int8
or int4 copy of the model is ``STANDALONE`` with ``speculative-draft-model-path`` (the export's compressed-tensors
checkpoint, ``ct_draft``), ``speculative-draft-model-quantization: compressed-tensors``, K steps of one token
(``speculative-eagle-topk`` 1, ``speculative-num-draft-tokens`` K + 1, as SGLang forces for top-k 1). An fp16 copy,
a hybrid's fallback and layer-skip drafts are not expressible, as for vLLM (``vllm.py``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from skipsearch.export import ct_draft
from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, plain, served_model, write_text
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
        return ct_draft.copy_gap(profile, describe)
    return Gap(f"{profile.method} drafts (no SGLang algorithm drafts with the model's own layers)", plain(profile),
               describe(plain(profile)))


def config(profile: Profile, *, draft_path: str | None = None) -> dict:
    """The server arguments (dataclass spelling); empty for plain decoding. ``draft_path``: where a copy's draft
    checkpoint lies (default: its directory's name, as inside the export)."""
    if profile.draft.max_draft_tokens == 0:
        return {}
    lk, dm = sh.setting(profile).lookup, ct_draft.exported_copy(profile)
    if dm is not None:
        return {"speculative_algorithm": "STANDALONE",
                "speculative_draft_model_path": draft_path or ct_draft.draft_dir(dm.scheme),
                "speculative_draft_model_quantization": "compressed-tensors", "speculative_num_steps": dm.k,
                "speculative_eagle_topk": 1, "speculative_num_draft_tokens": dm.k + 1}
    if lk is None:
        return {}
    return {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": lk.k + 1,
            "speculative_ngram_min_bfs_breadth": 1, "speculative_ngram_max_bfs_breadth": 1}


def no_schedule(profile: Profile) -> str:
    """The one line an SGLang export of a profile with a schedule carries."""
    return (f"SGLang 0.5.23 has no per-batch-size draft length: this exports the single K = "
            f"{profile.draft.max_draft_tokens} (the profile's own, its batch-1 draft) at every batch size; the "
            f"profile's schedule is {profile.schedule.describe()}")


def describe(profile: Profile) -> str:
    cfg = config(profile)
    if not cfg:
        return "no speculative algorithm (plain decoding)"
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cfg.items())


def write(directory: Path, profile: Profile, model=None) -> Written:
    draft, info, notes = ct_draft.write_draft(directory, profile, model)
    cfg = config(profile, draft_path=draft)
    body = yaml.safe_dump({k.replace("_", "-"): v for k, v in cfg.items()}, sort_keys=False) if cfg else "{}\n"
    if profile.schedule is not None:  # SGLang 0.5.23 has no draft length per batch size
        body = f"# {no_schedule(profile)}\n{body}"
    files = (write_text(directory, CONFIG, body),)
    if draft is not None:
        files = (*files, Path(draft).name)
    if cfg and draft is None:  # the nearest of a lookup
        notes = ("SGLang's NGRAM trie is filled by every request it serves, not only this one's text; the predicted "
                 "speedup is prompt lookup's in skipsearch's engine",)
    if profile.schedule is not None:
        notes = (*notes, no_schedule(profile))
    setting = {**cfg, "draft_checkpoint": info} if info else cfg
    target = shlex.quote(served_model(profile).hf)  # the hub id or directory SGLang loads, never skipsearch's alias
    return Written(files, setting, f"python -m sglang.launch_server --model-path {target} --config "
                                   f"{shlex.quote(str(directory / CONFIG))}", notes)


ENGINE = Engine(name="sglang", describe=describe, gap=gap, write=write,
                checked="parsed with SGLang 0.5.23's own ServerArgs where it installs, else against a schema kept in "
                        "the tests")

__all__ = ["CONFIG", "ENGINE", "config", "describe", "gap", "no_schedule", "write"]
