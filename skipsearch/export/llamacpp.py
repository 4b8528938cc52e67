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

import shlex
from pathlib import Path

from skipsearch.export import shapes as sh
from skipsearch.export.base import Engine, Gap, Written, batch_one_note, plain, served_model, write_text
from skipsearch.export.gguf_draft import DRAFT_SCHEMES, TYPES
from skipsearch.files.engine_runs import DRAFT_GGUF, EngineRun
from skipsearch.methods import DraftModel
from skipsearch.profile import Profile

ARGS = "llama-args.txt"
EXACT_TARGET = "target-exact.gguf"  # the record's target name for ``--llama-target exact`` (llamacpp_ggufs)


def _copy_problem(dm: DraftModel) -> str | None:
    if dm.skips:
        return "a draft that skips sublayers"
    if dm.trimmed_head:
        return "a trimmed draft head (a llama.cpp draft's vocabulary must be the target's)"
    if dm.adaptive:
        return "an adaptive exit threshold (--spec-draft-p-min is fixed)"
    if dm.scheme not in TYPES:
        return f"a {dm.scheme} copy (GGUF has no {dm.scheme} type)"
    return None


def gap(profile: Profile) -> Gap | None:
    if profile.draft.max_draft_tokens == 0:
        return None
    s = sh.setting(profile)
    lk, dm = s.lookup, s.draft_model
    problems = []
    if lk is not None and lk.min_n != lk.max_n:
        problems.append(f"lookup lengths {lk.min_n}..{lk.max_n} (ngram-simple looks up one n-gram size)")
    if s.fallback is not None and dm is None:
        problems.append(f"a {s.fallback} fallback")
    if dm is not None and _copy_problem(dm):
        problems.append(_copy_problem(dm))
    if lk is None and dm is None:
        return Gap(f"{profile.method} drafts (no llama.cpp speculative type drafts with the model's own layers)",
                   plain(profile), describe(plain(profile)))
    if not problems:
        return None
    near = _nearest(profile)
    return Gap("; ".join(problems), near, describe(near))


def _nearest(profile: Profile) -> Profile:
    """The profile as llama.cpp can run it: one lookup size (max_n), the copy without skips, trimmed head or
    adaptive threshold, in int8 where its scheme has no GGUF type; a fallback other than a draft model dropped."""
    s = sh.setting(profile)
    lk, dm = s.lookup, s.draft_model
    if dm is None:
        return sh.lookup_only(profile, n=None if lk.min_n == lk.max_n else lk.max_n)
    scheme = dm.scheme if dm.scheme in TYPES else "int8"
    if lk is None:
        return sh.copy_only(profile, scheme=scheme)
    return sh.lookup_then_copy(profile, n=lk.max_n, scheme=scheme)


def flags(profile: Profile, *, gguf_name: str = "draft.gguf") -> list[str]:
    """The ``llama-server`` flags of the profile (one the engine expresses); empty for plain decoding."""
    if profile.draft.max_draft_tokens == 0:
        return []
    s = sh.setting(profile)
    lk, dm = s.lookup, s.draft_model
    types, out = [], []
    if lk is not None:
        types.append("ngram-simple")
        out += ["--spec-ngram-simple-size-n", str(lk.max_n), "--spec-ngram-simple-size-m", str(lk.k),
                "--spec-ngram-simple-min-hits", "1"]
    if dm is not None:
        types.append("draft-simple")
        out += ["-md", gguf_name, "--spec-draft-n-max", str(dm.k), "--spec-draft-n-min", "0",
                "--spec-draft-p-min", f"{dm.threshold:g}"]
    return ["--spec-type", ",".join(types), *out]


def describe(profile: Profile) -> str:
    args = flags(profile, gguf_name=f"draft-{_scheme(profile)}.gguf")
    return " ".join(args) if args else "no --spec-type (plain decoding)"


def _scheme(profile: Profile) -> str:
    dm = sh.setting(profile).draft_model
    return dm.scheme if dm is not None else "none"


