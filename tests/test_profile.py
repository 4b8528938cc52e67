"""Draft profiles: round trips, and one clear one-line error for every kind of bad file."""

from __future__ import annotations

import copy
import warnings

import pytest
import yaml

from skipsearch.config import DraftConfig, ExitRule
from skipsearch.files.errors import ProfileError
from skipsearch.profile import (
    BASELINES,
    SCHEMA_VERSION,
    Environment,
    Measured,
    ModelRef,
    Profile,
    SearchInfo,
    check_model,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    save_profile,
    upgrade,
)

BASE = {
    "schema_version": 1,
    "model": {"name": "smollm2-135m", "num_layers": 30, "fingerprint": "abc123", "dtype": "float32"},
    "method": "layer-skip",
    "draft": {
        "skip_attn": [3, 7],
        "skip_mlp": [12],
        "max_draft_tokens": 4,
        "exit": {"threshold": 0.6, "adaptive": True, "target_acceptance": 0.9, "step": 0.01, "beta1": 0.5,
                 "beta2": 0.9},
    },
}


def full_profile() -> Profile:
    return Profile(
        model=ModelRef(name="smollm2-135m", num_layers=30, fingerprint="abc123"),
        method="clasp-dynamic",  # a method with params, so that they round-trip too
        draft=DraftConfig(skip_attn=(3, 7), skip_mlp=(12,), max_draft_tokens=5,
                          exit=ExitRule(threshold=0.4, adaptive=False)),
        measured=Measured(speedup=1.37, tokens_per_s=101.5, baseline_tokens_per_s=74.1, tau=2.4,
                          baseline="skipsearch-ar", device="cpu", dataset="mt-bench",
                          n_prompts=8, max_new_tokens=64, seed=0, source="bench", notes="quiet machine",
                          extra=(("p50_latency_ms", 12.5), ("tags", ["a", "b"]))),
        environment=Environment(python="3.11.7", torch="2.4.0", transformers="4.56.0", skipsearch="0.1.0",
                                device_name="cpu"),
        search=SearchInfo(strategy="optuna-tpe", budget=200, trials=180, study="studies/s.db", objective="speedup",
                          seed=1),
        method_params=(("num_skips", 2), ("loi", 4)),
    )


def write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def with_change(change) -> dict:
    raw = copy.deepcopy(BASE)
    change(raw)
    return raw


def load_error(path, **kwargs) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    return message


# ---------------------------------------------------------------- round trips


def test_full_round_trip(tmp_path):
    original = full_profile()
    path = save_profile(original, tmp_path / "deep" / "dir" / "p.yaml")
    loaded = load_profile(path)
    assert loaded == original
    assert loaded.measured.extra == (("p50_latency_ms", 12.5), ("tags", ["a", "b"]))
    text = path.read_text()
    assert text.startswith(f"# skipsearch draft profile (schema v{SCHEMA_VERSION})\n")
    assert "skip_attn: [3, 7]" in text and "tokens_per_s: 101.5" in text
    assert "!!" not in text  # no python-specific tags: any YAML reader can read it
    assert [p.name for p in path.parent.iterdir()] == ["p.yaml"]  # no temp file left behind


def test_minimal_profile_fills_defaults():
    raw = {"schema_version": 1, "model": {"name": "m", "num_layers": 4}, "method": "layer-skip", "draft": {}}
    p = profile_from_dict(raw)
    assert p.draft == DraftConfig() and p.model.dtype == "float32" and p.model.fingerprint is None
    assert p.measured is None and p.environment is None and p.search is None and p.method_params == ()
    assert profile_from_dict(profile_to_dict(p)) == p


def test_yaml_lists_become_sorted_tuples_and_ints_become_floats(tmp_path):
    raw = with_change(lambda r: r["draft"].update(skip_attn=[7, 3, 7], exit={"threshold": 1}))
    p = load_profile(write(tmp_path, raw))
    assert p.draft.skip_attn == (3, 7)
    assert isinstance(p.draft.exit.threshold, float) and p.draft.exit.threshold == 1.0


