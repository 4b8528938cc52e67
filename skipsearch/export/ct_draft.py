"""The draft model of a vLLM or SGLang export: the model's own weights as a compressed-tensors checkpoint directory
at the profile's scheme, which both engines load as a draft model (``quantization: compressed-tensors``).

The scheme is weight-only integer, as skipsearch's int8 and int4 drafts are: int8 with one symmetric scale per output
row (compressed-tensors' W8A16, ``channel`` strategy), int4 with one symmetric scale per group of 32 input weights
(``group``, group_size 32, skipsearch's CPU int4). Scales, rounding and packing are compressed-tensors' own
(``calculate_qparams``, ``quantize``, ``pack_to_int32``, format ``pack-quantized``), so the file is what its
decompressor and the engines' loaders read; the config's ``quantization_config`` is its ``QuantizationConfig``.
Linears of full-precision sublayers (``full_attn`` / ``full_mlp``) are listed in ``ignore``; so is the LM head,
which stays at the model's precision (skipsearch's draft may quantize it: ``quant_head``; the manifest says so).
Norms and the embedding stay as the model has them. compressed-tensors is an optional dependency
(``pip install skipsearch[export]``); without it this export is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from skipsearch.config import ConfigError
from skipsearch.export import shapes as sh
from skipsearch.export.base import Gap, plain, write_model_dir
from skipsearch.profile import Profile

# scheme -> (bits, compressed-tensors strategy, group size)
SCHEMES = {"int8": (8, "channel", None), "int4": (4, "group", 32)}
FORMAT = "pack-quantized"
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _library():
    try:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
        from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
        from compressed_tensors.quantization.lifecycle.forward import quantize
        from compressed_tensors.quantization.utils import calculate_qparams
    except ImportError:
        raise ConfigError("a vLLM/SGLang draft checkpoint is written with compressed-tensors, which is not installed: "
                          "pip install 'skipsearch[export]' (or compressed-tensors>=0.20)") from None
    return pack_to_int32, QuantizationArgs, QuantizationConfig, QuantizationScheme, quantize, calculate_qparams


def quantization_args(scheme: str):
    """compressed-tensors' QuantizationArgs for skipsearch's ``scheme`` (weights only, symmetric)."""
    if scheme not in SCHEMES:
        raise ConfigError(f"a compressed-tensors draft has no format for scheme {scheme} (it has {', '.join(SCHEMES)})")
    bits, strategy, group = SCHEMES[scheme]
    _, QuantizationArgs, *_ = _library()
    return QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group, symmetric=True,
                            dynamic=False)


def copy_problem(dm) -> str | None:
    """What a vLLM or SGLang draft model cannot be of a skipsearch draft copy ``dm`` (``methods.DraftModel``), every
    reason in one line; None when it can be exactly that."""
    problems = []
    if dm.skips:
        problems.append("a draft that skips sublayers")
    if dm.trimmed_head:
        problems.append("a trimmed draft head (a draft model's vocabulary must be the target's)")
    if dm.threshold:
        problems.append("a draft exit threshold (a draft model drafts its K tokens every step)")
    if dm.scheme not in SCHEMES:
        problems.append(f"a {dm.scheme} copy of the model as its draft (a draft model runs in the target's dtype; "
                        f"only {' and '.join(SCHEMES)} copies are written, as compressed-tensors checkpoints)")
    return "; ".join(problems) or None


def draft_dir(scheme: str) -> str:
    """The draft checkpoint's directory inside an export."""
    return f"draft-{scheme}"


HEAD_NOTE = ("the draft checkpoint keeps the LM head at the model's precision, where skipsearch's draft quantizes "
             "it too (quant_head): the engine's draft reads more bytes per token than the profile's")


def copy_gap(profile: Profile, describe) -> Gap | None:
    """The gap of a profile that drafts with a copy of the model alone, for an engine whose draft model is a
    compressed-tensors checkpoint (vLLM, SGLang): None, or the copy as it runs there (int8/int4), or plain."""
    dm = sh.setting(profile).draft_model
    problem = copy_problem(dm)
    if problem is None:
        return None
    if dm.scheme in SCHEMES:
        near = sh.copy_only(profile, exit=False)
        return Gap(problem, near, describe(near))
    return Gap(problem, plain(profile), describe(plain(profile)))


