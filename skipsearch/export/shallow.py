"""A shallow self-draft: the model with only some of its decoder layers, the layer-skip draft of whole layers in
the form an engine loads as a draft model of its own (llama.cpp's ``-md`` GGUF: ``gguf_draft``; a Hugging Face
checkpoint for vLLM's ``draft_model``: ``write_shallow_checkpoint``). A skipped sublayer has no such form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from skipsearch.config import ConfigError

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def shallow_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    """The decoder layers a shallow draft keeps: every one by default, else ``layers`` checked (each in range, at
    least one) and sorted."""
    if layers is None:
        return tuple(range(num_layers))
    kept = tuple(sorted(set(layers)))
    if not kept or kept[0] < 0 or kept[-1] >= num_layers:
        raise ConfigError(f"a shallow draft keeps 1 to {num_layers} of the model's layers 0..{num_layers - 1}, "
                          f"not {list(layers)}")
    return kept


def write_shallow_checkpoint(directory: Path, sm, checkpoint: Path, layers: Sequence[int]) -> dict:
    """``sm`` (loaded from ``checkpoint``, whose tokenizer files it carries) with only the decoder layers
    ``layers``, renumbered 0.., as a Hugging Face checkpoint in the model's own dtype (``config.json`` with
    ``num_hidden_layers`` and any per-layer list cut to match, ``model.safetensors``); returns what a manifest
    records about it."""
    from skipsearch.export.base import write_model_dir

    kept = shallow_layers(layers, sm.num_layers)
    renumber = {source: i for i, source in enumerate(kept)}
    hf = sm.hf
    tied = bool(getattr(hf.config, "tie_word_embeddings", False))
    state = {}
    for name, tensor in hf.state_dict().items():
        if tied and name == "lm_head.weight":
            continue  # shared with the embedding: the config ties them
        match = _LAYER.fullmatch(name)
        if match:
            source = int(match.group(1))
            if source not in renumber:
                continue
            name = f"model.layers.{renumber[source]}.{match.group(2)}"
        state[name] = tensor.detach().to("cpu").contiguous().clone()
    config = hf.config.to_dict()
    config["num_hidden_layers"] = len(kept)
    for key, value in list(config.items()):  # per-layer settings (layer_types, ...) follow the kept layers
        if isinstance(value, list) and len(value) == sm.num_layers and key.startswith("layer"):
            config[key] = [value[i] for i in kept]
    write_model_dir(directory, state, config, checkpoint)
    return {"format": "safetensors", "dtype": str(sm.dtype).removeprefix("torch."), "layers": list(kept),
            "of": sm.num_layers}


__all__ = ["shallow_layers", "write_shallow_checkpoint"]
