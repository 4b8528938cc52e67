"""``skipsearch bench --batch-sizes``: the rows per (batch size, contender), their flags against plain batched decoding,
the JSON section and older reports read back, and bad input refused in one line. No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest
import torch
from conftest import assert_one_line_error, make_tiny_model, tiny_tokenizer
from typer.testing import CliRunner

from skipsearch import bench as bn
from skipsearch import methods
from skipsearch.bench import batched as bb
from skipsearch.bench import batched_report
from skipsearch.bench import report as br
from skipsearch.cli import app
from skipsearch.config import ConfigError
from skipsearch.data import Prompt
from skipsearch.engine import equivalence, harness
from skipsearch.profile import ModelRef, Profile, save_profile

EXAMPLE = "profiles/smollm2-135m/example.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def sm():
    torch.set_num_threads(1)
    model = make_tiny_model(name="tiny-bench")
    model.tokenizer = tiny_tokenizer()  # word-level, over TINY_WORDS
    return model


# Prompts of different lengths (the batch is padded, each row at its own positions), repetitive so that lookup drafts.
PROMPTS = [Prompt("a", "def fib ( n ) : return fib ( n - 1 ) + fib ( n - 2 )", False, "x", "t"),
           Prompt("b", "what is it what is it", False, "y", "t"), Prompt("c", "how why", False, "x", "t")]


@dataclass(frozen=True)
class _Schedule:
    """What the bench reads of a profile's schedule (files.schedule.Schedule): k per batch size, the K weighed."""

    ranges: tuple[tuple[int, int, int], ...]
    considered: tuple[int, ...]

    def k_for(self, batch_size: int) -> int:
        return next((k for start, end, k in self.ranges if start <= batch_size <= end), 0)


def _ngram_plan(**kw) -> bb.BatchedPlan:
    candidate = methods.get("ngram").example(4)
    return bb.BatchedPlan(profile="p/ngram.yaml", candidate=candidate, **kw)


def _broken(contender: harness.Contender, *, batch, row: int = 0, position: int = 1) -> harness.Contender:
    """``contender`` with one token of one row changed on one batch (its prompts): what a batched decoder bug looks
    like."""

    def decode(prompts, max_new_tokens):
        out = contender.decode(prompts, max_new_tokens)
        rows = [list(r) for r in out.token_ids]
        if tuple(map(tuple, prompts)) == tuple(map(tuple, batch)) and len(rows[row]) > position:
            rows[row][position] = (rows[row][position] + 1) % 64
        return dataclasses.replace(out, token_ids=tuple(map(tuple, rows)))

    return harness.Contender("broken", contender.family, "one token changed", decode)


# -- input ---------------------------------------------------------------------------------------------
def test_batch_sizes_parse_sorted_and_once():
    assert bb.parse_sizes("4, 1,2,4", option="--batch-sizes", low=1, high=bb.MAX_BATCH_SIZE) == (1, 2, 4)
    for bad, fragment in (("0", "outside 1..1024"), ("-2", "outside"), ("1.5", "not an integer"),
                          ("2,x", "'x' is not an integer"), ("1025", "outside 1..1024"), ("", "not an integer")):
        with pytest.raises(ConfigError, match=fragment):
            bb.parse_sizes(bad, option="--batch-sizes", low=1, high=bb.MAX_BATCH_SIZE)


def test_batches_take_every_prompt_and_cycle_to_fill():
    assert bb.batches_of(5, 2) == ((0, 1), (2, 3), (4, 0))
    assert bb.batches_of(3, 8) == ((0, 1, 2, 0, 1, 2, 0, 1),)
    assert bb.batches_of(4, 1) == ((0,), (1,), (2,), (3,))


def test_the_fixed_k_and_the_schedule_rows_k_come_from_the_schedule_else_the_options_else_the_default():
    sched = _Schedule(ranges=((1, 2, 3), (3, 8, 1)), considered=(0, 1, 3, 5))
    plan = _ngram_plan(batch_sizes=(1, 4, 16), schedule=sched)
    assert bb.fixed_ks(plan)[0] == (1, 3, 5)
    assert [bb.schedule_k(plan, b)[0] for b in (1, 4, 16)] == [3, 1, 0]
    assert "no speculation" in bb.schedule_k(plan, 16)[1]
    assert bb.fixed_ks(dataclasses.replace(plan, ks=(0, 2)))[0] == (2,)  # asked for: K=0 is the plain row
    bare = _ngram_plan(batch_sizes=(2,))
    assert bb.fixed_ks(bare)[0] == bb.DEFAULT_KS
    k, setting = bb.schedule_k(bare, 2)
    assert k == bare.candidate.draft.max_draft_tokens and "no schedule" in setting


