"""The GPU side of #65 as far as a CPU can check it: the ``cudagraph`` kernel's registry entry and refusals, its
runner (inductor's graphs with CUDA graphs asked for; on a CPU inductor skips the capture) giving HF greedy's
tokens, cost files of an architecture with random weights, the H200 roofline, and the probe's comparison table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, make_tiny_model, tiny_llama
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.kernels import REGISTRY, check_kernel, parse_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import gpu_kit  # noqa: E402  (a script, not a package module)

runner = CliRunner()


def test_the_kernel_is_registered_with_blocks():
    assert "cudagraph" in REGISTRY
    assert parse_kernel("cudagraph").label == "cudagraph-c8"
    assert parse_kernel("cudagraph-c4").chunk == 4
    assert parse_kernel("cudagraph").compiled


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_it_is_refused_off_a_gpu_in_one_line(device):
    with pytest.raises(ConfigError, match="runs on a CUDA GPU only"):
        check_kernel(parse_kernel("cudagraph"), device)


def test_it_is_refused_where_cuda_is_asked_for_but_absent(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        check_kernel(parse_kernel("cudagraph"), "cuda")


def test_the_cli_refuses_it_before_the_model_loads(tmp_path):
    result = runner.invoke(app, ["costs", "--model", str(tmp_path / "absent"), "--kernel", "cudagraph",
                                 "--device", "cpu", "--out", str(tmp_path / "c.yaml")])
    assert_one_line_error(result, "runs on a CUDA GPU only")


def test_its_runner_gives_hf_greedy_tokens_and_copies_its_logits_out():
    """On a CPU, inductor compiles the same graphs and skips the capture: the runner's own parts (the settings, the
    logits copied out of the graph's memory, blocks and one-token steps) decode HF greedy's tokens."""
    from skipsearch.engine.decoding import generate, hf_generate
    from skipsearch.kernels import cudagraph

    sm = make_tiny_model(num_layers=2)
    runner_ = cudagraph.build(sm, parse_kernel("cudagraph-c4"), 64)
    assert runner_._copy_out and runner_._settings["triton.cudagraphs"] and not runner_._settings["freezing"]
    ids = torch.tensor([3, 5, 7, 9, 11], dtype=torch.long)
    one = runner_.forward(ids[:1], 0)
    again = runner_.forward(ids[:1], 0)
    assert one.data_ptr() != again.data_ptr()  # each call's logits are its own
    sm._runner = runner_  # what use_kernel would hold (use_kernel checks the device first)
    prompt = [3, 5, 7, 9, 11]
    out = generate(sm, prompt, max_new_tokens=12, drafter=None).token_ids
    assert tuple(out) == hf_generate(sm, prompt, max_new_tokens=12)


def _config_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "arch"
    tiny_llama().config.save_pretrained(folder)  # a config.json and no weights
    return folder


def test_costs_of_an_architecture_with_random_weights(tmp_path):
    out = tmp_path / "c.yaml"
    result = runner.invoke(app, ["costs", "--model", str(_config_dir(tmp_path)), "--random-weights", "--device",
                                 "cpu", "--schemes", "none", "--samples", "3", "--context-tokens", "40",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    from skipsearch.files.cost_profile import load_costs

    cp = load_costs(out)
    assert cp.run.context_tokens == 40 and cp.model.num_layers == 4 and cp.roofline is None
    assert cp.run.weights == "random:seed=0" and "weights: random:seed=0" in cp.describe()
    assert "random weights (seed 0)" in result.stderr


def test_random_weights_are_seeded_and_keep_the_architecture_fingerprint(tmp_path):
    from skipsearch.model.loader import random_model

    config = tiny_llama().config
    a, b = (random_model(config, name="t", device="cpu", dtype="float32", seed=3) for _ in range(2))
    c = random_model(config, name="t", device="cpu", dtype="float32", seed=4)
    wa, wb, wc = (m.hf.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    layout = [m.weights_fingerprint.split("-")[0] for m in (a, b, c)]  # the architecture half is the same
    assert layout[0] == layout[1] == layout[2] and a.weights_fingerprint != c.weights_fingerprint


@pytest.mark.parametrize(("args", "fragment"), [
    (["--context-tokens", "64"], "--context-tokens also with --random-weights"),
    (["--random-weights", "--roofline", "h200"], "--random-weights times a model"),
    (["--random-weights", "--context-tokens", "0"], "--context-tokens must be >= 1"),
])
def test_random_weights_misuse_is_one_line(tmp_path, args, fragment):
    result = runner.invoke(app, ["costs", "--model", str(_config_dir(tmp_path)), "--device", "cpu",
                                 "--out", str(tmp_path / "c.yaml"), *args])
    assert_one_line_error(result, fragment)


def test_an_alias_without_files_is_built_from_the_published_table(monkeypatch):
    from skipsearch.roofline.shapes import architecture_config

    config, source = architecture_config("llama-2-7b")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (32, 4096, 11008)
    assert source.startswith("published architecture")


def test_the_h200_roofline_and_the_probe_table(tmp_path):
    """A roofline of the H200 for llama-2-7b (no weights), compared with itself: every row 0% off."""
    out = tmp_path / "r.yaml"
    result = runner.invoke(app, ["costs", "--roofline", "h200", "--model", "llama-2-7b", "--dtype", "bfloat16",
                                 "--schemes", "int8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = gpu_kit.compare(out, out, tmp_path / "t.md")
    assert "| step, ms |" in table and "| v(8) |" in table and "| c, int8 draft |" in table
    rows = [line for line in table.splitlines()[2:]]
    assert rows and all(line.rstrip(" |").endswith("+0%") for line in rows), table


def test_the_probe_report_reads_what_the_stages_left(tmp_path):
    doc = {"model": "m", "architecture": "a", "dtype": "bfloat16", "kernel": "cudagraph-c8", "compile_seconds": 9.0,
           "prompts": 2, "prompt_tokens": 64, "max_new_tokens": 32, "repeats": 2, "rows": [
               {"method": "hf-greedy", "setting": "g", "ms_per_token": 20.0, "identical": 2, "lossless": 2,
                "prompts": 2},
               {"method": "hf-compiled", "setting": "c", "ms_per_token": 1.0, "identical": 1, "lossless": 2,
                "prompts": 2},
               {"method": "skipsearch-ar", "setting": "o", "ms_per_token": 2.0, "identical": 2, "lossless": 2,
                "prompts": 2}]}
    (tmp_path / "steps-bfloat16.json").write_text(json.dumps(doc))
    text = gpu_kit.probe_report(tmp_path, "h200", tmp_path / "p.md")
    assert "| bfloat16 | skipsearch-ar | o | 2.000 | 500.0 | 0.50x | 2/2 | 2/2 |" in text
    assert "random weights" in text.lower()


def test_the_probe_steps_time_each_loop_through_the_harness(tmp_path):
    """``gpu_kit steps`` on a CPU (eager kernel, no HF compiled): each loop's speed and verdicts, HF greedy's tokens."""
    doc = gpu_kit.steps(model=str(_config_dir(tmp_path)), device="cpu", dtype="float32", kernel="eager",
                        n_prompts=2, prompt_tokens=8, max_new_tokens=6, repeats=1, out=tmp_path / "s.json",
                        hf_compiled=False)
    assert [r["method"] for r in doc["rows"]] == ["hf-greedy", "skipsearch-ar"]
    assert all(r["identical"] == r["lossless"] == 2 and r["tokens"] == 12 for r in doc["rows"])
    assert json.loads((tmp_path / "s.json").read_text())["weights"] == "random (seed 0)"
