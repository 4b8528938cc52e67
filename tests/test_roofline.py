"""Roofline cost files (skipsearch.roofline): the arithmetic checked by hand on a tiny model, the file's schema,
re-planning every shipped profile with one, the one-line refusals, and a roofline never taken for a measurement.
Nothing here times anything but the CPU probe's own smoke test, which checks only that it returns figures."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch import roofline
from skipsearch.api.checks import costs_hardware_note, profile_hardware_note
from skipsearch.checkpoints import arch_fingerprint
from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.engine.measuring import architecture_of
from skipsearch.files.cost_profile import cost_profile_from_dict, cost_profile_to_dict, load_costs, save_costs
from skipsearch.files.costs import planned_costs_from_dict, planned_costs_to_dict
from skipsearch.files.errors import CostsError
from skipsearch.profile import Environment, Measured, ModelRef, Profile, load_profile, save_profile
from skipsearch.roofline import arithmetic as ar
from skipsearch.roofline import devices
from skipsearch.roofline.shapes import ARCHITECTURES, Shapes, resolve_shapes, shapes_from_config

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
SHIPPED = sorted((ROOT / "profiles" / "smollm2-135m").glob("*.yaml"))
HAND_WRITTEN = ("example.yaml", "hier-medium.yaml", "hier-small.yaml")  # they trace on the model first (test_replan)
# precision fp16 drafts, or hybrids falling back to one (their method_params name the scheme): CPU kernels only
FP16_DRAFTS = tuple(p.name for p in SHIPPED if (yaml.safe_load(p.read_text()).get("method_params") or {}).get("scheme")
                    == "fp16")
CPU_FIGURES = ["--bandwidth", "12", "--tflops", "0.15", "--launch-us", "6"]  # given by hand: nothing is probed

# a tiny model: 2 layers, hidden 8, intermediate 16, 2 query heads and 1 key/value head of 4, vocabulary 10
TINY = Shapes("tiny", num_layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=False)


# -- the arithmetic, by hand -----------------------------------------------------------------------------------
def test_bytes_and_flops_per_sublayer_by_hand():
    # attention weights: q and o 8 x (2 x 4) each, k and v 8 x (1 x 4) each: 64 + 64 + 32 + 32 = 192
    assert TINY.attn_params == 192 and TINY.mlp_params == 3 * 8 * 16 == 384 and TINY.head_params == 80
    # one token after 5 cached, 2 bytes a weight: 192 x 2 weights + 8 x 2 norm + KV (key and value, 4 each) x 2
    # bytes x 6 positions read and written = 384 + 16 + 96; FLOPs 2 x 192 + 4 x 2 heads x 4 x (5 + 1) pairs
    a1 = ar.attention(TINY, k=1, context=5, weight_bytes=2, act_bytes=2)
    assert (a1.bytes, a1.flops, a1.kernels) == (496, 576, ar.ATTN_KERNELS)
    # three tokens: the weights once, KV over 8 positions; pairs 3 x 5 + (1 + 2 + 3) = 21
    a3 = ar.attention(TINY, k=3, context=5, weight_bytes=2, act_bytes=2)
    assert (a3.bytes, a3.flops) == (384 + 16 + 8 * 2 * 8, 2 * 192 * 3 + 32 * 21)
    # int8 weights: one byte a weight, the norm and the KV cache stay 16-bit
    assert ar.attention(TINY, k=1, context=5, weight_bytes=1, act_bytes=2).bytes == 192 + 16 + 96
    m = ar.mlp(TINY, k=4, weight_bytes=2, act_bytes=2)
    assert (m.bytes, m.flops, m.kernels) == (384 * 2 + 16, 2 * 384 * 4, ar.MLP_KERNELS)
    h = ar.head(TINY, k=3, weight_bytes=2, act_bytes=2)
    assert (h.bytes, h.flops) == (80 * 2 + 16, 2 * 80 * 3)
    assert ar.embedding(TINY, k=3, act_bytes=2).bytes == 3 * 8 * 2


def test_each_piece_is_priced_by_its_slower_roof_plus_its_launches():
    memory_bound = ar.Machine(bandwidth=100.0, flops=1e6, launch=0.5)
    assert memory_bound.price(ar.Piece(496, 576, 7)) == pytest.approx(4.96 + 3.5)
    compute_bound = ar.Machine(bandwidth=1e6, flops=100.0, launch=0.0)
    assert compute_bound.price(ar.Piece(496, 576, 7)) == pytest.approx(5.76)
    # the cost file's figures: a step is L x (attention + MLP) + head + embedding, and v(k) its k-token forward
    costs = ar.costs_of(TINY, memory_bound, context=5, act_bytes=2, schemes={"int8": 1.0})
    attn, mlp, head, emb = 4.96 + 3.5, 7.84 + 2.5, 1.76 + 1.5, 0.16 + 0.5
    assert (costs.attn_seconds, costs.mlp_seconds, costs.lm_head_seconds) == pytest.approx((attn, mlp, head))
    assert costs.fixed_seconds == pytest.approx(head + emb)
    assert costs.step_seconds == pytest.approx(2 * (attn + mlp) + head + emb)
    assert costs.verify_ratio[0] == 1.0 and len(costs.verify_ratio) == ar.VERIFY_MAX
    v2 = 2 * ((384 + 16 + 8 * 2 * 7) / 100 + 3.5 + mlp) + head + 2 * 8 * 2 / 100 + 0.5
    assert costs.verify_ratio[1] == pytest.approx(v2 / costs.step_seconds)
    int8 = costs.scheme("int8")
    assert int8.attn_seconds == pytest.approx((192 + 16 + 96) / 100 + 3.5)
    assert int8.head_saving_seconds == pytest.approx(80 / 100)


def test_the_shapes_count_the_parameters_the_modelling_code_has():
    sm = make_tiny_model(num_layers=3)
    shapes = shapes_from_config(sm.hf.config, "tiny", source="test")
    layer = sm.hf.model.layers[0]
    assert shapes.attn_params == sum(p.numel() for p in layer.self_attn.parameters())
    assert shapes.mlp_params == sum(p.numel() for p in layer.mlp.parameters())
    assert shapes.head_params == sm.hf.lm_head.weight.numel() and shapes.num_layers == 3


def test_a_published_architecture_stands_in_for_a_checkpoint_not_on_this_machine(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: llama-2-13b is not here
    shapes = resolve_shapes("llama-2-13b")
    assert (shapes.num_layers, shapes.hidden, shapes.intermediate, shapes.kv_heads) == (40, 5120, 13824, 40)
    assert shapes.source.startswith("published architecture") and shapes.architecture is None
    fields, _ = ARCHITECTURES["llama-2-13b"]
    # the fingerprint a profile made on the real checkpoint under the same name holds
    assert shapes.fingerprint == arch_fingerprint(LlamaConfig(**fields), "llama-2-13b")


# -- the file --------------------------------------------------------------------------------------------------
def test_a_roofline_file_from_a_config_validates_round_trips_and_says_it_is_modelled(tiny_checkpoint, tmp_path):
    from skipsearch.model.loader import load_model

    cp = roofline.roofline_cost_profile(device="h100-sxm", model=str(tiny_checkpoint), context_tokens=64)
    back = load_costs(save_costs(cp, tmp_path / "r.yaml"))
    assert cost_profile_to_dict(back) == cost_profile_to_dict(cp)  # figures are written to 5 digits
    assert back.source == "roofline" and back.device == "cuda" and back.dtype == "bfloat16"
    assert back.roofline.key == "h100-sxm" and back.roofline.bandwidth_gb_s == 3350
    assert back.roofline.efficiency == devices.CALIBRATED["h100"] and "config.json" in back.roofline.shapes_source
    assert back.environment.gpu_name == "NVIDIA H100 SXM5 80GB" and back.environment.cpu_model is None
    assert {s.scheme for s in back.costs.schemes} == {"int8", "int4", "fp8", "int8-weight-only"}
    assert "not measured: a roofline model of NVIDIA H100" in back.describe()
    # the architecture is read from the checkpoint's headers: the loaded model's own
    assert back.model.architecture == architecture_of(load_model(str(tiny_checkpoint), device="cpu"))
    # fp8 needs compute capability 8.9: an A100 file leaves it out
    a100 = roofline.roofline_cost_profile(device="a100-80gb-sxm", model=str(tiny_checkpoint))
    assert "fp8" not in {s.scheme for s in a100.costs.schemes}


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda d: d.update(source="guessed"), "source must be measured or roofline"),
    (lambda d: d.pop("roofline"), "both or neither"),
    (lambda d: d["roofline"].pop("device"), "missing required key roofline.device"),
    (lambda d: d["roofline"].update(efficiency=0), "roofline.efficiency must be a finite number > 0"),
])
def test_a_broken_roofline_file_is_one_line(tiny_checkpoint, tmp_path, edit, fragment):
    raw = cost_profile_to_dict(roofline.roofline_cost_profile(device="l4", model=str(tiny_checkpoint)))
    edit(raw)
    with pytest.raises(CostsError) as e:
        cost_profile_from_dict(raw, source="bad.yaml")
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_roofline_models_the_batched_grid_and_the_verify_turns_compute_bound_at_large_batches():
    """A forward of B x T tokens reads the weights once and each row's KV cache: memory-bound at small B x T, it
    costs about one step whatever T; at large B x T its FLOPs pass the bandwidth and a verify costs real compute."""
    cp = roofline.roofline_cost_profile(device="h100-sxm", model="llama-3-8b", batch_sizes=(1, 8, 256))
    grid = cp.batched
    assert grid.batch_sizes == (1, 8, 256) and grid.kernel == "roofline" and grid.context_tokens == 512
    assert grid.verify(12, 1) / grid.step(1) == pytest.approx(1.0, abs=0.02)  # 13 tokens: weights dominate
    assert grid.verify(12, 256) / grid.step(256) > 2.0  # 3328 rows: past the ridge, priced by FLOPs
    ratios = [grid.verify(4, b) / grid.step(b) for b in grid.batch_sizes]
    assert ratios == sorted(ratios)  # a longer verify costs relatively more as the batch grows
    assert {s for s, _ in grid.rows[0].draft_seconds} == {s.scheme for s in cp.costs.schemes}
    assert grid.draft("int4", 1) < grid.step(1)  # a 4-bit copy reads fewer bytes than the model
    default = roofline.roofline_cost_profile(device="h100-sxm", model="smollm2-135m").batched
    assert default.batch_sizes == (1, 2, 4, 8, 16, 32)


def test_the_shipped_h100_file_is_what_the_roofline_makes_now():
    shipped = load_costs(ROOT / "costs" / "roofline-h100-sxm-bfloat16.yaml")
    assert shipped.source == "roofline" and shipped.roofline.key == "h100-sxm" and shipped.model.num_layers == 30
    fresh = roofline.roofline_cost_profile(device="h100-sxm", model="smollm2-135m")
    assert cost_profile_to_dict(fresh)["costs"] == cost_profile_to_dict(shipped)["costs"]  # remake it if this fails
    assert cost_profile_to_dict(fresh)["batched"] == cost_profile_to_dict(shipped)["batched"]
    assert fresh.roofline == shipped.roofline


def test_a_measured_file_is_written_as_it_always_was():
    raw = cost_profile_to_dict(load_costs(ROOT / "costs" / "cpu-float32.yaml"))
    assert "source" not in raw and "roofline" not in raw and load_costs(ROOT / "costs" / "cpu-float32.yaml").source == \
        "measured"


# -- re-planning -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roofline_files(tmp_path_factory):
    """A GPU roofline (H100) and a CPU one with its figures given (nothing probed) for the default model."""
    where = tmp_path_factory.mktemp("roofline")
    gpu = save_costs(roofline.roofline_cost_profile(device="h100-sxm"), where / "h100.yaml")
    cpu = where / "cpu.yaml"
    result = runner.invoke(app, ["costs", "--roofline", "cpu", *CPU_FIGURES, "--out", str(cpu)])
    assert result.exit_code == 0, result.output
    return {"gpu": str(gpu), "cpu": str(cpu)}


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.name not in HAND_WRITTEN], ids=lambda p: p.stem)
def test_every_shipped_profile_re_plans_under_a_roofline_file(path, roofline_files, tmp_path):
    for kind, costs in roofline_files.items():
        out = tmp_path / f"{kind}.yaml"
        result = runner.invoke(app, ["plan", "profile", "--profile", str(path), "--costs", costs, "--out", str(out)])
        if load_profile(path).model.target_precision == "int8":  # a roofline models the native target only
            native = "is the int8 target: measure its costs with skipsearch costs --target-precision int8"
            why = "runs on CPUs in fp32" if kind == "gpu" else native
            assert result.exit_code == 2 and why in result.stderr and not out.exists(), result.output
            continue
        assert result.exit_code == 0, result.output  # fp16 drafts too: they re-plan in a scheme traced beside it
        if kind == "gpu" and path.name in FP16_DRAFTS:
            assert dict(load_profile(out, num_layers=30).method_params)["scheme"] != "fp16"
        assert "a model, not a measurement" in result.stderr
        new = load_profile(out, num_layers=30)
        assert new.measured.notes.startswith("predicted, not timed")
        kept = planned_costs_from_dict(dict(new.measured.extra)["costs"])
        assert kept.roofline is not None and kept.device == ("cuda" if kind == "gpu" else "cpu")


def test_a_roofline_file_for_another_model_is_refused_in_one_line(tmp_path):
    other = save_costs(roofline.roofline_cost_profile(device="h100-sxm", model="llama-2-7b"), tmp_path / "l.yaml")
    result = runner.invoke(app, ["plan", "profile", "--profile", str(SHIPPED[0]), "--costs", str(other)])
    assert_one_line_error(result, "has 30 layers")


# -- refusals --------------------------------------------------------------------------------------------------
def test_an_unknown_gpu_is_refused_in_one_line_naming_the_known_ones_and_the_flags(tmp_path):
    result = runner.invoke(app, ["costs", "--roofline", "x100", "--out", str(tmp_path / "x.yaml")])
    assert_one_line_error(result, "unknown GPU 'x100'")
    for named in (*devices.GPUS, "cpu", "--bandwidth", "--tflops"):
        assert named in result.stderr
    assert not (tmp_path / "x.yaml").exists()
    # with its figures given by hand it is a device like any other
    given = runner.invoke(app, ["costs", "--roofline", "x100", "--bandwidth", "900", "--tflops", "120",
                                "--out", str(tmp_path / "x.yaml")])
    assert given.exit_code == 0, given.output
    made = load_costs(tmp_path / "x.yaml")
    assert made.roofline.figures_source == "given on the command line" and made.roofline.bandwidth_gb_s == 900


@pytest.mark.parametrize(("args", "fragment"), [
    (["--bandwidth", "100"], "use them with --roofline GPU"),
    (["--roofline", "h100-sxm", "--device", "cpu"], "a roofline names its device"),
    (["--roofline", "h100-sxm", "--schemes", "fp16"], "not fp16"),
    (["--roofline", "a100-40gb", "--dtype", "float64"], "float64"),  # the parser names the value
    (["--roofline", "l4", "--efficiency", "-1"], "--efficiency must be a positive number"),
    (["--roofline", "l4", "--model", "no-such-model"], "these architectures are also known without their files"),
])
def test_bad_roofline_input_is_one_line(args, fragment, tmp_path):
    assert_one_line_error(runner.invoke(app, ["costs", *args, "--out", str(tmp_path / "c.yaml")]), fragment)


# -- a model, never taken for a measurement --------------------------------------------------------------------
def _planned_with(cp, tiny_checkpoint, tmp_path) -> Path:
    """A tiny-model profile whose measured.costs were a roofline file's, made on this machine."""
    from skipsearch.files.cost_profile import planned_costs_of

    costs = planned_costs_to_dict(planned_costs_of(cp, source="r.yaml"))
    prof = Profile(model=ModelRef(name=str(tiny_checkpoint), num_layers=4), method="layer-skip",
                   draft=DraftConfig(skip_attn=(1,), max_draft_tokens=2),
                   measured=Measured(source="plan", extra=(("costs", costs),)), environment=Environment.current("cpu"))
    return save_profile(prof, tmp_path / "p.yaml")


