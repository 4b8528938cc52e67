"""The Python API that mirrors the CLI: open a model (from a name or a profile) and decode prompts.

The CLI only parses options, calls these, and prints what they return.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skipsearch.config import AUTOREGRESSIVE, GREEDY, DraftConfig, SamplingParams
from skipsearch.data import Prompt, encode_prompt
from skipsearch.decoding import DecodeResult, Drafter, generate, make_drafter
from skipsearch.models import DEFAULT_MODEL, ModelError, SkippableModel, load_model
from skipsearch.profile import Profile, check_model, load_profile


@dataclass(frozen=True)
class Decoded:
    prompt: Prompt
    prompt_token_ids: tuple[int, ...]
    result: DecodeResult
    text: str


def open_model(
    *, model: str | None = None, profile: str | None = None, device: str = "cpu", dtype: str | None = None,
    force: bool = False,
) -> tuple[SkippableModel, Profile | None]:
    """Load the model a profile names (or ``model``) and check the profile fits it.

    The profile is read and validated *before* the model loads, so a bad file fails in
    milliseconds rather than after a model load.
    """
    prof = load_profile(profile) if profile else None
    if prof is not None and model is not None and model != prof.model.name:
        raise ModelError(f"--model {model} differs from the profile's model {prof.model.name}; pass one of them")
    name = prof.model.name if prof is not None else (model or DEFAULT_MODEL)
    dtype = dtype or (prof.model.dtype if prof is not None else "float32")
    sm = load_model(name, device=device, dtype=dtype)
    if prof is not None:
        check_model(prof, num_layers=sm.num_layers, fingerprint=sm.fingerprint, force=force, source=profile)
    return sm, prof


# Which drafter runs each profile method: "module:function", imported on first use so that a
# method's dependencies load only when a profile asks for it. The function takes
# (profile, model) and returns a *fresh* Drafter (drafters hold per-sequence state such as the
# adaptive exit threshold), or None for plain decoding. Adding a method: one line here, plus the
# method's name in profile.KNOWN_METHODS.
DRAFTERS: dict[str, str] = {
    "layer-skip": "skipsearch.api:layer_skip_drafter",
    "clasp-dynamic": "skipsearch.clasp:dynamic_drafter",
    "hierarchical": "skipsearch.hierarchical:hierarchical_drafter",
    "fractal": "skipsearch.fractal:fractal_drafter",
}


def layer_skip_drafter(profile: Profile, sm: SkippableModel) -> Drafter | None:
    return make_drafter(profile.draft)


def drafter_factory(profile: Profile | None, sm: SkippableModel) -> Callable[[], Drafter | None]:
    """A function that builds a fresh drafter for ``profile`` (plain decoding without one)."""
    if profile is None:
        return lambda: None
    target = DRAFTERS.get(profile.method)
    if target is None:
        raise ModelError(f"profile method '{profile.method}' is not supported by this skipsearch's decoder")
    module, _, name = target.partition(":")
    build = getattr(importlib.import_module(module), name)
    build(profile, sm)  # fail now, before any prompt, if the profile's parameters do not fit the model
    return lambda: build(profile, sm)


def draft_config_for(profile: Profile | None) -> DraftConfig:
    """The layer-skip draft config a profile holds; plain autoregressive decoding without one."""
    if profile is None:
        return AUTOREGRESSIVE
    if profile.method != "layer-skip":
        raise ModelError(f"profile method '{profile.method}' has no single layer-skip config")
    return profile.draft


def decode_prompts(
    sm: SkippableModel,
    prompts: Sequence[Prompt],
    *,
    config: DraftConfig = AUTOREGRESSIVE,
    drafters: Callable[[], Drafter | None] | None = None,
    sampling: SamplingParams = GREEDY,
    max_new_tokens: int = 128,
    seed: int = 0,
    on_text: Callable[[int, str], None] | None = None,
) -> list[Decoded]:
    """Decode each prompt; ``on_text(index, new_text)`` streams text as it is produced.

    ``drafters`` (from ``drafter_factory``) gives each prompt a fresh drafter; without it,
    ``config`` is the layer-skip draft config.
    """
    out = []
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(sm.tokenizer, prompt)
        streamed: list[int] = []
        shown = [0]

        def stream(new: Sequence[int], i: int = i, streamed: list[int] = streamed, shown: list[int] = shown) -> None:
            # Decode the whole continuation each time: a token may complete a multi-byte char.
            streamed.extend(new)
            text = sm.tokenizer.decode(streamed, skip_special_tokens=True)
            if len(text) > shown[0]:
                on_text(i, text[shown[0]:])
                shown[0] = len(text)

        drafter = drafters() if drafters is not None else None
        result = generate(
            sm, ids, config=None if drafter is not None else config, drafter=drafter, sampling=sampling,
            max_new_tokens=max_new_tokens, seed=seed,
            on_tokens=stream if on_text else None,
        )
        text = sm.tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
        out.append(Decoded(prompt, tuple(ids), result, text))
    return out