def test_numpy_figures_are_written_as_plain_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    p = Profile(model=ModelRef(name="m", num_layers=2), method="layer-skip", draft=DraftConfig(),
                measured=Measured(speedup=np.float64(1.25), n_prompts=np.int64(3)))
    path = save_profile(p, tmp_path / "p.yaml")
    assert "speedup: 1.25" in path.read_text() and "n_prompts: 3" in path.read_text()
    assert load_profile(path).measured == Measured(speedup=1.25, n_prompts=3)


def test_save_validates_before_writing(tmp_path):
    bad = Profile(model=ModelRef(name="m", num_layers=4), method="layer-skip", draft=DraftConfig(skip_mlp=(4,)))
    path = tmp_path / "p.yaml"
    with pytest.raises(ProfileError, match=r"draft.skip_mlp has layer index 4 but the model has 4 layers \(0..3\)"):
        save_profile(bad, path)
    assert not path.exists()


def test_save_keeps_old_file_when_yaml_cannot_hold_a_value(tmp_path):
    path = save_profile(full_profile(), tmp_path / "p.yaml")
    before = path.read_text()
    odd = Profile(model=ModelRef(name="m", num_layers=2), method="layer-skip", draft=DraftConfig(),
                  measured=Measured(extra=(("obj", object()),)))
    with pytest.raises(ProfileError, match="cannot write as YAML"):
        save_profile(odd, path)
    assert path.read_text() == before


def test_upgrade_is_identity_for_current_version_and_copies():
    raw = copy.deepcopy(BASE)
    out = upgrade(raw, source="x.yaml")
    assert out == {**BASE, "schema_version": SCHEMA_VERSION} and out is not raw and raw == BASE


def test_upgrade_runs_every_step_up_to_the_current_version(monkeypatch):
    import skipsearch.profile.schema as profile_module

    def v1_to_v2(raw):
        return {**raw, "draft": {**raw["draft"], "max_draft_tokens": 9}}

    monkeypatch.setattr(profile_module, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(profile_module, "_UPGRADES", {1: v1_to_v2})
    out = upgrade(copy.deepcopy(BASE), source="x.yaml")
    assert out["schema_version"] == 2 and out["draft"]["max_draft_tokens"] == 9
    assert upgrade(out, source="x.yaml") == out  # already current: nothing more to do
    with pytest.raises(ProfileError, match=r"unknown schema_version 3 \(this skipsearch reads 1..2\)"):
        upgrade({**BASE, "schema_version": 3}, source="x.yaml")


def test_describe_names_everything_a_reader_needs():
    text = full_profile().describe()
    for fragment in ("smollm2-135m (30 layers, float32, fingerprint abc123)", "K=5", "fixed threshold 0.4",
                     "skip attn:   3, 7 (2 of 30)", "skip mlp:    12 (1 of 30)", "5.0% of 60 sublayers",
                     "1.37x speedup vs skipsearch-ar (skipsearch's own autoregressive loop", "device cpu",
                     "dataset mt-bench",
                     "p50_latency_ms 12.5", "strategy optuna-tpe", "trials 180", "torch 2.4.0"):
        assert fragment in text, fragment
    plain = profile_from_dict(BASE).describe()
    assert "adaptive threshold from 0.6 towards acceptance 0.9" in plain and "measured" not in plain


def test_environment_current_reads_this_interpreter():
    import platform

    env = Environment.current("cpu")
    assert env.python == platform.python_version() and env.device_name


# ---------------------------------------------------------------- bad files


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "schema_version: 1\nmodel: {name: m\n  num_layers: [1, 2\nmethod: x\n")
    message = load_error(path)
    assert "malformed YAML at line" in message


def test_malformed_yaml_line_number_is_the_broken_line(tmp_path):
    message = load_error(write(tmp_path, "schema_version: 1\nmethod: layer-skip\ndraft: [1, 2\nmodel: x\n"))
    assert "malformed YAML at line 4" in message


@pytest.mark.parametrize(("text", "got"), [("- a\n- b\n", "got a list"), ("just words\n", "got a str"),
                                           ("", "got an empty file")])
def test_top_level_must_be_a_mapping(tmp_path, text, got):
    assert f"expected a YAML mapping at the top level, {got}" in load_error(write(tmp_path, text))


