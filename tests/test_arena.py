"""A copy's packed weights in one huge-page block (``kernels/lowbit/arena.py``): the same outputs, eager and
compiled, siblings still one product, every buffer in one storage, and a plain block where the OS has no mapping."""

from __future__ import annotations

import copy
import mmap
import sys
from pathlib import Path

import pytest
import torch
from conftest import compiled_product_calls
from torch import nn

from skipsearch.kernels.lowbit import arena
from skipsearch.kernels.lowbit.convert import swap_linears
from skipsearch.kernels.lowbit.modules import F32PanelLinear, Int4WoLinear, Int8DqLinear, Int8WoLinear, LowbitLinear

pytestmark = pytest.mark.usefixtures("lowbit_built")  # skipped where the C++ products cannot build


class Block(nn.Module):
    """An attention's four linears (q, k, v read one input) and an MLP's three (gate, up read one)."""

    def __init__(self, hidden: int = 64, kv: int = 32, inner: int = 96, bias: bool = False) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, n, bias=bias) for n in (hidden, kv, kv))
        self.o_proj = nn.Linear(hidden, hidden, bias=bias)
        self.gate_proj, self.up_proj = nn.Linear(hidden, inner, bias=bias), nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = torch.cat([self.k_proj(x), self.v_proj(x)], -1).sigmoid()
        x = x + self.o_proj(self.q_proj(x) * kv)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _stand_ins(module: nn.Module) -> list[LowbitLinear]:
    return [m for m in module.modules() if isinstance(m, LowbitLinear)]


def _storages(mods: list[LowbitLinear]) -> set[int]:
    """The storages (by address) that hold ``mods``' buffers."""
    return {t.untyped_storage().data_ptr() for m in mods for t in m._buffers.values() if t is not None}


def _model(make, bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    module = nn.Sequential(Block(bias=bias), Block(bias=bias)).eval()
    swap_linears(module, make)
    return module


@pytest.mark.parametrize("make", [Int8WoLinear.from_linear, Int4WoLinear.from_linear, F32PanelLinear.from_linear,
                                  Int8DqLinear.from_linear])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("freezing", [True, False], ids=["frozen", "weights-as-inputs"])
def test_packed_weights_give_the_same_outputs_eager_and_compiled(make, bias, freezing):
    module = _model(make, bias)
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = module(x)
        moved = arena.pack([module])
        assert moved > 0
        assert torch.equal(module(x), before)
    compiled, calls = compiled_product_calls(module, x, freezing=freezing)
    assert torch.equal(compiled, before)
    assert len(calls) == 8, calls  # a block: q|k|v, o, gate|up, down; siblings still one call (k, v before q)


def test_every_buffer_lives_in_one_block_in_order_and_siblings_stay_views():
    module = _model(Int8WoLinear.from_linear, bias=True)
    arena.pack([module])
    mods = _stand_ins(module)
    assert len(_storages(mods)) == 1
    pointers = [m._buffers[name].data_ptr() for m in mods for name in (*m.STREAMED, "bias")]
    assert all(p % arena.ALIGN == 0 for p in pointers)
    first = module[0]
    assert first.q_proj.siblings_packed is first.k_proj.siblings_packed  # one object: compiled, one call
    assert first.q_proj.packed.data_ptr() == first.q_proj.siblings_packed.data_ptr()
    assert first.k_proj.packed.data_ptr() == first.q_proj.packed.data_ptr() + first.q_proj.packed.nbytes
    assert module[0].down_proj.packed.data_ptr() < module[1].q_proj.packed.data_ptr()  # the forward's order
    if hasattr(mmap, "MAP_ANONYMOUS"):
        assert min(pointers) % arena.HUGE == 0
    assert "q_proj.siblings_packed" not in module[0].state_dict()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/sys/kernel/mm/transparent_hugepage").is_dir(),
                    reason="transparent huge pages are Linux's")
def test_the_block_is_asked_for_as_huge_pages():
    block = arena.hugepage_bytes(4 * arena.HUGE)
    start = block.data_ptr()
    assert start % arena.HUGE == 0
    smaps = Path("/proc/self/smaps")
    if not smaps.exists() or "VmFlags:" not in smaps.read_text():
        pytest.skip("this kernel's /proc/self/smaps shows no mapping flags")
    for line in smaps.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("VmFlags:"):
            assert "hg" in line.split()[1:], line  # madvise(MADV_HUGEPAGE) marked the mapping
            return
    pytest.fail("the block's mapping is not in /proc/self/smaps")


