"""A draft profile run inside transformers' own ``model.generate``: what an exported ``custom_generate/generate.py``
calls (``skipsearch export --engine hf``).

transformers hands a ``custom_generate`` function every argument of ``generate`` as keywords, ``model`` first
(``GenerationMixin.generate``, transformers 5.x). ``generate_with_profile`` wraps that model in skipsearch's
adapter (``SkippableModel``; one per model, kept, so that a precision draft's reduced-precision copy is built
once), refuses a profile made for other weights as ``skipsearch decode`` does (``profile.check_model``), builds
the profile's drafter through the method registry and decodes with the one engine (``decoding.generate``). It
returns what ``generate`` returns: the sequences, prompt included, as a ``[B, T]`` tensor (or a
``GenerateDecoderOnlyOutput`` holding only them with ``return_dict_in_generate``).

Greedy output is the model's own greedy output, token for token in fp32; ``do_sample`` samples the same
distribution (temperature, top-k, top-p) with lossless rejection sampling, seeded from torch's global RNG, so
``torch.manual_seed`` makes it repeatable. What the engine cannot honour (beams, logits processors, penalties,
scores) is refused in one line, never ignored. A batch decodes row by row; left padding is stripped per row.

The full model's forwards run through the profile's kernel, as ``skipsearch decode`` runs them: a profile timed
or planned with ``inductor-c4`` compiles the model once per process (about a minute on a CPU, on the first call),
on a static cache of ``skipsearch_capacity`` positions (default: the call's longest prompt + max_new_tokens,
rounded up to a multiple of CAPACITY_STEP, so that most later calls fit without compiling again).
``skipsearch_kernel="eager"`` (or any kernel's name) overrides the profile's.
"""

from __future__ import annotations

import copy
import hashlib
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from skipsearch import methods
from skipsearch.checkpoints import arch_fingerprint
from skipsearch.config import ConfigError, SamplingParams
from skipsearch.engine.decoding import DecodeStats
from skipsearch.engine.decoding import generate as engine_generate
from skipsearch.kernels import check_kernel, choose_kernel
from skipsearch.model.loader import quiet_optional_kernels
from skipsearch.model.skippable import SkippableModel
from skipsearch.profile import Profile, check_model, profile_from_dict

# generate() arguments the engine cannot honour: (name in generate's signature, what to say)
_REFUSED_ARGS = {
    "logits_processor": "logits processors",
    "stopping_criteria": "stopping criteria",
    "prefix_allowed_tokens_fn": "prefix_allowed_tokens_fn",
    "assistant_model": "an assistant model (the profile drafts)",
    "negative_prompt_ids": "negative prompts",
    "negative_prompt_attention_mask": "negative prompts",
    "synced_gpus": "synced_gpus",
}
# GenerationConfig fields that change the output and that the engine does not apply: refused unless at their
# neutral value. None is neutral for all of them (transformers 5 leaves unset fields None).
_REFUSED_FIELDS: dict[str, tuple[Any, ...]] = {
    "num_beams": (1,), "num_beam_groups": (1,), "num_return_sequences": (1,), "penalty_alpha": (),
    "repetition_penalty": (1.0,), "encoder_repetition_penalty": (1.0,), "no_repeat_ngram_size": (0,),
    "bad_words_ids": (), "force_words_ids": (), "min_length": (0,), "min_new_tokens": (0,),
    "suppress_tokens": (), "begin_suppress_tokens": (), "forced_bos_token_id": (), "forced_eos_token_id": (),
    "sequence_bias": (), "guidance_scale": (1.0,), "stop_strings": (), "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,), "eta_cutoff": (0.0,), "min_p": (), "top_h": (), "diversity_penalty": (0.0,),
    "exponential_decay_length_penalty": (), "renormalize_logits": (False,), "watermarking_config": (),
    "output_scores": (False,), "output_logits": (False,), "output_attentions": (False,),
    "output_hidden_states": (False,), "prompt_lookup_num_tokens": (), "assistant_early_exit": (),
    "max_time": (), "low_memory": (False,), "use_mtp": (False,), "speculation_type": (),
}
quiet_optional_kernels()  # torchao's lines about CUDA kernels it cannot load are not the user's concern

DEFAULT_MAX_LENGTH = 20  # transformers' max_length when neither it nor max_new_tokens is set
CAPACITY_STEP = 512  # a compiled kernel's cache is built for a multiple of this many positions

StatsCallback = Callable[[DecodeStats], None]


