"""Hostile and broken inputs to what teams share (issue 28): profiles, cost files, studies, the files the commands
write, Ctrl-C in every long command, and two workers on one study.

Every case ends in one ``error:`` line on stderr (only ``warning:`` lines beside it) and exit 2, or exit 130 for
Ctrl-C, with no traceback, and loses nothing: an input is left as it was, and a good file at a command's target
survives intact or is replaced by a whole one. One parametrized case per input; ``test_the_count`` counts them.

Commands run in-process (typer's CliRunner) where they can, on the tiny random checkpoint where a model is needed;
Ctrl-C and the workers are real processes, started together once for the module (``interrupted``) so that the
file's run time stays modest.
"""

from __future__ import annotations

import base64
import errno
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import yaml
from clocks import work_clock
from conftest import save_tiny_checkpoint
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.files import yamlio
from skipsearch.files.cost_profile import load_costs
from skipsearch.profile import load_profile

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
CPU_COSTS = ROOT / "costs" / "cpu-float32.yaml"
TPE_PROFILE = ROOT / "profiles" / "smollm2-135m" / "cpu-float32-tpe.yaml"  # keeps its traces: plan needs no model
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

# The commands that read each kind of shared file, as argument lists around the file (``{}``); every input of
# that kind goes through each. `skipsearch export` (another change) reads profiles, cost files and studies:
# after merging, its readers are one line each here, e.g. ["export", "{}", "--out", "{out}"].
PROFILE_READERS = [["profile", "validate", "{}"],
                   ["decode", "--profile", "{}", "--prompt", "hi", "--max-new-tokens", "2"],
                   ["plan", "profile", "--profile", "{}", "--costs", str(CPU_COSTS)]]
COSTS_READERS = [["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", "{}"]]
STUDY_READERS = [["study", "show", "{}"],
                 ["optimize", "--model", "{model}", "--study", "{}", "--budget", "1", "--objective", "surrogate",
                  "--n-prompts", "1", "--max-new-tokens", "4", "--dataset", "humaneval", "--out", "{out}"]]
EXPORT_READERS: list[list[str]] = []  # `skipsearch export`: the lead adds its readers (and cases below) here


def assert_refused(result, fragment: str, *, code: int = 2) -> None:
    """Exit ``code``, one ``error:`` line holding ``fragment`` and ending stderr (a command that had started work
    says so on the lines before it), no traceback, no terminal control character."""
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert fragment in errors[0], errors[0]
    assert "Traceback" not in result.output and "\x1b" not in result.stderr


def _fill(argv: list[str], path: Path, **more: str) -> list[str]:
    return [a.replace("{}", str(path)).format(**more) if "{" in a else a for a in argv]


def _snapshot(path: Path) -> object:
    """What a file (or folder of files) holds, to check that a command left it as it was."""
    if path.is_symlink() or not path.exists():
        return os.readlink(path) if path.is_symlink() else None
    if path.is_dir():
        return {p.name: _snapshot(p) for p in sorted(path.iterdir())}
    if not path.is_file():
        return path.stat().st_mode
    return path.read_bytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("hostile-model") / "tiny-llama")


@pytest.fixture(autouse=True)
def _no_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache: a profile naming a hub model never finds one on this machine."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- profiles -----------------------------------------------------------------------------------------------------
GOOD = TPE_PROFILE.read_text()


def _v3(**over) -> str:
    raw = {"schema_version": 3, "model": {"name": "smollm2-135m", "num_layers": 30}, "method": "layer-skip",
           "draft": {"skip_attn": [3], "max_draft_tokens": 2}}
    raw.update(over)
    return yaml.safe_dump(raw, sort_keys=False)


def _bomb(depth: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, depth)]
    return "\n".join(lines) + f"\nschema_version: *a{depth - 1}\n"


def _vocab(raw: bytes, size: int = 5) -> str:
    ids = base64.b64encode(zlib.compress(raw, 9)).decode()
    return _v3(method_params={"vocab_subset": size, "vocab_ids": ids, "vocab_sha256": "0" * 64})


def _file(text: str | bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "input.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path
    return make


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "input.yaml")
    return tmp / "input.yaml"


