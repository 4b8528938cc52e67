"""The draft model of a llama.cpp export: the model's own weights as a GGUF at the profile's scheme, written with
the ``gguf`` package (its writer, its quantizers, its tokenizer readers).

Tensor names and metadata keys follow GGUF's ``llama`` and ``qwen2`` architectures (``gguf.constants``). Weights
of the quantized sublayers (attention q/k/v/o, MLP gate/up/down) and, with ``quant_head``, the LM head are stored
in the scheme's GGML type (``TYPES``); full-precision sublayers (``full_attn`` / ``full_mlp``), norms and the
token embedding stay F32, as the precision draft keeps them. For ``llama``, q and k rows are reordered from HF's
rotate-half rotary layout to GGUF's interleaved one (a fixed permutation per head; ``qwen2`` uses HF's layout).
The tokenizer (GPT-2 byte-level BPE or SentencePiece from ``tokenizer.json``) is read with ``gguf.vocab``.

With ``exact``, each weight that would be F32 (the full-precision linears, the head, the token embedding) is
written instead in the fewest bytes that give back its fp32 values bit for bit, as the ``panel`` kernel holds it
(``kernels/lowbit/exact.py``): a model converted from a GGUF gets its blocks back (smollm2-135m: Q4_1 linears, a
Q8_0 embedding; a Q4_0 file's linears Q4_0), a bf16 checkpoint's weights BF16, any other stays F32
(``exact_tensor``). llama.cpp then runs the
same weights as skipsearch in the same bytes, with its own arithmetic (8-bit activations for block types).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from skipsearch.config import ConfigError
from skipsearch.export.shallow import shallow_layers

# scheme -> (GGML tensor type, GGUF file type): the llama.cpp type nearest each scheme. int8 is per-row int8 in
# skipsearch (torchao) and blocks of 32 with an fp16 scale in Q8_0; int4 is groups of 32 on a CPU and Q4_0 blocks
# of 32: the same bits per weight, scales at another granularity.
TYPES = {"fp16": ("F16", "MOSTLY_F16"), "int8": ("Q8_0", "MOSTLY_Q8_0"), "int4": ("Q4_0", "MOSTLY_Q4_0")}
# a self-draft's name (its GGML type, lower case) -> its scheme: q8_0 -> int8, q4_0 -> int4, f16 -> fp16
DRAFT_SCHEMES = {ggml.lower(): scheme for scheme, (ggml, _) in TYPES.items()}
ARCHES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
_ATTN = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
_MLP = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def reorder_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q or k projection ([n_head * head_dim, in]) from HF's rotate-half rotary layout (each head's
    first half of dimensions pairs with its second half) to GGUF llama's interleaved one (pairs side by side)."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _halves(x) -> object:
    """fp16 [N, G] as its bytes [N, G, 2] (little-endian, as GGML stores a block's scale)."""
    import torch

    return x.contiguous().view(torch.uint8).view(*x.shape, 2)


def exact_tensor(weight) -> tuple[str, np.ndarray]:
    """(GGML type, data) holding ``weight`` [N, K]'s fp32 values bit for bit in the fewest bytes: its Q4_0, Q4_1 or
    Q8_0 blocks where ``kernels/lowbit/exact.py`` finds them (their GGML block bytes, [N, K / 32 * block size]
    uint8; a Q4_0 block's q = 8 reads back through gguf as -0.0 where d < 0, the same value), BF16 where bf16 gives
    them back, else F32 itself."""
    import gguf
    import torch

    from skipsearch.kernels.lowbit.exact import BLOCK, fit_bf16, fit_q4_0, fit_q4_1, fit_q8_0

    w = weight.detach().float().cpu().contiguous()
    n = w.shape[0]

    def nibbles(q):  # 16 bytes a block: q[j] in the low nibble, q[j + 16] in the high one
        b = q.view(n, -1, BLOCK)
        return b[..., :BLOCK // 2] | (b[..., BLOCK // 2:] << 4)

    if (fit := fit_q4_0(w)) is not None:  # block_q4_0: d (fp16), then the nibbles
        return "Q4_0", torch.cat((_halves(fit[1]), nibbles(fit[0])), -1).reshape(n, -1).numpy()
    if (fit := fit_q4_1(w)) is not None:
        q, d, m = fit  # block_q4_1: d, m (fp16), then the nibbles
        return "Q4_1", torch.cat((_halves(d), _halves(m), nibbles(q)), -1).reshape(n, -1).numpy()
    if (fit := fit_q8_0(w)) is not None:
        q, d = fit  # block_q8_0: d (fp16), then the 32 int8 codes
        return "Q8_0", torch.cat((_halves(d), q.view(torch.uint8).view(n, -1, BLOCK)), -1).reshape(n, -1).numpy()
    if fit_bf16(w) is not None:
        return "BF16", gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.BF16)  # exact: no rounding left
    return "F32", w.numpy()


def write_target_gguf(path: Path, sm, checkpoint: Path, *, exact: bool = False) -> dict:
    """The whole model as a llama.cpp target (``write_draft_gguf``'s record): every sublayer and the head at F32 or,
    ``exact``, each weight in the fewest bytes that give it back (``exact_tensor``)."""
    every = tuple(range(sm.num_layers))
    return write_draft_gguf(path, sm, checkpoint, scheme="fp16", quant_head=False, full_attn=every, full_mlp=every,
                            exact=exact)


def write_draft_gguf(path: Path, sm, checkpoint: Path, *, scheme: str, quant_head: bool = True,
                     full_attn: tuple[int, ...] = (), full_mlp: tuple[int, ...] = (),
                     layers: Sequence[int] | None = None, exact: bool = False) -> dict:
    """Write the draft GGUF of ``sm`` (loaded from ``checkpoint``, whose tokenizer it carries); returns what the
    manifest records about it (tensor types and counts). ``layers`` keeps only those decoder layers, in order,
    numbered 0.. in the file (a shallow draft: a layer-skip draft's kept whole layers; default all). ``exact``
    writes each weight that would be F32, norms aside, as ``exact_tensor`` holds it (the same values)."""
    import gguf

    if scheme not in TYPES:
        raise ConfigError(f"a llama.cpp draft has no GGUF type for scheme {scheme} (it has {', '.join(TYPES)})")
    cfg = sm.hf.config
    arch = ARCHES.get(cfg.model_type)
    if arch is None:
        raise ConfigError(f"no GGUF architecture for model type {cfg.model_type}")
    kept = shallow_layers(layers, sm.num_layers)
    qtype = gguf.GGMLQuantizationType[TYPES[scheme][0]]
    writer = gguf.GGUFWriter(str(path), arch)
    # an exact file's type is its tensors' most common, known once they are written
    _metadata(writer, cfg, arch, name=sm.name, blocks=len(kept),
              file_type=None if exact else gguf.LlamaFileType[TYPES[scheme][1]])
    _tokenizer(writer, Path(checkpoint), vocab_size=cfg.vocab_size)
    counts: dict[str, int] = {}

    def add(name: str, tensor, ggml: str) -> None:
        data = tensor.detach().float().cpu().numpy()
        if exact and ggml == "F32" and data.ndim == 2:  # a weight matrix, not a norm or a bias
            ggml, data = exact_tensor(tensor)
        kind = gguf.GGMLQuantizationType[ggml]
        if data.dtype == np.uint8:  # exact_tensor's blocks, as GGML stores them
            writer.add_tensor(name, data, raw_dtype=kind)
        elif kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data.astype(np.float32))
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        counts[ggml] = counts.get(ggml, 0) + 1

    n_head, n_kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    add("token_embd.weight", sm.hf.get_input_embeddings().weight, "F32")
    for i, source in enumerate(kept):
        layer = sm.layers[source]
        attn_type = "F32" if source in full_attn else qtype.name
        mlp_type = "F32" if source in full_mlp else qtype.name
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, "F32")
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, "F32")
        for hf_name, g_name in _ATTN.items():
            proj = getattr(layer.self_attn, hf_name)
            weight = proj.weight
            if arch == "llama" and hf_name in ("q_proj", "k_proj"):
                import torch

                weight = torch.from_numpy(reorder_rotary(weight.detach().float().cpu().numpy(),
                                                         n_head if hf_name == "q_proj" else n_kv))
            add(f"blk.{i}.{g_name}.weight", weight, attn_type)
            if getattr(proj, "bias", None) is not None:
                add(f"blk.{i}.{g_name}.bias", proj.bias, "F32")
        for hf_name, g_name in _MLP.items():
            add(f"blk.{i}.{g_name}.weight", getattr(layer.mlp, hf_name).weight, mlp_type)
    add("output_norm.weight", sm.hf.model.norm.weight, "F32")
    add("output.weight", sm.lm_head.weight, qtype.name if quant_head else "F32")
    if exact:
        writer.add_file_type(_file_type(counts))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = {"file": path.name, "architecture": arch, "scheme": scheme, "tensor_types": counts}
    if len(kept) < sm.num_layers:
        out["layers"] = list(kept)
    return out


