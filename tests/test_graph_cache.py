"""Compiled graphs kept on disk (skipsearch/kernels/graphs.py): a later process loads what an earlier one compiled
and decodes the same tokens; graphs never stand for other weights; an unreadable entry is compiled again with one
notice; two processes compiling at once both decode HF greedy's tokens. Each process is tests/graph_worker.py on
the tiny Llama (a cold compile takes about a minute on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skipsearch.kernels import graphs

ROOT = Path(__file__).resolve().parents[1]
CAPACITY = 64


def _worker(cache: Path, *args: object, wait: bool = True):
    env = {**os.environ, "SKIPSEARCH_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.graph_worker", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return _result(proc) if wait else proc


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if "could not be read" in line]


def _step_end(err: str) -> str:
    """The kernel step's last line on stderr (its end: what it did and its seconds)."""
    return [line for line in err.splitlines() if " graphs " in line and " ... " in line][-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache filled by two processes that compiled the same graphs at once, and what each decoded."""
    from skipsearch.config import ConfigError
    from skipsearch.kernels import Kernel, check_kernel

    try:
        check_kernel(Kernel("panel"), "cpu")  # a C++ compiler, transformers 5, the product built
    except ConfigError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("graphs")
    from tests.conftest import copy_lowbit_build

    copy_lowbit_build(cache)  # check_kernel built it: the racing processes compile graphs only
    racing = [_worker(cache, 1, CAPACITY, wait=False) for _ in range(2)]
    return cache, [_result(p)[0] for p in racing]


def _copy(cache: Path, tmp_path: Path) -> Path:
    shutil.copytree(cache, tmp_path / "copy")
    return tmp_path / "copy"


def test_two_processes_compiling_at_once_both_decode_hf_greedy(built):
    _, (first, second) = built
    for run in (first, second):
        assert run["tokens"] == run["plain"] == run["reference"]
        assert run["calls"].get("built", 0) + run["calls"].get("loaded", 0) == 3, run  # each built or loaded
    assert first["tokens"] == second["tokens"]


def test_a_later_process_loads_every_graph_and_compiles_none(built, tmp_path):
    cache, (first, _) = built
    run, err = _worker(_copy(cache, tmp_path), 1, CAPACITY)
    assert run["calls"] == {"loaded": 3}  # the step, the block and the draft's graph: none traced nor compiled
    assert run["fx"] == {} and run["aot"] == {} and run["dynamo"] == 0
    assert run["tokens"] == run["plain"] == run["reference"] == first["tokens"]
    assert not _notices(err)
    step = _step_end(err)
    assert step.startswith("loading panel-c4 graphs (kept on this machine") and "built" not in step.split(" ... ")[1]


def test_a_capacity_in_the_same_bucket_loads_and_another_thread_count_compiles_its_own(built, tmp_path):
    cache, (first, _) = built
    copy = _copy(cache, tmp_path)
    run, _ = _worker(copy, 1, CAPACITY + 100)  # 64 and 164 positions (+ the block) share the 1024-position bucket
    assert run["calls"] == {"loaded": 3} and run["tokens"] == first["tokens"]
    assert graphs.bucket(CAPACITY + 4) == graphs.bucket(CAPACITY + 104) != graphs.bucket(2000)
    assert graphs.graphs_dir(1) != graphs.graphs_dir(2)  # the thread count is baked into the C++: its own folder


def test_another_capacity_bucket_builds_calls_of_its_own_beside_the_first(built, tmp_path):
    """A cache of another capacity bucket is another call (its graph fixes the cache's shape): it builds its own
    files, and the first bucket's still load after it, neither built over the other."""
    cache, (first, _) = built
    copy = _copy(cache, tmp_path)
    other, err = _worker(copy, 1, 1100)
    assert graphs.bucket(1100 + 4) != graphs.bucket(CAPACITY + 4)
    # the step and the block were built beside the process by two children of it (precompiled.build_aside), the
    # draft's graph by the process itself, and all three decode what they decoded the first time
    assert other["calls"] == {"built": 3, "aside": 2} and other["tokens"] == first["tokens"]
    # the step had said it loads kept graphs: it ends saying it built them (the draft's is built after it)
    assert _step_end(err).endswith(": 2 of 2 graphs built (none kept for these shapes and versions)"), err[-2000:]
    again, _ = _worker(copy, 1, CAPACITY)
    assert again["calls"] == {"loaded": 3} and again["tokens"] == first["tokens"]


def test_a_precision_draft_built_aside_is_the_one_its_decode_loads(built, tmp_path):
    """A search's precision drafts are built by children of the process, side by side, before any is timed
    (``methods.precision.build_drafts_aside``): the draft's decode then loads that child's call (the draft's graph
    counted as built aside, none built by the process) and decodes what it decoded when the process built it."""
    cache, (first, _) = built
    run, _ = _worker(_copy(cache, tmp_path), 1, 1100, 0.0, "aside")  # another capacity bucket: all built anew
    assert run["calls"] == {"built": 3, "aside": 3}  # the step, the block and the draft: all three by children
    assert run["tokens"] == run["plain"] == run["reference"] == first["tokens"]


def test_graphs_read_the_weights_they_are_given(built, tmp_path):
    """Edited weights of the same shapes load the same graphs (the weights are inputs, not frozen constants) and
    decode what HF greedy decodes with those weights, not what the first weights gave."""
    cache, (first, _) = built
    run, _ = _worker(_copy(cache, tmp_path), 1, CAPACITY, 3.0)
    assert run["calls"] == {"loaded": 3}
    assert run["tokens"] == run["plain"] == run["reference"] != first["tokens"]


def test_garbage_in_the_cache_is_compiled_again_with_one_notice(built, tmp_path):
    cache, (first, _) = built
    copy = _copy(cache, tmp_path)
    spoiled = [p for p in copy.rglob("*") if p.is_file() and "locks" not in p.parts]
    for i, path in enumerate(spoiled):  # half garbage, half truncated
        path.write_bytes(b"\x00garbage" * 8 if i % 2 else path.read_bytes()[: path.stat().st_size // 2])
    run, err = _worker(copy, 1, CAPACITY)
    assert len(_notices(err)) == 1, err[-3000:]
    assert "Traceback" not in err
    assert run["tokens"] == run["plain"] == run["reference"] == first["tokens"]
    again, err = _worker(copy, 1, CAPACITY)  # what the recovery wrote is whole
    assert again["calls"] == {"loaded": 3} and not _notices(err)


def test_the_cache_command_lists_and_clears_the_kept_folders(built, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    monkeypatch.setenv("SKIPSEARCH_CACHE", str(_copy(built[0], tmp_path)))
    listed = CliRunner().invoke(app, ["cache"])
    assert listed.exit_code == 0 and "torch-" in listed.output and "files" in listed.output
    cleared = CliRunner().invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and cleared.output.startswith("removed 1 folder")
    assert graphs.caches() == ()
    assert "no compiled graphs kept yet" in CliRunner().invoke(app, ["cache"]).output


def test_the_cache_command_lists_every_kept_folder_and_clears_beyond_the_graphs_only_with_all(tmp_path, monkeypatch):
    """Beside the compiled graphs, the converted models, the C++ builds and the llama.cpp GGUFs (gigabytes for a
    real model) are listed with what each is; --clear leaves them, --clear --all removes them too, a models folder
    that links elsewhere is unlinked with its target kept, and a folder that is not skipsearch's is never touched."""
    from typer.testing import CliRunner

    from skipsearch.cli import app

    root, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    for folder in (root / "graphs" / "torch-x-cpu-2t", root / "lowbit" / "torch-x", root / "llama.cpp" / "m",
                   root / "mine", elsewhere / "smollm2-135m"):
        folder.mkdir(parents=True)
        (folder / "f.bin").write_bytes(b"x" * 1000)
    (root / "models").symlink_to(elsewhere)  # as a test setup or a user shares one copy of the models
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(root))
    listed = CliRunner().invoke(app, ["cache"])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert [ln.split("  ")[0] for ln in lines] == [str(root / p) for p in ("graphs/torch-x-cpu-2t", "models", "lowbit",
                                                                           "llama.cpp")]
    assert lines[1].endswith("1 files  0.0 MB  written 0 s ago  (converted models: converting one again takes a "
                             "minute)") and "(GGUFs the llama.cpp peer serves" in lines[3]
    assert CliRunner().invoke(app, ["cache", "--all"]).exit_code == 2  # --all only with --clear
    cleared = CliRunner().invoke(app, ["cache", "--clear"])
    assert cleared.output.startswith("removed 1 folder (0.0 MB)")
    assert sorted(p.name for p in root.iterdir()) == ["graphs", "llama.cpp", "lowbit", "mine", "models"]
    everything = CliRunner().invoke(app, ["cache", "--clear", "--all"])
    assert everything.output.startswith("removed 3 folders (0.0 MB)"), everything.output
    assert sorted(p.name for p in root.iterdir()) == ["graphs", "mine"]  # graphs/: the root of what --clear empties
    assert (elsewhere / "smollm2-135m" / "f.bin").is_file() and (root / "mine" / "f.bin").is_file()


def test_the_notice_keeps_what_building_cost_after_a_process_that_only_loaded(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    graphs.graphs_dir(torch.get_num_threads()).mkdir(parents=True)
    assert graphs.building("panel-c8", keeps=True).startswith("compiling panel-c8 graphs (the first time")
    graphs.record("panel-c8", 326.0)  # a first build
    graphs.record("panel-c8", 4.0)  # a later process that loaded them
    assert graphs.building("panel-c8", keeps=True) == \
        "loading panel-c8 graphs (kept on this machine; building them took 326 s)"


def _aside_args():
    """A tiny model and the arguments of one of its calls, for ``precompiled.build_aside`` without a compile."""
    import torch

    from tests.conftest import make_tiny_model

    sm = make_tiny_model(vocab_size=64, num_layers=2, seed=3)
    ids, positions = torch.zeros(1, 4, dtype=torch.long), torch.arange(1, 5).unsqueeze(0)
    return sm.hf, (ids, positions, sm.cache_kwargs(sm.new_cache()), None)


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="builds aside need fork and 2 cores")
def test_a_build_aside_that_fails_or_hangs_leaves_the_call_to_the_process(monkeypatch, tmp_path):
    """A child that fails leaves no file and the process builds the call itself; one that outlives
    ``ASIDE_SECONDS`` is stopped and reaped; ``stop_aside`` stops any still running; a call already kept is not
    built aside again."""
    import time

    from skipsearch.kernels import precompiled

    model, args = _aside_args()

    def fails(path, *_):
        raise RuntimeError("no compiler")

    def hangs(path, *_):
        time.sleep(120)

    def saves(path, *_):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a call")

    path = precompiled._path(tmp_path, model, args, "full:sdpa", {})
    for build, seconds, built in ((fails, 60.0, False), (hangs, 1.0, False), (saves, 60.0, True)):
        monkeypatch.setattr(precompiled, "_build", build)  # the child runs it: forked after this
        monkeypatch.setattr(precompiled, "ASIDE_SECONDS", seconds)
        precompiled.build_aside(tmp_path, model, args, "full:sdpa", {})
        assert path in precompiled._ASIDE
        t0 = time.monotonic()
        assert precompiled._await(path) is built and path.is_file() is built, build.__name__
        assert time.monotonic() - t0 < 30 and not precompiled._ASIDE
    precompiled.build_aside(tmp_path, model, args, "full:sdpa", {})  # kept: nothing to build
    assert not precompiled._ASIDE
    path.unlink()
    monkeypatch.setattr(precompiled, "_build", hangs)
    precompiled.build_aside(tmp_path, model, args, "full:sdpa", {})
    pid = precompiled._ASIDE[path]
    precompiled.stop_aside()
    assert not precompiled._ASIDE and not path.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no child left behind


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="builds aside need fork and 2 cores")
def test_nothing_is_timed_while_a_child_builds_a_call(monkeypatch, tmp_path):
    """The harness waits for every call a child is building before its first timed call (``settle_aside``), and
    the call's first ``Call.of`` still learns that a child built it."""
    import time

    from skipsearch.engine.harness import time_interleaved
    from skipsearch.kernels import precompiled

    model, args = _aside_args()

    def saves_later(path, *_):
        time.sleep(1.0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a call")

    monkeypatch.setattr(precompiled, "_build", saves_later)  # the child runs it: forked after this
    path = precompiled._path(tmp_path, model, args, "draft:sdpa", {})
    precompiled.build_aside(tmp_path, model, args, "draft:sdpa", {})
    assert path in precompiled._ASIDE and not path.exists()
    seen = []
    time_interleaved({"call": lambda: seen.append(path.is_file())}, rounds=2, warmup=1)
    assert seen == [True, True, True] and not precompiled._ASIDE
    assert precompiled._await(path) is True  # built aside, as Call.of counts it
    assert precompiled._await(path) is False  # and only once


def test_a_calls_name_tells_apart_what_its_dropped_model_guards_checked():
    """A saved call keeps no guard on the model (``precompiled._savable``): its file's name (``structure``) tells apart
    whatever those guards checked, and nothing else. Other weights of the same shapes name the same call; another
    stride, a view at another offset, tied weights, an attribute, a nested object's attribute do not."""
    import torch

    from skipsearch.kernels import precompiled
    from tests.conftest import make_tiny_model

    def named(edit=None, seed=3) -> str:
        sm = make_tiny_model(vocab_size=64, num_layers=2, seed=seed)
        if edit is not None:
            edit(sm.hf)
        return precompiled.structure(sm.hf)

    def strided(hf):  # the same shape and values, another memory layout
        w = hf.model.layers[0].mlp.up_proj.weight
        w.data = w.data.t().contiguous().t()

    def viewed(hf):  # two tensors viewing one buffer, the second at another offset
        buffer = torch.zeros(8)
        hf.model.layers[0].register_buffer("a", buffer[:4], persistent=False)
        hf.model.layers[0].register_buffer("b", buffer[4:] if viewed.offset else buffer[:4], persistent=False)

    class Group:
        def __init__(self, n):
            self.members = n

    base = named()
    assert named(seed=4) == base  # weights are the call's inputs
    assert named(strided) != base
    viewed.offset = True
    at_four = named(viewed)
    viewed.offset = False
    assert named(viewed) != at_four
    assert named(lambda hf: setattr(hf.lm_head, "weight", hf.model.embed_tokens.weight)) != base
    assert named(lambda hf: setattr(hf.model.layers[1].self_attn, "kept", (1, 2))) != \
        named(lambda hf: setattr(hf.model.layers[1].self_attn, "kept", (1, 3)))
    assert named(lambda hf: setattr(hf.model.layers[1].mlp, "group", Group(2))) != \
        named(lambda hf: setattr(hf.model.layers[1].mlp, "group", Group(3)))
    shared = Group(2)

    def one_group(hf):
        hf.model.layers[0].mlp.group = hf.model.layers[1].mlp.group = shared

    def two_groups(hf):
        hf.model.layers[0].mlp.group, hf.model.layers[1].mlp.group = Group(2), Group(2)

    assert named(one_group) != named(two_groups)


def test_the_vector_isa_check_runs_once_per_machine_folder(tmp_path, monkeypatch):
    """Inductor compiles and loads a test library per vector ISA in every process (about a second); the first
    process on a machine's folder records what passed, and every process then trusts the CPU's flags, alike (the
    setting is part of inductor's cache key). Flags that list other ISAs than the record are checked again; an ISA
    that the flags list but fails its check is never trusted."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    calls: list = []

    class Isas:
        def __init__(self, trusted, checked):
            self.trusted, self.checked = trusted, checked

        def __call__(self):
            calls.append(inductor_config.cpp.vec_isa_ok)
            return self.trusted if inductor_config.cpp.vec_isa_ok else self.checked

        def cache_clear(self):
            pass

    def run(isas):
        calls.clear()
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", isas)
        inductor_config.cpp.vec_isa_ok = None  # not monkeypatch: its undo deletes a key of torch's config proxy
        graphs._known_isa(tmp_path)
        return inductor_config.cpp.vec_isa_ok

    before = inductor_config.cpp.vec_isa_ok
    try:
        record = tmp_path / "vec-isa.txt"
        assert run(Isas(["avx2"], ["avx2"])) is True and calls == [None, True] and record.read_text() == "avx2\n"
        assert run(Isas(["avx2"], ["avx2"])) is True and calls == [True]  # a later process: no check
        record.write_text("avx512\n")  # another CPU's record in this folder, or the flags changed
        assert run(Isas(["avx2"], ["avx2"])) is True and calls == [True, None, True] and \
            record.read_text() == "avx2\n"
        # the flags list an ISA that fails its check: every process checks, and nothing is recorded
        assert run(Isas(["avx512", "avx2"], ["avx2"])) is None and not record.exists()
        assert run(Isas(["avx512", "avx2"], ["avx2"])) is None and calls == [None, True]
    finally:
        inductor_config.cpp.vec_isa_ok = before  # what this process had: later tests compile under it


def test_a_build_that_trips_on_a_bad_entry_of_the_folder_clears_it_once_then_falls_back(tmp_path, monkeypatch):
    """A garbage ``.py`` of inductor's where it would write its code made the build fail; counted a capture refusal,
    no call file was written and every later process built again. An error naming a file of the folder is raised
    (``graphs.recovering`` clears the folder and builds again), once a process; then it falls back as a refusal."""
    from skipsearch.kernels import precompiled

    folder = tmp_path / "graphs"
    folder.mkdir()

    def failing(path, model, args, settings, rows=None):
        raise RuntimeError(f"Failed to import {folder / 'c5' / 'cc5e.py'}")

    monkeypatch.setattr(precompiled, "_path", lambda folder, *a: folder / "calls" / "x.bin")
    monkeypatch.setattr(precompiled, "_await", lambda path: False)
    monkeypatch.setattr(precompiled, "_build", failing)
    monkeypatch.setattr(precompiled, "_CLEARING", set())
    refused = precompiled.COUNTS["refused"]
    with pytest.raises(RuntimeError, match="Failed to import"):
        precompiled.Call.of(folder, None, (), "full:sdpa", {})
    assert precompiled.Call.of(folder, None, (), "full:sdpa", {}) is None  # the second time: torch.compile runs it
    assert precompiled.COUNTS["refused"] == refused + 1
    assert graphs.names_entry(folder, RuntimeError(f"Failed to import {folder}/c5/x.py"))
    assert not graphs.names_entry(folder, RuntimeError("a graph break in the model"))


def _recorded(position: str = "positions"):
    """A stand-in for a loaded precompiled call (``torch.compiler.load_compiled_function``'s) on a model of one
    weight: its bytecode reads the weight and calls its graph by a global, as dynamo's does, with the positions as
    the expression ``position`` makes of them. Returns the call, the model and how often the bytecode and the graph
    ran."""
    from types import SimpleNamespace

    import torch

    ran = {"bytecode": 0, "graph": 0}

    def graph(weight, ids, positions):
        ran["graph"] += 1
        return [ids * weight + positions, weight.sum()]

    namespace = {"__compiled_fn_test": graph, "ran": ran}
    exec("def bytecode(model, ids, positions, cache, mask):\n"
         "    ran['bytecode'] += 1\n"
         f"    return __compiled_fn_test(model.w, ids, {position})[0]\n", namespace)

    class Loaded:
        fn, _artifacts = staticmethod(namespace["bytecode"]), SimpleNamespace(backend_id="__compiled_fn_test")

        def __call__(self, *args):
            return self.fn(*args)

    return Loaded(), SimpleNamespace(w=torch.tensor([2.0])), ran


def test_a_replayed_call_skips_the_bytecode_only_where_two_runs_agree():
    """``precompiled._Replay``: after two runs through the bytecode that passed the graph the same objects but for
    the call's own tensors, later runs call the graph with the new ids and positions, and give what the bytecode
    gives. Where the bytecode passes another object each run (a weight replaced), or a number (which identity cannot
    tell apart), it keeps running the bytecode."""
    import torch

    from skipsearch.kernels.precompiled import _Replay

    loaded, model, ran = _recorded()
    replay = _Replay()
    for step in range(5):
        ids, positions = torch.tensor([float(step)]), torch.tensor([10.0 + step])
        assert torch.equal(replay(loaded, model, (ids, positions, {"cache": None}, None)), ids * 2 + positions)
    assert ran == {"bytecode": 2, "graph": 5}  # two recorded runs, then the graph alone

    loaded, model, ran = _recorded()
    replay = _Replay()
    for step in range(5):
        model.w = torch.tensor([float(step)])  # another weight every run
        ids, positions = torch.tensor([3.0]), torch.tensor([1.0])
        assert torch.equal(replay(loaded, model, (ids, positions, {"cache": None}, None)), ids * step + positions)
    assert ran == {"bytecode": 5, "graph": 5}

    loaded, model, ran = _recorded("int(positions)")  # a number made of the call's tensor: the same in both records
    replay = _Replay()
    for step in range(5):
        ids, positions = torch.tensor([3.0]), torch.tensor([1 if step < 3 else step])
        assert torch.equal(replay(loaded, model, (ids, positions, {"cache": None}, None)), ids * 2 + positions)
    assert ran == {"bytecode": 5, "graph": 5}


def test_a_precompiled_call_refuses_arguments_of_another_shape_after_its_first_run(tmp_path):
    """The kernel's C++ wrapper no longer checks its inputs' sizes at every call (``panel.SETTINGS``): a call's
    first run checks dynamo's guards, and every later run checks its own tensors' shapes, strides and dtypes against
    that run's. Arguments of another shape raise; the same shapes, new values, run (and replay)."""
    import pytest
    import torch

    from skipsearch.kernels import panel, precompiled

    assert panel.SETTINGS["size_asserts"] is False
    loaded, model, ran = _recorded()

    class Checked:  # the loaded call's guard check, as torch's precompiled function has it
        fn, _artifacts = loaded.fn, loaded._artifacts

        def __call__(self, *args):
            return loaded(*args)

        def guard_check(self, *args):
            return True

        def disable_guard_check(self):
            pass

    call = precompiled.Call(Checked(), build=lambda: None, settings={}, path=tmp_path / "call")
    for step in range(4):
        ids, positions = torch.tensor([float(step)]), torch.tensor([1.0])
        assert torch.equal(call(model, ids, positions, {"cache": None}, None), ids * 2 + positions)
    assert ran["graph"] == 4
    with pytest.raises(RuntimeError, match="called with"):
        call(model, torch.tensor([1.0, 2.0]), torch.tensor([1.0]), {"cache": None}, None)
    with pytest.raises(RuntimeError, match="called with"):
        call(model, torch.tensor([1]), torch.tensor([1.0]), {"cache": None}, None)  # another dtype
    assert ran["graph"] == 4
