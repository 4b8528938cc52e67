"""Cost files: measured through the objective's own cost measurement, round-tripped, validated in one line,
and refused for another model."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from clocks import work_clock
from conftest import assert_one_line_error, make_tiny_model
from typer.testing import CliRunner

from skipsearch.cli import app
from skipsearch.config import DraftConfig
from skipsearch.engine.measuring import architecture_of, check_costs_for, measure_cost_profile
from skipsearch.files.cost_profile import (
    SCHEMA_VERSION,
    CostModelRef,
    CostProfile,
    check_costs_model,
    cost_profile_from_dict,
    cost_profile_to_dict,
    load_costs,
    save_costs,
)
from skipsearch.files.costs import BatchCosts, BatchedCosts, Costs
from skipsearch.files.errors import CostsError

runner = CliRunner()
SHIPPED = "costs/cpu-float32.yaml"


def synthetic(*, num_layers: int = 30, name: str = "smollm2-135m", verify=(1.0, 1.5, 1.8), fixed=0.01,
              architecture: str | None = None) -> CostProfile:
    return CostProfile(CostModelRef(name, num_layers, architecture), "cpu", "float32",
                       Costs(0.05, 0.0004, 0.0008, fixed, tuple(verify), lm_head_seconds=fixed / 2))


def test_round_trip_and_the_cost_model(tmp_path):
    cp = synthetic()
    path = save_costs(cp, tmp_path / "c.yaml")
    assert path.read_text().startswith(f"# skipsearch cost profile (schema v{SCHEMA_VERSION})")
    back = load_costs(path)
    assert back == cp
    cm = back.cost_model()
    assert cm.num_layers == 30 and cm.verify(2) == 1.5
    assert cm.draft_ratio(DraftConfig(skip_attn=(3, 7))) < cm.draft_ratio(DraftConfig())
    assert "LM head" in back.describe()


def test_the_shipped_cpu_file_loads_and_fits_the_default_model():
    cp = load_costs(SHIPPED)
    assert cp.model.name == "smollm2-135m" and cp.model.num_layers == 30 and cp.device == "cpu"
    assert cp.dtype == "float32" and cp.run.threads is not None
    assert cp.costs.verify_ratio[0] == pytest.approx(1.0)
    # a draft that skips nothing runs the eager parts: one eager step, priced in the file's (maybe compiled) steps
    eager = cp.costs.eager_step_seconds or cp.costs.step_seconds
    assert cp.cost_model().draft_ratio(DraftConfig()) == pytest.approx(eager / cp.costs.step_seconds, rel=0.25)
    assert (cp.kernel.verify != "eager") == (cp.costs.eager_step_seconds is not None)


def _batched() -> BatchedCosts:
    return BatchedCosts((1, 2, 5), (BatchCosts(1, (0.05, 0.051, 0.052), (("int8", 0.03),)),
                                    BatchCosts(4, (0.052, 0.06, 0.09), (("int8", 0.031),))), context_tokens=64)


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("costs/*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_cost_file_loads_and_names_its_target(path):
    cp = load_costs(path)
    assert cp.model.name == "smollm2-135m" and cp.model.num_layers == 30
    assert cp.target_precision == ("int8" if "-int8-" in path.name else "native")


def test_a_batched_grid_round_trips_and_an_old_file_reads_without_one(tmp_path):
    cp = dataclasses.replace(synthetic(), batched=_batched())
    back = load_costs(save_costs(cp, tmp_path / "b.yaml"))
    assert back == cp and back.batched.step(4) == 0.052 and back.batched.verify(1, 4) == 0.06
    assert back.batched.verify(3, 4) == pytest.approx(0.08)  # T = 4: two thirds of the way from T = 2 to T = 5
    assert back.batched.draft("int8", 4) == 0.031 and back.batched.draft("fp16", 4) is None
    assert "B 4: step 0.052 ms" not in back.describe() and "B 4: step 52.000 ms" in back.describe()
    old = cost_profile_to_dict(synthetic())
    old["schema_version"] = 2  # a file written before the grid
    assert cost_profile_from_dict(old).batched is None


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda b: b.update(tokens=[2, 3]), "batched.tokens must list ascending integers T from 1"),
    (lambda b: b.update(tokens=[1, 1, 5]), "batched.tokens must list ascending integers T from 1"),
    (lambda b: b["rows"][1].update(batch_size=1), "rows ascend by batch size"),
    (lambda b: b["rows"][0].update(batch_size=0), "batched.rows[0].batch_size must be an integer in 1..4096"),
    (lambda b: b["rows"][0].update(verify_seconds=[0.1]), "batched.rows[0].verify_seconds must hold 3 positive"),
    (lambda b: b["rows"][0].update(verify_seconds=[0.1, -1, 0.2]), "must hold 3 positive numbers"),
    (lambda b: b["rows"][0].update(draft_seconds={"int8": 0}), "draft_seconds.int8 must be a positive number"),
    (lambda b: b["rows"][0].update(typo=1), "unknown key 'typo'"),
    (lambda b: b.update(rows=[]), "batched.rows must list at least one"),
    (lambda b: b["rows"].pop(0), "batched.rows must include batch size 1"),
])
def test_a_bad_batched_grid_is_one_line(edit, fragment):
    raw = cost_profile_to_dict(dataclasses.replace(synthetic(), batched=_batched()))
    edit(raw["batched"])
    with pytest.raises(CostsError) as e:
        cost_profile_from_dict(raw, source="bad.yaml")
    assert fragment in str(e.value) and "bad.yaml" in str(e.value) and "\n" not in str(e.value)


def test_batched_forwards_are_measured_on_the_tiny_model():
    """Each (B, T) forward is timed through the harness: positive medians, nothing asserted about speed."""
    from skipsearch.engine.measuring import measure_batched

    sm = make_tiny_model()
    grid = measure_batched(sm, list(range(3, 19)), (1, 2), repeats=1, tokens=(1, 2))
    assert grid.batch_sizes == (1, 2) and grid.tokens == (1, 2) and grid.context_tokens == 16
    assert all(v > 0 for r in grid.rows for v in r.verify_seconds) and grid.kernel == "eager"


def test_a_schemes_draft_step_is_timed_in_the_batched_rounds_on_the_tiny_model():
    """c(B) per scheme, through the method's own whole-model draft: positive, and the model is whole again after."""
    from skipsearch import methods
    from skipsearch.api.costs import measure_batched_costs

    sm = make_tiny_model()
    modules = [(layer.self_attn, layer.mlp) for layer in sm.layers] + [sm.lm_head]
    said: list[str] = []
    grid = measure_batched_costs(sm, list(range(3, 19)), (1, 2), ("fp16", "int8-dynamic"), repeats=1,
                                 warn=said.append)
    for b in (1, 2):
        assert math.isfinite(grid.draft("fp16", b)) and grid.draft("fp16", b) > 0
        assert grid.draft("int8-dynamic", b) is None  # its method (fractal) times no batched whole-model draft
    assert len(said) == 1 and "int8-dynamic" in said[0] and methods.scheme_draft(sm, "int8-dynamic") is None
    assert [(layer.self_attn, layer.mlp) for layer in sm.layers] + [sm.lm_head] == modules


