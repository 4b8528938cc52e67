"""``--engine llama.cpp``: ``llama-server`` flags, and the draft model as a GGUF at the profile's scheme.

Flags as the llama.cpp vendored in llama-cpp-python 0.3.36 defines them (``common/arg.cpp``,
``common/speculative.cpp``):
- prompt lookup: ``--spec-type ngram-simple`` looks up one n-gram size (``--spec-ngram-simple-size-n``) and
  drafts up to ``--spec-ngram-simple-size-m`` tokens after its latest earlier match: exact for a lookup with
  min_n = max_n; a range of sizes is not expressible (nearest: max_n alone);
- a precision draft: ``--spec-type draft-simple -md draft.gguf`` with ``--spec-draft-n-max`` K and a fixed exit
  threshold as ``--spec-draft-p-min``; the GGUF holds the model's weights at the scheme (``gguf_draft``);
- a hybrid with a precision fallback: ``--spec-type ngram-simple,draft-simple``; llama.cpp tries its n-gram
  drafters before the draft model and takes the first that drafts (``common_speculative_init``'s order), which
  is skipsearch's lookup-then-fallback.
Not expressible: skip sets, a trimmed draft head (a draft's vocabulary must be the target's), an adaptive exit
threshold, fp8 (no GGUF type), layer-skip, CLaSp, fractal and hierarchical drafts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, plain, write_text
from skipsearch.export.gguf_draft import TYPES
from skipsearch.profile import Profile

ARGS = "llama-args.txt"


def _copy_problem(cp: sh.Copy) -> str | None:
    if cp.skips:
        return "a draft that skips sublayers"
    if cp.trimmed_head:
        return "a trimmed draft head (a llama.cpp draft's vocabulary must be the target's)"
    if cp.adaptive:
        return "an adaptive exit threshold (--spec-draft-p-min is fixed)"
    if cp.scheme not in TYPES:
        return f"a {cp.scheme} copy (GGUF has no {cp.scheme} type)"
    return None


def gap(profile: Profile) -> Gap | None:
    if profile.draft.max_draft_tokens == 0:
        return None
    lk, fb, cp = sh.lookup(profile), sh.fallback(profile), sh.copy_of(profile)
    problems = []
    if lk is not None and lk.min_n != lk.max_n:
        problems.append(f"lookup lengths {lk.min_n}..{lk.max_n} (ngram-simple looks up one n-gram size)")
    if fb is not None and fb != sh.PRECISION:
        problems.append(f"a {fb} fallback")
    if cp is not None and _copy_problem(cp):
        problems.append(_copy_problem(cp))
    if lk is None and cp is None:
        return Gap(f"{profile.method} drafts (no llama.cpp speculative type drafts with the model's own layers)",
                   plain(profile), describe(plain(profile)))
    if not problems:
        return None
    near = _nearest(profile)
    return Gap("; ".join(problems), near, describe(near))


def _nearest(profile: Profile) -> Profile:
    """The profile as llama.cpp can run it: one lookup size (max_n), the copy without skips, trimmed head or
    adaptive threshold, in int8 where its scheme has no GGUF type; a fallback other than a precision copy dropped."""
    lk, fb, cp = sh.lookup(profile), sh.fallback(profile), sh.copy_of(profile)
    if lk is not None and fb != sh.PRECISION:
        return sh.lookup_only(profile, n=None if lk.min_n == lk.max_n else lk.max_n)
    copy = sh.copy_only(profile, scheme=cp.scheme if cp.scheme in TYPES else "int8")
    if lk is None:
        return copy
    params = dict(copy.method_params)
    params.update(min_n=lk.max_n, max_n=lk.max_n, fallback=sh.PRECISION, fallback_k=cp.k)
    return replace(profile, method=sh.HYBRID, draft=replace(copy.draft, max_draft_tokens=lk.k),
                   method_params=tuple(params.items()), measured=copy.measured)


def flags(profile: Profile, *, gguf_name: str = "draft.gguf") -> list[str]:
    """The ``llama-server`` flags of the profile (one the engine expresses); empty for plain decoding."""
    if profile.draft.max_draft_tokens == 0:
        return []
    lk, cp = sh.lookup(profile), sh.copy_of(profile)
    types, out = [], []
    if lk is not None:
        types.append("ngram-simple")
        out += ["--spec-ngram-simple-size-n", str(lk.max_n), "--spec-ngram-simple-size-m", str(lk.k),
                "--spec-ngram-simple-min-hits", "1"]
    if cp is not None:
        types.append("draft-simple")
        out += ["-md", gguf_name, "--spec-draft-n-max", str(cp.k), "--spec-draft-n-min", "0",
                "--spec-draft-p-min", f"{cp.threshold:g}"]
    return ["--spec-type", ",".join(types), *out]


def describe(profile: Profile) -> str:
    args = flags(profile, gguf_name=f"draft-{_scheme(profile)}.gguf")
    return " ".join(args) if args else "no --spec-type (plain decoding)"


def _scheme(profile: Profile) -> str:
    cp = sh.copy_of(profile)
    return cp.scheme if cp is not None else "none"


def needs_weights(profile: Profile) -> bool:
    return profile.draft.max_draft_tokens > 0 and sh.copy_of(profile) is not None


def write(directory: Path, profile: Profile, model=None) -> Written:
    """The flags, and the draft GGUF when the profile drafts with a copy (``model()`` gives (adapter, checkpoint))."""
    from skipsearch.export.gguf_draft import write_draft_gguf

    cp = sh.copy_of(profile) if profile.draft.max_draft_tokens else None
    files, setting, notes = [], {}, []
    name = f"draft-{cp.scheme}.gguf" if cp is not None else ""
    if cp is not None:
        sm, checkpoint = model()
        setting["draft_gguf"] = write_draft_gguf(directory / name, sm, checkpoint, scheme=cp.scheme,
                                                 quant_head=cp.quant_head, full_attn=cp.full_attn,
                                                 full_mlp=cp.full_mlp)
        files.append(name)
        if cp.scheme in ("int8", "int4"):
            notes.append(f"{cp.scheme} is {TYPES[cp.scheme][0]} here: GGML's blocks of 32 weights with one scale "
                         "each, where skipsearch's kernel scales per row (int8) or per group of 32 (int4)")
        if cp.threshold:
            notes.append("--spec-draft-p-min stops before a token below the threshold; skipsearch's exit keeps that "
                         "token and stops after it")
    args = flags(profile, gguf_name=str(directory / name) if name else "draft.gguf")
    setting["flags"] = args
    files.append(write_text(directory, ARGS, " ".join(args) + "\n"))
    usage = f"llama-server -m TARGET.gguf {' '.join(args)}".rstrip()
    return Written(tuple(files), setting, usage, tuple(notes))


ENGINE = Engine(name="llama.cpp", describe=describe, gap=gap, write=write, needs_weights=needs_weights,
                checked="the draft GGUF read back with the gguf reader (tests); decoded with llama-cpp-python where "
                        "it builds")

__all__ = ["ARGS", "ENGINE", "describe", "flags", "gap", "needs_weights", "write"]