class _Adapted:
    """The adapter of one HF model, and the profiles already checked against its weights."""

    def __init__(self, model) -> None:
        self.sm = SkippableModel(model, None, name=str(getattr(model, "name_or_path", "") or "model"))
        self.checked: set[str] = set()  # sha256 of profile texts that fit this model


_ADAPTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # HF model -> _Adapted
_PROFILES: dict[str, Profile] = {}  # sha256 of a profile's text -> the profile it validates to


def parse_profile(text: str, *, source: str = "custom_generate profile") -> Profile:
    """The profile a ``custom_generate`` directory carries, validated (once per text)."""
    import yaml

    from skipsearch.files.errors import ProfileError

    key = hashlib.sha256(text.encode()).hexdigest()
    if key not in _PROFILES:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ProfileError(f"{source}: not YAML: {' '.join(str(e).split())}") from None
        _PROFILES[key] = profile_from_dict(raw, source=source)
    return _PROFILES[key]


def adapter_for(model, profile: Profile, *, text: str, source: str, force: bool = False) -> SkippableModel:
    """``model``'s adapter, with ``profile`` checked against its weights: read from the checkpoint's safetensors
    files when the model was loaded from a local directory (as ``decode`` reads them, whatever dtype it was loaded
    in), else hashed from the weights in memory. A profile made for other weights is refused in one line."""
    from skipsearch.checkpoints import state_fingerprint, weights_fingerprint

    adapted = _ADAPTED.get(model)
    if adapted is None:
        adapted = _ADAPTED[model] = _Adapted(model)
    key = hashlib.sha256(text.encode()).hexdigest()
    if key not in adapted.checked:
        sm, path = adapted.sm, str(getattr(model, "name_or_path", "") or "")
        weights = weights_fingerprint(path) if path and Path(path).is_dir() else None
        check_model(profile, num_layers=sm.num_layers, fingerprint=arch_fingerprint(model.config, path),
                    weights_fingerprint=weights or state_fingerprint(model), force=force, source=source)
        adapted.checked.add(key)
    return adapted.sm


def generate_with_profile(model, input_ids: torch.Tensor | None = None, *, profile_text: str,
                          source: str = "custom_generate profile", **kwargs) -> Any:
    """``model.generate(...)`` decoded with the profile in ``profile_text`` (see the module docstring).

    Besides generate's own arguments it takes ``skipsearch_stats``, a callable given each row's ``DecodeStats``
    (τ, acceptance, draft and verify time), ``skipsearch_force`` to use a profile made for other weights, and
    ``skipsearch_kernel`` / ``skipsearch_capacity`` (see the module docstring).
    """
    on_stats: StatsCallback | None = kwargs.pop("skipsearch_stats", None)
    force = bool(kwargs.pop("skipsearch_force", False))
    kernel_name = kwargs.pop("skipsearch_kernel", None)
    capacity = kwargs.pop("skipsearch_capacity", None)
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise ConfigError(f"custom_generate: skipsearch_capacity must be a positive number of positions, "
                          f"got {capacity!r}")
    inputs = kwargs.pop("inputs", None)
    ids = input_ids if input_ids is not None else inputs
    if ids is None:
        raise ConfigError("custom_generate: give the prompt as input_ids (a [batch, length] tensor of token ids)")
    for name, what in _REFUSED_ARGS.items():
        value = kwargs.pop(name, None)
        if value is not None and value is not False and not (isinstance(value, list) and not value):
            raise ConfigError(f"custom_generate: {what} cannot be used with a skipsearch draft profile")
    streamer = kwargs.pop("streamer", None)
    attention_mask = kwargs.pop("attention_mask", None)
    kwargs.pop("tokenizer", None)  # only stop_strings read it, and they are refused
    gc = copy.deepcopy(kwargs.pop("generation_config", None) or model.generation_config)
    unused = gc.update(**kwargs)
    unused.pop("use_cache", None)
    unused.pop("use_model_defaults", None)  # transformers 4.56 hands it over: how to fill the config, no output change
    if unused:
        raise ConfigError(f"custom_generate: unknown argument {sorted(unused)[0]!r} for a skipsearch draft profile")
    for name, neutral in _REFUSED_FIELDS.items():
        value = getattr(gc, name, None)
        if value is not None and value not in neutral:
            raise ConfigError(f"custom_generate: {name}={value!r} cannot be used with a skipsearch draft profile")
    return _decode(model, ids, attention_mask, gc, streamer=streamer, on_stats=on_stats,
                   profile_text=profile_text, source=source, force=force, kernel_name=kernel_name,
                   capacity=capacity)


