"""The HF peers as bench contenders: ``model.generate`` in the decoding modes users would otherwise pick, with a
forward counter (for τ and acceptance), and a profile run by skipsearch's engine or, exported, by HF generate."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from skipsearch.config import ConfigError
from skipsearch.engine.decoding import hf_generate
from skipsearch.engine.harness import (
    Contender,
    ContenderOutput,
    engine_method,
)
from skipsearch.model.skippable import SkippableModel

BASELINE = "hf-greedy"  # the speed baseline and the reference output


@dataclass(frozen=True)
class Peer:
    """An HF ``generate`` decoding mode that users would otherwise pick, and the values of its knob."""

    name: str
    option: str | None  # the ``generate`` argument that is swept; None: nothing to set
    values: Callable[[int], tuple[int, ...]] = field(compare=False, repr=False)  # num_layers -> candidates


def early_exit_layers(num_layers: int) -> tuple[int, ...]:
    """Exit after about 1/8, 1/4 and 1/2 of the layers (4, 8, 15 for a 30-layer model)."""
    return tuple(sorted({min(max(1, round(num_layers * f)), num_layers - 1) for f in (1 / 8, 1 / 4, 1 / 2)}))


# hf-assisted-quantized: HF assisted generation whose assistant is a reduced-precision copy of the model
# itself (the peer a user can assemble from stock parts). Its knob is the assistant's schedule: 0 is HF's
# heuristic schedule (starting at 5 tokens, +2 after a full accept, -1 otherwise), k > 0 a constant k tokens.
ASSISTED = "hf-assisted-quantized"
HEURISTIC = 0
# hf-generate+profile: each benched profile exported for transformers (``skipsearch export --engine hf``) and run
# by model.generate through that custom_generate directory: a row per profile, beside the profile's own row.
HF_PROFILE = "hf-generate+profile"
PROFILE_IN_HF = "hf-profile"  # its rows' family: a skipsearch profile, run by HF generate; not an HF peer

# hf-compiled: HF generate with a static KV cache and its one-token step compiled by torch.compile, the recipe
# transformers documents for its fastest greedy decoding, with the inductor kernel's settings (frozen weights, CPU
# GEMM templates: on the AVX2 Zen 3 a step of 47-52 ms, 84-91 ms frozen alone), so that what compilation alone gains
# is measured apart from what speculation adds.
HF_COMPILED = "hf-compiled"

PEERS: dict[str, Peer] = {
    BASELINE: Peer(BASELINE, None, lambda n: ()),
    HF_COMPILED: Peer(HF_COMPILED, None, lambda n: ()),
    "hf-prompt-lookup": Peer("hf-prompt-lookup", "prompt_lookup_num_tokens", lambda n: (2, 4, 10)),
    "hf-early-exit": Peer("hf-early-exit", "assistant_early_exit", early_exit_layers),
    ASSISTED: Peer(ASSISTED, "num_assistant_tokens", lambda n: (HEURISTIC, 4, 6, 8)),
    HF_PROFILE: Peer(HF_PROFILE, None, lambda n: ()),
}


# -- methods ---------------------------------------------------------------------------------------
@dataclass
class _Forwards:
    full: int = 0  # forwards through every layer
    fed: int = 0  # positions those forwards processed
    draft: int = 0  # forwards with the layer count lowered (HF's early-exit draft)
    unknown: bool = False  # a forward without input_ids: counts cannot be trusted


@contextlib.contextmanager
def _count_forwards(sm: SkippableModel) -> Iterator[_Forwards]:
    """Count the HF model's forwards. HF's early-exit assistant is the model itself with
    ``config.num_hidden_layers`` lowered, so a lowered count marks a draft forward."""
    counts = _Forwards()
    base = getattr(sm.hf, sm.hf.base_model_prefix)

    def hook(module, args, kwargs) -> None:
        if base.config.num_hidden_layers < sm.num_layers:
            counts.draft += 1
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        counts.full += 1
        if ids is None:
            counts.unknown = True
        else:
            counts.fed += int(ids.shape[-1])

    handle = sm.hf.register_forward_pre_hook(hook, with_kwargs=True)
    layers = base.config.num_hidden_layers
    try:
        yield counts
    finally:
        handle.remove()
        # HF's early-exit drafter lowers the layer count without try/finally: an exception
        # inside it must not leave a truncated model for the methods that run next.
        base.config.num_hidden_layers = layers


def hf_method(sm: SkippableModel, name: str, *, setting: str = "", before: Callable[[], None] | None = None,
              **generate_kwargs) -> Contender:
    """An HF ``generate`` mode as a method; τ and acceptance come from counting its forwards.
    ``before`` runs ahead of every call (to reset state HF keeps between calls, e.g. an assistant's schedule)."""

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        if before is not None:
            before()
        with _count_forwards(sm) as n:
            ids = hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, **generate_kwargs)
        if n.unknown or n.full == 0:
            return ContenderOutput(ids)
        # Every full forward emits (its accepted drafts + 1) tokens. The first one also reads the
        # prompt, whose last token plays the part that the pending token plays in later forwards.
        drafted = n.fed - (len(prompt_ids) - 1) - n.full
        return ContenderOutput(
            ids, verify_steps=n.full - 1, drafted=drafted, accepted=max(len(ids) - n.full, 0),
            draft_steps=n.draft,
        )

    return Contender(name, "hf", setting or "model.generate(do_sample=False)", decode)