def _link(target: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        os.symlink(target, tmp / "input.yaml")
        return tmp / "input.yaml"
    return make


def _loop(tmp: Path) -> Path:
    os.symlink("b.yaml", tmp / "input.yaml")
    os.symlink("input.yaml", tmp / "b.yaml")
    return tmp / "input.yaml"


def _folder(tmp: Path) -> Path:
    (tmp / "input.yaml").mkdir()
    return tmp / "input.yaml"


# (id, how the input is made, a fragment of the one error line)
FILE_INPUTS = [
    ("alias-bomb", _file(_bomb()), "expands through its aliases"),
    ("alias-to-itself", _file("a: &a [*a]\n"), "an alias refers to a node that contains it"),
    ("over-1-MiB", _file(GOOD + "#" * (1 << 20)), "larger than 1 MiB"),
    ("binary-garbage", _file(bytes(range(256)) * 40), "cannot read"),
    ("latin-1", _file(b"# caf\xe9\n" + GOOD.encode()), "'utf-8' codec can't decode"),
    ("utf-16", _file(GOOD.encode("utf-16")), "'utf-8' codec can't decode"),
    ("nul-bytes", _file(b"\x00" * 64), "malformed YAML"),
    ("deep-flow-nesting", _file("a: " + "[" * 5000 + "]" * 5000), "nested too deeply"),
    ("deep-block-nesting", _file("".join(" " * i + f"k{i}:\n" for i in range(1200)) + " " * 1200 + "v: 1\n"),
     "nested too deeply"),
    ("empty", _file(""), "got an empty file"),
    ("top-level-list", _file("- 1\n- 2\n"), "expected a YAML mapping at the top level, got a list"),
    ("top-level-scalar", _file("just text\n"), "expected a YAML mapping at the top level, got a str"),
    ("a-directory", _folder, "Is a directory"),
    ("link-to-dev-zero", _link("/dev/zero"), "not a regular file"),
    ("symlink-loop", _loop, "Too many levels of symbolic links"),
    ("dangling-symlink", _link("gone.yaml"), "No such file or directory"),
    ("named-pipe", _fifo, "not a regular file"),
    ("key-given-twice", _file(GOOD + "\nmethod: layer-skip\n"), "key 'method' is given twice"),
    ("python-tag", _file("!!python/object/apply:os.system ['echo owned']\n"), "could not determine a constructor"),
    ("unhashable-key", _file("? [a, b]\n: 1\n"), "found unhashable key"),
    ("huge-integer", _file(_v3().replace("max_draft_tokens: 2", "max_draft_tokens: " + "9" * 5000)),
     "malformed YAML"),
    ("february-30", _file(_v3(model={"name": "x", "num_layers": 30}).replace("name: x", "name: 2023-02-30")),
     "malformed YAML"),
    ("half-written", _file(GOOD[: len(GOOD) // 2].rsplit("\n", 1)[0] + "\n  skip_attn: [3, 7"), "malformed YAML"),
    ("schema-from-the-future", _file(_v3(schema_version=99)), "unknown schema_version 99"),
    ("schema-as-string", _file(_v3(schema_version="3")), "unknown schema_version '3'"),
    ("unknown-method", _file(_v3(method="rm -rf /")), "unknown method 'rm -rf /'"),
    ("terminal-escapes", _file(_v3(method="\x1b[2J\x1b[31mowned\x07")), "unknown method '\\x1b[2J"),
    ("unknown-top-level-key", _file(_v3(payload="x")), "unknown top-level key 'payload'"),
    ("layer-10^20", _file(_v3(draft={"skip_attn": [10**20], "max_draft_tokens": 2})),
     "has layer index 100000000000000000000"),
    ("negative-K", _file(_v3(draft={"max_draft_tokens": -1})), "max_draft_tokens"),
    ("K-true", _file(_v3(draft={"max_draft_tokens": True})), "max_draft_tokens must be an integer"),
    ("K-2.5", _file(_v3(draft={"max_draft_tokens": 2.5})), "max_draft_tokens must be an integer"),
    ("threshold-nan", _file(_v3(draft={"max_draft_tokens": 2, "exit": {"threshold": float("nan")}})), "threshold"),
    ("threshold-inf", _file(_v3(draft={"max_draft_tokens": 2, "exit": {"threshold": float("inf")}})), "threshold"),
    ("date-as-model-name", _file(_v3(model={"name": "2001-12-14", "num_layers": 30}).replace("'2001-12-14'",
                                                                                             "2001-12-14")),
     "model.name must be a string, got datetime.date(2001, 12, 14)"),
    ("zlib-bomb-vocab", _file(_vocab(b"\x01" * (40 << 20))), "more than 5 MiB of ids"),
    ("endless-varint-vocab", _file(_vocab(b"\x80" * (1 << 20))), "a varint longer than 5 bytes"),
    ("vocab-checksum-wrong", _file(_vocab(bytes([1, 1, 1, 1, 1]))), "vocab_sha256 does not match vocab_ids"),
    ("traces-not-base64", _file(GOOD.replace("traces: [", "traces: ['%%%not base64', ", 1)), "not base64"),
    ("unknown-fallback", _file(_v3(method="hybrid", method_params={"fallback": "shell"})),
     "method_params.fallback must be one of"),
    ("fractal-w-10^6", _file(_v3(method="fractal", draft={"max_draft_tokens": 4},
                                 method_params={"n": 1, "w": 10**6})), "fractal: method_params.w"),
    ("precision-scheme-unknown", _file(_v3(method="precision", method_params={"scheme": "fp3"})), "fp3"),
]
# Issue 42: nonsense that validated. Each number a profile holds is finite and inside what the engine runs
# (skipsearch.files.bounds); every reader refuses it before a model loads, export too (below).
BOUNDS_INPUTS = [
    ("K-10^9", _file(_v3(draft={"max_draft_tokens": 10**9})), "draft.max_draft_tokens must be in 0..4095"),
    ("num-layers-10^12", _file(_v3(model={"name": "smollm2-135m", "num_layers": 10**12})),
     "model.num_layers must be in 1..1024, got 1000000000000"),
    ("dtype-float7", _file(_v3(model={"name": "smollm2-135m", "num_layers": 30, "dtype": "float7"})),
     "model.dtype must be one of float32, float16, bfloat16, got 'float7'"),
    ("speedup-inf", _file(_v3(measured={"speedup": float("inf")})), "measured.speedup must be a finite number"),
    ("tau-nan", _file(_v3(measured={"tau": float("nan")})), "measured.tau must be a finite number"),
    ("acceptance-7", _file(_v3(measured={"acceptance_rate": 7})), "measured.acceptance_rate must be in 0..1"),
    ("threads-10^9", _file(_v3(environment={"threads": 10**9})), "environment.threads must be in 1..1024"),
    ("budget-negative", _file(_v3(search={"strategy": "tpe", "budget": -5})), "search.budget must be >= 0"),
    ("kernel-block-10^8", _file(_v3(kernel="inductor-c100000000")), "unknown kernel 'inductor-c100000000'"),
]
FILE_INPUTS += BOUNDS_INPUTS


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in FILE_INPUTS], ids=[c[0] for c in FILE_INPUTS])
@pytest.mark.parametrize("reader", PROFILE_READERS + EXPORT_READERS, ids=lambda r: r[0] + ("-" + r[1] if
                                                                                            r[0] == "profile" else ""))
def test_a_hostile_profile_is_one_line(tmp_path, make, fragment, reader):
    path = make(tmp_path)
    before = _snapshot(tmp_path)
    assert_refused(runner.invoke(app, _fill(reader, path, out=str(tmp_path / "out.yaml"))), fragment)
    assert _snapshot(tmp_path) == before  # the input is left as it was, and nothing was written beside it


def _profile_for(model: str, layers: int = 30) -> Callable[[Path], Path]:
    """A profile naming ``model`` (``{tmp}`` in it: the test's folder)."""
    def make(tmp: Path) -> Path:
        (tmp / "weights.bin").write_bytes(b"not a model")
        return _file(_v3(model={"name": model.format(tmp=tmp), "num_layers": layers}))(tmp)
    return make


# A valid profile that names a model this machine cannot load, or one it does not fit: decode refuses it.
MODEL_INPUTS = [
    ("hub-model-not-here", _profile_for("someorg/not-here-70b"), "fetch it with `hf download someorg/not-here-70b`"),
    ("model-path-climbs-out", _profile_for("../../../../../../../nowhere/model"), "does not exist"),
    ("model-path-is-a-file", _profile_for("{tmp}/weights.bin"), "weights.bin"),
    ("model-name-escapes", _profile_for("\x1b]0;owned\x07"), "unknown model '\\x1b]0;owned\\x07'"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in MODEL_INPUTS], ids=[c[0] for c in MODEL_INPUTS])
def test_a_profile_naming_a_model_it_cannot_get_is_one_line(tmp_path, make, fragment):
    path = make(tmp_path)
    result = runner.invoke(app, ["decode", "--profile", str(path), "--prompt", "hi", "--max-new-tokens", "2"])
    assert_refused(result, fragment)


def test_a_profile_for_a_model_of_another_depth_is_one_line(tmp_path, tiny):
    path = _profile_for(str(tiny), layers=7)(tmp_path)
    result = runner.invoke(app, ["decode", "--profile", str(path), "--prompt", "hi", "--max-new-tokens", "2"])
    assert_refused(result, "profile was made for a 7-layer model, this model has 4 layers")


def _no_model(monkeypatch) -> None:
    """Any model load fails the test: what is checked must be refused before one."""
    from skipsearch.api import loading
    from skipsearch.model import loader

    for module in (loader, loading):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in BOUNDS_INPUTS], ids=[c[0] for c in BOUNDS_INPUTS])
def test_export_refuses_a_profile_out_of_bounds_before_the_model_loads(tmp_path, monkeypatch, make, fragment):
    path = make(tmp_path)
    before = _snapshot(tmp_path)
    _no_model(monkeypatch)
    result = runner.invoke(app, ["export", "--profile", str(path), "--engine", "hf", "--out", str(tmp_path / "x")])
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