def write(directory: Path, profile: Profile, model=None) -> Written:
    """The flags, and the draft GGUF when the profile drafts with a copy (``model()`` gives (adapter, checkpoint))."""
    from skipsearch.export.gguf_draft import write_draft_gguf

    dm = sh.setting(profile).draft_model if profile.draft.max_draft_tokens else None
    files, setting, notes = [], {}, []
    name = f"draft-{dm.scheme}.gguf" if dm is not None else ""
    if dm is not None:
        sm, checkpoint = model()
        setting["draft_gguf"] = write_draft_gguf(directory / name, sm, checkpoint, scheme=dm.scheme,
                                                 quant_head=dm.quant_head, full_attn=dm.full_attn,
                                                 full_mlp=dm.full_mlp)
        files.append(name)
        if dm.scheme in ("int8", "int4"):
            notes.append(f"{dm.scheme} is {TYPES[dm.scheme][0]} here: GGML's blocks of 32 weights with one scale "
                         "each, where skipsearch's kernel scales per row (int8) or per group of 32 (int4)")
        if dm.threshold:
            notes.append("--spec-draft-p-min stops before a token below the threshold; skipsearch's exit keeps that "
                         "token and stops after it")
    args = flags(profile, gguf_name=str(directory / name) if name else "draft.gguf")
    setting["flags"] = args
    files.append(write_text(directory, ARGS, " ".join(args) + "\n"))
    served = served_model(profile)
    if served.gguf is None:  # llama.cpp loads GGUF only: the target must be converted first, and the line says so
        notes.append(f"llama.cpp loads a GGUF: convert {served.hf} to TARGET.gguf first (llama.cpp's "
                     "convert_hf_to_gguf.py), then run the line as printed with that path")
    target = shlex.quote(served.gguf or "TARGET.gguf")
    usage = f"llama-server -m {target} {' '.join(shlex.quote(a) for a in args)}".rstrip()
    return Written(tuple(files), setting, usage, (*notes, *batch_one_note(profile, "llama.cpp")))


def write_run(directory: Path, run: EngineRun, model=None) -> Written:
    """The setting llama.cpp itself ran fastest (``skipsearch optimize --engine llama.cpp``): its flags, and the
    self-draft GGUF they load (the model at that GGML type, its head too; a shallow one keeps only its recorded
    layers), as the search ran them; on the exact target (``--llama-target exact``) that target too, which no
    llama.cpp tool writes."""
    from skipsearch.export.gguf_draft import write_draft_gguf, write_target_gguf

    files, setting, notes = [], {"measured_setting": run.setting}, []
    args = list(run.args)
    target = "TARGET.gguf"
    if run.target == EXACT_TARGET:  # no llama.cpp tool writes these bytes: the export carries the file timed
        sm, checkpoint = model()
        setting["target_gguf"] = write_target_gguf(directory / EXACT_TARGET, sm, checkpoint, exact=True)
        files.append(EXACT_TARGET)
        target = str(directory / EXACT_TARGET)
        notes.append(f"{EXACT_TARGET} is the model's weights in the fewest bytes that give them back (a GGUF's own "
                     "Q4_0/Q4_1/Q8_0 blocks, BF16, else F32), as skipsearch's panel kernel holds them and as llama.cpp "
                     "was timed; llama.cpp multiplies them by 8-bit activations, so its tokens are checked against "
                     "its own plain decoding of this file")
    else:
        kind = "Q8_0" if "q8_0" in run.target else "F32"
        notes.append(f"TARGET.gguf is the model as {kind}, as llama.cpp was timed (convert_hf_to_gguf.py --outtype "
                     f"{kind.lower()}; the search wrote its own, {run.target}, under skipsearch's cache)")
    if run.draft is not None:
        name = f"draft-{run.draft}.gguf"
        sm, checkpoint = model()
        setting["draft_gguf"] = write_draft_gguf(directory / name, sm, checkpoint, scheme=DRAFT_SCHEMES[run.draft],
                                                 quant_head=True, layers=run.draft_layers)
        files.append(name)
        args = [str(directory / name) if a == DRAFT_GGUF else a for a in args]
    setting["flags"] = args
    files.append(write_text(directory, ARGS, " ".join(args) + "\n"))
    notes.insert(0, f"measured: {run.summary()}")
    usage = f"llama-server -m {shlex.quote(target)} {' '.join(shlex.quote(a) for a in args)}".rstrip()
    return Written(tuple(files), setting, usage, tuple(notes))


ENGINE = Engine(name="llama.cpp", describe=describe, gap=gap, write=write, write_run=write_run,
                checked="the draft GGUF read back with the gguf reader (tests); decoded with llama-cpp-python where "
                        "it builds")

__all__ = ["ARGS", "ENGINE", "describe", "flags", "gap", "write", "write_run"]