def test_costs_batch_sizes_writes_c_of_b_for_each_scheme(tiny_checkpoint, tmp_path):
    out = tmp_path / "c.yaml"
    result = runner.invoke(app, ["costs", "--model", str(tiny_checkpoint), "--device", "cpu", "--samples", "1",
                                 "--max-new-tokens", "4", "--schemes", "fp16", "--batch-sizes", "1,2",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    grid = load_costs(out).batched
    assert grid.batch_sizes == (1, 2) and [s for s, _ in grid.rows[0].draft_seconds] == ["fp16"]
    for b in grid.batch_sizes:
        c = grid.draft("fp16", b)
        assert c is not None and math.isfinite(c) and c > 0
    assert "c(fp16)" in result.output  # describe shows c(B) / v(0, B)


@pytest.mark.parametrize("where", ["scheme", "batched"])
def test_ctrl_c_after_the_models_own_costs_keeps_them_in_the_file(tiny_checkpoint, tmp_path, monkeypatch, where):
    # a GPU run of a 7B model's costs ran past its deadline while measuring the schemes, minutes after its step and
    # v(k) were measured, and wrote nothing
    import skipsearch.api.costs as api_costs
    from skipsearch import methods

    measure = methods.measure_scheme_costs

    def second_interrupted(sm, context, schemes, **kwargs):
        if schemes == ("int8",):
            raise KeyboardInterrupt
        return measure(sm, context, schemes, **kwargs)

    def grid_interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "scheme":
        monkeypatch.setattr(methods, "measure_scheme_costs", second_interrupted)
    else:
        monkeypatch.setattr(api_costs, "measure_batched_costs", grid_interrupted)
    out = tmp_path / "c.yaml"
    # three samples, whose median a descheduled one cannot carry: the kept file must pass the cost file's own
    # consistency check (one sample on a busy machine once split a step 12.5 times over, and the save refused it)
    args = ["costs", "--model", str(tiny_checkpoint), "--device", "cpu", "--samples", "3", "--max-new-tokens", "4",
            "--schemes", "fp16,int8" if where == "scheme" else "fp16", "--out", str(out)]
    result = runner.invoke(app, args + (["--batch-sizes", "1,2"] if where == "batched" else []))
    assert result.exit_code == 130, result.output
    missing = "scheme int8" if where == "scheme" else "the batched grid"
    assert f"interrupted while measuring {missing}: wrote {out} without it" in result.output
    assert "Traceback" not in result.output
    kept = load_costs(out)  # a valid cost file: the step, v(k) and the schemes measured before the interrupt
    assert kept.costs.step_seconds > 0 and len(kept.costs.verify_ratio) >= 2
    assert [s.scheme for s in kept.costs.schemes] == ["fp16"] and kept.batched is None


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda d: d.pop("schema_version"), "missing required key schema_version"),
    (lambda d: d.update(schema_version=7), "unknown schema_version 7"),
    (lambda d: d.update(surprise=1), "unknown top-level key 'surprise'"),
    (lambda d: d["costs"].pop("attn_seconds"), "missing required key costs.attn_seconds"),
    (lambda d: d["costs"].update(mlp_seconds=-1.0), "costs.mlp_seconds must be a finite number of seconds >= 0"),
    (lambda d: d["costs"].update(step_seconds=0), "costs.step_seconds must be a finite number of seconds > 0"),
    (lambda d: d["costs"].update(verify_ratio=[]), "costs.verify_ratio must list v(1), v(2)"),
    (lambda d: d["costs"].update(verify_ratio=[1, "x"]), "costs.verify_ratio must hold positive numbers"),
    (lambda d: d["costs"].update(typo=1), "unknown key costs.typo"),
    (lambda d: d["model"].update(num_layers="30"), "model.num_layers must be an integer"),
    (lambda d: d["model"].update(precision="int9"), "model.precision must be one of native, int8, got 'int9'"),
    (lambda d: d.update(device=""), "device must be a non-empty string"),
])
def test_every_problem_is_one_line_naming_the_file(tmp_path, edit, fragment):
    raw = cost_profile_to_dict(synthetic())
    edit(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(CostsError) as e:
        load_costs(path)
    assert str(e.value).startswith(f"{path}: ") and fragment in str(e.value) and "\n" not in str(e.value)


def test_malformed_and_missing_files_are_one_line(tmp_path):
    (tmp_path / "m.yaml").write_text("costs: [1, 2\n")
    for path, fragment in ((tmp_path / "m.yaml", "malformed YAML"), (tmp_path / "none.yaml", "cannot read")):
        with pytest.raises(CostsError, match=fragment):
            load_costs(path)


def test_a_cost_file_for_another_model_is_refused():
    cp = synthetic(num_layers=30, architecture="aaaa")
    with pytest.raises(CostsError, match="measured on smollm2-135m \\(30 layers\\); this model has 4 layers"):
        check_costs_model(cp, num_layers=4)
    with pytest.raises(CostsError, match="another architecture"):
        check_costs_model(cp, num_layers=30, architecture="bbbb")
    check_costs_model(cp, num_layers=30, architecture="aaaa")  # same architecture: other weights are fine


def test_a_cost_file_names_its_target_precision_and_refuses_another_target(tmp_path):
    native = save_costs(synthetic(), tmp_path / "native.yaml")
    assert "precision" not in native.read_text()  # a native target's file is written as it always was
    assert load_costs(native).target_precision == "native"
    cp = synthetic()
    int8 = load_costs(save_costs(dataclasses.replace(cp, model=dataclasses.replace(cp.model, precision="int8")),
                                 tmp_path / "int8.yaml"))
    assert int8.target_precision == "int8" and "the int8 target" in int8.describe().splitlines()[0]
    check_costs_model(int8, num_layers=30, target_precision="int8")
    with pytest.raises(CostsError) as e:
        check_costs_model(int8, num_layers=30, source="int8.yaml", what="model m")
    assert str(e.value) == ("int8.yaml: cost file was measured on smollm2-135m's int8 target; model m is the native "
                            "target: measure its costs with skipsearch costs --target-precision native")
    with pytest.raises(CostsError, match="is the int8 target: measure its costs with skipsearch costs "
                                         "--target-precision int8"):
        check_costs_model(load_costs(native), num_layers=30, target_precision="int8")


@pytest.mark.parametrize("args", [["--roofline", "h100-sxm"], ["--random-weights"]])
def test_costs_of_the_int8_target_are_timed_on_its_weights_only(args, tmp_path):
    result = runner.invoke(app, ["costs", "--target-precision", "int8", *args, "--out", str(tmp_path / "c.yaml")])
    assert_one_line_error(result, "--target-precision int8")
    assert not (tmp_path / "c.yaml").exists()


def test_measured_on_a_tiny_model_with_the_objectives_measurement(tmp_path):
    sm = make_tiny_model(num_layers=3)
    with work_clock(sm):  # one round of timings on a loaded machine need not split a step: time the work alone
        cp = measure_cost_profile(sm, list(range(1, 20)), repeats=1, verify_sizes=(1, 2, 4), command="test")
    assert cp.model.num_layers == 3 and cp.model.architecture == architecture_of(sm)
    assert len(cp.costs.verify_ratio) == 4 and cp.run.context_tokens == 19 and cp.run.command == "test"
    assert 0 <= cp.costs.lm_head_seconds <= cp.costs.fixed_seconds
    back = load_costs(save_costs(cp, tmp_path / "tiny.yaml"))
    check_costs_for(back, sm, source="tiny.yaml")
    with pytest.raises(CostsError, match="tiny.yaml: cost file was measured on tiny \\(3 layers\\)"):
        check_costs_for(back, make_tiny_model(num_layers=4), source="tiny.yaml")


def _split_apart(monkeypatch, times: int) -> list[int]:
    """surrogate.measure_costs whose first ``times`` timings put 10 steps in one layer's attention, as one
    descheduled sample in a median of few does; the samples each timing took come back in the list."""
    from skipsearch.engine import surrogate

    real, samples = surrogate.measure_costs, []

    def timed(sm, context, **kwargs):
        cm = real(sm, context, **kwargs)
        samples.append(kwargs["repeats"])
        return dataclasses.replace(cm, attn_seconds=10 * cm.step_seconds) if len(samples) <= times else cm

    monkeypatch.setattr(surrogate, "measure_costs", timed)
    return samples


def test_costs_whose_sublayers_do_not_fit_the_step_are_timed_again_with_more_samples(monkeypatch, tmp_path):
    sm = make_tiny_model(num_layers=3)
    samples = _split_apart(monkeypatch, times=1)
    with work_clock(sm):
        cp = measure_cost_profile(sm, list(range(1, 20)), repeats=1, verify_sizes=(1, 2))
    assert samples == [1, 3] and cp.run.repeats == 3  # the file says how many samples its costs took
    assert cp.costs.attn_seconds < cp.costs.step_seconds
    check_costs_for(load_costs(save_costs(cp, tmp_path / "c.yaml")), sm, source="c.yaml")


def test_costs_that_never_fit_the_step_end_in_one_line_and_write_nothing(tiny_checkpoint, monkeypatch, tmp_path):
    samples = _split_apart(monkeypatch, times=3)
    out = tmp_path / "c.yaml"
    result = runner.invoke(app, ["costs", "--model", str(tiny_checkpoint), "--device", "cpu", "--samples", "1",
                                 "--max-new-tokens", "4", "--out", str(out)])
    # exit 2 and one error line, after the loading notice and a line for each timing taken again
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], result.stderr
    assert "in each of 3 timings: is something else running?" in lines[-1]
    assert sum("timing again with" in ln for ln in lines) == 2
    assert samples == [1, 3, 7] and not out.exists()