def test_a_profile_naming_another_architecture_beside_the_models_weights_is_refused_unless_forced(tmp_path, tiny):
    """Issue 42, row 6: model.fingerprint edited (or stale) while weights_fingerprint matches."""
    from skipsearch.checkpoints import weights_fingerprint

    raw = yaml.safe_load(_tiny_profile(tiny))
    raw["model"].update(fingerprint="0123456789abcdef", weights_fingerprint=weights_fingerprint(tiny))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    argv = ["decode", "--profile", str(path), "--prompt", "hi", "--max-new-tokens", "2"]
    assert_refused(runner.invoke(app, argv), "profile records model fingerprint 0123456789abcdef")
    forced = runner.invoke(app, [*argv, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "0123456789abcdef" in forced.stderr and "forced" in forced.stderr
    raw["model"].pop("fingerprint")  # a profile that records no architecture fingerprint: the weights decide
    path.write_text(yaml.safe_dump(raw))
    assert runner.invoke(app, argv).exit_code == 0


# -- cost files ---------------------------------------------------------------------------------------------------
COSTS = CPU_COSTS.read_text()


def _costs_edit(edit: Callable[[dict], None]) -> str:
    raw = yaml.safe_load(COSTS)
    edit(raw)
    return yaml.safe_dump(raw, sort_keys=False)


COSTS_INPUTS = [
    ("alias-bomb", _file(_bomb()), "expands through its aliases"),
    ("over-1-MiB", _file(COSTS + "#" * (1 << 20)), "larger than 1 MiB"),
    ("binary-garbage", _file(bytes(range(256)) * 40), "cannot read"),
    ("named-pipe", _fifo, "not a regular file"),
    ("half-written", _file(COSTS[: len(COSTS) // 2] + "  verify_ratio: [1.0, 1."), "malformed YAML"),
    ("empty", _file(""), "empty"),
    ("a-profile-not-costs", _file(GOOD), "this is a skipsearch profile, not a skipsearch cost file"),
    ("negative-seconds", _file(_costs_edit(lambda r: r["costs"].update(mlp_seconds=-1.0))),
     "costs.mlp_seconds must be a finite number of seconds >= 0"),
    ("nan-step", _file(_costs_edit(lambda r: r["costs"].update(step_seconds=float("nan")))), "costs.step_seconds"),
    ("verify-falls", _file(_costs_edit(lambda r: r["costs"].update(verify_ratio=[1.0, 3.0, 0.5]))), "verify"),
    ("sublayers-exceed-the-step", _file(_costs_edit(lambda r: r["costs"].update(attn_seconds=1.0))),
     "does not fit the step"),
    ("another-model", _file(_costs_edit(lambda r: r["model"].update(num_layers=4, name="tiny"))),
     "cost file was measured on tiny (4 layers)"),
    ("scheme-entry-cut-short", _file(_costs_edit(lambda r: r["costs"]["schemes"].update(fp16={"attn_seconds": 0.1}))),
     "missing required key costs.schemes.fp16.mlp_seconds"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in COSTS_INPUTS], ids=[c[0] for c in COSTS_INPUTS])
@pytest.mark.parametrize("reader", COSTS_READERS + EXPORT_READERS, ids=lambda r: r[0])
def test_a_hostile_cost_file_is_one_line(tmp_path, make, fragment, reader):
    path = make(tmp_path)
    before = _snapshot(tmp_path)
    assert_refused(runner.invoke(app, _fill(reader, path, out=str(tmp_path / "out.yaml"))), fragment)
    assert _snapshot(tmp_path) == before


# -- studies ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ngram_study(tmp_path_factory, tiny) -> Path:
    """A real (tiny) study, made by the ngram strategy on the 4-layer checkpoint."""
    folder = tmp_path_factory.mktemp("hostile-study") / "study"
    result = runner.invoke(app, ["optimize", "--model", str(tiny), "--strategy", "ngram", "--study", str(folder),
                                 "--budget", "2", "--objective", "surrogate", "--n-prompts", "1",
                                 "--max-new-tokens", "4", "--dataset", "humaneval",
                                 "--out", str(folder.parent / "n.yaml")])
    assert result.exit_code == 0, result.output
    return folder


def _study_file(data: bytes | Callable[[bytes], bytes]) -> Callable[[Path, Path], Path]:
    def make(tmp: Path, real: Path) -> Path:
        (tmp / "study").mkdir()
        raw = data(( real / "study.db").read_bytes()) if callable(data) else data
        (tmp / "study" / "study.db").write_bytes(raw)
        return tmp / "study"
    return make


def _study_copy(edit: Callable[[Path], None]) -> Callable[[Path, Path], Path]:
    def make(tmp: Path, real: Path) -> Path:
        shutil.copytree(real, tmp / "study")
        edit(tmp / "study" / "study.db")
        return tmp / "study"
    return make


def _study_fifo(tmp: Path, real: Path) -> Path:
    (tmp / "study").mkdir()
    os.mkfifo(tmp / "study" / "study.db")
    return tmp / "study"


def _study_is_a_file(tmp: Path, real: Path) -> Path:
    (tmp / "study").write_text("not a folder")
    return tmp / "study"


def _hostile_trial(attrs: dict) -> Callable[[Path], None]:
    """A trial another machine wrote into the shared study, holding ``attrs``."""
    def edit(db: Path) -> None:
        storage = f"sqlite:///{db}"
        study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1e308, params={},
                                                  distributions={}, user_attrs=attrs))
    return edit


def _another_depth(db: Path) -> None:
    storage = f"sqlite:///{db}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    study.set_user_attr("model", {"name": "big", "num_layers": 80, "fingerprint": None})


STUDY_INPUTS = [
    ("binary-garbage", _study_file(bytes(range(256)) * 40), "not"),
    ("half-written", _study_file(lambda real: real[: len(real) // 2]), "malformed"),
    ("named-pipe", _study_fifo, "study.db' is not a regular file"),
    ("a-file-not-a-folder", _study_is_a_file, "is a file, not a study folder"),
]
# readers that resume the study too: refused before the model loads
RESUMED_INPUTS = [  # (id, the study, the strategy that resumes it, the error)
    ("from-another-strategy", _study_copy(lambda db: None), "tpe", "was made by strategy 'ngram', not 'tpe'"),
    ("for-a-model-of-another-depth", _study_copy(_another_depth), "ngram", "was made for a 80-layer model (big)"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in STUDY_INPUTS], ids=[c[0] for c in STUDY_INPUTS])
@pytest.mark.parametrize("reader", STUDY_READERS + EXPORT_READERS, ids=lambda r: r[0])
def test_a_hostile_study_is_one_line(tmp_path, tiny, ngram_study, make, fragment, reader):
    study = make(tmp_path, ngram_study)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, _fill(reader, study, model=str(tiny), out=str(tmp_path / "out.yaml")))
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(("make", "strategy", "fragment"), [c[1:] for c in RESUMED_INPUTS],
                         ids=[c[0] for c in RESUMED_INPUTS])
def test_resuming_a_study_made_otherwise_is_one_line_before_the_model_loads(tmp_path, tiny, ngram_study,
                                                                             monkeypatch, make, strategy, fragment):
    from skipsearch.model import loader

    study = make(tmp_path, ngram_study)
    before = _snapshot(study)
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    result = runner.invoke(app, ["optimize", "--model", str(tiny), "--strategy", strategy, "--study", str(study),
                                 "--budget", "3", "--out", str(tmp_path / "out.yaml")])
    assert_refused(result, fragment)
    assert _snapshot(study) == before


TRIAL_INPUTS = [
    ("trial-missing-keys", {"config": {"skip_attn": [1]}, "method": "layer-skip"}),
    ("trial-wrong-types", {"config": {"skip_attn": ["\x1b[2J", -5, 10**30], "skip_mlp": {"a": 1},
                                      "max_draft_tokens": "many"}, "method": [[[[]]]], "kind": 7,
                           "measurement": "\x1b[31mfast"}),
    ("trial-escapes-in-a-good-shape", {"config": {"skip_attn": [1], "skip_mlp": [], "max_draft_tokens": 2},
                                       "method": "\x1b[2Jlayer-skip", "kind": "timed",
                                       "measurement": {"kind": "timed", "speedup": "\x1b[31m9.9"}}),
]


@pytest.mark.parametrize("attrs", [c[1] for c in TRIAL_INPUTS], ids=[c[0] for c in TRIAL_INPUTS])
@pytest.mark.parametrize("reader", [["study", "show", "{}"], ["plan", "hierarchical", "--model", "{model}",
                                                              "--study", "{}", "--no-validate", "--n-prompts", "1",
                                                              "--max-new-tokens", "4"]], ids=lambda r: r[0])
def test_a_study_holding_a_trial_another_machine_wrote_is_one_line(tmp_path, tiny, ngram_study, attrs, reader):
    study = _study_copy(_hostile_trial(attrs))(tmp_path, ngram_study)
    before = _snapshot(study)
    result = runner.invoke(app, _fill(reader, study, model=str(tiny)))
    assert_refused(result, "has trials skipsearch did not write")
    assert _snapshot(study) == before


# -- prompts files and datasets ----------------------------------------------------------------------------------
def _named(name: str, text: str | bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(text if isinstance(text, bytes) else text.encode())
        return tmp / name
    return make


def _fifo_named(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        os.mkfifo(tmp / name)
        return tmp / name
    return make


# `decode --prompts-file`: every line is read and checked before the model loads
PROMPT_FILE_INPUTS = [
    ("named-pipe", _fifo, "not a regular file"),  # waited on for a writer for ever, once
    ("link-to-dev-zero", _link("/dev/zero"), "not a regular file"),  # read for ever, once
    ("a-directory", _folder, "Is a directory"),
    ("dangling-symlink", _link("gone.jsonl"), "No such file or directory"),
    ("latin-1", _file(b'{"prompt": "caf\xe9"}\n'), "not UTF-8 text"),
    ("not-json", _file('{"prompt": "a"}\n{not json\n'), ":2: not valid JSON"),
    ("deep-nesting", _file("[" * 100_000 + "\n"), ":1: not valid JSON (nested too deeply)"),
    ("a-list-not-an-object", _file("[1, 2]\n"), ":1: each line must be a JSON object"),
    ("prompt-null", _file('{"prompt": null}\n'), ':1: "prompt" must be a string, got null'),
    ("chat-as-a-string", _file('{"prompt": "a", "chat": "false"}\n'), ':1: "chat" must be true or false'),
    ("no-prompt-key", _file('{"text": "a"}\n'), ':1: no "prompt" key'),
    ("empty", _file(""), "holds no prompts"),
    ("blank-lines-only", _file("\n  \n\n"), "holds no prompts"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in PROMPT_FILE_INPUTS],
                         ids=[c[0] for c in PROMPT_FILE_INPUTS])
def test_a_hostile_prompts_file_is_one_line_before_the_model_loads(tmp_path, tiny, monkeypatch, make, fragment):
    from skipsearch import api

    path = make(tmp_path)
    before = _snapshot(tmp_path)
    monkeypatch.setattr(api, "open_model", lambda **kwargs: pytest.fail("the model loaded before the check"))
    result = runner.invoke(app, ["decode", "--model", str(tiny), "--prompts-file", str(path),
                                 "--max-new-tokens", "2"])
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


def test_a_prompts_file_over_the_limit_is_refused_unread(tmp_path, tiny, monkeypatch):
    from skipsearch.cli import decode

    monkeypatch.setattr(decode, "MAX_PROMPTS_BYTES", 64)  # the real limit is 256 MiB: too big to write here
    path = _file('{"prompt": "' + "a" * 100 + '"}\n')(tmp_path)
    result = runner.invoke(app, ["decode", "--model", str(tiny), "--prompts-file", str(path)])
    assert_refused(result, "larger than")


# `optimize --dataset FILE`: read before the model loads
DATASET_INPUTS = [
    ("named-pipe", _fifo_named("input.jsonl"), "dataset file not found"),
    ("not-json", _named("input.jsonl", '{"prompt": "a"}\n{not json\n'), ":2: not valid JSON"),
    ("deep-nesting", _named("input.jsonl", "[" * 100_000 + "\n"), ":1: not valid JSON (nested too deeply)"),
    ("a-list-not-an-object", _named("input.jsonl", "[1, 2]\n"), ":1: each line must be a JSON object"),
    ("latin-1", _named("input.jsonl", b'{"prompt": "caf\xe9"}\n'), "not UTF-8 text"),
    ("no-prompt-field", _named("input.jsonl", '{"x": 1}\n'), "row 0: no prompt or"),
    ("prompt-not-a-string", _named("input.jsonl", '{"prompt": 5}\n'), "row 0: prompt must be a non-empty string"),
    ("chat-not-a-flag", _named("input.jsonl", '{"prompt": "a", "chat": "maybe"}\n'), "chat must be true or false"),
    ("unknown-suffix", _named("input.exe", '{"prompt": "a"}\n'), "unknown dataset"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in DATASET_INPUTS], ids=[c[0] for c in DATASET_INPUTS])
def test_a_hostile_dataset_file_is_one_line_before_the_model_loads(tmp_path, tiny, monkeypatch, make, fragment):
    from skipsearch.model import loader

    path = make(tmp_path)
    before = _snapshot(tmp_path)
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    result = runner.invoke(app, ["optimize", "--model", str(tiny), "--dataset", str(path), "--budget", "1",
                                 "--out", str(tmp_path / "out.yaml")])
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


# -- study database URLs (--storage) ---------------------------------------------------------------------------------
def _sqlite_at(make: Callable[[Path], Path]) -> Callable[[Path], str]:
    return lambda tmp: f"sqlite:///{make(tmp)}"


STORAGE_INPUTS = [  # (id, the URL made in the test's folder, a fragment of the one error line)
    ("not-a-url", lambda tmp: "not a url", "is not a database URL"),
    ("escapes-in-the-url", lambda tmp: "\x1b[2J\x1b[31m://x", "'\\x1b[2J\\x1b[31m://x' is not a database URL"),
    ("unknown-dialect", lambda tmp: "nosuchdb://x/y", "sqlalchemy.dialects:nosuchdb"),
    ("driver-not-installed", lambda tmp: "mysql+mysqldb://u@127.0.0.1:1/x", "driver is not installed"),
    ("sqlite-garbage", _sqlite_at(_named("g.db", bytes(range(256)) * 40)), "file is not a database"),
    ("sqlite-named-pipe", _sqlite_at(_fifo_named("p.db")), "is not a regular file"),  # SQLite waited, once
    ("sqlite-a-folder", _sqlite_at(_folder), "is not a regular file"),
]
STORAGE_READERS = [["study", "show", "--storage", "{}"],
                   ["optimize", "--model", "{model}", "--storage", "{}", "--budget", "1", "--out", "{out}"]]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in STORAGE_INPUTS], ids=[c[0] for c in STORAGE_INPUTS])
@pytest.mark.parametrize("reader", STORAGE_READERS, ids=lambda r: r[0])
def test_a_hostile_storage_url_is_one_line_and_creates_nothing(tmp_path, tiny, monkeypatch, make, fragment, reader):
    from skipsearch.model import loader

    url = make(tmp_path)
    if url.startswith("mysql+mysqldb:") and importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("MySQLdb is installed here: the URL would reach for a server instead")
    before = _snapshot(tmp_path)
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    argv = [a.replace("{}", url) if a == "{}" else a.format(model=str(tiny), out=str(tmp_path / "out.yaml"))
            if "{" in a else a for a in reader]
    assert_refused(runner.invoke(app, argv), fragment)
    assert _snapshot(tmp_path) == before  # nothing was created or changed beside the input


# -- what the commands write: nothing good is lost ------------------------------------------------------------------
def _full_disk(monkeypatch) -> None:
    """The disk fills while a file is written: the atomic writer's write fails with ENOSPC."""
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise ENOSPC

    monkeypatch.setattr(yamlio.os, "fdopen", lambda *a, **k: Full(real(*a, **k)))


def test_a_full_disk_on_plan_out_keeps_the_good_profile_there(tmp_path, monkeypatch):
    out = tmp_path / "out.yaml"
    shutil.copy(TPE_PROFILE, out)
    before = out.read_bytes()
    _full_disk(monkeypatch)
    result = runner.invoke(app, ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", str(CPU_COSTS),
                                 "--out", str(out), "--force"])
    assert_refused(result, "No space left on device")
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["out.yaml"]


def test_a_full_disk_on_costs_out_keeps_the_good_cost_file_there(tmp_path, tiny, monkeypatch):
    out = tmp_path / "costs.yaml"
    shutil.copy(CPU_COSTS, out)
    before = out.read_bytes()
    _full_disk(monkeypatch)
    with work_clock():
        result = runner.invoke(app, ["costs", "--model", str(tiny), "--device", "cpu", "--samples", "1",
                                     "--max-new-tokens", "4", "--schemes", "none", "--out", str(out), "--force"])
    assert_refused(result, "No space left on device")
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["costs.yaml"]


@pytest.mark.parametrize(("target", "fragment"), [
    (lambda tmp: tmp / "folder", "is a directory"),
    (lambda tmp: tmp / "file.txt" / "out.yaml", "is not a directory"),
    (lambda tmp: tmp / "notes.txt", "is not a skipsearch profile"),
])
def test_an_out_that_cannot_or_must_not_be_written_is_one_line_before_any_work(tmp_path, target, fragment):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("my notes, not a profile")
    before = _snapshot(tmp_path)
    result = runner.invoke(app, ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", str(CPU_COSTS),
                                 "--out", str(target(tmp_path))])
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


def test_a_temporary_file_left_by_a_killed_writer_is_never_read_and_does_not_block_the_next_write(tmp_path):
    out = tmp_path / "out.yaml"
    (tmp_path / ".out.yaml.4242.deadbeef.tmp").write_text(GOOD[: len(GOOD) // 3])  # killed before its rename
    result = runner.invoke(app, ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", str(CPU_COSTS),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert load_profile(out).method == "layer-skip"


# -- issue 42: one overwrite rule for every writer ------------------------------------------------------------------
def _there(kind: str) -> Callable[[Path], Path]:
    """What is at the target before the command: a file (or folder) of ``kind``."""
    def make(tmp: Path) -> Path:
        target = tmp / "target"
        if kind == "profile":
            shutil.copy(TPE_PROFILE, target)
        elif kind == "costs":
            shutil.copy(CPU_COSTS, target)
        elif kind == "notes":
            target.write_text("# my notes: not a report\n")
        elif kind == "export":
            target.mkdir()
            (target / "export.yaml").write_text("# skipsearch export (schema v1)\nschema_version: 1\n")
        else:  # a folder of someone's files
            target.mkdir()
            (target / "notes.txt").write_text("mine")
        return target
    return make


ANALYSIS = ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.7", "--c", "0.3", "--cs", "0.2"]
# (id, the command around its target, what is there first, a fragment of the one error line)
WRITER_INPUTS = [
    ("costs-over-a-profile", ["costs", "--model", "{model}", "--device", "cpu", "--out", "{}"], _there("profile"),
     "holds a skipsearch profile, not a skipsearch cost file"),  # row 1
    ("costs-forced-over-a-profile", ["costs", "--model", "{model}", "--device", "cpu", "--out", "{}", "--force"],
     _there("profile"), "holds a skipsearch profile, not a skipsearch cost file"),
    ("roofline-over-a-profile", ["costs", "--roofline", "h100-sxm", "--model", "{model}", "--out", "{}", "--force"],
     _there("profile"), "holds a skipsearch profile, not a skipsearch cost file"),
    ("costs-over-a-cost-file-unasked", ["costs", "--model", "{model}", "--device", "cpu", "--out", "{}"],
     _there("costs"), "holds a skipsearch cost file already; --force replaces it"),
    ("plan-out-over-a-cost-file", ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", str(CPU_COSTS),
                                   "--out", "{}", "--force"], _there("costs"),
     "holds a skipsearch cost file, not a skipsearch profile"),
    ("plan-out-over-a-profile-unasked", ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs",
                                         str(CPU_COSTS), "--out", "{}"], _there("profile"),
     "holds a skipsearch profile already; --force"),
    ("plan-report-over-a-profile", [*ANALYSIS, "--report", "{}", "--force"], _there("profile"),
     "holds a skipsearch profile, not a skipsearch plan report"),
    ("plan-plot-over-notes", [*ANALYSIS, "--plot", "{}", "--force"], _there("notes"), "is not a PNG plot"),
    ("bench-report-over-a-profile", ["bench", "--model", "{model}", "--peers", "hf-greedy", "--report", "{}",
                                     "--force"], _there("profile"),
     "holds a skipsearch profile, not a skipsearch bench report"),
    ("bench-json-over-a-cost-file", ["bench", "--model", "{model}", "--peers", "hf-greedy", "--json-out", "{}",
                                     "--force"], _there("costs"),
     "holds a skipsearch cost file, not a skipsearch bench JSON report"),
    ("optimize-out-over-a-cost-file", ["optimize", "--model", "{model}", "--budget", "1", "--out", "{}", "--force"],
     _there("costs"), "holds a skipsearch cost file, not a skipsearch profile"),
    ("export-over-a-folder", ["export", "--profile", str(TPE_PROFILE), "--engine", "hf", "--out", "{}", "--force"],
     _there("folder"), "is a directory that holds no skipsearch export"),
    ("export-over-a-profile", ["export", "--profile", str(TPE_PROFILE), "--engine", "hf", "--out", "{}", "--force"],
     _there("profile"), "exists and is not a directory"),
    ("export-over-an-export-unasked", ["export", "--profile", str(TPE_PROFILE), "--engine", "hf", "--out", "{}"],
     _there("export"), "holds a skipsearch export already; --force replaces it"),
]


@pytest.mark.parametrize(("argv", "make", "fragment"), [c[1:] for c in WRITER_INPUTS],
                         ids=[c[0] for c in WRITER_INPUTS])
def test_a_file_of_another_kind_or_not_asked_for_is_kept_byte_for_byte(tmp_path, tiny, monkeypatch, argv, make,
                                                                      fragment):
    target = make(tmp_path)
    before = _snapshot(tmp_path)
    _no_model(monkeypatch)
    assert_refused(runner.invoke(app, _fill(argv, target, model=str(tiny))), fragment)
    assert _snapshot(tmp_path) == before


def test_a_file_of_the_same_kind_is_replaced_when_asked(tmp_path):
    out = _there("profile")(tmp_path)
    result = runner.invoke(app, ["plan", "profile", "--profile", str(TPE_PROFILE), "--costs", str(CPU_COSTS),
                                 "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert load_profile(out).method == "layer-skip" and out.read_bytes() != TPE_PROFILE.read_bytes()


# -- issue 42: one bound per numeric option, declared with it (--help shows it) ---------------------------------------
OPTION_INPUTS = [  # (id, the arguments, a fragment of the one error line)
    ("optimize-max-k-10^9", ["optimize", "--model", "{model}", "--max-k", "1000000000"],
     "'--max-k': Input should be less than or equal to 4095"),  # row 4
    ("plan-max-m-and-n-10^7", [*ANALYSIS, "--max-m", "10000000", "--max-n", "10000000"],
     "'--max-m': Input should be less than or equal to 64"),  # row 5
    ("plan-max-n-10^7", [*ANALYSIS, "--max-n", "10000000"], "'--max-n': Input should be less than or equal to 16"),
    ("plan-max-n-negative", [*ANALYSIS, "--max-n", "-1"], "'--max-n'"),
    ("decode-temperature-inf", ["decode", "--model", "{model}", "--prompt", "hi", "--temperature", "inf"],
     "'--temperature': inf is not a finite number"),  # row 7
    ("decode-temperature-nan", ["decode", "--model", "{model}", "--prompt", "hi", "--temperature", "nan"],
     "'--temperature'"),
    ("decode-temperature-negative", ["decode", "--model", "{model}", "--prompt", "hi", "--temperature", "-1"],
     "'--temperature'"),
    ("decode-top-p-inf", ["decode", "--model", "{model}", "--prompt", "hi", "--top-p", "inf"], "'--top-p'"),
    ("decode-threads-10^9", ["decode", "--model", "{model}", "--prompt", "hi", "--threads", "1000000000"],
     "'--threads': Input should be less than or equal to 1024"),
    ("costs-threads-10^9", ["costs", "--model", "{model}", "--threads", "1000000000"], "'--threads'"),
    ("bench-threads-10^9", ["bench", "--model", "{model}", "--threads", "1000000000"], "'--threads'"),
    ("optimize-max-skip-ratio-nan", ["optimize", "--model", "{model}", "--max-skip-ratio", "nan"],
     "'--max-skip-ratio'"),
    ("plan-alpha-nan", ["plan", "hierarchical", "--alpha", "nan", "--beta", "0.7", "--c", "0.3", "--cs", "0.2"],
                        "'--alpha'"),
    ("plan-c-inf", ["plan", "hierarchical", "--alpha", "0.8", "--beta", "0.7", "--c", "inf", "--cs", "0.2"],
     "'--c': inf is not a finite number"),
    ("decode-kernel-block-10^8", ["decode", "--model", "{model}", "--prompt", "hi", "--kernel", "inductor-c100000000"],
     "unknown kernel 'inductor-c100000000'"),
    ("decode-kernel-block-99", ["decode", "--model", "{model}", "--prompt", "hi", "--kernel", "inductor-c99"],
     "kernel block must be one of 1, 2, 4, 8, 16 tokens, got 99"),
    ("export-engine-escapes", ["export", "--profile", str(TPE_PROFILE), "--engine", "\x1b[2Jvllm", "--out", "{out}"],
     "unknown engine '\\x1b[2Jvllm'"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in OPTION_INPUTS], ids=[c[0] for c in OPTION_INPUTS])
def test_a_numeric_option_out_of_its_bound_is_one_line_before_any_work(tmp_path, tiny, monkeypatch, argv, fragment):
    before = _snapshot(tmp_path)
    _no_model(monkeypatch)
    result = runner.invoke(app, [a.format(model=str(tiny), out=str(tmp_path / "out")) for a in argv])
    assert_refused(result, fragment)
    assert _snapshot(tmp_path) == before


def test_each_bound_is_shown_in_help():
    for command, shown in ((["plan", "hierarchical"], ("1<=x<=64", "0<=x<=16")), (["optimize"], ("x<=4095",)),
                           (["decode"], ("x>=0", "1<=x<=1024"))):
        text = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        for bound in shown:
            assert bound in text, (command, bound)


# -- Ctrl-C at 1 s, 5 s and 15 s in every long command, and two workers on one study ---------------------------------
@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str
    still_running: bool  # the command was still at work when the signal came (not finished, not failed)


def _run(argv: list[str], *, at: float, after_start: bool, cwd: Path, sig: int = signal.SIGINT) -> Done:
    """Run ``skipsearch argv``; Ctrl-C it ``at`` seconds after it started (``after_start``: after its first line
    of output, so that the signal lands in its work however slowly the machine imports), as a terminal sends it
    (``sig``: or SIGTERM, as ``timeout`` or a scheduler sends it)."""
    proc = subprocess.Popen([sys.executable, "-m", "skipsearch", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    first = threading.Event()

    def pump(name: str) -> None:
        for line in getattr(proc, name):
            out[name].append(line)
            first.set()

    pumps = [threading.Thread(target=pump, args=(n,), daemon=True) for n in out]
    for t in pumps:
        t.start()
    _wait_for_python(proc)
    if after_start:
        first.wait(timeout=600)
    time.sleep(at)
    still = proc.poll() is None
    proc.send_signal(sig)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in pumps:
        t.join(timeout=30)
    return Done(proc.returncode, "".join(out["stdout"]), "".join(out["stderr"]), still)


def _wait_for_python(proc: subprocess.Popen, timeout: float = 600) -> None:
    """Until the child's Python handles SIGINT itself (Linux: its SigCgt mask), or it ended: a Ctrl-C in the
    moments before, while the interpreter starts, ends it as the shell's default does, before skipsearch runs."""
    status = Path(f"/proc/{proc.pid}/status")
    deadline = time.monotonic() + timeout
    while proc.poll() is None and status.exists() and time.monotonic() < deadline:
        caught = next((ln.split()[1] for ln in status.read_text().splitlines() if ln.startswith("SigCgt:")), "0")
        if int(caught, 16) & (1 << (signal.SIGINT - 1)):
            return
        time.sleep(0.01)


def _tiny_profile(model: Path) -> str:
    return yaml.safe_dump({"schema_version": 3, "model": {"name": str(model), "num_layers": 4},
                           "method": "layer-skip", "draft": {"skip_attn": [1], "max_draft_tokens": 2}})


INTERRUPTED = ["optimize", "bench", "costs", "plan-tracing", "decode-many"]
# what a bench left at its --report and --json before (--force replaces a bench report, and only a bench report)
EARLIER_REPORT = "# skipsearch bench: an earlier report\n"
EARLIER_JSON = '{"format": "skipsearch-bench", "earlier": true}\n'
AT = [(1.0, False), (5.0, True), (15.0, True)]  # seconds; from the start, or from the command's first output
TERMINATED = ["optimize", "decode-many"]  # also sent SIGTERM, 5 s after their first output


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny):
    """Every long command Ctrl-C'd at 1 s, 5 s and 15 s, and two workers on one study, as real processes run
    side by side. Each has a good file at its target first. -> {case: (Done, folder)}."""
    from skipsearch.engine.measuring import measure_cost_profile
    from skipsearch.files.cost_profile import save_costs
    from skipsearch.model.loader import load_model

    base = tmp_path_factory.mktemp("interrupted")
    sm = load_model(str(tiny), device="cpu", dtype="float32")
    with work_clock(sm):
        tiny_costs = save_costs(measure_cost_profile(sm, list(range(3, 40)), repeats=1), base / "tiny-costs.yaml")
    (base / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"def f{i} ( n ) : return n"}) + "\n"
                                                for i in range(3000)))
    m = str(tiny)
    commands = {
        "optimize": (["optimize", "--model", m, "--strategy", "tpe", "--budget", "100000", "--objective",
                      "surrogate", "--n-prompts", "2", "--max-new-tokens", "8", "--dataset", "humaneval",
                      "--study", "study", "--out", "target.yaml", "--force"], "profile"),
        "bench": (["bench", "--model", m, "--profiles", "tiny.yaml", "--peers", "hf-greedy", "--n-prompts", "80",
                   "--max-new-tokens", "400", "--repeats", "5", "--sweep-prompts", "0", "--report", "target.md",
                   "--json-out", "target.json", "--force"], "report"),
        "costs": (["costs", "--model", m, "--device", "cpu", "--samples", "100000", "--schemes", "none",
                   "--out", "target.yaml", "--force"], "costs"),
        "plan-tracing": (["plan", "profile", "--profile", "tiny.yaml", "--costs", str(tiny_costs), "--n-prompts", "80",
                          # the longest of these prompts, 326 tokens, and 600 more fit the tiny model's 1024
                          "--max-new-tokens", "600", "--out", "target.yaml", "--force"], "profile"),
        "decode-many": (["decode", "--model", m, "--prompts-file", str(base / "prompts.jsonl"), "--json",
                         "--max-new-tokens", "200"], "jsonl"),
    }
    jobs = {}
    for name, (argv, kind) in commands.items():
        for at, after_start in AT:
            folder = base / f"{name}-{at:g}"
            folder.mkdir()
            (folder / "tiny.yaml").write_text(_tiny_profile(tiny))
            if kind == "profile":
                (folder / "target.yaml").write_text(_tiny_profile(tiny))
            elif kind == "costs":
                shutil.copy(tiny_costs, folder / "target.yaml")
            elif kind == "report":
                (folder / "target.md").write_text(EARLIER_REPORT)
                (folder / "target.json").write_text(EARLIER_JSON)
            jobs[f"{name}-{at:g}s"] = (argv, at, after_start, folder, signal.SIGINT)
        if name in TERMINATED:
            folder = base / f"{name}-sigterm"
            folder.mkdir()
            (folder / "tiny.yaml").write_text(_tiny_profile(tiny))
            (folder / "target.yaml").write_text(_tiny_profile(tiny))
            jobs[f"{name}-sigterm"] = (argv, 5.0, True, folder, signal.SIGTERM)
    # two workers on one study: two searches started together on a new study, and a third, of another strategy,
    # while the study exists
    two = base / "two-workers"
    two.mkdir()
    worker = ["optimize", "--model", m, "--strategy", "tpe", "--budget", "10", "--objective", "surrogate",
              "--n-prompts", "1", "--max-new-tokens", "8", "--dataset", "humaneval", "--study", "study"]
    results = {}
    with ThreadPoolExecutor(max_workers=len(jobs) + 2) as pool:  # all at once: most of the time is waiting
        futures = {case: pool.submit(_run, argv, at=at, after_start=after, cwd=folder, sig=sig)
                   for case, (argv, at, after, folder, sig) in jobs.items()}
        workers = [pool.submit(subprocess.run, [sys.executable, "-m", "skipsearch", *worker, "--out", f"w{i}.yaml"],
                               capture_output=True, text=True, env=ENV, cwd=two, timeout=900) for i in range(2)]
        for case, f in futures.items():
            results[case] = (f.result(), jobs[case][3])
        results["two-workers"] = ([w.result() for w in workers], two)
    other = subprocess.run([sys.executable, "-m", "skipsearch", *worker, "--strategy", "bayes", "--out", "o.yaml"],
                           capture_output=True, text=True, env=ENV, cwd=two, timeout=900)
    results["another-strategy-on-it"] = (other, two)
    return results


def _whole(path: Path, kind: str) -> None:
    """``path`` is a whole file of its kind: the good one put there first, or a complete new one."""
    if kind == "profile":
        load_profile(path)
    elif kind == "costs":
        load_costs(path)
    elif kind == "jsonl":
        for line in path.read_text().splitlines():
            assert set(json.loads(line)) >= {"prompt_token_ids", "token_ids", "text", "stats"}


@pytest.mark.parametrize("case", [f"{name}-{at:g}s" for name in INTERRUPTED for at, _ in AT])
def test_ctrl_c_is_exit_130_without_a_traceback_and_loses_nothing(interrupted, case):
    done, folder = interrupted[case]
    assert done.still_running, f"{case}: the command had ended before Ctrl-C: {done.stderr[-2000:]}"
    # 130, or an end by SIGINT after the "interrupted" line (seen once, under heavy load, with the model loading
    # when the signal came): a shell reports both as exit status 130
    assert done.returncode in (130, -signal.SIGINT), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-3000:]
    assert [ln for ln in done.stderr.splitlines() if ln.strip()][-1].startswith("interrupted"), done.stderr[-2000:]
    name = case.rsplit("-", 1)[0]
    if name in ("optimize", "plan-tracing"):
        _whole(folder / "target.yaml", "profile")
    elif name == "costs":
        _whole(folder / "target.yaml", "costs")
    elif name == "bench":
        reports = (folder / "target.md").read_text(), (folder / "target.json").read_text()
        assert reports == (EARLIER_REPORT, EARLIER_JSON) or (
            reports[0].startswith("#") and json.loads(reports[1]))
    else:
        stdout = folder / "stdout.jsonl"
        stdout.write_text(done.stdout)
        _whole(stdout, "jsonl")  # every result written before Ctrl-C is whole
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no writer left its temporary file


@pytest.mark.parametrize("name", TERMINATED)
def test_sigterm_is_taken_as_ctrl_c(interrupted, name):
    """SIGTERM (``timeout``, a scheduler stopping the job): what Ctrl-C does, not an end on the spot that keeps
    nothing and leaves whatever the command started running."""
    done, folder = interrupted[f"{name}-sigterm"]
    assert done.still_running, f"{name}: the command had ended before SIGTERM: {done.stderr[-2000:]}"
    # 130, or an end by SIGINT after the "interrupted" line, as for Ctrl-C above: a KeyboardInterrupt re-delivered
    # from a finalizer (__main__._interrupt_again) as the process exits; a shell reports both as 130
    assert done.returncode in (130, -signal.SIGINT), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-3000:]
    assert [ln for ln in done.stderr.splitlines() if ln.strip()][-1].startswith("interrupted"), done.stderr[-2000:]
    if name == "optimize":
        _whole(folder / "target.yaml", "profile")
    else:
        (folder / "stdout.jsonl").write_text(done.stdout)
        _whole(folder / "stdout.jsonl", "jsonl")


def test_a_compile_forked_beside_a_process_dies_with_it_however_it_dies(tmp_path):
    """``interrupts.die_with_parent``: a process that forked a child (as ``precompiled.build_aside`` does) and is
    then killed outright, SIGKILL, which runs no clean-up: the child goes with it (Linux), not on compiling."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the kernel's parent-death signal is Linux's")
    code = ("import os, sys, time\nfrom skipsearch.interrupts import die_with_parent\nparent = os.getpid()\n"
            "pid = os.fork()\nif pid == 0:\n    die_with_parent(parent)\n    time.sleep(120)\n    os._exit(0)\n"
            "print(pid, flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    child = int(proc.stdout.readline())
    time.sleep(0.5)  # the child has set its signal by now (it is fine either way: it checks its parent after)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{child}/stat").read_text() if Path(f"/proc/{child}/stat").exists() else ""
        if stat.split(")")[-1].split()[:1] == ["Z"]:
            break  # gone, waiting only for init to reap it
        time.sleep(0.1)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z", "the child outlived its parent"


def test_two_workers_on_one_study_both_finish_and_a_third_of_another_strategy_is_one_line(interrupted):
    (first, second), folder = interrupted["two-workers"]
    for w in (first, second):
        assert w.returncode == 0 and "Traceback" not in w.stderr, w.stderr[-2000:]
    load_profile(folder / "w0.yaml")
    load_profile(folder / "w1.yaml")
    storage = f"sqlite:///{folder / 'study' / 'study.db'}"
    trials = optuna.load_study(study_name="study", storage=storage).get_trials(deepcopy=False)
    assert trials and optuna.trial.TrialState.RUNNING not in {t.state for t in trials}
    other, _ = interrupted["another-strategy-on-it"]
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-2000:]
    lines = [ln for ln in other.stderr.splitlines() if ln.strip()]
    assert lines == ["error: study study [tpe] was made by strategy 'tpe', not 'bayes': resume it with 'tpe' or start "
                     "another study"], other.stderr[-2000:]


# -- the count ------------------------------------------------------------------------------------------------------
HOSTILE_INPUTS = (len(FILE_INPUTS) + len(MODEL_INPUTS) + 1 + len(COSTS_INPUTS) + len(STUDY_INPUTS)
                  + len(RESUMED_INPUTS) + len(TRIAL_INPUTS) + len(PROMPT_FILE_INPUTS) + 1 + len(DATASET_INPUTS)
                  + len(STORAGE_INPUTS) + 2 + 3 + 1 + len(INTERRUPTED) * len(AT) + 2
                  + 1 + len(WRITER_INPUTS) + len(OPTION_INPUTS))  # issue 42: row 6, writers, options


def test_the_count():
    """The issue asks for at least 60 hostile or broken inputs; each is one case above (a profile input counts
    once however many commands read it)."""
    assert HOSTILE_INPUTS >= 60, HOSTILE_INPUTS


def _interpreter_start() -> float:
    """Seconds this machine takes to start a bare interpreter, now: the slowest of three. Before that, Python itself
    is starting (runpy has not yet imported skipsearch) and no code of ours can hold an interrupt back; on a slow or
    busy machine 50 ms can still land there (once measured at the start of a run and kept, it was too short later
    on, under the load of the suite's other worker). The delays below count from it, so that each lands in
    skipsearch's own start-up on any machine."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=ENV, cwd=ROOT, check=True)
        times.append(time.perf_counter() - start)
    return max(times)


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8, 1.5])
def test_ctrl_c_while_the_cli_imports_is_exit_130_without_a_traceback(delay):
    # Wherever in the start-up imports the signal lands (numpy's C initialisation under scipy included, where an
    # interrupt once surfaced as an AttributeError), the verdict is the same: the delay only moves the landing point
    up = _interpreter_start()
    proc = subprocess.Popen([sys.executable, "-m", "skipsearch", "methods"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    time.sleep(up + delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it had finished before the signal: nothing to check
        return
    assert proc.returncode in (130, -signal.SIGINT), err[-2000:]
    assert "Traceback" not in err and "Error" not in err, err[-2000:]


def test_ctrl_c_turned_into_a_bad_input_error_by_native_code_is_still_exit_130(tmp_path, tiny):
    # CI saw it: Ctrl-C landing inside safetensors' reader came back out of it as a ValueError ("could not determine
    # the shape of object type 'torch.storage.UntypedStorage'"), which the CLI reported as unreadable weights, exit 2.
    # Here the reader is replaced by one that does the same, deterministically: the signal is delivered to the
    # process inside it and the KeyboardInterrupt comes back out as the reader's own error.
    script = (
        "import os, signal, sys\n"
        "import skipsearch.model.loader as loader\n"
        "from skipsearch.checkpoints import ModelError\n"
        "def reader(path):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(10**7): pass\n"
        "    except KeyboardInterrupt:\n"
        "        raise ModelError(f'cannot read the weights in {path}: could not determine the shape') from None\n"
        "    raise AssertionError('the signal never arrived')\n"
        "loader.weights_fingerprint = reader\n"
        "from skipsearch.__main__ import main\n"
        "sys.argv = ['skipsearch', 'decode', '--model', sys.argv[1], '--prompt', 'def f(n):',\n"
        "            '--max-new-tokens', '4']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tiny)], capture_output=True, text=True, env=ENV,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 130, done.stderr[-2000:]
    assert [ln for ln in done.stderr.splitlines() if ln.strip()][-1] == "interrupted", done.stderr[-2000:]
    assert "cannot read" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]

