"""What the commands check before a model loads, and the one-line notes they give about other hardware.

Every check fails with a one-line error of a known kind (ModelError, ProfileError, ConfigError, StudyError), which
the CLI prints on stderr with exit code 2; a note is returned as text, for the caller to show as a warning.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from skipsearch.checkpoints import ModelError
from skipsearch.data import Prompt
from skipsearch.files.errors import ProfileError
from skipsearch.profile import Profile


def check_model_arg(model: str | None) -> None:
    """``--model`` naming a file other than a GGUF, not a model directory: say so before anything loads."""
    if model and Path(model).is_file() and not model.lower().endswith(".gguf"):
        raise ModelError(f"--model '{model}' is a file; give a model directory (with config.json), a GGUF file, an "
                         f"alias (`skipsearch models`) or a hub id")


def check_prompts_fit(model: str, prompts: Sequence[Prompt], *, max_new_tokens: int) -> int:
    """Every prompt fits ``model``'s context with ``max_new_tokens`` more, checked before the model loads, with its
    config and tokenizer alone (``data.longest_within``): one that cannot fit is refused in one line naming it
    (its file and line or row) and its length, untokenized where its length in characters already rules it out.
    Returns the most tokens a prompt takes, which sizes the KV cache in the memory check."""
    from skipsearch.checkpoints import find_checkpoint
    from skipsearch.data import context_of, longest_within
    from skipsearch.model.loader import read_config, read_tokenizer

    check_model_arg(model)
    checkpoint = find_checkpoint(model)
    context = context_of(read_config(checkpoint))
    return longest_within(read_tokenizer(checkpoint), prompts, context=context, max_new_tokens=max_new_tokens)


def check_study_for_model(label: str, attrs: dict, model: str, *, force: bool = False) -> None:
    """A study made for another model (depth, fingerprint) is refused before this one loads."""
    from skipsearch.checkpoints import arch_fingerprint, find_checkpoint
    from skipsearch.model.loader import read_config
    from skipsearch.search.study import check_study_model

    check_model_arg(model)
    config = read_config(find_checkpoint(model))
    check_study_model(label, attrs, model=model, num_layers=config.num_hidden_layers,
                      fingerprint=arch_fingerprint(config, model), force=force)


def profile_paths(given: Iterable[str]) -> list[str]:
    """Profile paths as ``--profiles`` takes them: repeated, comma-separated, or a glob the shell left unexpanded."""
    out: list[str] = []
    for item in given:
        for part in filter(None, (p.strip() for p in item.split(","))):
            matches = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
            if not matches:
                raise ProfileError(f"{part}: no profile matches this pattern")
            out.extend(m for m in matches if m not in out)
    return out


def hardware_note(environment, device, *, what: str, replan: str) -> str | None:
    """One line when a file's figures (its ``environment``) were measured on other hardware than this
    machine's ``device``, or on hardware it does not name; None when it matches (skipsearch.hardware)."""
    from skipsearch import hardware

    return hardware.mismatch(environment, hardware.probe(str(device)), what=what, replan=replan)


MODELLED = "a model, not a measurement (how far to trust it: studies/roofline-vs-published.md)"


def planned_roofline(profile: Profile | None) -> Any:
    """The roofline (``files.costs.RooflineInfo``) a profile was planned with, or None when its costs were measured
    (or it keeps none)."""
    from skipsearch.files.costs import COSTS_KEY, planned_costs_from_dict

    extra = dict(profile.measured.extra) if profile is not None and profile.measured is not None else {}
    if COSTS_KEY not in extra:
        return None
    return planned_costs_from_dict(extra[COSTS_KEY], source="<profile>").roofline


def profile_hardware_note(profile: Profile | None, device, *, source: str) -> str | None:
    """``hardware_note`` for a profile about to decode on ``device``: it points to re-planning it here. A profile
    planned with a roofline cost file says so first, in the same line: its figures are modelled. A profile
    written by hand (``measured.source: hand``) has no measured figures that could fail to hold: no note."""
    if profile is None or (profile.measured is not None and profile.measured.source == "hand"):
        return None
    note = hardware_note(profile.environment, device, what=f"profile {source}",
                         replan=f"skipsearch costs --out C && skipsearch plan profile --profile {source} --costs C")
    roofline = planned_roofline(profile)
    if roofline is None:
        return note
    modelled = (f"profile {source}: planned with {roofline.describe()}, {MODELLED}; time it with `skipsearch bench "
                f"--profiles {source} --write-measured`")
    return modelled if note is None else f"{modelled}; {note.split(': ', 1)[1]}"


def costs_model_note(target: Any, source: str) -> str | None:
    """One line when the cost file ``target`` (``costs.CostProfile``) is a roofline model, not a measurement."""
    if getattr(target, "roofline", None) is None:
        return None
    return f"costs {source}: {target.roofline.describe()}, {MODELLED}"


def costs_hardware_note(target: Any, sm: Any, source: str) -> str | None:
    """``hardware_note`` for a cost file (``target``) used with the model loaded here (``sm``); a roofline file is
    never compared as a measurement: its note says it is a model, whatever the hardware."""
    replan = f"skipsearch costs --model {sm.name} --out C` here and use `--costs C"
    modelled = costs_model_note(target, source)
    if modelled is not None:
        return f"{modelled}; to measure them instead: `{replan}"
    return hardware_note(target.environment, sm.device, what=f"costs {source}", replan=replan)


__all__ = ["MODELLED", "check_model_arg", "check_prompts_fit", "check_study_for_model", "costs_hardware_note",
           "costs_model_note", "hardware_note", "planned_roofline", "profile_hardware_note", "profile_paths"]