def _file_type(counts: dict[str, int]):
    """The GGUF file type an exact file declares (for people: llama.cpp reads each tensor's own type): its most
    common weight type's."""
    import gguf

    kinds = {"Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q8_0": "MOSTLY_Q8_0", "BF16": "MOSTLY_BF16"}
    common = max((c, t) for t, c in counts.items() if t in kinds)[1] if set(counts) & set(kinds) else None
    return gguf.LlamaFileType[kinds[common]] if common else gguf.LlamaFileType.ALL_F32


def _metadata(writer, cfg, arch: str, *, name: str, blocks: int, file_type) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    writer.add_name(Path(name).name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    if file_type is not None:
        writer.add_file_type(file_type)


def _tokenizer(writer, checkpoint: Path, *, vocab_size: int) -> None:
    """The tokenizer's tokens, types, merges and special ids (llama.cpp checks a draft's vocabulary against the
    target's: the same tokens, BOS and EOS)."""
    import gguf
    from gguf.vocab import BpeVocab, LlamaHfVocab, SpecialVocab

    try:
        vocab = BpeVocab(checkpoint)
    except (FileNotFoundError, ValueError):
        try:
            vocab = LlamaHfVocab(checkpoint)
        except (FileNotFoundError, ValueError, TypeError) as e:
            raise ConfigError(f"cannot read the tokenizer in {checkpoint} for the GGUF: {e}") from None
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    while len(tokens) < vocab_size:  # rows of the embedding no token names (padding)
        tokens.append(f"[PAD{len(tokens)}]".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model(vocab.tokenizer_model)
    if vocab.tokenizer_model == "gpt2":
        writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    SpecialVocab(checkpoint, load_merges=vocab.tokenizer_model == "gpt2", n_vocab=len(tokens)).add_to_gguf(writer)


__all__ = ["ARCHES", "DRAFT_SCHEMES", "TYPES", "exact_tensor", "reorder_rotary", "write_draft_gguf",
           "write_target_gguf"]