@pytest.mark.parametrize(("value", "fragment"), [("0", "--batch-sizes: 0 is outside 1..1024"),
                                                  ("-4", "--batch-sizes: -4 is outside"),
                                                  ("two", "--batch-sizes: 'two' is not an integer"),
                                                  ("1.5", "--batch-sizes: '1.5' is not an integer"),
                                                  ("2048", "--batch-sizes: 2048 is outside 1..1024")])
def test_cli_bad_batch_sizes_are_one_line_before_the_model_loads(value, fragment, monkeypatch):
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    result = runner.invoke(app, ["bench", "--profiles", EXAMPLE, "--peers", "hf-greedy", "--batch-sizes", value])
    assert_one_line_error(result, fragment)


@pytest.mark.parametrize(("args", "fragment"), [
    (["--profiles", EXAMPLE, "--batch-ks", "1,2"], "--batch-ks goes with --batch-sizes"),
    (["--profiles", EXAMPLE, "--strict"], "--strict goes with --batch-sizes"),
    (["--batch-sizes", "1,2"], "--batch-sizes benches one profile"),
    (["--profiles", EXAMPLE, "--batch-sizes", "2", "--batch-ks", "1,-1"], "--batch-ks: -1 is outside"),
])
def test_cli_batch_options_that_do_not_fit_together_are_one_line(args, fragment, monkeypatch):
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    assert_one_line_error(runner.invoke(app, ["bench", "--peers", "hf-greedy", *args]), fragment)


def test_cli_a_method_that_cannot_batch_is_one_line_before_the_model_loads(tiny_checkpoint, tmp_path, monkeypatch):
    from skipsearch.model import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    cannot = [m for m in methods.names() if m not in methods.batch_methods()]
    assert cannot, "every method batches: nothing to refuse"
    candidate = methods.get(cannot[0]).example(4)
    path = save_profile(Profile(model=ModelRef(name=str(tiny_checkpoint), num_layers=4), method=candidate.method,
                                draft=candidate.draft, method_params=candidate.params), tmp_path / "p.yaml")
    result = runner.invoke(app, ["bench", "--model", str(tiny_checkpoint), "--profiles", str(path), "--peers",
                                 "hf-greedy", "--dataset", "humaneval", "--n-prompts", "1", "--max-new-tokens", "2",
                                 "--sweep-prompts", "0", "--batch-sizes", "2", "--device", "cpu"])
    assert_one_line_error(result, f"method '{cannot[0]}' cannot decode a batch")


def test_the_bench_itself_refuses_a_method_that_cannot_batch_before_anything_is_timed(sm):
    cannot = next(m for m in methods.names() if m not in methods.batch_methods())
    plan = bb.BatchedPlan(profile="p.yaml", candidate=methods.get(cannot).example(4), batch_sizes=(2,))
    stages = []
    with pytest.raises(ConfigError, match=f"method '{cannot}' cannot decode a batch"):
        bn.bench(sm, PROMPTS, max_new_tokens=4, sweep=False, batched=plan,
                 on_stage=lambda title, total: stages.append(title))
    assert stages == []


# -- the run -----------------------------------------------------------------------------------------
def test_a_row_per_batch_size_and_contender_and_the_drafts_equal_plain(sm):
    sched = _Schedule(ranges=((1, 1, 2), (2, 4, 1)), considered=(0, 1, 2))
    plan = _ngram_plan(batch_sizes=(1, 2, 4), schedule=sched)
    stages = []
    report = bn.bench(sm, PROMPTS, max_new_tokens=8, sweep=False, batched=plan,
                      on_stage=lambda title, total: stages.append((title, total)))
    section = report.batched
    contenders = [bb.PLAIN, bb.SCHEDULE, "k=1", "k=2", bb.HF_BATCHED]
    assert [(r.batch_size, r.contender) for r in section.rows] == [(b, c) for b in (1, 2, 4) for c in contenders]
    # batches: 3 of one row, 2 of two (the second cycles back to the first prompt), 1 of four
    assert stages[-3:] == [("batched B=1", 3 * 5), ("batched B=2", 2 * 5), ("batched B=4", 1 * 5)]
    for r in section.rows:
        assert r.rows == r.batches * r.batch_size and 0 < r.new_tokens <= 8 * r.rows
        assert r.new_tokens == section.row(r.batch_size, bb.PLAIN).new_tokens
        assert r.identical == r.rows and not r.flagged and r.speedup is not None, r
    assert [section.row(b, bb.SCHEDULE).k for b in (1, 2, 4)] == [2, 1, 1]
    assert section.row(1, bb.PLAIN).speedup == pytest.approx(1.0)
    assert section.row(4, "k=2").acceptance_rate is not None and section.row(4, bb.PLAIN).acceptance_rate is None
    assert section.row(2, bb.HF_BATCHED).family == "hf" and section.row(2, bb.HF_BATCHED).k is None