def exported_copy(profile: Profile):
    """The draft copy (``methods.DraftModel``) a vLLM or SGLang export runs as its draft model: the profile drafts
    with a copy of the model alone that a draft model can be exactly; else None."""
    s = sh.setting(profile)
    dm = s.draft_model
    if profile.draft.max_draft_tokens == 0 or s.lookup is not None or dm is None or copy_problem(dm) is not None:
        return None
    return dm


def write_draft(directory: Path, profile: Profile, model) -> tuple[str | None, dict, tuple[str, ...]]:
    """The draft checkpoint of a copy profile in ``directory`` (``model()`` gives (adapter, checkpoint)): its path,
    what the manifest records, and notes; (None, {}, ()) when the profile drafts with no copy."""
    dm = exported_copy(profile)
    if dm is None:
        return None, {}, ()
    sm, checkpoint = model()
    where = directory / draft_dir(dm.scheme)
    info = write_draft_checkpoint(where, sm, checkpoint, scheme=dm.scheme, full_attn=dm.full_attn,
                                  full_mlp=dm.full_mlp)
    return str(where), info, (HEAD_NOTE,) if dm.quant_head else ()


def _ignored(num_layers: int, full_attn: tuple[int, ...], full_mlp: tuple[int, ...]) -> list[str]:
    names = ["lm_head"]
    names += [f"model.layers.{i}.self_attn.{p}" for i in full_attn if 0 <= i < num_layers for p in _ATTN]
    names += [f"model.layers.{i}.mlp.{p}" for i in full_mlp if 0 <= i < num_layers for p in _MLP]
    return names


def write_draft_checkpoint(directory: Path, sm, checkpoint: Path, *, scheme: str, full_attn: tuple[int, ...] = (),
                           full_mlp: tuple[int, ...] = ()) -> dict:
    """Write ``sm``'s weights (loaded from ``checkpoint``) into ``directory`` as a compressed-tensors draft model;
    returns what the manifest records about it."""
    import torch


    pack_to_int32, _, QuantizationConfig, QuantizationScheme, quantize, calculate_qparams = _library()
    args = quantization_args(scheme)
    bits, strategy, group = SCHEMES[scheme]
    hf = sm.hf
    ignore = _ignored(sm.num_layers, full_attn, full_mlp)
    linears = {name for name, module in hf.named_modules() if isinstance(module, torch.nn.Linear)}
    tied = bool(getattr(hf.config, "tie_word_embeddings", False))
    dtype = sm.dtype
    state: dict[str, torch.Tensor] = {}
    quantized = 0
    with torch.no_grad():
        for name, tensor in hf.state_dict().items():
            module, _, leaf = name.rpartition(".")
            if tied and name == "lm_head.weight":
                continue  # shared with the embedding: the config ties them
            if leaf != "weight" or module not in linears or module in ignore:
                state[name] = tensor.detach().to("cpu").contiguous().clone()
                continue
            w = tensor.detach().to("cpu", torch.float32)  # [out, in]
            if strategy == "group":
                if w.shape[1] % group:
                    raise ConfigError(f"{module}: {w.shape[1]} inputs are not a multiple of the group size {group}")
                grouped = w.view(w.shape[0], -1, group)  # [out, in/g, g]
                lo, hi = grouped.amin(-1), grouped.amax(-1)  # [out, in/g]
            else:
                lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)  # [out, 1]
            scale, zero = calculate_qparams(lo, hi, args)
            q = quantize(x=w, scale=scale, zero_point=zero, args=args, dtype=torch.int8)
            state[f"{module}.weight_packed"] = pack_to_int32(q, bits)
            state[f"{module}.weight_scale"] = scale.to(dtype).contiguous()
            state[f"{module}.weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
            quantized += 1
    if not quantized:
        raise ConfigError("the draft quantizes no linear layer (every sublayer is kept at full precision)")
    qcfg = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                              format=FORMAT, quantization_status="compressed", ignore=ignore)
    config = hf.config.to_dict()
    config["quantization_config"] = json.loads(qcfg.model_dump_json(exclude_none=False))
    write_model_dir(directory, state, config, checkpoint)
    return {"format": f"compressed-tensors {FORMAT}", "scheme": scheme, "bits": bits, "strategy": strategy,
            "group_size": group, "quantized_linears": quantized, "ignored": ignore}


__all__ = ["FORMAT", "HEAD_NOTE", "SCHEMES", "copy_gap", "copy_problem", "draft_dir", "exported_copy",
           "quantization_args", "write_draft", "write_draft_checkpoint"]
