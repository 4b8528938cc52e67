"""Loading a model: ``load_model(name)`` finds a checkpoint, places it and returns the adapter (``SkippableModel``).

``name`` is the embedded default model (``smollm2-135m``), a local Hugging Face directory, an alias of a
well-known checkpoint (``llama-2-13b``) or a hub id, both found in the local Hugging Face cache
(checkpoints.py). Device and dtype default to ``auto`` and are checked against free memory before any weight
is read (placement.py). This module sits above the adapter (models.py): it builds one.
"""

from __future__ import annotations

import logging

from skipsearch.checkpoints import Checkpoint, ModelError, find_checkpoint, weights_fingerprint
from skipsearch.model.placement import DEFAULT_MAX_TOKENS, Placement, check_memory, checkpoint_dtype, choose_placement
from skipsearch.model.skippable import SUPPORTED_MODEL_TYPES, SkippableModel
from skipsearch.model.target import NATIVE, SUMMARY, check_precision, quantize_target
from skipsearch.notices import quiet_optional_kernels, route_library_logs

__all__ = ["DEFAULT_MODEL", "load_model", "quiet_optional_kernels", "random_model", "read_config", "read_tokenizer"]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"


def read_config(checkpoint: Checkpoint):
    """The checkpoint's config, without its weights; refuses an architecture the adapter cannot skip in."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{checkpoint.name}': {_first_line(exc)}") from None
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model '{checkpoint.name}' has architecture '{getattr(config, 'model_type', '?')}'; "
            f"skipsearch supports Llama-style decoder stacks: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def read_tokenizer(checkpoint: Checkpoint):
    """The checkpoint's tokenizer, without its weights: what prompts are checked against before the model loads."""
    quiet_optional_kernels()
    from transformers import AutoTokenizer

    route_library_logs()
    try:
        return AutoTokenizer.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{checkpoint.name}': {_first_line(exc)}") from None


def load_model(name: str | Checkpoint = DEFAULT_MODEL, *, device: str = "auto", dtype: str = "auto",
               profile_dtype: str | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
               draft_bits: int | None = None, precision: str = NATIVE) -> SkippableModel:
    """Load ``name`` (embedded model, directory, alias or hub id; see ``find_checkpoint``) as a SkippableModel.

    ``device`` and ``dtype`` may be ``auto`` (placement.choose_placement): CUDA when available, spread
    over several GPUs with accelerate's device_map; the checkpoint's dtype on a GPU (``profile_dtype``,
    a profile's, takes precedence), fp32 on the CPU. The choice is logged in one line. Before any
    weight is read, the model's memory (weights plus the KV cache of ``max_tokens`` positions: the
    longest prompt plus max_new_tokens) is checked against what is free there. ``precision`` is the target's
    (model/target.py): ``int8`` loads the fp32 weights and swaps every linear for its int8 copy.
    """
    choose_placement(device, dtype)  # a bad --device or --dtype fails before a first-use conversion
    check_precision(precision, dtype=dtype)
    quiet_optional_kernels()
    checkpoint = name if isinstance(name, Checkpoint) else find_checkpoint(name)
    config = read_config(checkpoint)
    placement = choose_placement(device, dtype, checkpoint=checkpoint_dtype(config), profile=profile_dtype)
    if precision != NATIVE:
        check_precision(precision, device=placement.device, dtype=placement.dtype)
    check_memory(config, placement, max_tokens=max_tokens, label=f"model '{checkpoint.name}'", draft_bits=draft_bits)
    log.info("loading %s on %s", checkpoint.name, placement.describe())
    model, tokenizer = _from_pretrained(checkpoint, placement)
    if precision != NATIVE:
        log.info("making the %s target: %s", precision, SUMMARY[precision])
        quantize_target(model, precision)
    return SkippableModel(model, tokenizer, name=checkpoint.name, placement=placement,
                          weights_fingerprint=weights_fingerprint(checkpoint.path), precision=precision)


def random_model(config, *, name: str, device: str = "auto", dtype: str = "auto", seed: int = 0,
                 max_tokens: int = DEFAULT_MAX_TOKENS) -> SkippableModel:
    """A model of ``config``'s architecture with randomly initialised weights (seeded), built on its device, with
    no tokenizer: for timing a model whose weights are not here (its costs do not depend on the weights' values;
    its acceptance does). ``device`` and ``dtype`` as ``load_model``'s, checked against free memory first."""
    import torch
    from transformers import AutoModelForCausalLM

    choose_placement(device, dtype)
    quiet_optional_kernels()
    route_library_logs()
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"model '{name}' has architecture '{getattr(config, 'model_type', '?')}'; skipsearch "
                         f"supports Llama-style decoder stacks: {', '.join(SUPPORTED_MODEL_TYPES)}")
    placement = choose_placement(device, dtype, checkpoint=checkpoint_dtype(config))
    if placement.device == "auto":
        raise ModelError("random weights are built on one device: name it (--device cuda:0 or cpu)")
    check_memory(config, placement, max_tokens=max_tokens, label=f"model '{name}' (random weights)")
    log.info("building %s with random weights (seed %d) on %s", name, seed, placement.describe())
    torch.manual_seed(seed)
    with torch.device(placement.device):  # initialised where it runs: no host copy of a 7B model
        model = AutoModelForCausalLM.from_config(config, dtype=placement.torch_dtype, attn_implementation="sdpa")
    return SkippableModel(model, None, name=name, placement=placement)  # fingerprinted from memory when asked


def _from_pretrained(checkpoint: Checkpoint, placement: Placement):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    route_library_logs()  # transformers' logged deprecations as the CLI routes its warnings (skipsearch.notices)
    kwargs = {"dtype": placement.torch_dtype, "attn_implementation": "sdpa"}
    if placement.device == "auto":
        kwargs["device_map"] = "auto"  # accelerate splits the layers across the GPUs
    elif placement.device.startswith("cuda"):
        kwargs["device_map"] = {"": placement.device}  # straight onto the GPU, never a whole copy in host RAM
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint.path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{checkpoint.name}': {_first_line(exc)}") from None
    if placement.device == "mps":
        model = model.to("mps")
    return model, tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