def test_a_row_that_differs_from_plain_is_flagged_and_gets_no_speedup(sm):
    plan = _ngram_plan(batch_sizes=(2,), ks=(2,))
    ids = [[1, 5, 7, 9, 1, 5, 7, 9, 3], [2, 11, 4, 11, 4, 11, 6], [8, 8, 3, 8, 8, 3, 8]]
    (size,) = bb.prepare(sm, plan, ids, max_new_tokens=6)
    k2 = next(c for c, k in size.contenders if c.name == "k=2")
    batches = [tuple(tuple(ids[i]) for i in b) for b in size.batches]
    contenders = [*size.contenders, (_broken(k2, batch=batches[1], row=0, position=2), 2)]
    runs = harness.run_rounds([c for c, _ in contenders], batches, max_new_tokens=6, device=sm.device)
    rows = bb.summarize_size(2, contenders, runs, batches, [["t:a", "t:b"], ["t:c", "t:a"]],
                             judge=lambda p, got, want: equivalence.check(sm, p, got, want))
    broken = rows[-1]
    assert broken.flagged and broken.speedup is None and broken.identical == 3 and broken.rows == 4
    assert broken.first_mismatch.startswith("batch 1 row 0 (prompt t:c), token 2")
    assert all(not r.flagged for r in rows[:-1])
    # strict: the harness stops after the round in which the output differed, naming the row
    with pytest.raises(harness.LosslessnessError, match=r"broken differs from plain \(prompt 1, row 0, token 2\)"):
        harness.run_rounds([c for c, _ in contenders], batches, max_new_tokens=6, device=sm.device,
                           reference=bb.PLAIN, strict=True)
    lines = batched_report.flagged_lines(rows)
    assert lines == [f"warning: broken at B=2 output differs from plain batched decoding ({broken.first_mismatch})"]


# -- the report --------------------------------------------------------------------------------------
def _section() -> bb.BatchedBench:
    def row(b, name, k, speedup, identical=4, family="skipsearch"):
        return bb.BatchedRow(b, name, family, "", k, 2, 4, identical, 64, 1.0, 64.0, speedup, None, None, None,
                             None if identical == 4 else "batch 0 row 1 (prompt t:b), token 3")

    rows = (row(2, bb.PLAIN, 0, 1.0), row(2, bb.SCHEDULE, 2, 1.3), row(2, "k=1", 1, 1.2), row(2, "k=2", 2, 1.3),
            row(2, bb.HF_BATCHED, None, None, identical=3, family="hf"))
    return bb.BatchedBench("p/ngram.yaml", "ngram", "the profile's schedule", (1, 2), "--batch-ks", (2,), 3, 1, False,
                           rows)


def _report(section):
    settings = bn.BenchSettings("m", "cpu", "float32", "d", "heldout", 4, 32, 1, 1, 0, "memory")
    rows = (bn.BenchRow("hf-greedy", "hf", "", 4, 4, 100, 1.0, 100.0, 1.0, None, None, None, None, None, None, None,
                        None),)
    return bn.BenchReport(settings, (("device_name", "cpu"),), rows, (), (), (), 1.0, batched=section)


def test_a_schedule_of_k_0_is_said_to_decode_as_plain_does():
    """Where the schedule runs K = 0 it is plain decoding timed twice: the summary says their gap is noise."""
    def row(name, k, speedup):
        return bb.BatchedRow(16, name, "skipsearch", "", k, 1, 16, 16, 64, 1.0, 30.0, speedup, None, None, None, None)

    section = dataclasses.replace(_section(), batch_sizes=(16,), rows=(row(bb.PLAIN, 0, 1.0),
                                                                       row(bb.SCHEDULE, 0, 0.85), row("k=1", 1, 0.7)))
    (line,) = batched_report.summary_lines(section)
    assert line.startswith("B=16: plain 30.0 tok/s; schedule (k=0) 0.85x plain (k=0 decodes as plain does: the gap")
    assert "timing noise" not in batched_report.summary_lines(_section())[0]  # a schedule that drafts: no such note