def test_missing_file(tmp_path):
    assert "cannot read the profile: No such file or directory" in load_error(tmp_path / "absent.yaml")


@pytest.mark.parametrize(("version", "shown"), [(7, "7"), (0, "0"), ("1", "'1'"), (1.0, "1.0"), (True, "True")])
def test_unknown_schema_version(tmp_path, version, shown):
    path = write(tmp_path, with_change(lambda r: r.update(schema_version=version)))
    assert f"unknown schema_version {shown} (this skipsearch reads 1..{SCHEMA_VERSION})" in load_error(path)


def _drop(section, key):
    def change(raw):
        del (raw[section] if section else raw)[key]
    return change


@pytest.mark.parametrize(("section", "key", "named"), [
    (None, "schema_version", "schema_version"),
    (None, "model", "model"),
    (None, "method", "method"),
    (None, "draft", "draft"),
    ("model", "name", "model.name"),
    ("model", "num_layers", "model.num_layers"),
])
def test_missing_required_key(tmp_path, section, key, named):
    path = write(tmp_path, with_change(_drop(section, key)))
    assert load_error(path).endswith(f": missing required key {named}")


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda r: r["draft"].update(skip_attn=[3, 31]),
     "draft.skip_attn has layer index 31 but the model has 30 layers (0..29)"),
    (lambda r: r["draft"].update(skip_mlp=[30]), "draft.skip_mlp has layer index 30 but the model has 30 layers"),
    (lambda r: r["draft"].update(skip_attn=[-1]), "draft.skip_attn must list layer indices as integers >= 0, got -1"),
    (lambda r: r["draft"].update(skip_mlp=["3"]), "draft.skip_mlp must list layer indices as integers >= 0, got '3'"),
    (lambda r: r["draft"].update(skip_mlp=[2.0]), "draft.skip_mlp must list layer indices as integers >= 0, got 2.0"),
    (lambda r: r["draft"].update(skip_attn=[True]), "got True"),
    (lambda r: r["draft"].update(skip_attn=3), "draft.skip_attn must be a list of layer indices, got 3"),
    (lambda r: r["draft"]["exit"].update(threshold=1.5), "draft.exit.threshold must be in [0, 1], got 1.5"),
    (lambda r: r["draft"]["exit"].update(beta2=-0.1), "draft.exit.beta2 must be in [0, 1], got -0.1"),
    (lambda r: r["draft"]["exit"].update(threshold="high"), "draft.exit.threshold must be a number, got 'high'"),
    (lambda r: r["draft"]["exit"].update(adaptive="sometimes"), "draft.exit.adaptive must be true or false"),
    (lambda r: r["draft"].update(exit=0.6), "draft.exit must be a mapping, got 0.6"),
    (lambda r: r["draft"]["exit"].update(thresold=0.5), "unknown key draft.exit.thresold"),
    (lambda r: r["draft"].update(max_draft_tokens=-1), "draft.max_draft_tokens must be an integer >= 0, got -1"),
    (lambda r: r["draft"].update(max_draft_tokens=True), "draft.max_draft_tokens must be an integer, got True"),
    (lambda r: r["draft"].update(skip_atn=[1]), "unknown key draft.skip_atn"),
    (lambda r: r.update(method="no-such-method"), "unknown method 'no-such-method' (known: "),
    (lambda r: r.update(method=3), "method must be a string, got 3"),
    (lambda r: r.update(drafts={}), "unknown top-level key 'drafts' (known: schema_version, model, method"),
    (lambda r: r.update(model="smollm2"), "model must be a mapping, got 'smollm2'"),
    (lambda r: r["model"].update(num_layers="30"), "model.num_layers must be an integer, got '30'"),
    (lambda r: r["model"].update(num_layers=0), "model.num_layers must be >= 1, got 0"),
    (lambda r: r["model"].update(num_layers=10**12), "model.num_layers must be in 1..1024, got 1000000000000"),
    (lambda r: r["model"].update(dtype="float7"), "model.dtype must be one of float32, float16, bfloat16, "
                                                  "got 'float7'"),
    (lambda r: r["draft"].update(max_draft_tokens=10**9), "draft.max_draft_tokens must be in 0..4095, "
                                                          "got 1000000000"),
    (lambda r: r.update(measured={"speedup": float("inf")}), "measured.speedup must be a finite number, got inf"),
    (lambda r: r.update(measured={"tau": float("nan")}), "measured.tau must be a finite number, got nan"),
    (lambda r: r.update(measured={"acceptance_rate": 1.5}), "measured.acceptance_rate must be in 0..1, got 1.5"),
    (lambda r: r.update(measured={"speedup": -2.0}), "measured.speedup must be >= 0, got -2.0"),
    (lambda r: r.update(environment={"threads": 0}), "environment.threads must be in 1..1024, got 0"),
    (lambda r: r.update(search={"strategy": "tpe", "budget": -1}), "search.budget must be >= 0, got -1"),
    (lambda r: r["model"].update(name=""), "model.name must not be empty"),
    (lambda r: r["model"].update(layers=30), "unknown key model.layers"),
    (lambda r: r.update(measured={"speedup": "fast"}), "measured.speedup must be a number, got 'fast'"),
    (lambda r: r.update(measured={"n_prompts": -2}), "measured.n_prompts must be >= 0, got -2"),
    (lambda r: r.update(search={"trials": 3}), "missing required key search.strategy"),
    (lambda r: r.update(environment={"cuda": "12"}), "unknown key environment.cuda"),
    (lambda r: r.update(method_params=[1]), "method_params must be a mapping, got [1]"),
])
def test_bad_field(tmp_path, change, fragment):
    assert fragment in load_error(write(tmp_path, with_change(change)))


