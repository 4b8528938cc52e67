"""The tested set of versions (skipsearch/constraints.txt) and the KV-cache argument name the adapter passes
to the installed transformers."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import torch
from packaging.requirements import Requirement
from typer.testing import CliRunner

from skipsearch import __version__, tested
from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.engine.decoding import generate, hf_generate
from skipsearch.engine.surrogate import trace

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return [Requirement(r) for r in reqs if Requirement(r).name != "skipsearch"]


# -- the lock ---------------------------------------------------------------------------------------------
def test_the_lock_pins_every_declared_dependency_inside_its_declared_range():
    lock = tested.locked()
    for req in _declared():
        name = tested.normalize(req.name)
        assert name in lock, f"{req.name} is declared in pyproject but not locked"
        assert req.specifier.contains(lock[name], prereleases=True), f"locked {name}=={lock[name]} is outside {req}"


def test_every_lock_line_is_an_exact_pin_and_the_key_packages_are_there():
    lines = [ln for ln in tested.lock_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9-]*==[0-9][^\s=]*", ln) for ln in lines), lines
    assert {"torch", "transformers", "optuna", "torchao", "pytest", "build"} <= set(tested.locked())
    assert "+" not in tested.locked()["torch"]  # torch==2.13.0 also resolves where the +cpu index is not set up


def test_lock_id_names_the_file_and_a_hash_of_its_bytes():
    import hashlib

    digest = hashlib.sha256((ROOT / "skipsearch" / "constraints.txt").read_bytes()).hexdigest()[:10]
    assert tested.lock_id() == f"constraints.txt {digest}"


def test_a_build_label_matches_the_lock_but_another_version_does_not():
    assert tested.same_version("2.13.0+cpu", "2.13.0")
    assert tested.same_version("2.13.0", "2.13.0")
    assert not tested.same_version("2.13.1", "2.13.0")
    assert not tested.same_version("2.13.0", "2.13.0+cu128")


def test_compare_reports_each_kind_of_difference(monkeypatch):
    monkeypatch.setattr(tested, "locked", lambda: {"torch": "2.13.0", "transformers": "5.24.0", "optuna": "5.0.0"})
    monkeypatch.setattr(tested, "installed",
                        lambda: {"torch": "2.13.0+cpu", "transformers": "5.25.0", "optuna": "5.0.0", "extra": "1.0"})
    result = tested.compare()
    assert result.differ == (("transformers", "5.25.0", "5.24.0"),)
    assert result.unlocked == (("extra", "1.0"),)
    assert not result.exact
    line = tested.describe(result)
    assert "2 package(s) differ" in line and "transformers 5.25.0 (tested 5.24.0)" in line and "extra 1.0" in line


def test_a_kept_torch_and_what_it_brought_are_not_faults(monkeypatch):
    monkeypatch.setattr(tested, "locked", lambda: {"torch": "2.13.0", "sympy": "1.14.0", "optuna": "5.0.0"})
    monkeypatch.setattr(tested, "installed", lambda: {"torch": "2.5.1+cu124", "sympy": "1.13.1", "optuna": "5.0.0",
                                                      "nvidia-cublas-cu12": "12.4.5.8"})
    monkeypatch.setattr(tested, "_requirement_closure", lambda root, have: {"torch", "sympy", "nvidia-cublas-cu12"})
    result = tested.compare(kept_torch=True)
    assert result.exact and {n for n, *_ in result.kept} == {"torch", "sympy", "nvidia-cublas-cu12"}
    assert "kept your torch 2.5.1+cu124" in tested.describe(result)
    assert tested.constraints(kept_torch=True) == "optuna==5.0.0\n"  # setup.sh leaves torch's own pins to it
    assert tested.constraints() == "sympy==1.14.0\noptuna==5.0.0\n"  # torch is pinned by setup.sh itself
    assert not tested.compare().exact


def test_freeze_writes_a_lock_that_reads_back(monkeypatch):
    monkeypatch.setattr(tested, "installed", lambda: {"torch": "2.13.0+cpu", "pyyaml": "6.0.4"})
    text = tested.freeze()
    monkeypatch.setattr(tested, "lock_text", lambda: text)
    assert tested.locked() == {"pyyaml": "6.0.4", "torch": "2.13.0"}


def test_version_names_the_package_and_its_tested_set():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert f"skipsearch {__version__}" in result.output
    assert f"tested set: {tested.lock_id()}" in result.output
    assert "this environment:" in result.output


# -- the KV-cache argument ------------------------------------------------------------------------------------
def test_the_cache_goes_in_under_a_name_the_installed_transformers_takes(tiny_sm):
    model_params = inspect.signature(type(tiny_sm.hf).forward).parameters
    layer_params = inspect.signature(type(tiny_sm.layers[0]).forward).parameters
    (model_name,) = tiny_sm.cache_kwargs(None)
    (layer_name,) = tiny_sm.cache_kwargs(None, layer=True)
    assert model_name in model_params and layer_name in layer_params
    if "cache" in model_params:  # the name the deprecation names, wherever it exists
        assert model_name == "cache"


def test_no_cache_argument_deprecation_on_any_path_that_passes_a_cache(tiny_sm):
    prompt, config = [3, 5, 7, 11, 13], DraftConfig(skip_attn=(1,), skip_mlp=(2,), max_draft_tokens=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(tiny_sm, prompt, config=config, max_new_tokens=12).token_ids
        assert out == hf_generate(tiny_sm, prompt, max_new_tokens=12)  # greedy identity on this transformers
        trace(tiny_sm, prompt, out[:6], config)
        cache = tiny_sm.new_cache()
        tiny_sm.forward(torch.tensor(prompt), start=0, cache=cache)
        tiny_sm.hidden_states(torch.tensor(out[:2]), start=len(prompt), cache=cache)
        tiny_sm.crop(cache, len(prompt))
        hidden = torch.zeros(2, tiny_sm.hf.config.hidden_size)
        tiny_sm.run_layer(1, hidden, torch.tensor([len(prompt), len(prompt)]), cache)
        frame = tiny_sm.frame(start=len(prompt), length=2)
        tiny_sm.run_layers(hidden, list(tiny_sm.layers)[:2], frame=frame, context=tiny_sm.prefix_kv(cache, len(prompt)))
    about_cache = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert not about_cache


def test_the_wheel_ships_every_data_file_in_the_package():
    # setuptools packs only .py files unless package-data names the rest: the lock, read by `skipsearch --version`
    # and setup.sh, must be in the wheel.
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {f"{pkg.replace('.', '/')}/{pattern}" for pkg, patterns in data.items() for pattern in patterns}
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "skipsearch").rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert "skipsearch/constraints.txt" in files
    assert all(any(Path(f).match(pattern) for pattern in shipped) for f in files), (files, shipped)
