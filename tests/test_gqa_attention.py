"""``skipsearch::gqa_attention`` (kernels/lowbit/csrc/attention.cpp), the ``panel`` kernel's attention for one token
a row: against attention computed in fp64 from the same operands, for every mask layout the kernel passes (one mask
row for all, one per query, a row per batch row, bool or additive), head sizes on the vector paths and off them,
masks with holes, a row that may attend to nothing, the threaded path; its refusals; and one compiled graph.

Tolerance: each output is a convex combination of value rows; fp32 scores and ATen's exp_u20 (about 20 ulp) put
the weights within about 1e-6 relative, so outputs are checked within 1e-5 absolute for unit-scale operands."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("lowbit_built")  # skipped where the C++ products cannot build


def _reference(q, k, v, mask, scale):
    """softmax(q k^T scale + mask) v in fp64, row i of a head on mask row i mod M; a row with no key: zeros."""
    B, H, R, D = q.shape
    M = mask.shape[2]
    rows = mask.expand(B, 1, M, mask.shape[-1])[:, :, torch.arange(R) % M]  # [B, 1, R, S]
    add = rows.double() if rows.dtype != torch.bool else torch.zeros(rows.shape, dtype=torch.float64).masked_fill(
        ~rows, float("-inf"))
    scores = q.double() @ k.double().transpose(-1, -2) * scale + add
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf only: NaN -> zeros
    return weights @ v.double()


def _causal(B, T, S, lengths, dtype):
    """[B, 1, T, S]: query t of batch row b sees positions 0..lengths[b] + t."""
    keep = torch.zeros(B, 1, T, S, dtype=torch.bool)
    for b, n in enumerate(lengths):
        for t in range(T):
            keep[b, 0, t, :n + t + 1] = True
    return keep if dtype is torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize(("B", "H", "groups", "T", "D", "S"), [
    (1, 3, 3, 1, 64, 308),  # smollm2's heads, one token: what the kernel runs
    (1, 2, 4, 1, 32, 40),  # two vectors a head on AVX-512
    (1, 1, 3, 1, 48, 17),  # a head size off the vector paths (the plain loop)
    (2, 3, 3, 1, 64, 50),  # a batch: a mask row per batch row
    (1, 3, 3, 5, 64, 70),  # five queries a row group: row (r, t) reads mask row t
    (1, 4, 5, 8, 128, 600),  # enough work for the threaded path
])
def test_it_matches_attention_in_fp64(dtype, B, H, groups, T, D, S):
    g = torch.Generator().manual_seed(B * 100 + T * 10 + D)
    q = torch.randn(B, H, groups * T, D, generator=g)
    k, v = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)
    mask = _causal(B, T, S, [S // 2 - b for b in range(B)], dtype)
    out = torch.ops.skipsearch.gqa_attention(q, k, v, mask, D ** -0.5)
    assert out.shape == q.shape and out.dtype is torch.float32
    torch.testing.assert_close(out.double(), _reference(q, k, v, mask, D ** -0.5), rtol=0, atol=1e-5)


def test_one_mask_row_for_all_rows_a_mask_with_holes_and_additive_values():
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 2, 6, 64, generator=g), torch.randn(1, 2, 30, 64, generator=g), torch.randn(
        1, 2, 30, 64, generator=g)
    holes = torch.rand(1, 1, 1, 30, generator=g) > 0.4  # positions kept at random, the last one too
    holes[..., 29] = True
    biased = torch.randn(1, 1, 1, 30, generator=g).masked_fill(~holes, float("-inf"))  # an additive mask's values
    for mask in (holes, biased):
        out = torch.ops.skipsearch.gqa_attention(q, k, v, mask, 0.3)
        torch.testing.assert_close(out.double(), _reference(q, k, v, mask, 0.3), rtol=0, atol=1e-5)


def test_a_row_that_may_attend_to_nothing_gets_zeros():
    q, k, v = torch.randn(1, 1, 2, 64), torch.randn(1, 1, 9, 64), torch.randn(1, 1, 9, 64)
    mask = torch.zeros(1, 1, 2, 9, dtype=torch.bool)
    mask[0, 0, 1, :4] = True  # row 0 sees nothing, row 1 four keys
    out = torch.ops.skipsearch.gqa_attention(q, k, v, mask, 0.125)
    assert torch.equal(out[0, 0, 0], torch.zeros(64))
    torch.testing.assert_close(out.double(), _reference(q, k, v, mask, 0.125), rtol=0, atol=1e-5)


def test_a_strided_cache_and_a_transposed_query_read_as_they_are():
    """The static cache's K/V are views of a longer buffer; the stacked queries come from a transpose."""
    g = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 1, 3, 40, 64, generator=g)  # [k/v, B, H, S, D] in one buffer
    k, v = cache[0, :, :, :32], cache[1, :, :, :32]  # not contiguous over S's end
    q = torch.randn(1, 6, 3, 64, generator=g).transpose(1, 2)  # [1, 3, 6, 64], non-contiguous
    mask = _causal(1, 1, 32, [20], torch.float32)
    out = torch.ops.skipsearch.gqa_attention(q, k, v, mask, 0.125)
    torch.testing.assert_close(out.double(), _reference(q, k, v, mask, 0.125), rtol=0, atol=1e-5)


def test_it_refuses_operands_it_cannot_read():
    q, k, v = torch.randn(1, 2, 3, 64), torch.randn(1, 2, 9, 64), torch.randn(1, 2, 9, 64)
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    op = torch.ops.skipsearch.gqa_attention
    with pytest.raises(RuntimeError, match="float32"):
        op(q.double(), k.double(), v.double(), mask, 0.1)
    with pytest.raises(RuntimeError, match="Hkv"):
        op(q, torch.randn(1, 3, 9, 64), torch.randn(1, 3, 9, 64), mask, 0.1)
    with pytest.raises(RuntimeError, match="mask must be"):
        op(q, k, v, torch.ones(1, 1, 2, 9, dtype=torch.bool), 0.1)  # 2 mask rows do not divide 3 query rows
    with pytest.raises(RuntimeError, match="bool or float32"):
        op(q, k, v, torch.ones(1, 1, 1, 9, dtype=torch.int64), 0.1)
    with pytest.raises(RuntimeError, match="contiguous last dim"):
        op(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, mask, 0.1)


def test_torch_compile_keeps_it_in_one_graph():
    q, k, v = torch.randn(1, 3, 3, 64), torch.randn(1, 3, 20, 64), torch.randn(1, 3, 20, 64)
    mask = _causal(1, 1, 20, [10], torch.bool)

    def attend(q, k, v, mask):
        return torch.ops.skipsearch.gqa_attention(q * 2, k, v, mask, 0.125) + 1

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True)  # a graph break would raise
    torch.testing.assert_close(compiled(q, k, v, mask), attend(q, k, v, mask), rtol=0, atol=0)