def test_error_stays_on_one_line_even_for_a_key_with_a_newline(tmp_path):
    message = load_error(write(tmp_path, with_change(lambda r: r.update(environment={"gpu\nname": "x"}))))
    assert "unknown key environment.gpu name" in message


def test_unknown_measured_keys_are_kept_not_refused(tmp_path):
    p = load_profile(write(tmp_path, with_change(lambda r: r.update(measured={"speedup": 2, "gpu_util": 0.8}))))
    assert p.measured.speedup == 2.0 and p.measured.extra == (("gpu_util", 0.8),)


# ---------------------------------------------------------------- measured.baseline


def test_the_baseline_is_a_field_with_a_closed_set_of_values(tmp_path):
    assert set(BASELINES) == {"skipsearch-ar", "hf-greedy", "predicted"}
    for value in BASELINES:
        raw = with_change(lambda r, v=value: r.update(schema_version=SCHEMA_VERSION,
                                                      measured={"speedup": 1.2, "baseline": v}))
        p = load_profile(write(tmp_path, raw))
        assert p.measured.baseline == value and p.measured.extra == ()
        assert f"1.20x speedup vs {value} ({BASELINES[value]})" in p.describe()
    raw = with_change(lambda r: r.update(schema_version=SCHEMA_VERSION,
                                         measured={"speedup": 1.2, "baseline": "hf-greedy, same bench run"}))
    message = load_error(write(tmp_path, raw))
    assert message.endswith("measured.baseline must be one of skipsearch-ar, hf-greedy, predicted, "
                            "got 'hf-greedy, same bench run'")
    # nor can a writer put free text back: a profile is validated before it is written
    bad = Profile(model=ModelRef(name="m", num_layers=2), method="layer-skip", draft=DraftConfig(),
                  measured=Measured(speedup=1.1, baseline="my laptop"))
    with pytest.raises(ProfileError, match="measured.baseline must be one of"):
        save_profile(bad, tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()


@pytest.mark.parametrize(("version", "text", "value"), [
    (2, "skipsearch autoregressive, same process, interleaved", "skipsearch-ar"),  # what optimize wrote
    (2, "hf-greedy (transformers generate, do_sample=False), same bench run", "hf-greedy"),  # bench --write-measured
    (2, "cost-model prediction (not timed)", "predicted"),  # plan --profile, optimize --budget 0
    (2, "cost-model prediction", "predicted"),  # optimize with a surrogate objective
    (2, "planner prediction", "predicted"),  # plan --medium/--small without validation
    (1, "skipsearch-autoregressive, same run", "skipsearch-ar"),  # hand-written, schema 1
    (1, "  HF Greedy,  same run", "hf-greedy"),
])
def test_an_old_free_text_baseline_loads_as_its_value(tmp_path, version, text, value):
    raw = with_change(lambda r: r.update(schema_version=version, measured={"speedup": 1.3, "baseline": text}))
    path = write(tmp_path, raw)
    p = load_profile(path)
    assert p.measured.baseline == value and p.measured.extra == ()
    again = load_profile(save_profile(p, tmp_path / "again.yaml"))  # written as schema v3, read back the same
    assert again == p and f"schema_version: {SCHEMA_VERSION}" in (tmp_path / "again.yaml").read_text()


def test_an_old_bench_block_keeps_the_search_s_baseline_as_a_value_too(tmp_path):
    before = {"speedup": 1.2, "baseline": "skipsearch autoregressive, same process, interleaved", "source": "optimize"}
    raw = with_change(lambda r: r.update(schema_version=2, measured={
        "speedup": 1.1, "baseline": "hf-greedy (transformers generate, do_sample=False), same bench run",
        "before_bench": before}))
    p = load_profile(write(tmp_path, raw))
    assert p.measured.baseline == "hf-greedy"
    assert dict(p.measured.extra)["before_bench"] == {**before, "baseline": "skipsearch-ar"}
    kept = copy.deepcopy(raw)
    assert upgrade(raw)["measured"]["before_bench"]["baseline"] == "skipsearch-ar"
    assert raw == kept  # the caller's dict is left as it was


def test_profile_show_names_the_baseline_of_an_old_file(tmp_path):
    from typer.testing import CliRunner

    from skipsearch.cli import app

    raw = with_change(lambda r: r.update(schema_version=2, measured={
        "speedup": 1.25, "baseline": "hf-greedy (transformers generate, do_sample=False), same bench run"}))
    shown = CliRunner().invoke(app, ["profile", "show", str(write(tmp_path, raw))])
    assert shown.exit_code == 0, shown.output
    assert "1.25x speedup vs hf-greedy (HF transformers generate(do_sample=False), timed in the same bench run)" \
        in shown.stdout


def test_an_old_baseline_text_that_names_no_value_still_loads_and_is_kept(tmp_path):
    raw = with_change(lambda r: r.update(schema_version=2, measured={"speedup": 1.3, "baseline": "vLLM, batch 1"}))
    p = load_profile(write(tmp_path, raw))
    assert p.measured.baseline is None and p.measured.extra == (("baseline_text", "vLLM, batch 1"),)
    assert "1.30x speedup vs an unrecorded baseline" in p.describe() and "vLLM, batch 1" in p.describe()
    assert load_profile(save_profile(p, tmp_path / "again.yaml")) == p
    # an old baseline that is not text at all is refused as it always was
    raw = with_change(lambda r: r.update(schema_version=2, measured={"baseline": 3}))
    assert "measured.baseline must be a string, got 3" in load_error(write(tmp_path, raw))


def test_the_shipped_profiles_load_with_a_baseline_value():
    from pathlib import Path

    shipped = sorted(Path("profiles").rglob("*.yaml"))
    assert shipped
    for path in shipped:
        measured = load_profile(path).measured
        assert measured is None or measured.baseline in (None, *BASELINES), path


def test_from_dict_uses_the_source_name():
    with pytest.raises(ProfileError, match=r"^team/a.yaml: unknown method 'x'"):
        profile_from_dict(with_change(lambda r: r.update(method="x")), source="team/a.yaml")
    with pytest.raises(ProfileError, match=r"^<profile>: the profile must be a mapping"):
        profile_from_dict([1, 2])


# ---------------------------------------------------------------- model checks


def test_num_layers_mismatch(tmp_path):
    path = write(tmp_path, BASE)
    message = load_error(path, num_layers=12)
    assert "profile was made for a 30-layer model, this model has 12 layers" in message
    assert load_profile(path, num_layers=30).model.num_layers == 30


def test_num_layers_mismatch_cannot_be_forced(tmp_path):
    assert "30-layer model" in load_error(write(tmp_path, BASE), num_layers=12, force=True)


def test_fingerprint_mismatch_is_an_error(tmp_path):
    message = load_error(write(tmp_path, BASE), fingerprint="zzz")
    assert "profile was made for model fingerprint abc123, this model's is zzz" in message


def test_fingerprint_mismatch_forced_warns_and_loads(tmp_path):
    path = write(tmp_path, BASE)
    with pytest.warns(UserWarning, match="fingerprint abc123, this model's is zzz"):
        p = load_profile(path, fingerprint="zzz", force=True)
    assert p.model.fingerprint == "abc123"


def test_fingerprint_checked_only_when_both_known(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_profile(write(tmp_path, BASE), fingerprint="abc123").model.name == "smollm2-135m"
        no_print = with_change(lambda r: r["model"].pop("fingerprint"))
        assert load_profile(write(tmp_path, no_print, "n.yaml"), fingerprint="zzz").model.fingerprint is None


def test_check_model_after_loading():
    p = profile_from_dict(BASE)
    check_model(p, num_layers=30, fingerprint="abc123")
    with pytest.raises(ProfileError, match=r"^m.yaml: profile was made for a 30-layer model, this model has 2"):
        check_model(p, num_layers=2, source="m.yaml")


# ---------------------------------------------------------------- methods


def test_method_params_are_validated_when_the_profile_is_read(tmp_path):
    raw = with_change(lambda r: r.update(method="fractal", method_params={"n": 0, "w": 3}))
    assert "fractal: method_params.n must be an integer >= 1, got 0" in load_error(write(tmp_path, raw))


# ---------------------------------------------------------------- hostile and huge files (issue 14, cause 5)


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": about 1 KB of YAML whose aliases expand to width**levels scalars."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["schema_version", "measured"])
def test_an_alias_bomb_is_refused_at_once(tmp_path, where):
    import time

    bomb = _alias_bomb()
    if where == "schema_version":
        text = bomb + "schema_version: *l8\n"
    else:  # a valid profile whose measured block holds the bomb (kept as an unknown key, then printed)
        text = yaml.safe_dump(BASE, sort_keys=False) + "measured:\n" + "".join(
            f"  {line}\n" for line in bomb.splitlines()) + "  boom: *l8\n"
    path = write(tmp_path, text)
    assert len(text) < 1500
    start = time.perf_counter()
    message = load_error(path)
    assert time.perf_counter() - start < 30  # not expanded: minutes; a wide margin for a loaded machine
    assert "refused" in message and "expands through its aliases" in message


def test_a_few_plain_aliases_still_load(tmp_path):
    text = yaml.safe_dump(BASE, sort_keys=False) + "measured: {dataset: &d mt-bench, notes: *d}\n"
    assert load_profile(write(tmp_path, text)).measured.notes == "mt-bench"


@pytest.mark.parametrize(("text", "fragment"), [
    ("schema_version: &a [*a]\n", "an alias refers to a node that contains it"),
    ("schema_version: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("schema_version: 0x" + "f" * 20000 + "\n", "an integer of 80000 bits"),
    ("schema_version: " + "9" * 5000 + "\n", "at line 1: Exceeds the limit"),
    ("schema_version: 1\nmeasured: {date: 2024-02-30}\n", "at line 2: day is out of range"),
])
def test_values_python_cannot_build_are_one_line_errors(tmp_path, text, fragment):
    assert fragment in load_error(write(tmp_path, text))


def test_a_file_over_the_size_cap_is_refused_without_reading_it_all(tmp_path):
    from skipsearch.profile import MAX_PROFILE_BYTES

    path = write(tmp_path, yaml.safe_dump(BASE) + "# " + "x" * MAX_PROFILE_BYTES + "\n")
    assert "refused: larger than 1 MiB" in load_error(path)


def test_short_never_builds_a_whole_repr_of_a_huge_value():
    from skipsearch.files.yamlio import short as _short

    shared = ["lol"] * 10
    for _ in range(30):  # 10**30 strings as a repr would write them out
        shared = [shared] * 10
    assert len(_short(shared)) == 60 and _short(shared).endswith("...")
    assert _short("x" * 10**7) == repr("x" * 56)[:57] + "..."
    assert _short(1 << 100_000) == "<an integer of 100001 bits>"
    for value in ([1, 2], {"a": [1, "b"]}, (), "s", 3.5, None, {1}, set()):
        assert _short(value) == repr(value)


# ---------------------------------------------------------------- where a profile may be written (cause 4)


def _refused(path, fragment, **kwargs):
    from skipsearch.profile import check_profile_target

    with pytest.raises(ProfileError) as info:
        check_profile_target(path, **kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_check_profile_target_accepts_new_paths_profiles_and_empty_files(tmp_path):
    from skipsearch.profile import check_profile_target

    assert check_profile_target(tmp_path / "new" / "deeper" / "p.yaml") == tmp_path / "new" / "deeper" / "p.yaml"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    # a profile is replaced when the command was asked to (force); an empty file holds nothing to lose
    check_profile_target(save_profile(full_profile(), tmp_path / "ours.yaml"), force=True)
    check_profile_target(write(tmp_path, BASE, "hand-written.yaml"), force=True)  # no header, but a profile's keys
    check_profile_target(write(tmp_path, with_change(lambda r: r.update(method="gone")), "old.yaml"),
                         force=True)  # invalid: still a profile
    check_profile_target(write(tmp_path, "", "empty.yaml"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.yaml", "hand-written.yaml", "old.yaml", "ours.yaml"]


def test_check_profile_target_refuses_what_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file" / "p.yaml", "file is not a directory")
    _refused(tmp_path / "file" / "sub" / "p.yaml", "file is not a directory")
    _refused(tmp_path, "is a directory")
    _refused("/dev/null", "not a regular file", force=True)


def test_check_profile_target_refuses_read_only_targets_even_for_root(tmp_path):
    import os

    path = save_profile(full_profile(), tmp_path / "p.yaml")
    before = path.read_bytes()
    os.chmod(path, 0o444)
    _refused(path, "read-only", force=True)
    folder = tmp_path / "locked"
    folder.mkdir()
    os.chmod(folder, 0o555)
    try:
        _refused(folder / "sub" / "p.yaml", "is not writable")
    finally:
        os.chmod(folder, 0o755)
    assert path.read_bytes() == before


def test_check_profile_target_refuses_an_immutable_target(tmp_path):
    import subprocess

    path = save_profile(full_profile(), tmp_path / "p.yaml")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE and a filesystem that has it)")
    try:
        _refused(path, "read-only (or immutable)")
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_check_profile_target_keeps_other_files_even_when_forced(tmp_path):
    from test_costs import synthetic

    from skipsearch.files.cost_profile import save_costs
    from skipsearch.profile import check_profile_target

    notes = write(tmp_path, "my notes: do not lose\n", "notes.yaml")
    _refused(notes, "is not a skipsearch profile; refusing to replace it: give another path")
    _refused(notes, "is not a skipsearch profile", force=True)  # another kind of file: never replaced
    _refused(write(tmp_path, "\xff binary", "blob.yaml"), "not a skipsearch profile")
    cost_file = save_costs(synthetic(num_layers=30), tmp_path / "costs.yaml")
    _refused(cost_file, "holds a skipsearch cost file, not a skipsearch profile", force=True)
    ours = save_profile(full_profile(), tmp_path / "ours.yaml")
    _refused(ours, "holds a skipsearch profile already; --force replaces it")  # the same kind, not asked
    check_profile_target(ours, force=True)  # the same kind, asked
    assert notes.read_text() == "my notes: do not lose\n"


def test_the_bounds_name_the_engines_own_limits():
    from skipsearch.files import bounds
    from skipsearch.model.placement import DEFAULT_MAX_TOKENS, DTYPES

    assert set(bounds.DTYPES) == set(DTYPES)
    assert bounds.MAX_DRAFT_TOKENS == DEFAULT_MAX_TOKENS - 1  # K + 1 verified positions fit the default cache
    assert bounds.MAX_PLAN_M * (bounds.MAX_PLAN_N + 1) <= bounds.MAX_DRAFT_TOKENS  # plan's largest block runs
    for path in bounds.PROFILE_BOUNDS:  # every bound names a real field
        section, key = path.split(".")
        cls = {"model": ModelRef, "draft": DraftConfig, "measured": Measured, "environment": Environment,
               "search": SearchInfo}[section]
        assert key in cls.__dataclass_fields__, path
