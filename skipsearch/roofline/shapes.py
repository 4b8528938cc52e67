"""A model's shapes for the roofline: read from its config.json (no weight is read), or, for the well-known
architectures whose checkpoints are not on this machine, from a small table of published hyper-parameters.

Every row of the table names where its numbers come from. The roofline needs only what sets a sublayer's
bytes and FLOPs: depth, hidden and intermediate sizes, query and key/value heads, head size, vocabulary, and
whether the LM head is the embedding matrix. A config on this machine always wins over the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from skipsearch.checkpoints import ModelError

# Where the table's numbers are published. gpt-fast's model.py is a stored public copy (pytorch-labs/gpt-fast at
# commit 32971d3129541c5bfb4f715abc33d1c5f408d204, ``transformer_configs``; an intermediate size it leaves out is
# find_multiple(int(2 * 4 * dim / 3), 256), as ModelArgs.__post_init__ computes it); each is the architecture
# of the matching Hugging Face config.json.
GPT_FAST = "pytorch-labs/gpt-fast model.py transformer_configs @32971d3"
_LLAMA2 = dict(model_type="llama", vocab_size=32000, tie_word_embeddings=False)
_LLAMA3 = dict(model_type="llama", vocab_size=128256, tie_word_embeddings=False)
_7B = dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
           num_key_value_heads=32)
_13B = dict(num_hidden_layers=40, hidden_size=5120, intermediate_size=13824, num_attention_heads=40,
            num_key_value_heads=40)
_70B = dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
            num_key_value_heads=8)
_34B = dict(num_hidden_layers=48, hidden_size=8192, intermediate_size=22016, num_attention_heads=64,
            num_key_value_heads=8)
_L3_8B = dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
              num_key_value_heads=8)

# alias (skipsearch.model.skippable.ALIASES) -> (config fields, source)
ARCHITECTURES: dict[str, tuple[dict[str, Any], str]] = {
    **{name: ({**_LLAMA2, **_7B}, f'{GPT_FAST} "7B"') for name in ("llama-2-7b", "llama-2-7b-chat")},
    **{name: ({**_LLAMA2, **_13B}, f'{GPT_FAST} "13B"') for name in ("llama-2-13b", "llama-2-13b-chat")},
    **{name: ({**_LLAMA2, **_70B}, f'{GPT_FAST} "70B"') for name in ("llama-2-70b", "llama-2-70b-chat")},
    **{name: ({**_LLAMA2, **_34B}, f'{GPT_FAST} "34B" (CodeLlama-34B)')
       for name in ("codellama-34b", "codellama-34b-instruct")},
    # Code Llama 7B and 13B add 16 infilling tokens to Llama 2's vocabulary (codellama/CodeLlama-13b-hf config.json:
    # vocab_size 32016); 16 rows of the head are under 0.1% of its bytes
    **{name: ({**_LLAMA2, **_13B, "vocab_size": 32016}, f'{GPT_FAST} "13B", vocabulary 32016 (Code Llama)')
       for name in ("codellama-13b", "codellama-13b-instruct")},
    **{name: ({**_LLAMA2, **_7B, "vocab_size": 32016}, f'{GPT_FAST} "7B", vocabulary 32016 (Code Llama)')
       for name in ("codellama-7b", "codellama-7b-instruct")},
    **{name: ({**_LLAMA3, **_L3_8B}, f'{GPT_FAST} "llama-3-8b"')
       for name in ("llama-3-8b", "llama-3-8b-instruct", "llama-3.1-8b", "llama-3.1-8b-instruct")},
    **{name: ({**_LLAMA3, **_70B}, f'{GPT_FAST} "llama-3-70b"')
       for name in ("llama-3-70b", "llama-3-70b-instruct", "llama-3.1-70b", "llama-3.1-70b-instruct")},
    **{name: ({"model_type": "mistral", "vocab_size": 32000, "tie_word_embeddings": False, **_L3_8B},
              f'{GPT_FAST} "Mistral-7B"') for name in ("mistral-7b", "mistral-7b-v0.1")},
}


@dataclass(frozen=True)
class Shapes:
    """What sets a Llama-style model's bytes and FLOPs per token."""

    name: str  # the --model string: it is part of the architecture fingerprint profiles hold
    num_layers: int
    hidden: int
    intermediate: int
    heads: int  # query heads
    kv_heads: int  # key/value heads (grouped-query attention: fewer than heads)
    head_dim: int
    vocab: int
    tied: bool  # the LM head is the embedding matrix
    attn_bias: bool = False  # q, k, v (and o) projections carry biases (Qwen2)
    mlp_bias: bool = False
    source: str = ""  # where the shapes come from: the config.json read, or the table's row
    fingerprint: str | None = None  # models.arch_fingerprint: what schema-1 profiles and cost files compare
    architecture: str | None = None  # the layout hash of the checkpoint's tensors, where its files are here

    @property
    def attn_params(self) -> int:
        """One layer's attention weights: q and o (heads x head_dim), k and v (kv_heads x head_dim)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv + ((q + 2 * kv) if self.attn_bias else 0)

    @property
    def mlp_params(self) -> int:
        """One layer's gated MLP: gate, up (hidden -> intermediate) and down."""
        return 3 * self.hidden * self.intermediate + ((2 * self.intermediate + self.hidden) if self.mlp_bias else 0)

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_width(self) -> int:
        """Values written to (and read from) the KV cache per layer and position: a key and a value."""
        return 2 * self.kv_heads * self.head_dim