def test_a_roofline_file_is_never_taken_for_a_measured_one(tiny_checkpoint, tmp_path):
    here = roofline.roofline_cost_profile(device="cpu", model=str(tiny_checkpoint), bandwidth_gb_s=12, tflops=0.15,
                                          launch_us=6)
    sm = make_tiny_model()
    measured = dataclasses.replace(here, roofline=None)
    assert costs_hardware_note(measured, sm, "m.yaml") is None  # measured on this very machine: nothing to say
    note = costs_hardware_note(here, sm, "r.yaml")
    assert "r.yaml: a roofline model of" in note and "a model, not a measurement" in note and "\n" not in note
    profile = load_profile(_planned_with(here, tiny_checkpoint, tmp_path))
    line = profile_hardware_note(profile, "cpu", source="p.yaml")
    assert line.startswith("profile p.yaml: planned with a roofline model") and "\n" not in line
    gpu = roofline.roofline_cost_profile(device="rtx-4090", model=str(tiny_checkpoint))
    assert "a model, not a measurement" in costs_hardware_note(gpu, sm, "g.yaml")  # a GPU file, read on a CPU


def test_decode_and_bench_say_a_profile_was_planned_with_a_model(tiny_checkpoint, tmp_path):
    cp = roofline.roofline_cost_profile(device="h100-sxm", model=str(tiny_checkpoint))
    path = str(_planned_with(cp, tiny_checkpoint, tmp_path))
    decoded = runner.invoke(app, ["decode", "--profile", path, "--device", "cpu", "--prompt", "def fib",
                                  "--max-new-tokens", "4"])
    assert decoded.exit_code == 0, decoded.output
    lines = [ln for ln in decoded.stderr.splitlines() if "roofline" in ln]
    assert len(lines) == 1 and "planned with a roofline model of NVIDIA H100" in lines[0]
    benched = runner.invoke(app, ["bench", "--profiles", path, "--peers", "hf-greedy", "--n-prompts", "1",
                                  "--max-new-tokens", "4", "--sweep-prompts", "0", "--device", "cpu",
                                  "--dtype", "float32"])
    assert benched.exit_code == 0, benched.output
    lines = [ln for ln in benched.stderr.splitlines() if "roofline" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: profile ") and "a model, not a measurement" in lines[0]


# -- the probe and the calibration -----------------------------------------------------------------------------
def test_the_cpu_probe_returns_figures_through_the_one_timer():
    from skipsearch.roofline.probe import probe_cpu

    figures = probe_cpu(repeats=1, copy_bytes=1 << 16, matmul_n=16)
    assert figures.bandwidth_gb_s > 0 and figures.tflops > 0 and figures.launch_us > 0 and figures.threads >= 1


def test_the_shipped_efficiencies_and_launch_cost_are_the_fit_of_the_published_data():
    sys.path.insert(0, str(ROOT / "scripts"))
    import roofline_calibration as rc  # a script, not a package module

    data = yaml.safe_load((ROOT / "scripts" / "roofline_published.yaml").read_text())
    launch, fit = rc.shipped(data)
    assert (launch, fit) == (devices.DEFAULT_LAUNCH_US, devices.CALIBRATED)
    assert rc.fallback(fit) == devices.FALLBACK_EFFICIENCY
    # and the committed study is what the script makes of the committed data
    text, _, _ = rc.report(data, command="python scripts/roofline_calibration.py")
    assert text == (ROOT / "studies" / "roofline-vs-published.md").read_text()


def test_the_cpu_check_compares_a_roofline_with_a_measured_file_and_refuses_other_contexts(roofline_files, tmp_path,
                                                                                          capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import roofline_cpu_check  # a script, not a package module

    measured = ROOT / "costs" / "cpu-float32.yaml"
    same = save_costs(roofline.roofline_cost_profile(device="cpu", bandwidth_gb_s=12, tflops=0.15, launch_us=6,
                                                     context_tokens=load_costs(measured).run.context_tokens),
                      tmp_path / "r.yaml")
    out = tmp_path / "check.md"
    assert roofline_cpu_check.main(["--measured", str(measured), "--roofline", str(same), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| v(k) measured | 1.00" in text and "| v(k) roofline | 1.00" in text and "cpu-float32-tpe.yaml" in text
    # the CLI's file prices context 512: the check says which context to make it with
    code = roofline_cpu_check.main(["--measured", str(measured), "--roofline", roofline_files["cpu"], "--out",
                                    str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--context-tokens" in err[0]