def peer_method(sm: SkippableModel, peer: str, value: int | None = None) -> Contender:
    """The peer ``peer`` at one value of its knob (the row name carries the value)."""
    spec = PEERS.get(peer)
    if spec is None:
        raise ConfigError(f"unknown peer '{peer}': use {', '.join(PEERS)}")
    if peer == ASSISTED:
        return _assisted_method(sm, HEURISTIC if value is None else value)
    if spec.option is None or value is None:
        return hf_method(sm, spec.name)
    return hf_method(sm, spec.name, setting=f"{spec.option}={value}", **{spec.option: value})


def hf_compiled_method(sm: SkippableModel, *, capacity: int) -> Contender:
    """HF greedy ``generate`` on a StaticCache of ``capacity`` positions, its one-token step compiled by torch.compile
    and the prompt run eagerly, as transformers' own ``generate`` compiles (``GenerationMixin._sample``): on a CPU
    inside the compiled kernel's inductor settings, on a CUDA GPU in ``mode="reduce-overhead"`` (CUDA graphs), the
    recipe transformers documents there. Compiled here, on one warm-up prompt, so that no timed call compiles.

    Only the step: on the AVX2 Zen 3 of ``studies/startup-cpu.md`` compiling the prompt's graphs too (a static and a
    dynamic one, each autotuned) took 9-12 minutes of every bench, the step alone 2-4 (129-227 s); the prompt is
    one forward of each decode."""
    from skipsearch.kernels.inductor import inductor_settings
    from skipsearch.kv_cache import static_cache

    # allocated here, not in the first compiled forward (kv_cache.allocate: under CUDA graphs, the replays' pool)
    cache = static_cache(sm.hf.config, capacity=capacity, dtype=sm.dtype, device=sm.device)
    gpu = sm.device.type == "cuda"
    eager = sm.hf.forward
    compiled = torch.compile(eager, mode="reduce-overhead") if gpu else torch.compile(eager)
    # the settings apply where the call compiles: torch.compile's options= left the CPU step unfrozen and untuned
    settings = contextlib.nullcontext if gpu else inductor_settings

    def forward(*args, **kwargs):  # generate passes every input by name
        ids = kwargs.get("input_ids")
        return compiled(*args, **kwargs) if ids is not None and ids.shape[-1] == 1 else eager(*args, **kwargs)

    def generate_compiled(prompt_ids: Sequence[int], max_new_tokens: int, **kwargs):
        sm.hf.forward = forward  # generate calls the module, which calls this instance's forward
        try:
            with torch.inference_mode():
                cache.reset()
            with settings():
                return hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, cache=cache, **kwargs)
        finally:
            del sm.hf.forward

    generate_compiled([1] * 3, 2)  # the step compiles once, static

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        return ContenderOutput(generate_compiled(prompt_ids, max_new_tokens))  # forwards uncounted: compiled

    how = 'mode="reduce-overhead"' if gpu else "inductor settings"
    return Contender(HF_COMPILED, "hf", f"generate(cache=StaticCache), one-token step compiled ({how})", decode)


