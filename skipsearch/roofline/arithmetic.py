"""The roofline arithmetic: bytes and FLOPs of each piece of a forward over k tokens, and its price.

A piece (one layer's attention, one layer's MLP, the LM head, the embedding) costs
    max(bytes / bandwidth, FLOPs / throughput) + kernels x launch
where bytes are what it must move through memory at batch 1: its weights once per forward (in their storage
format), the KV cache it reads at the context and the k positions it writes, and the embedding rows it reads.
Activations (k x hidden values per kernel) are left out: at batch 1 they are under a thousandth of the bytes.
FLOPs are 2 per multiply-add: 2 x weights x k for the projections, and for attention 4 x heads x head_dim per
(query, key) pair, k queries over the context and the block itself.

Nothing here needs torch or a model: shapes in, seconds out. ``costs_of`` turns the prices into the cost file's
figures (a step, per-sublayer costs, the fixed part, v(k), and each draft scheme's sublayers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from skipsearch.files.costs import BatchCosts, BatchedCosts, Costs, SchemeCosts
from skipsearch.roofline.shapes import Shapes

# Kernels one piece launches in a fused decode step (an assumed count, not a measured one): attention = norm,
# q/k/v projection, rotary embedding, KV-cache write, attention, output projection, residual add; MLP = norm,
# gate and up projection, activation x product, down projection, residual add; LM head = final norm, the head,
# argmax; embedding = one gather. Eager PyTorch launches several times as many (the README says how far that moves
# the figures); the count only matters through ``launch``, which a user can give.
ATTN_KERNELS, MLP_KERNELS, HEAD_KERNELS, EMBED_KERNELS = 7, 5, 3, 1
VERIFY_MAX = 13  # v(k) for k = 1..13, as a measured cost file keeps it (costs.VERIFY_SIZES: up to a K = 12 verify)
BATCHED_TOKENS = (1, 2, 3, 4, 6, 9, 13)  # the batched grid's T, as costs.VERIFY_SIZES

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True)
class Piece:
    """What one piece of a forward moves, computes and launches."""

    bytes: float
    flops: float
    kernels: int


@dataclass(frozen=True)
class Machine:
    """What the pieces are priced with: achieved bandwidth (peak x efficiency), throughput, launch cost."""

    bandwidth: float  # bytes/s
    flops: float  # FLOP/s in the model's dtype (weight-only schemes compute in it too)
    launch: float  # seconds per kernel

    def price(self, p: Piece) -> float:
        return max(p.bytes / self.bandwidth, p.flops / self.flops) + p.kernels * self.launch


def attention(s: Shapes, *, k: int, context: int, weight_bytes: float, act_bytes: float, batch: int = 1) -> Piece:
    """One layer's attention over k new tokens after ``context`` cached ones, for each of ``batch`` rows: its
    weights (and its norm's) once, each row's KV cache read over the context and its k positions written."""
    kv = s.kv_width * act_bytes * (context + k) * batch
    pairs = k * context + k * (k + 1) // 2  # each new token attends to the context and to itself and those before
    return Piece(bytes=s.attn_params * weight_bytes + s.hidden * act_bytes * batch + kv,
                 flops=batch * (2 * s.attn_params * k + 4 * s.heads * s.head_dim * pairs), kernels=ATTN_KERNELS)


def mlp(s: Shapes, *, k: int, weight_bytes: float, act_bytes: float, batch: int = 1) -> Piece:
    return Piece(bytes=s.mlp_params * weight_bytes + s.hidden * act_bytes * batch, flops=2 * s.mlp_params * k * batch,
                 kernels=MLP_KERNELS)


def head(s: Shapes, *, k: int, weight_bytes: float, act_bytes: float, batch: int = 1) -> Piece:
    """The final norm and the LM head over k positions of each row (a verifier reads every row's logits)."""
    return Piece(bytes=s.head_params * weight_bytes + s.hidden * act_bytes * batch,
                 flops=2 * s.head_params * k * batch, kernels=HEAD_KERNELS)


def embedding(s: Shapes, *, k: int, act_bytes: float, batch: int = 1) -> Piece:
    return Piece(bytes=k * s.hidden * act_bytes * batch, flops=0.0, kernels=EMBED_KERNELS)


def forward_seconds(s: Shapes, m: Machine, *, k: int, context: int, act_bytes: float,
                    weight_bytes: float | None = None, head_bytes: float | None = None, batch: int = 1) -> float:
    """One forward of the whole model over k tokens after ``context`` cached ones, for ``batch`` rows (the weights
    read once, the KV cache and the FLOPs per row: at a large batch x k the forward turns compute-bound); weights in
    ``weight_bytes`` per parameter (default: the model's dtype), the head in ``head_bytes`` (default: as the
    other weights)."""
    wb = act_bytes if weight_bytes is None else weight_bytes
    hb = wb if head_bytes is None else head_bytes
    rows = dict(k=k, act_bytes=act_bytes, batch=batch)
    layer = (m.price(attention(s, context=context, weight_bytes=wb, **rows))
             + m.price(mlp(s, weight_bytes=wb, **rows)))
    return (s.num_layers * layer + m.price(head(s, weight_bytes=hb, **rows))
            + m.price(embedding(s, **rows)))


def batched_of(s: Shapes, m: Machine, *, context: int, act_bytes: float, batch_sizes: Sequence[int],
               schemes: Mapping[str, float] | None = None, tokens: Sequence[int] = BATCHED_TOKENS) -> BatchedCosts:
    """The cost file's batched grid for ``s`` on ``m``: per batch size B a forward of B x T tokens at each T of
    ``tokens``, and per draft scheme (name -> bytes per weight) the whole model in it over B x 1 tokens."""
    rows = tuple(BatchCosts(
        b, tuple(forward_seconds(s, m, k=t, context=context, act_bytes=act_bytes, batch=b) for t in tokens),
        tuple((name, forward_seconds(s, m, k=1, context=context, act_bytes=act_bytes, weight_bytes=wb, batch=b))
              for name, wb in (schemes or {}).items())) for b in batch_sizes)
    return BatchedCosts(tuple(tokens), rows, kernel="roofline", context_tokens=context)


def costs_of(s: Shapes, m: Machine, *, context: int, act_bytes: float,
             schemes: Mapping[str, float] | None = None, verify_max: int = VERIFY_MAX) -> Costs:
    """The cost file's figures for ``s`` on ``m`` at ``context``: one step, one attention and one MLP, the fixed
    part (head, embedding), v(1..verify_max), and per draft scheme (name -> bytes per weight) its sublayers and the
    head it saves. The model's weights are in its dtype (``act_bytes`` per parameter)."""
    one = dict(k=1, act_bytes=act_bytes)
    attn = m.price(attention(s, context=context, weight_bytes=act_bytes, **one))
    ffn = m.price(mlp(s, weight_bytes=act_bytes, **one))
    lm_head = m.price(head(s, weight_bytes=act_bytes, **one))
    fixed = lm_head + m.price(embedding(s, **one))
    forwards = [forward_seconds(s, m, k=k, context=context, act_bytes=act_bytes) for k in range(1, verify_max + 1)]
    step = forwards[0]  # = L x (attention + MLP) + fixed, summed as v(k)'s forwards are, so that v(1) is exactly 1
    curve = tuple(f / step for f in forwards)
    priced = tuple(
        SchemeCosts(name, attn_seconds=m.price(attention(s, context=context, weight_bytes=wb, **one)),
                    mlp_seconds=m.price(mlp(s, weight_bytes=wb, **one)),
                    head_saving_seconds=lm_head - m.price(head(s, weight_bytes=wb, **one)))
        for name, wb in (schemes or {}).items())
    return Costs(step, attn, ffn, fixed, curve, lm_head_seconds=lm_head, schemes=priced)


__all__ = ["ATTN_KERNELS", "BATCHED_TOKENS", "DTYPE_BYTES", "EMBED_KERNELS", "HEAD_KERNELS", "MLP_KERNELS",
           "VERIFY_MAX", "Machine", "Piece", "attention", "batched_of", "costs_of", "embedding", "forward_seconds",
           "head", "mlp"]
