"""The YAML toolkit that profiles and cost files share (skipsearch.files.yamlio), and the one overwrite rule every
command's writes follow (skipsearch.files.targets)."""

from __future__ import annotations

import os

import pytest

from skipsearch import profile
from skipsearch.files import cost_profile as costs
from skipsearch.files import targets, yamlio
from skipsearch.files.errors import CostsError, ProfileError, TargetError


def test_the_atomic_writer_fsyncs_before_it_renames_and_leaves_nothing_behind(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    target = tmp_path / "deep" / "f.yaml"
    assert yamlio.write_atomic(target, "a: 1\n") == target
    yamlio.write_atomic(target, "a: 2\n")  # over an existing file
    assert target.read_text() == "a: 2\n" and events == ["fsync", "replace"] * 2
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.yaml"]


def test_a_failed_write_removes_its_temporary_file(tmp_path, monkeypatch):
    def refuse(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        yamlio.write_atomic(tmp_path / "f.yaml", "a: 1\n")
    assert list(tmp_path.iterdir()) == []


def test_each_file_kind_reports_its_problems_as_its_own_one_line_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n  b")
    for load, error in ((profile.load_profile, ProfileError), (costs.load_costs, CostsError)):
        with pytest.raises(error) as info:
            load(bad)
        assert isinstance(info.value, yamlio.OneLineError)
        assert str(info.value).startswith(f"{bad}: malformed YAML at line") and "\n" not in str(info.value)
    with pytest.raises(CostsError, match="cannot read the cost file"):
        costs.load_costs(tmp_path / "missing.yaml")


def test_a_file_of_one_kind_given_as_another_is_named_for_what_it_is(tmp_path):
    """A cost file given as --profile, a profile given as --costs, an export's manifest given as either: one line
    that says what the file is and where it goes, before any other check of it."""
    from conftest import assert_one_line_error
    from typer.testing import CliRunner

    from skipsearch.cli import app

    shipped, cost_file = "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml", "costs/cpu-float32.yaml"
    exported = CliRunner().invoke(app, ["export", "--profile", shipped, "--engine", "hf", "--out", str(tmp_path / "e")])
    assert exported.exit_code == 0, exported.output
    manifest = tmp_path / "e" / "export.yaml"
    assert targets.document_kind(yamlio.read_yaml(manifest, "m")) == targets.EXPORT  # its costs key notwithstanding
    with pytest.raises(TargetError, match="holds a skipsearch export, not a skipsearch cost file"):
        targets.check_target(manifest, targets.COSTS, replace=True)  # costs --out export.yaml --force: never
    for path, fragment in ((cost_file, "this is a skipsearch cost file, not a skipsearch profile: cost files"),
                           (manifest, "this is a skipsearch export's manifest, not a skipsearch profile: the profile "
                                      "it exported is profile.yaml beside it")):
        with pytest.raises(ProfileError, match="this is a skipsearch"):
            profile.load_profile(path)
        assert_one_line_error(CliRunner().invoke(app, ["decode", "--profile", str(path), "--prompt", "hi"]), fragment)
    for path, fragment in ((shipped, "this is a skipsearch profile, not a skipsearch cost file: draft profiles go "
                                     "to --profile"),
                           (manifest, "this is a skipsearch export's manifest, not a skipsearch cost file")):
        with pytest.raises(CostsError, match="this is a skipsearch"):
            costs.load_costs(path)
        assert_one_line_error(CliRunner().invoke(app, ["plan", "profile", "--profile", shipped, "--costs", str(path)]),
                              fragment)


# -- the one overwrite rule (skipsearch.files.targets) -------------------------------------------------------------
def _kinds_written_by_their_writers(tmp_path):
    """One file (or export directory) of each kind, written by its own writer where the writer needs no model."""
    import json

    from test_costs import synthetic
    from test_profile import full_profile

    from skipsearch.api.planning import plan_given
    from skipsearch.bench import report as bench_report
    from skipsearch.export import MANIFEST
    from skipsearch.methods.hierarchical.closed_form import plot_plan

    plan = plan_given(0.8, 0.7, 0.3, 0.2, max_m=2, max_n=1)
    (tmp_path / "report.md").write_text(plan.body)
    plot_plan(plan.plan, str(tmp_path / "plot.png"))
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / MANIFEST).write_text("# skipsearch export (schema v1)\nschema_version: 1\n")
    (tmp_path / "bench.json").write_text(json.dumps({"format": bench_report.JSON_FORMAT, "version": 3}, indent=2))
    (tmp_path / "bench.md").write_text("# skipsearch bench: smollm2-135m on cpu\n")  # render_markdown's title
    return {targets.PROFILE: profile.save_profile(full_profile(), tmp_path / "profile.yaml"),
            targets.COSTS: costs.save_costs(synthetic(), tmp_path / "costs.yaml"),
            targets.PLAN_REPORT: tmp_path / "report.md", targets.PLOT: tmp_path / "plot.png",
            targets.EXPORT: tmp_path / "export", targets.BENCH_JSON: tmp_path / "bench.json",
            targets.BENCH_REPORT: tmp_path / "bench.md"}


def test_every_kind_is_told_by_its_content_not_its_name(tmp_path):
    made = _kinds_written_by_their_writers(tmp_path)
    assert set(made) == set(targets.NOUNS)
    for kind, path in made.items():
        assert targets.kind_of(path) == kind, kind
        if path.is_file():  # under another name it is the same kind
            renamed = path.with_name(f"renamed-{kind}.txt")
            renamed.write_bytes(path.read_bytes())
            assert targets.kind_of(renamed) == kind
    (tmp_path / "notes.md").write_text("# my notes\n")
    (tmp_path / "other.json").write_text('{"format": "mine"}\n')
    for other in ("notes.md", "other.json"):
        assert targets.kind_of(tmp_path / other) is None


def test_a_file_is_replaced_only_by_its_own_kind_and_only_when_asked(tmp_path):
    made = _kinds_written_by_their_writers(tmp_path)
    for kind, path in made.items():
        targets.check_target(path, kind, replace=True)  # the same kind, asked: fine
        with pytest.raises(TargetError, match="already; --force replaces it"):
            targets.check_target(path, kind)  # the same kind, not asked
        for other in made:
            if other != kind and targets.EXPORT not in (kind, other):  # a file is never a directory: below
                with pytest.raises(TargetError, match="refusing to replace it: give another path") as info:
                    targets.check_target(path, other, replace=True)  # another kind: never
                assert "\n" not in str(info.value)
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "empty-dir").mkdir()
    targets.check_target(tmp_path / "empty.yaml", targets.COSTS)  # nothing to lose
    targets.check_target(tmp_path / "empty-dir", targets.EXPORT)
    with pytest.raises(TargetError, match="exists and is not a directory; give a directory for the export"):
        targets.check_target(made[targets.PROFILE], targets.EXPORT, replace=True)
    with pytest.raises(TargetError, match="is a directory; give a file path"):
        targets.check_target(made[targets.EXPORT], targets.PROFILE, replace=True)
    with pytest.raises(TargetError, match="--write-measured replaces it"):
        targets.check_target(made[targets.PROFILE], targets.PROFILE, flag="--write-measured")
