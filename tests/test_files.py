"""The YAML toolkit that profiles and cost files share (skipsearch.files.yamlio)."""

from __future__ import annotations

import os

import pytest

from skipsearch import costs, profile
from skipsearch.files import yamlio
from skipsearch.files.errors import CostsError, ProfileError


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