def _use_profile_kernel(sm: SkippableModel, profile: Profile, kernel_name: str | None, *, positions: int,
                        capacity: int | None) -> None:
    """Run the full model through the profile's kernel (or ``kernel_name``), built for ``capacity`` positions
    (default: ``positions`` rounded up to CAPACITY_STEP); a kernel already built that fits is kept."""
    try:
        kernel = choose_kernel(kernel_name, profile.kernel)
        check_kernel(kernel, sm.device.type, instead='skipsearch_kernel="eager"')
        methods.check_kernel_fits(profile.candidate, kernel, instead='skipsearch_kernel="eager"')
    except ConfigError as e:
        raise ConfigError(f"custom_generate: {e}") from None
    if not kernel.compiled:
        sm.use_kernel(kernel, capacity=0)
        return
    if capacity is not None and capacity < positions:
        raise ConfigError(f"custom_generate: skipsearch_capacity={capacity} is less than this call's "
                          f"{positions} positions (prompt + max_new_tokens)")
    current = sm.kernel_report
    if capacity is None:
        if current is not None and current.kernel == kernel.label and current.capacity >= positions + kernel.chunk:
            return  # the kernel built by an earlier call fits: no compile
        capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
    sm.use_kernel(kernel, capacity=capacity)


def _decode(model, ids: torch.Tensor, attention_mask, gc, *, streamer, on_stats, profile_text: str, source: str,
            force: bool, kernel_name: str | None, capacity: int | None):
    profile = parse_profile(profile_text, source=source)
    sm = adapter_for(model, profile, text=profile_text, source=source, force=force)
    ids = ids if ids.dim() == 2 else ids.view(1, -1)  # [B, T]
    if attention_mask is None:
        attention_mask = torch.ones_like(ids)
    if streamer is not None and ids.shape[0] != 1:
        raise ConfigError("custom_generate: a streamer needs a batch of one prompt")
    length = ids.shape[1]
    max_new = gc.max_new_tokens if gc.max_new_tokens is not None else (
        (gc.max_length if gc.max_length is not None else DEFAULT_MAX_LENGTH) - length)
    if max_new < 1:
        raise ConfigError(f"custom_generate: nothing to generate: max_new_tokens is {max_new} for a "
                          f"{length}-token prompt (set max_new_tokens)")
    _use_profile_kernel(sm, profile, kernel_name, positions=length + max_new, capacity=capacity)
    eos = gc.eos_token_id
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    if isinstance(eos, torch.Tensor):
        eos_ids = tuple(int(e) for e in eos.view(-1))
    sampling = SamplingParams()
    if gc.do_sample:
        sampling = SamplingParams(temperature=float(gc.temperature if gc.temperature is not None else 1.0),
                                  top_p=float(gc.top_p if gc.top_p is not None else 1.0),
                                  top_k=int(gc.top_k or 0))
    rows = []
    for b in range(ids.shape[0]):
        keep = attention_mask[b].bool()
        first = int(keep.nonzero()[0]) if keep.any() else length
        if not keep[first:].all():
            raise ConfigError("custom_generate: the attention mask pads inside or after a prompt: pad on the left "
                              "(tokenizer.padding_side = 'left')")
        prompt = ids[b, first:].tolist()
        if not prompt:
            raise ConfigError(f"custom_generate: prompt {b} is empty")
        if streamer is not None:
            streamer.put(ids[b].cpu())
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if gc.do_sample else 0
        result = engine_generate(
            sm, prompt, drafter=methods.build_drafter(profile.candidate, sm), sampling=sampling,
            max_new_tokens=max_new, eos_token_ids=eos_ids, seed=seed,
            on_tokens=(lambda new: streamer.put(torch.tensor(list(new)))) if streamer is not None else None,
        )
        if on_stats is not None:
            on_stats(result.stats)
        rows.append(result.token_ids)
    if streamer is not None:
        streamer.end()
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    width = max(len(r) for r in rows)
    new = torch.full((ids.shape[0], width), int(pad), dtype=ids.dtype, device=ids.device)  # [B, new]
    for b, row in enumerate(rows):
        new[b, : len(row)] = torch.tensor(row, dtype=ids.dtype)
    sequences = torch.cat([ids, new], dim=1)  # [B, T + new], the prompt included, as generate returns it
    if gc.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


__all__ = ["adapter_for", "generate_with_profile", "parse_profile"]