def test_the_section_shows_every_row_flags_a_difference_and_round_trips_through_json():
    section = _section()
    report = _report(section)
    md = br.render_markdown(report)
    assert "## By batch size" in md and md.count("| 2 | ") == 5
    assert "| 2 | hf-batched-greedy |" in md and "3/4 DIFFERS" in md and "no (output differs)" in md
    assert "B=2: plain 64.0 tok/s; schedule (k=2) 1.30x plain; best fixed K k=2 1.30x" in md
    tables = br.rich_tables(report)
    assert tables[-1].row_count == 5
    doc = br.read_report_json(br.report_json(report))
    assert doc["version"] == br.JSON_VERSION == 7
    assert [r["flagged"] for r in doc["batched"]["rows"]] == [False] * 4 + [True]
    assert br.batched_section(doc) == section


def test_older_bench_json_still_reads():
    section_less = br.report_to_dict(_report(None))
    assert section_less["batched"] is None and br.batched_section(section_less) is None
    v4 = {k: v for k, v in section_less.items() if k != "batched"} | {"version": 4}
    doc = br.read_report_json(json.dumps(v4))
    assert doc["batched"] is None and doc["version"] == br.JSON_VERSION and doc["rows"] == v4["rows"]
    old_rows = [{k: v for k, v in r.items() if k not in ("ties", "tie_tokens", "verdict")} for r in v4["rows"]]
    v1 = {k: v for k, v in v4.items() if k != "llama.cpp"} | {"version": 1, "rows": old_rows, "categories": {}}
    v1["summary"] = {k: v for k, v in v1["summary"].items() if k not in ("tie_equal", "inside_hf")}
    doc = br.read_report_json(json.dumps(v1))
    assert doc["llama.cpp"] is None and doc["batched"] is None and doc["summary"]["inside_hf"] == []
    assert doc["rows"][0]["verdict"] == "identical" and doc["rows"][0]["ties"] == 0
    v5 = {**v4, "version": 5, "batched": None}
    v5["summary"] = {k: v for k, v in v5["summary"].items() if k not in ("best_drafted", "best_vs_ours_ar")}
    doc = br.read_report_json(json.dumps(v5))
    assert doc["summary"]["best_drafted"] is True
    assert doc["summary"]["best_vs_ours_ar"] == v5["summary"]["speculation_gain"]
    for bad in ({**v4, "version": 99}, {**v4, "version": "4"}, {**v4, "format": "other"}):
        with pytest.raises(ValueError, match="version|format"):
            br.read_report_json(json.dumps(bad))


def test_cli_end_to_end_by_batch_size_on_a_tiny_checkpoint(tiny_checkpoint, tmp_path):
    candidate = methods.get("ngram").example(4)
    path = save_profile(Profile(model=ModelRef(name=str(tiny_checkpoint), num_layers=4), method=candidate.method,
                                draft=candidate.draft, method_params=candidate.params), tmp_path / "p.yaml")
    js, md = tmp_path / "b.json", tmp_path / "b.md"
    result = runner.invoke(app, ["bench", "--model", str(tiny_checkpoint), "--profiles", str(path), "--peers",
                                 "hf-greedy", "--dataset", "humaneval", "--n-prompts", "3", "--max-new-tokens", "4",
                                 "--sweep-prompts", "0", "--batch-sizes", "1,2", "--batch-ks", "1,2", "--strict",
                                 "--device", "cpu", "--threads", "1", "--json-out", str(js), "--report", str(md)])
    assert result.exit_code == 0, result.output
    doc = br.read_report_json(js.read_text())
    section = br.batched_section(doc)
    assert [(r.batch_size, r.contender) for r in section.rows] == [
        (b, c) for b in (1, 2) for c in (bb.PLAIN, bb.SCHEDULE, "k=1", "k=2", bb.HF_BATCHED)]
    assert section.strict and all(not r.flagged for r in section.rows if r.family == "skipsearch")
    assert "--batch-sizes 1,2 --batch-ks 1,2 --strict" in md.read_text()
    assert "B=1: plain" in result.stdout