def test_a_plain_block_where_there_is_no_anonymous_mapping(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError("no mappings here")

    monkeypatch.setattr(arena.mmap, "mmap", refused)
    block = arena.hugepage_bytes(1000)
    assert block.dtype == torch.uint8 and block.numel() == 1000
    module = _model(Int4WoLinear.from_linear)
    x = torch.randn(2, 64)
    with torch.no_grad():
        before = module(x)
        arena.pack([module])
        assert torch.equal(module(x), before)


def test_nothing_to_move_and_a_copy_of_a_packed_module():
    assert arena.pack([nn.Sequential(nn.Linear(4, 4))]) == 0
    module = _model(F32PanelLinear.from_linear)
    arena.pack([module])
    twin = copy.deepcopy(module)
    assert twin[0].q_proj.siblings_packed is twin[0].v_proj.siblings_packed
    x = torch.randn(2, 64)
    with torch.no_grad():
        assert torch.equal(twin(x), module(x))


def test_the_draft_copy_and_the_block_copy_are_each_one_block(tiny_sm):
    from skipsearch.kernels.panel import shared_copy
    from skipsearch.methods.precision.copy import quantized_copy

    qcopy = quantized_copy(tiny_sm, "int8")
    rows = shared_copy(tiny_sm.hf, panels=True)
    for parts in ([*qcopy.attn, *qcopy.mlp, qcopy.head], [rows]):
        mods = [m for part in parts for m in _stand_ins(part)]
        assert mods
        assert len(_storages(mods)) == 1


# ---- a block kept in a file for later processes (``KEEP_FROM`` bytes and more) ----

@pytest.fixture
def kept(tmp_path, monkeypatch):
    """Every block kept, in a cache of its own; files taken as mapping on huge pages unless a test says otherwise
    (whether this test folder's filesystem does is not what these tests check)."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    monkeypatch.setattr(arena, "KEEP_FROM", 0)
    monkeypatch.setattr(arena, "_huge_share", lambda block: 1.0)
    return tmp_path / "graphs" / "arenas"


def _packed_outputs(x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A fresh module's outputs before and after ``pack``."""
    module = _model(F32PanelLinear.from_linear, bias=True)
    with torch.no_grad():
        before = module(x)
        arena.pack([module])
        return module, before, module(x)


def _no_fresh_block(monkeypatch):
    def fresh(nbytes):
        raise AssertionError("a fresh block was made where the kept file should have been mapped")

    monkeypatch.setattr(arena, "hugepage_bytes", fresh)


def test_a_block_is_kept_and_a_later_pack_maps_it(kept, monkeypatch):
    x = torch.randn(3, 64)
    _, before, first = _packed_outputs(x)
    files = list(kept.glob("*.bin"))
    assert len(files) == 1 and not list(kept.glob("*.tmp"))
    _no_fresh_block(monkeypatch)
    module, before2, second = _packed_outputs(x)
    assert torch.equal(first, before) and torch.equal(second, before2) and torch.equal(second, first)
    block = bytes(files[0].read_bytes())
    q = module[0].q_proj.packed
    assert q.untyped_storage().nbytes() == len(block)  # every buffer views the one mapped file
    mods = _stand_ins(module)
    assert len(_storages(mods)) == 1


@pytest.mark.parametrize("damage", ["other bytes", "truncated", "empty"])
def test_a_kept_file_that_does_not_hold_the_block_is_not_used_and_is_written_again(kept, monkeypatch, damage):
    x = torch.randn(3, 64)
    _packed_outputs(x)
    (path,) = kept.glob("*.bin")
    good = path.read_bytes()
    if damage == "other bytes":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        path.write_bytes(bytes(bad))
    else:
        path.write_bytes(good[: len(good) // 2] if damage == "truncated" else b"")
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before)
    assert path.read_bytes() == good  # kept again, whole


def _files_map_huge(folder: Path) -> bool:
    """Whether a file in ``folder``, read through a mapping asked for as huge pages, maps any of them here (a probe
    of this filesystem and kernel, independent of ``pack``)."""
    import os

    path = folder / "probe.bin"
    with path.open("wb") as f:
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    block = arena._mapped(path, 8 << 20, reread=True)
    try:
        if block is None:
            return False
        block.view(torch.int64).sum()  # reads every page, which the share counts
        return arena._huge_share(block) > 0
    finally:
        del block
        path.unlink()


def test_a_large_fresh_block_is_kept_unmarked_where_files_map_huge(tmp_path, monkeypatch):
    """The first process's own check of what it wrote reads the file through before it counts its huge pages: a
    check of an untouched mapping counted none and marked every folder small-pages on a fresh machine."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    folder = tmp_path / "graphs" / "arenas"
    folder.mkdir(parents=True)
    if not _files_map_huge(folder):
        pytest.skip("files here do not map as huge pages")
    monkeypatch.setattr(arena, "KEEP_FROM", 0)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(1024, 4096)).eval()  # 16 MB of panels: eight huge pages
    swap_linears(module, F32PanelLinear.from_linear)
    arena.pack([module])
    assert len(list(folder.glob("*.bin"))) == 1 and not (folder / arena._SMALL_PAGES).exists()


def test_where_files_map_on_small_pages_the_fresh_block_is_used_and_none_is_kept(kept, monkeypatch):
    monkeypatch.setattr(arena, "_huge_share", lambda block: 0.0)
    x = torch.randn(3, 64)
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before)
    assert not list(kept.glob("*.bin"))  # written once, found on small pages, removed
    assert (kept / arena._SMALL_PAGES).exists()
    written = []
    monkeypatch.setattr(arena, "_keep", lambda *a: written.append(a))
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before) and not written


def test_a_kept_file_mapped_partly_huge_is_read_again_once_and_used_where_it_then_maps_huge(kept, monkeypatch):
    x = torch.randn(3, 64)
    _packed_outputs(x)
    assert len(list(kept.glob("*.bin"))) == 1
    shares, rereads = [0.5, 1.0], []  # half of it on small pages, then whole once its page cache is read again
    monkeypatch.setattr(arena, "_huge_share", lambda block: shares.pop(0))
    mapped = arena._mapped
    monkeypatch.setattr(arena, "_mapped", lambda path, size, reread=False: rereads.append(reread) or
                        mapped(path, size, reread=reread))
    _no_fresh_block(monkeypatch)
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before) and rereads == [False, True] and not shares


def test_a_kept_file_that_stays_partly_huge_is_not_used_now_but_stays_for_later(kept, monkeypatch):
    x = torch.randn(3, 64)
    _packed_outputs(x)
    (path,) = kept.glob("*.bin")
    good = path.read_bytes()
    monkeypatch.setattr(arena, "_huge_share", lambda block: 0.5)  # memory fragmented: half of it on small pages
    written = []
    monkeypatch.setattr(arena, "_keep", lambda *a: written.append(a))
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before) and not written  # the fresh block, and nothing written over the file
    assert path.read_bytes() == good and not (kept / arena._SMALL_PAGES).exists()


def test_a_block_that_cannot_be_written_is_used_as_it_is(kept, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(arena.tempfile, "mkstemp", full)
    x = torch.randn(3, 64)
    _, before, after = _packed_outputs(x)
    assert torch.equal(after, before)
    assert not list(kept.glob("*"))


def test_an_interrupted_write_leaves_no_file(kept, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(arena.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _packed_outputs(torch.randn(3, 64))
    assert not list(kept.glob("*"))


def test_a_block_no_process_used_for_weeks_goes_when_another_is_kept(kept):
    import os
    import time

    kept.mkdir(parents=True)
    old, recent, stray = kept / "old.bin", kept / "recent.bin", kept / "x.tmp"
    for path in (old, recent, stray):
        path.write_bytes(b"0" * 64)
    weeks = time.time() - (arena.KEPT_DAYS + 1) * 86400
    os.utime(old, (weeks, weeks))
    os.utime(stray, (weeks, weeks))
    _packed_outputs(torch.randn(3, 64))
    assert not old.exists() and not stray.exists() and recent.exists()
    assert len(list(kept.glob("*.bin"))) == 2


def test_the_cache_command_lists_and_clears_the_kept_blocks(kept):
    from typer.testing import CliRunner

    from skipsearch.cli import app
    from skipsearch.kernels import graphs

    _packed_outputs(torch.randn(3, 64))
    listed = [c for c in graphs.caches() if c.path == str(kept)]
    assert len(listed) == 1 and listed[0].files == 1 and listed[0].bytes > 0
    line = [row for row in CliRunner().invoke(app, ["cache"]).output.splitlines() if row.startswith(str(kept))]
    assert len(line) == 1 and line[0].endswith("(packed weights, mapped by later processes)"), line
    (kept / arena._SMALL_PAGES).touch()  # this filesystem maps kept files on small pages: the line says none is kept
    assert "(packed weights: none kept, files map on small pages" in CliRunner().invoke(app, ["cache"]).output
    graphs.clear()
    assert not kept.exists()