def shapes_from_config(config: Any, name: str, *, source: str, architecture: str | None = None) -> Shapes:
    """Shapes of a transformers config (or anything with its attributes)."""
    from skipsearch.checkpoints import arch_fingerprint

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Shapes(
        name=name, num_layers=config.num_hidden_layers, hidden=config.hidden_size,
        intermediate=config.intermediate_size, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim, vocab=config.vocab_size,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        attn_bias=bool(getattr(config, "attention_bias", False) or config.model_type == "qwen2"),
        mlp_bias=bool(getattr(config, "mlp_bias", False)), source=source,
        fingerprint=arch_fingerprint(config, name), architecture=architecture)


def _locate(model: str) -> tuple[Any, tuple[dict[str, Any], str] | None]:
    """``--model``'s checkpoint where it is on this machine (an embedded model, a directory, a cached alias or hub
    id), else ``(None, its row)`` of the published table (``ARCHITECTURES``); one ModelError line for neither."""
    from skipsearch.checkpoints import find_checkpoint

    try:
        return find_checkpoint(model), None
    except ModelError as e:
        row = ARCHITECTURES.get(model.lower())
        if row is None:
            raise ModelError(f"{e}; these architectures are also known without their files: "
                             f"{', '.join(sorted(ARCHITECTURES))}") from None
        return None, row


def architecture_config(model: str) -> tuple[Any, str]:
    """``--model``'s transformers config and where it comes from: its config.json where the checkpoint is on this
    machine (no weight is read), else the published table's row for an alias (``_locate``)."""
    from skipsearch.model.loader import read_config

    checkpoint, row = _locate(model)
    if row is not None:
        from transformers import AutoConfig

        fields, source = row
        return AutoConfig.for_model(**fields), f"published architecture: {source}"
    return read_config(checkpoint), f"config.json of {model}"


def resolve_shapes(model: str) -> Shapes:
    """``--model``'s shapes: its config.json's where the checkpoint is on this machine (no weight is read), else the
    published table's row for an alias (``_locate``)."""
    from skipsearch.checkpoints import layout_fingerprint
    from skipsearch.model.loader import read_config

    checkpoint, row = _locate(model)
    if row is not None:
        fields, source = row
        return shapes_from_config(SimpleNamespace(**fields), model, source=f"published architecture: {source}")
    return shapes_from_config(read_config(checkpoint), model, source=f"config.json of {model}",
                              architecture=layout_fingerprint(checkpoint.path))


__all__ = ["ARCHITECTURES", "GPT_FAST", "Shapes", "architecture_config", "resolve_shapes", "shapes_from_config"]
