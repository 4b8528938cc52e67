"""Hardware named in every profile and cost file, and the one line that says a file was measured elsewhere."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.hardware import Hardware, mismatch, probe, recorded
from skipsearch.profile import Environment, ModelRef, Profile, load_profile, save_profile

OTHER_CPU = {"cpu_model": "AMD EPYC 7B12", "cpu_capability": "DEFAULT", "threads": 2}


def test_this_machine_is_probed_into_every_new_environment():
    here = probe("cpu")
    assert here.cpu_capability and here.threads and not here.gpu
    env = Environment.current("cpu")
    assert recorded(env) == here


def test_the_line_appears_when_the_hardware_differs_and_is_silent_when_it_matches():
    here = Hardware(cpu_model="Intel Xeon", cpu_capability="AVX512", threads=2)
    same = Environment(**here.to_environment())
    assert mismatch(same, here, what="profile p.yaml", replan="skipsearch plan --profile p.yaml --costs C") is None
    line = mismatch(Environment(**OTHER_CPU), here, what="profile p.yaml",
                    replan="skipsearch plan --profile p.yaml --costs C")
    assert line.count("\n") == 0
    assert "measured on AMD EPYC 7B12 (DEFAULT, 2 threads); this machine is Intel Xeon (AVX512, 2 threads)" in line
    assert "`skipsearch plan --profile p.yaml --costs C`" in line
    fewer = mismatch(Environment(**{**here.to_environment(), "threads": 1}), here, what="x", replan="r")
    assert fewer is not None and "1 thread)" in fewer
    gpu = Hardware(gpu_name="NVIDIA H100", gpu_capability="9.0")
    assert "NVIDIA H100 (compute capability 9.0)" in mismatch(Environment(**here.to_environment()), gpu,
                                                              what="x", replan="r")
    old = mismatch(Environment(device_name="cpu"), here, what="profile old.yaml", replan="r")
    assert "unknown hardware" in old and old.count("\n") == 0
    assert "unknown hardware" in mismatch(None, here, what="x", replan="r")


def test_a_profile_keeps_its_hardware_through_a_round_trip(tmp_path):
    prof = Profile(model=ModelRef(name="m", num_layers=4), method="layer-skip", draft=DraftConfig(max_draft_tokens=0),
                   environment=Environment(device="cpu", **OTHER_CPU))
    back = load_profile(save_profile(prof, tmp_path / "p.yaml"))
    assert recorded(back.environment) == Hardware(**OTHER_CPU)


def _decode(tiny_checkpoint, tmp_path, environment):
    prof = Profile(model=ModelRef(name=str(tiny_checkpoint), num_layers=4), method="layer-skip",
                   draft=DraftConfig(skip_attn=(1,), max_draft_tokens=2), environment=environment)
    path = save_profile(prof, tmp_path / "p.yaml")
    result = CliRunner().invoke(app, ["decode", "--profile", str(path), "--device", "cpu", "--prompt", "hi",
                                      "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output  # a warning, never a refusal
    return [ln for ln in result.stderr.splitlines() if "measured on" in ln]


def test_decode_of_a_profile_made_elsewhere_warns_in_one_line_and_still_decodes(tiny_checkpoint, tmp_path):
    lines = _decode(tiny_checkpoint, tmp_path, Environment(device="cpu", **OTHER_CPU))
    assert len(lines) == 1 and lines[0].startswith("warning: profile ") and "AMD EPYC 7B12" in lines[0]
    assert "skipsearch plan profile --profile" in lines[0]


def test_decode_of_a_profile_made_here_is_silent(tiny_checkpoint, tmp_path):
    assert _decode(tiny_checkpoint, tmp_path, Environment.current("cpu")) == []


def test_decode_of_an_old_profile_says_its_hardware_is_unknown(tiny_checkpoint, tmp_path):
    lines = _decode(tiny_checkpoint, tmp_path, Environment(device="cpu", device_name="cpu"))
    assert len(lines) == 1 and "unknown hardware" in lines[0]


@pytest.mark.parametrize("field", ["cpu_capability", "cpu_model"])
def test_each_field_decides(field):
    here = Hardware(cpu_model="X", cpu_capability="AVX2", threads=4)
    other = dataclasses.replace(here, **{field: "other"})
    assert mismatch(Environment(**other.to_environment()), here, what="w", replan="r") is not None


def test_decode_of_a_hand_written_profile_gives_no_hardware_note(tiny_checkpoint, tmp_path):
    from skipsearch.profile import Measured

    prof = Profile(model=ModelRef(name=str(tiny_checkpoint), num_layers=4), method="layer-skip",
                   draft=DraftConfig(skip_attn=(1,), max_draft_tokens=2), measured=Measured(source="hand"),
                   environment=Environment(device="cpu", **OTHER_CPU))
    path = save_profile(prof, tmp_path / "p.yaml")
    result = CliRunner().invoke(app, ["decode", "--profile", str(path), "--device", "cpu", "--prompt", "hi",
                                      "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "measured on" not in result.stderr  # it has no figures that could fail to hold here