def test_write_measured_keeps_the_fastest_measured_k_per_batch_size_never_a_loss():
    from skipsearch.files.schedule import BatchRange, Schedule

    planned = Schedule((BatchRange(1, 3, 2, 1.5), BatchRange(4, 16, 4, 1.2)), (0, 1, 2, 4), basis="plan")

    def row(b, name, k, speedup):
        return bb.BatchedRow(b, name, "skipsearch", "", k, 1, b, b, 64, 1.0, 64.0, speedup, None, None, None, None)

    rows = (row(1, bb.PLAIN, 0, 1.0), row(1, "k=1", 1, 1.01), row(1, "k=2", 2, 0.9),  # within noise: plain
            row(2, bb.PLAIN, 0, 1.0), row(2, bb.SCHEDULE, 2, 1.2), row(2, "k=2", 2, 1.2), row(2, "k=1", 1, 1.1),
            row(4, bb.PLAIN, 0, 1.0), row(4, "k=2", 2, 1.1), row(4, "k=4", 4, None),  # k=4 differed: no figure
            row(8, bb.PLAIN, 0, 1.0), row(8, "k=1", 1, 0.8), row(8, bb.SCHEDULE, 4, 0.7))
    bench = dataclasses.replace(_section(), batch_sizes=(1, 2, 4, 8), ks=(1, 2, 4), rows=rows)
    got = bb.measured_schedule(bench, planned)
    assert [(r.start, r.end, r.k, r.predicted, r.measured) for r in got.ranges] == [
        (1, 1, 0, None, 1.0), (2, 7, 2, 1.5, 1.1), (8, 8, 0, None, 1.0)]  # B 2-7 merged at its lowest figure
    assert [got.k_for(b) for b in (1, 2, 5, 8, 9)] == [0, 2, 2, 0, 0]
    assert got.considered == (0, 1, 2, 4) and "measured by bench at B = 1, 2, 4, 8" in got.basis and "plan" in got.basis
    assert all(r.measured >= 1.0 for r in got.ranges)  # every range runs what measured no slower than plain
    unplanned = bb.measured_schedule(bench, None)  # a profile without a schedule gets one from the bench alone
    assert [r.k for r in unplanned.ranges] == [0, 2, 0] and all(r.predicted is None for r in unplanned.ranges)


def test_over_several_runs_a_k_ships_only_where_it_beat_plain_in_every_run():
    def row(b, name, k, speedup):
        return bb.BatchedRow(b, name, "skipsearch", "", k, 1, b, b, 64, 1.0, 64.0, speedup, None, None, None, None)

    # run A: K 2 wins at B = 2 and K 3 at B = 4; run B: K 2 holds at B = 2, but K 3 at B = 4 was noise and K 1 held
    a = (row(2, bb.PLAIN, 0, 1.0), row(2, "k=2", 2, 1.20), row(2, "k=3", 3, 1.10),
         row(4, bb.PLAIN, 0, 1.0), row(4, "k=1", 1, 1.06), row(4, "k=3", 3, 1.26))
    b = (row(2, bb.PLAIN, 0, 1.0), row(2, "k=2", 2, 1.08), row(2, "k=3", 3, 1.05),
         row(4, bb.PLAIN, 0, 1.0), row(4, "k=1", 1, 1.05), row(4, "k=3", 3, 0.93))
    run_a = dataclasses.replace(_section(), batch_sizes=(2, 4), ks=(1, 2, 3), rows=a)
    run_b = dataclasses.replace(run_a, rows=b)
    assert [r.k for r in bb.measured_schedule(run_a, None).ranges] == [2, 3]  # one run: its own fastest
    both = bb.measured_schedule([run_a, run_b], None)
    assert [(r.start, r.end, r.k, r.measured) for r in both.ranges] == [(1, 3, 2, 1.08), (4, 4, 1, 1.05)]
    assert "over 2 runs" in both.basis and "in every run" in both.basis
    # a K that beat plain in one run only, and lost in the other, is K = 0
    worse = dataclasses.replace(run_b, rows=tuple(dataclasses.replace(r, speedup=0.95) if r.k else r for r in b))
    assert [r.k for r in bb.measured_schedule([run_a, worse], None).ranges] == [0]
    # a K without a figure in one run (its output differed there) does not count
    missing = dataclasses.replace(run_b, rows=tuple(r for r in b if r.k != 2))
    assert bb.measured_schedule([run_a, missing], None).k_for(2) == 3


def test_the_schedule_script_refuses_a_report_without_a_batched_section_in_one_line(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from schedule_from_bench import main

    report = tmp_path / "r.json"
    report.write_text(br.report_json(_report(None)))
    assert main(["profiles/x.yaml", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no batched section" in err[0]
    report.write_text(br.report_json(_report(_section())))  # benched p/ngram.yaml, not the profile named
    assert main(["profiles/x.yaml", str(report)]) == 2
    assert "benched p/ngram.yaml, not profiles/x.yaml" in capsys.readouterr().err
