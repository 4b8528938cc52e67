"""What ``skipsearch costs`` measures by default: the device's own draft scheme and every scheme a profile shipped
for the model needs, so that the default cost file re-plans every shipped draft profile (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from clocks import work_clock
from conftest import assert_one_line_error
from typer.testing import CliRunner

from skipsearch.api.costs import default_schemes, model_folders, parse_schemes
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.files.cost_profile import load_costs
from skipsearch.files.errors import CostsError
from skipsearch.profile import load_profile
from skipsearch.search import replan as device_replan

runner = CliRunner()
ROOT = Path(__file__).parents[1]
SHIPPED = sorted((ROOT / "profiles" / "smollm2-135m").glob("*.yaml"))


def _profile(folder: Path, name: str, method: str, params: dict, k: int = 2) -> None:
    raw = {"schema_version": 3, "model": {"name": "m", "num_layers": 4}, "method": method,
           "draft": {"skip_attn": [1], "max_draft_tokens": k}, "method_params": params}
    (folder / name).write_text(yaml.safe_dump(raw))


def test_the_defaults_are_the_devices_scheme_and_what_each_profile_needs(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    _profile(folder, "a-precision.yaml", "precision", {"scheme": "int8"}, k=0)  # plain decoding keeps its scheme
    _profile(folder, "b-hybrid.yaml", "hybrid", {"fallback": "precision", "scheme": "int4", "min_n": 1, "max_n": 2})
    _profile(folder, "c-hybrid-skip.yaml", "hybrid", {"fallback": "layer-skip", "min_n": 1, "max_n": 2})
    _profile(folder, "d-fractal.yaml", "fractal", {"n": 1, "w": 2, "quantization": "auto"}, k=4)
    _profile(folder, "e-fractal-none.yaml", "fractal", {"n": 1, "w": 2, "quantization": "none"}, k=4)
    _profile(folder, "f-layer-skip.yaml", "layer-skip", {})
    (folder / "g-broken.yaml").write_text("method: [")
    cpu = default_schemes(["m"], "cpu", root=tmp_path)
    assert cpu.schemes == ("fp16", "int8", "int4", "int8-dynamic")
    assert dict(cpu.why)["fp16"] == "the device's own draft scheme"
    assert dict(cpu.why)["int8-dynamic"] == "needed by d-fractal.yaml"
    assert len(cpu.notes) == 1 and "g-broken.yaml" in cpu.notes[0] and "\n" not in cpu.notes[0]
    gpu = default_schemes(["m"], "cuda:0", root=tmp_path)
    assert gpu.schemes[0] == "int8" and "int8-dynamic" not in gpu.schemes  # fractal auto is another scheme there
    assert default_schemes(["other"], "cpu", root=tmp_path).schemes == ("fp16",)
    # the int8 target's file: its own scheme (int4 streams fewer bytes than it), and what its own profiles need only
    raw = yaml.safe_load((folder / "b-hybrid.yaml").read_text())
    raw["model"]["precision"] = "int8"
    (folder / "h-int8-target.yaml").write_text(yaml.safe_dump({**raw, "schema_version": 6}))
    int8 = default_schemes(["m"], "cpu", root=tmp_path, target_precision="int8")
    assert int8.schemes == ("int4",)  # not the native profiles' fp16, int8 or int8-dynamic
    assert dict(int8.why) == {"int4": "the int8 target's own draft scheme, needed by h-int8-target.yaml"}
    assert "h-int8-target.yaml" not in str(default_schemes(["m"], "cpu", root=tmp_path).why)


def test_a_model_names_a_folder_under_profiles_and_never_one_outside_it(tmp_path):
    (tmp_path / "profiles" / "m").mkdir(parents=True)
    root = tmp_path / "profiles"
    assert model_folders(["m", "/models/m", "org/m"], root=root) == (root / "m",)  # the last part names it
    for outside in ("..", ".", "", "../..", "/"):
        assert model_folders([outside], root=root) == ()


@pytest.mark.parametrize(("text", "schemes"), [(None, None), ("none", ()), ("fp16, int8,fp16", ("fp16", "int8"))])
def test_schemes_as_given(text, schemes):
    choice = parse_schemes(text)
    assert (choice.schemes if choice else None) == schemes


@pytest.mark.parametrize("text", [",", "fp17", "fp16,bogus"])
def test_a_bad_scheme_is_one_line_before_the_model_loads(text):
    with pytest.raises(ConfigError):
        parse_schemes(text)
    assert_one_line_error(runner.invoke(app, ["costs", "--model", "/nonexistent", "--schemes", text]), "scheme")


def test_the_default_cost_file_re_plans_every_shipped_draft_profile(tmp_path, monkeypatch):
    """The default `skipsearch costs` on the default model, then every shipped profile re-planned with it. The
    costs are read off a clock that only the model's work moves: the same file on a quiet or a loaded machine,
    and one round (--repeats 1) is enough."""
    monkeypatch.chdir(ROOT)  # profiles/<model>/ is read from the working directory
    out = tmp_path / "default.yaml"
    with work_clock():
        result = runner.invoke(app, ["costs", "--model", "smollm2-135m", "--device", "cpu", "--dtype", "float32",
                                     "--repeats", "1", "--max-new-tokens", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "measuring draft schemes fp16 (the device's own draft scheme, needed by" in result.stderr
    cp = load_costs(out)
    assert {s.scheme for s in cp.costs.schemes} >= {"fp16", "int8-dynamic"}
    replanned, int8_targets = 0, []
    for path in SHIPPED:
        prof = load_profile(path, num_layers=30)
        if prof.model.target_precision != "native":  # another target's steps: its own cost file, below
            with pytest.raises(CostsError, match="is the int8 target: measure its costs with skipsearch costs "
                                                 "--target-precision int8"):
                device_replan.replan_profile(prof, cp, source=str(path), costs_source=str(out))
            int8_targets.append((path, prof))
            continue
        try:
            new, _ = device_replan.replan_profile(prof, cp, source=str(path), costs_source=str(out))
        except device_replan.NoRecordError:
            # a hand-written profile keeps no record: raised only after the cost file passed every check; plan
            # then traces its draft on the model (test_replan.py: test_every_shipped_draft_profile_re_plans)
            assert path.name in ("example.yaml", "hier-medium.yaml", "hier-small.yaml")
            continue
        assert new.method == prof.method and new.measured.notes.startswith("predicted, not timed")
        replanned += 1
    assert replanned == len(SHIPPED) - 3 - len(int8_targets) and int8_targets
    # the int8 target's default cost file re-plans the profiles made for it
    out8 = tmp_path / "int8.yaml"
    with work_clock():
        result = runner.invoke(app, ["costs", "--model", "smollm2-135m", "--target-precision", "int8", "--device",
                                     "cpu", "--repeats", "1", "--max-new-tokens", "4", "--out", str(out8)])
    assert result.exit_code == 0, result.output
    assert "the int8 target" in result.stderr and "the int8 target" in result.stdout
    cp8 = load_costs(out8)
    assert cp8.target_precision == "int8" and cp8.model.precision == "int8"
    for path, prof in int8_targets:
        new, _ = device_replan.replan_profile(prof, cp8, source=str(path), costs_source=str(out8))
        assert new.model.target_precision == "int8" and new.measured.notes.startswith("predicted, not timed")


def test_without_the_scheme_plan_still_says_in_one_line_how_to_measure_it(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cp = load_costs("costs/cpu-float32.yaml")
    from dataclasses import replace

    from skipsearch.files.cost_profile import save_costs

    bare = save_costs(replace(cp, costs=replace(cp.costs, schemes=())), tmp_path / "bare.yaml")
    result = runner.invoke(app, ["plan", "profile", "--profile", "profiles/smollm2-135m/cpu-float32-chat.yaml",
                                 "--costs", str(bare)])
    # the shipped profile keeps fp16, int8 and int4 traces: the line names them all and how to measure one
    assert_one_line_error(result, "no costs for any precision scheme this draft was traced in (fp16, int8, int4): "
                                  "measure one with `skipsearch costs --schemes fp16`")


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_the_default_schemes_re_plan_every_shipped_profile_without_timing(tmp_path, device):
    """No model and no clock: a cost file of fixed numbers (costs/cpu-float32.yaml's, every scheme costed as its
    fp16 entry) for ``device`` that keeps exactly the schemes `skipsearch costs` measures there by default re-plans
    every shipped profile. Re-planning names the scheme it misses (CostsError), independently of what the methods'
    replan_schemes say, so a method that forgets to ask for one fails here, as does a profile that needs a scheme
    the default list leaves out."""
    from dataclasses import replace

    from skipsearch.files.costs import SchemeCosts
    from skipsearch.files.errors import NoRecordError, ProfileError

    # one model's profiles ship today; another model's folder needs its own cost file's fixed numbers here
    assert sorted(p.name for p in (ROOT / "profiles").iterdir() if p.is_dir()) == ["smollm2-135m"]
    template = load_costs(ROOT / "costs" / "cpu-float32.yaml")
    choice = default_schemes(["smollm2-135m"], device, root=ROOT / "profiles")
    assert not choice.notes  # every shipped profile was read
    like = next(s for s in template.costs.schemes if s.scheme == "fp16")
    schemes = tuple(SchemeCosts(name, like.attn_seconds, like.mlp_seconds, like.head_saving_seconds)
                    for name in choice.schemes)
    cp = replace(template, device=device, costs=replace(template.costs, schemes=schemes))
    # the int8 target's profiles re-plan with the int8 target's cost file, which keeps its own default schemes
    choice8 = default_schemes(["smollm2-135m"], device, root=ROOT / "profiles", target_precision="int8")
    cp8 = replace(cp, model=replace(cp.model, precision="int8"), costs=replace(cp.costs, schemes=tuple(
        SchemeCosts(name, like.attn_seconds, like.mlp_seconds, like.head_saving_seconds) for name in choice8.schemes)))
    replanned = refused = 0
    for path in SHIPPED:
        prof = load_profile(path, num_layers=30)
        try:
            new, _ = device_replan.replan_profile(prof, cp8 if prof.model.target_precision == "int8" else cp,
                                                  source=str(path), costs_source="default.yaml")
        except NoRecordError:  # hand-written: keeps no record (raised after the cost file passed its checks)
            assert path.name in ("example.yaml", "hier-medium.yaml", "hier-small.yaml")
            continue
        except ConfigError as e:  # an int8 target runs on CPUs only: a GPU's cost file is refused for it
            assert device != "cpu" and prof.model.target_precision == "int8" and "runs on CPUs" in str(e), str(e)
            refused += 1
            continue
        assert new.method == prof.method
        replanned += 1
    assert replanned == len(SHIPPED) - 3 - refused
    # and the check has teeth: without any one default scheme some shipped profile cannot be re-planned
    for missing in choice.schemes:
        short = replace(cp, costs=replace(cp.costs, schemes=tuple(s for s in schemes if s.scheme != missing)))
        needed = "needed by" in dict(choice.why)[missing]
        failed = rescued = False
        for path in SHIPPED:
            prof = load_profile(path, num_layers=30)
            if prof.model.target_precision != "native":  # re-planned with its own target's file, above
                continue
            try:
                new, _ = device_replan.replan_profile(prof, short, source=str(path), costs_source="short.yaml")
            except NoRecordError:
                continue
            except ConfigError as e:
                if "runs on CPUs" in str(e):  # the int8 target on a GPU's cost file, as above
                    continue
                raise
            except ProfileError as e:
                assert "no costs for" in str(e) and missing in str(e), str(e)
                failed = True
                continue
            # a draft traced in several schemes re-plans in another one the file prices, never the missing one
            if _scheme(prof) == missing:
                assert _scheme(new) != missing, path.name
                rescued = True
        assert failed == needed or (needed and rescued), (missing, dict(choice.why)[missing])


def _scheme(prof) -> str | None:
    """The precision scheme a profile drafts in (a hybrid keeps its fallback's beside its own params)."""
    return dict(prof.method_params).get("scheme")
