"""``panel``: the inductor kernel with less around its products. Three changes, each measured on a CPU without
AVX-512 (the Zen 1 EPYC of ``studies/verify-panel-cpu.md``), where a one-token step spent about 17 of its 44 ms
outside its matrix products:

- **Every product on the panel product.** Every linear of the full model's forwards (a one-token step, a verify
  block, a batch) runs ``skipsearch::f32_panel_linear``: the model's own fp32 weights, packed in panels of 32
  output columns and streamed once for all rows (``kernels/lowbit/csrc/lowbit.cpp``). The BLAS call of inductor's
  frozen graph runs a few rows at compute speed there: an 8-token verify cost 3.6 one-token steps through two
  4-token blocks. For one row it was the faster product on that Zen 1 (30.7 against 46.1 ms for MKL's packed
  product), but on a Zen 4 EPYC inductor's autotuned product runs a one-token step 24% faster
  (``studies/startup-cpu.md``). The step runs the panel product anyway, since with no frozen weights in any graph
  inductor's caches keep every graph for the next process (``kernels/graphs.py``): a later process loads them in
  seconds where each used to compile for minutes.
- **The weights in the fewest bytes that give them back.** A linear whose fp32 weights are a GGUF's blocks (every
  linear of smollm2-135m, converted from a Q4_1 file; its head from the file's Q8_0 embedding) is held as those
  blocks, and its product decodes each weight in registers and sums as the fp32 panels' product does, in the same
  order: the same output bit for bit, 96 MB a step for smollm2-135m in place of 540 (``kernels/lowbit/exact.py``).
  A bf16 checkpoint's weights are held as bf16 (half the bytes, the same way); any other stays fp32 panels.
- **Attention without copies.** The model has fewer key/value heads than query heads (grouped-query attention).
  HF's SDPA path, when compiled, copies every key and value head across its group over the whole static cache
  (``repeat_kv``) in every layer. Here the queries of a group are stacked instead (``packed_gqa_attention``), so
  attention reads the cache as it is, through ``skipsearch::gqa_attention`` (``kernels/lowbit/csrc/attention.cpp``):
  each query row reads the cache only up to the last position its mask keeps, where SDPA read every slot of the
  static cache. The arithmetic is the same but for the order of the sums.
  The draft graphs (``compiled_draft``: a precision draft, a hybrid's fallback) run the model itself with its
  stand-ins swapped in, not a copy: for each draft (all its steps) every attention in it is switched to the packed
  one (``packed_attention``) and back. On an AVX-512 Xeon the copies of ``repeat_kv`` took 2.8 ms of a profiled int8
  draft step of 22.6 ms, and packed attention made the step 0.8-3.5 ms faster (``studies/draft-attention-cpu.md``).
- **A C++ wrapper.** inductor's ``cpp_wrapper`` calls the graph's kernels from C++, not from generated Python: a
  compiled precision draft (181 custom products a step) spends less between them. The wrapper (one function of
  about 4,000 lines for smollm2-135m: allocations and calls) is compiled apart from the kernels, at GCC's ``-Og``,
  the kernels at ``-O3``. At ``-O1`` the wrapper's own compile took 18 s on the AVX2 Zen 3 of
  ``studies/startup-cpu.md``, 6 s at ``-O0`` (a step and a block's build from 329 to 160 s with nothing else
  changed). ``-Og`` builds in the time ``-O0`` does (24 s for a ``panel-c8`` step and block either way on a Zen 5)
  and inlines the wrapper's handle and pointer helpers, which ``-O0`` calls one by one: the int8 target's step
  5.09 -> 4.71 ms, the fp32 step 9.53 -> 9.29 ms (``studies/int8-target.md``, section 8).

Same graphs, cache and rules as ``inductor`` (``kernels/inductor.py``): one-token steps and blocks of up to ``chunk``
tokens, compiled once per machine, nothing recompiled while decoding. The block's graph covers every width from 2
to ``chunk`` (``exact_rows``): a product costs about a row's arithmetic more for each row, so a verify of 3 tokens
runs 3 rows, not 8 (``studies/verify-widths-cpu.md``). The cache holds a multiple of
``graphs.CAPACITY_STEP`` positions, so sequences of every ordinary length share the graphs. Both run one copy of
the HF model that shares every parameter with it (it adds its packed weights: the model's linear weights again),
so the model the drafts and the prompt run is untouched. The products agree with ``nn.Linear`` up to the order of
their sums; greedy choices are checked against eager where the cost timing runs (``costs``) and in the tests.

No torch at import (the registry parses ``--kernel`` before anything loads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from skipsearch.config import ConfigError
from skipsearch.kernels import graphs
from skipsearch.kernels.base import Adapter, Kernel, KernelSpec
from skipsearch.kernels.inductor import CHUNKS, CompiledBlocks
from skipsearch.kernels.inductor import check as check_inductor

DEFAULT_BLOCK = 8  # a verify of up to 8 tokens in one block: what the panel product is for


def check(kernel: Kernel, device: str, instead: str) -> None:
    """inductor's refusals (not a CPU, no C++ compiler, an old transformers), and the panel op's own: it is built
    on first use by the same compiler, so a machine that cannot build it is refused here, before the model loads."""
    check_inductor(kernel, device, instead)
    from skipsearch.kernels.lowbit import check_lowbit

    try:
        check_lowbit()
    except ConfigError as exc:
        reason = str(exc).split("cannot be built here: ", 1)[-1]
        raise ConfigError(f"kernel {kernel.label} runs skipsearch's own C++ products, which cannot be built here: "
                          f"{reason}; use {instead} or --kernel inductor") from None


ATTENTION = "skipsearch_packed_gqa"  # the name the attention below is registered under with transformers
# on top of inductor's own (kernels/inductor.py): a C++ wrapper, built apart from the kernels and unoptimised (the
# kernels at -O3), and no frozen weights, so that inductor's FX graph and AOTAutograd caches keep every graph for the
# next process (kernels/graphs.py); nothing here needs freezing, since every linear of the full model runs the panel
# product, which reads the weights as they are. No size asserts: the wrapper checked every input's shape and strides
# at every call (smollm2-135m's step has 548 inputs, its weights among them, and each check built a string and a
# stringstream), about 0.3 ms of a 6 ms int8 step on a Zen 4 (studies/int8-target.md, section 15). A kept call's
# first run checks dynamo's guards on its inputs, and every later run its own tensors' shapes, strides and dtypes
# (precompiled.Call); the weights and the cache are the objects that first run read.
SETTINGS = {"cpp_wrapper": True, "freezing": False, "cpp_wrapper_build_separate": True,
            "aot_inductor.compile_wrapper_opt_level": "Og", "size_asserts": False}


def packed_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """HF's SDPA attention without ``repeat_kv``: the ``groups`` query heads that share a key/value head are
    stacked as rows of that head (query [B, H, T, D] -> [B, H / groups, groups * T, D]), so attention reads the
    cache's key/value heads as they are. In fp32 on a CPU it runs ``skipsearch::gqa_attention``
    (``kernels/lowbit/csrc/attention.cpp``), which reads the cache only up to the last position the mask keeps,
    where SDPA reads every slot of the static cache: 0.7-0.9 ms off a 22 ms step, 1.4-1.7 ms off an 8-token verify
    block and 0.9 ms off a 10 ms int8 draft token on an AVX-512 Xeon (``studies/attention-cpu.md``). Else SDPA,
    the mask repeated to match. Anything else (no grouping, no mask, a per-head mask) goes to HF's own SDPA
    attention. Returns [B, T, H, D], as HF's does."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask
    if groups == 1 or mask is None or mask.dim() != 4 or mask.shape[1] != 1 or dropout or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    B, H, T, D = query.shape
    q = query.reshape(B, H // groups, groups * T, D)  # head h = kv * groups + r: its rows are (r, t)
    scale = D ** -0.5 if scaling is None else scaling
    if query.dtype == torch.float32 and query.device.type == "cpu" and mask.dtype in (torch.bool, torch.float32):
        out = torch.ops.skipsearch.gqa_attention(q, key, value, mask, scale)  # the keys up to the last it keeps
    else:
        if T > 1:  # [B, 1, T, S] -> [B, 1, groups * T, S], row (r, t) is query t's
            mask = mask[:, :, None].expand(B, 1, groups, T, mask.shape[-1]).reshape(B, 1, groups * T, mask.shape[-1])
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
    return out.reshape(B, H, T, D).transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, packed_gqa_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the masks SDPA takes


@contextlib.contextmanager
def packed_attention(sm: Adapter) -> Iterator[None]:
    """Run every attention of ``sm``'s model as it stands (a draft's stand-ins included: each copy has a config of
    its own) as ``packed_gqa_attention``, and put each config's own back after. A model that does not run HF's SDPA
    attention is left as it is, as ``shared_copy`` leaves it."""
    if sm.hf.config._attn_implementation != "sdpa":
        yield
        return
    attentions = (getattr(layer, "self_attn", None) for layer in sm.layers)  # a skipped layer may have none
    configs = {id(c): c for c in (sm.hf.config, *(getattr(a, "config", None) for a in attentions))
               if c is not None and c._attn_implementation == "sdpa"}
    for config in configs.values():
        _set_attention(config, ATTENTION)
    try:
        yield
    finally:
        for config in configs.values():
            _set_attention(config, "sdpa")


def _set_attention(config, name: str) -> None:
    """``config._attn_implementation = name``, without transformers' setter where the config has no sub-configs:
    the setter only stores the name and recurses into sub-configs, but runs the config's validating
    ``__setattr__`` (11 µs a config on the AVX-512 Xeon, 0.7 ms of every draft's 62 switches)."""
    if type(config).sub_configs or not hasattr(config, "_attn_implementation_internal"):
        config._attn_implementation = name
    else:
        object.__setattr__(config, "_attn_implementation_internal", name)


def shared_copy(hf, *, panels: bool):
    """A copy of the HF model that shares its parameters and buffers and runs ``packed_gqa_attention``; with
    ``panels``, every ``nn.Linear`` (the LM head too) swapped for a stand-in of the same weights
    (``exact_panel_linear``: their exact blocks, else fp32 panels), their packed weights in one block of huge pages
    (``kernels/lowbit/arena.py``)."""
    import copy

    from skipsearch.kernels.lowbit.arena import pack
    from skipsearch.kernels.lowbit.convert import swap_linears
    from skipsearch.kernels.lowbit.exact import exact_panel_linear

    shared = {id(t): t for t in (*hf.parameters(), *hf.buffers())}
    out = copy.deepcopy(hf, memo=shared)
    if hf.config._attn_implementation == "sdpa":  # another (eager, a custom one) is kept as the model has it
        _register_attention()
        out.set_attn_implementation(ATTENTION)
    if panels:
        swap_linears(out, exact_panel_linear)
        pack([out])  # its packed weights in one huge-page block, in the forward's order (kernels/lowbit/arena.py)
    return out


def build(sm: Adapter, kernel: Kernel, capacity: int) -> CompiledBlocks:
    """inductor's runner on one copy of the model on panel products (steps, blocks and batches alike, and the
    prompt, eagerly), with a C++ wrapper and drafts on packed attention, its cache a multiple of
    ``graphs.CAPACITY_STEP`` positions: minutes the first time on a machine, seconds in every later process
    (``kernels/graphs.py``)."""
    panels = shared_copy(sm.hf, panels=True)
    return CompiledBlocks(sm, kernel, capacity=graphs.bucket(capacity + kernel.chunk), step_model=panels,
                          rows_model=panels, prompt_model=panels, settings=SETTINGS,
                          draft_context=lambda: packed_attention(sm),  # the attention shared_copy registered
                          precompile=True, exact_rows=True)


KERNEL = KernelSpec(
    name="panel",
    summary="inductor's graphs with every linear on skipsearch's fp32 panel product (weights streamed once for all "
            "rows), compiled once per machine and kept for later processes",
    compiled=True,
    build=build,
    check=check,
    blocks=CHUNKS,
    default_block=DEFAULT_BLOCK,
    keeps_graphs=True,
)