def test_cli_refuses_a_cost_file_for_another_model_in_one_line(tmp_path):
    """plan --profile with a cost file measured on a 4-layer model, for a 30-layer profile: exit 2, one line."""
    other = save_costs(synthetic(num_layers=4, name="tiny"), tmp_path / "tiny.yaml")
    from test_replan import write_synthetic_profile

    profile = write_synthetic_profile(tmp_path / "p.yaml")
    result = runner.invoke(app, ["plan", "profile", "--profile", str(profile), "--costs", str(other)])
    assert_one_line_error(result, "cost file was measured on tiny (4 layers); the profile's model (smollm2-135m) has "
                                  "30 layers")


def test_cli_costs_refuses_a_bad_target_before_loading_the_model(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["costs", "--out", str(tmp_path / "notes.txt")])
    assert_one_line_error(result, "is not a skipsearch cost file")


def test_kernel_fastest_times_every_registered_compiled_kernel_and_keeps_the_fastest_that_agrees(monkeypatch):
    """``costs --kernel fastest`` asks the registry, not a name: every compiled kernel this device runs is built and
    timed; one that changes a greedy choice is passed over; the fastest step that beats eager's wins and is what
    the model runs afterwards."""
    import skipsearch.engine.measuring as costs
    from skipsearch.config import ConfigError
    from skipsearch.kernels import EAGER, REGISTRY, Kernel

    compiled = [name for name, spec in REGISTRY.items() if spec.compiled]
    monkeypatch.setattr(costs, "check_kernel", lambda kernel, device: None)  # as on a machine that runs them all
    assert [k.name for k in costs.fastest_kernels("cpu")] == compiled and "panel" in compiled

    class Model:  # what _fastest reads of the adapter: the kernel it runs, and use_kernel
        device, kernel, built = "cpu", EAGER, []

        def use_kernel(self, kernel, *, capacity):
            self.kernel = kernel
            self.built.append(kernel.label)

    steps = {"inductor": 0.020, "panel": 0.012}  # seconds; eager's step is 0.030 in the same rounds

    state = {"disagree": False}

    def measured(sm, context, **_):
        if sm.kernel.name == "panel" and state["disagree"]:
            raise ConfigError("kernel panel-c8 changes greedy choices here")
        cp = synthetic()
        return dataclasses.replace(cp, costs=dataclasses.replace(cp.costs, step_seconds=steps.get(sm.kernel.name,
                                                                                                   0.030),
                                                                 eager_step_seconds=0.030))

    monkeypatch.setattr(costs, "measure_cost_profile", measured)
    for disagree, winner in ((False, Kernel("panel", 8)), (True, Kernel("inductor", 4))):
        state["disagree"] = disagree
        sm = Model()
        costs._fastest(sm, list(range(40)), repeats=3, verify_sizes=(2, 4), command=None)
        assert sm.kernel == winner
    steps = {"inductor": 0.040, "panel": 0.050}  # neither beats eager: eager it is
    sm = Model()
    costs._fastest(sm, list(range(40)), repeats=3, verify_sizes=(2, 4), command=None)
    assert sm.kernel == EAGER
