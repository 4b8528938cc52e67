"""Sibling products (``kernels/lowbit/siblings.py``): the stand-ins that read one input share one buffer per packed
tensor, run their own slices eagerly and one product compiled, with the same outputs either way."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import compiled_product_calls
from torch import nn

from skipsearch.kernels.lowbit.convert import lowbit_linears, swap_linears
from skipsearch.kernels.lowbit.modules import F32PanelLinear, Int4WoLinear, Int8DqLinear, Int8WoLinear
from skipsearch.kernels.lowbit.siblings import SIBLINGS, share_siblings

pytestmark = pytest.mark.usefixtures("lowbit_built")  # skipped where the C++ products cannot build


class Attention(nn.Module):
    """q, k, v read one input; o reads another (as in HF's attentions)."""

    def __init__(self, hidden: int = 64, kv: int = 32, bias: bool = False) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, kv, bias=bias)
        self.v_proj = nn.Linear(hidden, kv, bias=bias)
        self.o_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(q.view(*q.shape[:-1], -1, 16).flatten(-2) * torch.cat([k, v], -1).sigmoid())


@pytest.mark.parametrize("make", [Int8WoLinear.from_linear, Int4WoLinear.from_linear, F32PanelLinear.from_linear,
                                  Int8DqLinear.from_linear])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("freezing", [True, False], ids=["frozen", "weights-as-inputs"])
def test_siblings_run_as_one_product_compiled_with_the_same_outputs(make, bias, freezing):
    """Frozen, or with the weights as the graph's inputs (the kept graphs of kernels/graphs.py: AOT autograd keeps an
    unmutated duplicate input apart, so identical calls do not merge there by themselves)."""
    torch.manual_seed(0)
    module = Attention(bias=bias).eval()
    swap_linears(module, make)
    q, k, v, o = module.q_proj, module.k_proj, module.v_proj, module.o_proj
    assert (q.columns, k.columns, v.columns, o.columns) == ((0, 64, 128), (64, 96, 128), (96, 128, 128), None)
    assert q.packed.untyped_storage().data_ptr() == v.packed.untyped_storage().data_ptr()
    assert v.packed.storage_offset() == q.packed.numel() + k.packed.numel()
    x = torch.randn(3, 64)
    with torch.no_grad():
        eager = module(x)
    compiled, calls = compiled_product_calls(module, x, freezing=freezing)
    assert len(calls) == 2, calls  # q, k, v as one; o alone
    assert torch.equal(eager, compiled)


def test_each_sibling_runs_its_own_slice_eagerly():
    torch.manual_seed(0)
    plain = Attention().eval()
    module = copy.deepcopy(plain)
    swap_linears(module, F32PanelLinear.from_linear)
    x = torch.randn(2, 64)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            ref = F32PanelLinear.from_linear(getattr(plain, name))(x)
            assert torch.equal(getattr(module, name)(x), ref)


def test_only_named_siblings_of_one_kind_share():
    torch.manual_seed(0)
    module = Attention()
    module.k_proj = nn.Linear(64, 40)  # not whole panels of 32 outputs: the three stay apart
    swap_linears(module, Int8WoLinear.from_linear)
    assert all(m.columns is None for m in (module.q_proj, module.k_proj, module.v_proj, module.o_proj))
    mixed = Attention()
    mixed.q_proj = Int4WoLinear.from_linear(mixed.q_proj)  # another kind
    share_siblings(mixed)
    assert mixed.q_proj.columns is None
    assert ("q_proj", "k_proj", "v_proj") in SIBLINGS and ("gate_proj", "up_proj") in SIBLINGS


def test_a_copy_keeps_its_siblings_storage():
    torch.manual_seed(0)
    module = lowbit_linears(Attention(), "int8")
    twin = copy.deepcopy(module)
    assert twin.q_proj.packed.untyped_storage().data_ptr() == twin.v_proj.packed.untyped_storage().data_ptr()
    assert twin.q_proj.siblings_packed.untyped_storage().data_ptr() == twin.q_proj.packed.untyped_storage().data_ptr()
    assert "siblings_packed" not in twin.state_dict() and "q_proj.siblings_packed" not in twin.state_dict()
    x = torch.randn(1, 64)
    with torch.no_grad():
        assert torch.equal(module(x), twin(x))