def _assisted_method(sm: SkippableModel, value: int) -> Contender:
    """HF assisted generation with the model's own reduced-precision copy (fp16 weights on a CPU, int8 on a
    GPU: the schemes of the precision draft, their real kernels) as the assistant, at one schedule."""
    from skipsearch.methods.precision import quantized_assistant

    assistant, scheme = quantized_assistant(sm)
    schedule = "heuristic" if value == HEURISTIC else "constant"

    def reset() -> None:  # HF's heuristic schedule moves num_assistant_tokens on the assistant's own config
        assistant.generation_config.num_assistant_tokens_schedule = schedule
        assistant.generation_config.num_assistant_tokens = 5 if value == HEURISTIC else value

    setting = f"assistant={scheme} copy, {schedule}" + ("" if value == HEURISTIC else f" {value}")
    return hf_method(sm, ASSISTED, setting=setting, before=reset, assistant_model=assistant)


def profile_method(sm: SkippableModel, path: str, profile) -> Contender:
    """A profile of any registered method, decoded through the one engine with a fresh drafter per prompt."""
    from skipsearch import methods

    name = f"{profile.method}:{Path(path).stem}"
    candidate = profile.candidate
    # parameters that do not fit the model fail here, before any timing; a compiled draft's graph compiles here too
    # (a hybrid's fallback may not draft in the harness's warm-up: its first miss would compile inside a timed call)
    drafter = methods.build_drafter(candidate, sm)
    if drafter is not None:
        drafter.warm(sm)
    return engine_method(sm, name, lambda _ids: methods.build_drafter(candidate, sm), setting=str(path))


def hf_profile_method(sm: SkippableModel, path: str, profile, directory: Path, *, capacity: int) -> Contender:
    """``profile`` exported for transformers into ``directory`` and decoded by ``model.generate(custom_generate=
    directory)``, as a user runs it: transformers loads the directory's generate.py on every call, and that runs the
    engine. τ and acceptance come from the engine's stats, which the exported function hands back. It runs the
    kernel our own rows run (``sm.kernel``), built for the bench's ``capacity`` as theirs is, by the exported
    function itself (a second compile, in the warm-up: a user's process compiles it once too)."""
    from skipsearch.export import hf

    hf.write(directory, profile)
    name = f"{HF_PROFILE}:{Path(path).stem}"
    kernel = sm.kernel.label

    def decode(prompt_ids: Sequence[int], max_new_tokens: int) -> ContenderOutput:
        stats = []
        ids = hf_generate(sm, prompt_ids, max_new_tokens=max_new_tokens, custom_generate=str(directory),
                          trust_remote_code=True, skipsearch_stats=stats.append, skipsearch_kernel=kernel,
                          skipsearch_capacity=capacity)
        s = stats[0]
        return ContenderOutput(ids, verify_steps=s.verify_steps, drafted=s.drafted_tokens, accepted=s.accepted_tokens,
                               draft_steps=s.draft_steps, draft_seconds=s.draft_seconds,
                               verify_seconds=s.verify_seconds, drafter_stats=s.drafter_stats)

    return Contender(name, PROFILE_IN_HF, f"model.generate(custom_generate=export of {path})", decode)
