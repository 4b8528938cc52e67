"""A bench report as data, Markdown, JSON and rich tables. Nothing here runs a model.

The summary keeps two gains apart so that neither hides the other:
- *loop overhead gain*: our autoregressive path over HF greedy (same model, no drafting), which
  is what our loop saves or costs per token whatever the draft does;
- *speculation gain*: our best profile over our own autoregressive path, which is what drafting
  itself buys.
Their product is the best profile's speedup over HF greedy.

Every row carries its verdict against HF greedy's output (``equivalence.py``): identical, equal up to
numerical ties (with the number of tied tokens), or different. The first two get a speedup figure.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from skipsearch.bench import batched_report, vllm_bench
from skipsearch.bench import llamacpp_report as llama_report
from skipsearch.bench.batched import BatchedBench
from skipsearch.bench.peers import BASELINE, HF_COMPILED, PROFILE_IN_HF
from skipsearch.bench.rows import BenchRow
from skipsearch.bench.runner import BenchReport
from skipsearch.engine.equivalence import DIFFERENT, IDENTICAL, tolerance_rule
from skipsearch.engine.harness import OURS_AR
from skipsearch.profile import BASELINE_HF_GREEDY, OLD_BASELINE_KEY, Measured, Profile

JSON_FORMAT = "skipsearch-bench"
# JSON versions: 1: first version (settings, environment, summary, rows, categories, sweeps, prompts).
# 2: rows gain ties, tie_tokens and verdict; prompts gain verdict and tie_tokens; the summary gains
#    tie_equal. A version-1 reader that ignores unknown keys still reads every version-1 field.
# 3: a profile run inside HF generate (hf-generate+profile) is family "hf-profile", no longer an HF peer; the
#    summary gains inside_hf.
# 4: "llama.cpp": the llama.cpp peer (bench.llamacpp_report.result_to_dict, with its "sweep" beside; null when not
#    asked for). Every version-3 field is as it was.
# 5: "batched": the section by batch size (bench.batched_report.to_dict; null without --batch-sizes). Every
#    version-4 field is as it was.
# 6: the summary gains best_drafted and best_vs_ours_ar, and its speculation_gain is null where the best profile
#    drafted no token (a profile that ships plain decoding). Every other version-5 field is as it was.
# 7: "vllm": the vLLM peer (bench.vllm_bench.result_to_dict; null when not asked for). Every version-6 field is as
#    it was.
JSON_VERSION = 7
WITHIN = 0.05  # a profile inside HF generate is meant to run within 5% of the same profile in skipsearch's engine


@dataclass(frozen=True)
class Summary:
    baseline_tokens_per_s: float | None  # HF greedy
    loop_overhead_gain: float | None  # skipsearch-ar speed / HF greedy speed
    best_profile: str | None  # the fastest profile row whose output is identical or equal up to ties
    best_profile_speedup: float | None  # vs HF greedy
    speculation_gain: float | None  # best profile speed / skipsearch-ar speed; None when it drafted nothing
    peers: tuple[tuple[str, float | None], ...]  # each HF peer's speedup (None: output differs)
    not_slower_than_hf_greedy: bool | None  # goal 1; None without a usable profile row
    beats_every_peer: bool | None  # goal 2; None without a usable profile row or any peer
    flagged: tuple[str, ...]  # methods whose output differs from HF greedy
    tie_equal: tuple[tuple[str, int, int], ...] = ()  # (method, prompts, tied tokens) equal only up to ties
    # (row, its speedup, its speed over the same profile's own row) for each profile run inside HF generate
    inside_hf: tuple[tuple[str, float | None, float | None], ...] = ()
    best_drafted: bool = True  # the best profile drafted some token (one that ships max_draft_tokens 0 does not)
    best_vs_ours_ar: float | None = None  # its speed over skipsearch-ar's, whether it drafted or not


def _profiles(report: BenchReport) -> list[BenchRow]:
    return [r for r in report.rows if r.family == "skipsearch" and r.method != OURS_AR]


def summarize_report(report: BenchReport) -> Summary:
    base, ar = report.row(BASELINE), report.row(OURS_AR)
    usable = [r for r in _profiles(report) if r.speedup is not None]
    best = max(usable, key=lambda r: r.speedup, default=None)
    peers = tuple((r.method, r.speedup) for r in report.rows if r.family == "hf" and r.method != BASELINE)
    beats = None
    if best is not None and peers:
        beats = all(s is None or best.speedup > s for _, s in peers)
    own = {r.method.split(":", 1)[-1]: r for r in _profiles(report)}
    inside = []
    for r in report.rows:
        if r.family == PROFILE_IN_HF:
            mine = own.get(r.method.split(":", 1)[-1].split("#")[0])
            ratio = (r.speedup / mine.speedup if mine is not None and r.speedup is not None
                     and mine.speedup is not None else None)
            inside.append((r.method, r.speedup, ratio))
    return Summary(
        baseline_tokens_per_s=base.tokens_per_s if base else None,
        loop_overhead_gain=ar.speedup if ar else None,
        best_profile=best.method if best else None,
        best_profile_speedup=best.speedup if best else None,
        speculation_gain=best.vs_ours_ar if best and best.acceptance_rate is not None else None,
        peers=peers,
        not_slower_than_hf_greedy=None if best is None else best.speedup >= 1.0,
        beats_every_peer=beats,
        flagged=tuple(r.method for r in report.rows if r.flagged),
        tie_equal=tuple((r.method, r.ties, r.tie_tokens) for r in report.rows if r.ties and not r.flagged),
        inside_hf=tuple(inside),
        best_drafted=best is None or best.acceptance_rate is not None,
        best_vs_ours_ar=best.vs_ours_ar if best else None,
    )


def report_to_dict(report: BenchReport) -> dict:
    """The JSON document: everything measured, per prompt included, and the summary."""

    def rows(rs: Sequence[BenchRow]) -> list[dict]:
        return [{**dataclasses.asdict(r), "flagged": r.flagged, "verdict": r.verdict} for r in rs]

    return {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "settings": dataclasses.asdict(report.settings),
        "environment": dict(report.environment),
        "wall_seconds": report.wall_seconds,
        "summary": dataclasses.asdict(summarize_report(report)),
        "rows": rows(report.rows),
        "categories": {c: rows(rs) for c, rs in report.categories},
        "sweeps": [{"peer": s.peer, "option": s.option, "best": s.best, "rows": rows(s.rows)} for s in report.sweeps],
        "prompts": [dataclasses.asdict(p) for p in report.prompts],
        "llama.cpp": None if report.llama is None else _llama_dict(report.llama, report.llama_sweep),
        **({"llama.cpp targets": [_llama_dict(*more) for more in report.llama_more]} if report.llama_more else {}),
        "batched": None if report.batched is None else batched_report.to_dict(report.batched),
        "vllm": None if report.vllm is None else vllm_bench.result_to_dict(report.vllm),
    }


def _llama_dict(result, sweep) -> dict:
    return {**llama_report.result_to_dict(result),
            "sweep": None if sweep is None else llama_report.result_to_dict(sweep)}


def report_json(report: BenchReport) -> str:
    return json.dumps(report_to_dict(report), indent=2) + "\n"


def read_report_json(text: str) -> dict:
    """A bench JSON document of any version, upgraded to this one (``upgrade``); ValueError for what is not one."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT:
        raise ValueError(f"not a skipsearch bench JSON report (its format is not {JSON_FORMAT!r})")
    return upgrade(doc)


def upgrade(doc: dict) -> dict:
    """An older document as this version writes it: what later versions added, at its absent value (a version-1 row
    has no ties and its verdict follows its flag). Raises ValueError on a version this reader does not know."""
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= JSON_VERSION:
        raise ValueError(f"bench JSON version {version!r} is not one this skipsearch reads (1 to {JSON_VERSION})")
    doc = dict(doc)
    if version < 2:
        def rows(rs: list) -> list:
            return [{"ties": 0, "tie_tokens": 0, "verdict": DIFFERENT if r.get("flagged") else IDENTICAL, **r}
                    for r in rs]

        doc["rows"] = rows(doc.get("rows", []))
        doc["categories"] = {c: rows(rs) for c, rs in doc.get("categories", {}).items()}
        doc["summary"] = {"tie_equal": [], **doc.get("summary", {})}
    if version < 3:
        doc["summary"] = {"inside_hf": [], **doc.get("summary", {})}
    if version < 4:
        doc.setdefault("llama.cpp", None)
    if version < 5:
        doc.setdefault("batched", None)
    if version < 7:
        doc.setdefault("vllm", None)
    if version < 6:  # written before the distinction: the gain as it was then
        summary = doc.get("summary", {})
        doc["summary"] = {"best_drafted": True, "best_vs_ours_ar": summary.get("speculation_gain"), **summary}
    doc["version"] = JSON_VERSION
    return doc


def batched_section(doc: dict) -> BatchedBench | None:
    """The batched section of a document ``read_report_json`` read (None: the run had no --batch-sizes)."""
    return None if doc.get("batched") is None else batched_report.from_dict(doc["batched"])


# -- formatting ------------------------------------------------------------------------------------
def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _identical(r: BenchRow) -> str:
    """Identical prompts of all, then those equal up to ties (and their tied tokens), then the flag."""
    ties = f" + {r.ties} up to ties ({_tokens(r.tie_tokens)})" if r.ties else ""
    return f"{r.identical}/{r.prompts}{ties}" + ("" if not r.flagged else " DIFFERS")


def _speedup(r: BenchRow) -> str:
    if r.flagged:
        return "no (output differs)"
    return _x(r.speedup) + (f" (ties: {_tokens(r.tie_tokens)})" if r.ties and r.speedup is not None else "")


def _memory(r: BenchRow) -> str:
    if r.peak_memory_mib is None:
        return "-"
    return f"{r.peak_memory_mib:.0f} (+{r.added_memory_mib or 0:.1f})"


MAIN_COLUMNS = ("method", "setting", "tokens/s", "speedup vs HF greedy", f"vs {OURS_AR}", "τ", "acceptance",
                "wall s", "peak MiB (+added)", "identical (+ up to ties)")


def main_cells(r: BenchRow) -> tuple[str, ...]:
    return (r.method, r.setting, _f(r.tokens_per_s, 1), _speedup(r), "-" if r.flagged else _x(r.vs_ours_ar),
            _f(r.tau), _f(r.acceptance_rate), _f(r.seconds, 1), _memory(r), _identical(r))


CATEGORY_COLUMNS = ("method", "tokens/s", "speedup vs HF greedy", "τ", "acceptance", "identical (+ up to ties)")


def category_cells(r: BenchRow) -> tuple[str, ...]:
    return (r.method, _f(r.tokens_per_s, 1), _speedup(r), _f(r.tau), _f(r.acceptance_rate), _identical(r))


def _count(rows: Sequence[BenchRow]) -> str:
    n = rows[0].prompts if rows else 0
    return f"{n} prompt" if n == 1 else f"{n} prompts"


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)]


def summary_lines(report: BenchReport) -> list[str]:
    """The gains and goals in words, each figure as measured in this run."""
    s = summarize_report(report)
    out = [
        f"Loop overhead gain ({OURS_AR} over {BASELINE}, no drafting on either side): {_x(s.loop_overhead_gain)}",
    ]
    if s.best_profile is None:
        out.append("No profile with identical (or tie-equal) output was benched, so there is no speculation gain "
                   "to report.")
    else:
        if s.best_drafted:
            out.append(f"Speculation gain ({s.best_profile} over {OURS_AR}): {_x(s.speculation_gain)}")
        else:  # a profile that ships plain decoding runs our loop's path: its lead over that row is spread, not gain
            out.append(f"Speculation gain: none; the best profile, {s.best_profile}, drafted no token (it ships plain "
                       f"decoding), so its {_x(s.best_vs_ours_ar)} over {OURS_AR} is the spread between two runs "
                       "of one decoding path")
        out.append(f"Best profile {s.best_profile}: {_x(s.best_profile_speedup)} HF greedy; "
                   f"goal 'never slower than HF greedy': {'met' if s.not_slower_than_hf_greedy else 'missed'}")
        if s.peers:
            peers = ", ".join(f"{name} {'differs' if v is None else _x(v)}" for name, v in s.peers)
            out.append(f"Peers: {peers}; goal 'beats every peer': {'met' if s.beats_every_peer else 'missed'}")
    for name, speedup, ratio in s.inside_hf:
        if ratio is None:
            out.append(f"Inside HF generate: {name} {'differs' if speedup is None else _x(speedup)}")
        else:
            met = abs(ratio - 1.0) <= WITHIN
            out.append(f"Inside HF generate: {name} {_x(speedup)}, {ratio:.3f} of the same profile's own row; goal "
                       f"'within {WITHIN:.0%} of decode': {'met' if met else 'missed'}")
    if s.tie_equal:
        out.append("Equal to HF greedy up to numerical ties (speedup given): " + ", ".join(
            f"{name} ({n} prompt{'' if n == 1 else 's'}, {_tokens(k)})" for name, n, k in s.tie_equal))
    if s.flagged:
        out.append("Output differs from HF greedy (no speedup given): " + ", ".join(s.flagged))
    if report.llama is not None:
        out.append(llama_report.summary_line(report.llama))
    out += [llama_report.summary_line(more) for more, _ in report.llama_more]
    if report.vllm is not None:
        out.append(vllm_bench.summary_line(report.vllm))
    if (last := headline(report, s)) is not None:
        out.append(last)
    return out


def headline(report: BenchReport, summary: Summary | None = None) -> str | None:
    """One line for people, the bench's last: the fastest profile whose output was HF greedy's, its speed beside HF
    greedy's and HF compiled greedy's in this run, on this machine. None where no profile qualified. ``summary``:
    the report's, where the caller has it."""
    name = (summary or summarize_report(report)).best_profile
    best, compiled = report.row(name) if name else None, report.row(HF_COMPILED)
    if best is None or best.speedup is None:
        return None
    env = dict(report.environment)
    where = ", ".join(str(v) for v in (env.get("cpu_model") or env.get("device_name"), env.get("cpu_capability"),
                                       env.get("threads") and f"{env['threads']} threads") if v)
    vs = (f" and {best.speedup / compiled.speedup:.2f}x HF compiled greedy" if compiled is not None
          and compiled.speedup is not None else "")
    ties = f", {best.ties} more up to numerical ties" if best.ties else ""
    return (f"{name}: {best.tokens_per_s:.1f} tokens/s on this machine ({where or 'unnamed'}), {best.speedup:.2f}x HF "
            f"greedy{vs} in this run; output identical to HF greedy on {best.identical} of {best.prompts} prompts"
            f"{ties}.")


def diagnosis_rows(report: BenchReport) -> list[tuple[str, ...]]:
    """Why a profile is as fast as it is: acceptance, draft cost and verify cost, per step.

    c is one draft forward over one autoregressive token of our own loop; a draft of k tokens
    pays when the tokens it adds (τ) outweigh k·c plus the verify forward.
    """
    ar = report.row(OURS_AR)
    ar_ms = 1000 * ar.seconds / ar.new_tokens if ar and ar.new_tokens else None
    out = []
    for r in _profiles(report):
        c = r.draft_ms / ar_ms if r.draft_ms is not None and ar_ms else None
        v = r.verify_ms / ar_ms if r.verify_ms is not None and ar_ms else None
        out.append((r.method, _f(r.tau), _f(r.acceptance_rate), _f(r.draft_ms), _f(r.verify_ms), _f(ar_ms),
                    _f(c), _f(v)))
    return out


DIAGNOSIS_COLUMNS = ("profile", "τ", "acceptance", "draft ms/forward", "verify ms/cycle", f"{OURS_AR} ms/token",
                     "c = draft/AR", "verify/AR")


def render_markdown(report: BenchReport, *, command: str | None = None) -> str:
    st = report.settings
    lines = [f"# skipsearch bench: {st.model} on {dict(report.environment).get('device_name') or st.device}", ""]
    if command:
        lines += ["Reproduce with:", "", "```bash", command, "```", ""]
    lines += [
        f"{st.n_prompts} prompts from `{st.dataset or '?'}` ({st.split or '?'} split), at most {st.max_new_tokens} new "
        f"tokens each, greedy, {st.repeats} timed run(s) per prompt and method, {st.dtype} on {st.device}, "
        + ("the int8 target (every linear as int8 weights, one scale per row, fp32 activations: HF's rows run it "
           "through skipsearch's int8 products, the same numbers as torchao's Int8WeightOnlyConfig), "
           if st.precision == "int8" else "") +
        f"{st.threads} torch thread(s); skipsearch's own rows ran on the {st.kernel} kernel. Baseline and reference "
        f"output: HF `generate(do_sample=False)` (eager) in the same "
        f"run. Every method decoded the same prompt token ids, warmed up first, interleaved prompt by prompt with "
        f"the order rotated. The whole bench took {report.wall_seconds:.0f} s.",
        "",
        *_md_table(MAIN_COLUMNS, [main_cells(r) for r in report.rows]),
        "",
        "## Summary",
        "",
        *(f"- {line}" for line in summary_lines(report)),
        "",
    ]
    diag = diagnosis_rows(report)
    if diag:
        lines += ["## Why: acceptance, draft cost, verify cost (measured in this run)", "",
                  *_md_table(DIAGNOSIS_COLUMNS, diag), ""]
    if len(report.categories) > 1:
        lines += ["## Per category", ""]
        for cat, rows in report.categories:
            lines += [f"### {cat} ({_count(rows)})", "",
                      *_md_table(CATEGORY_COLUMNS, [category_cells(r) for r in rows]), ""]
    if report.sweeps:
        n = st.sweep_prompts
        lines += [f"## Peer sweeps ({n} prompt{'' if n == 1 else 's'} of the calib split, each value against HF "
                  "greedy; the chosen value then ran in the table above)", ""]
        sweep_rows = [(s.peer, r.setting + (" (chosen)" if r.method == f"{s.peer}[{s.best}]" else ""),
                       _f(r.tokens_per_s, 1), _speedup(r), _f(r.tau), _f(r.acceptance_rate), _identical(r))
                      for s in report.sweeps for r in s.rows]
        lines += [*_md_table(("peer", "setting", "tokens/s", "speedup vs HF greedy", "τ", "acceptance",
                              "identical"), sweep_rows), ""]
    lines += _llama_lines(report)
    if report.vllm is not None:
        base = report.row(BASELINE)
        lines += ["## vLLM", "", *vllm_bench.markdown_lines(
            report.vllm, baseline_tokens_per_s=base.tokens_per_s if base else None)]
    if report.batched is not None:
        b = report.batched
        lines += ["## By batch size", "", batched_report.intro(b), "",
                  *_md_table(batched_report.COLUMNS, [batched_report.cells(r) for r in b.rows]), "",
                  *(f"- {line}" for line in (*batched_report.summary_lines(b), *batched_report.NOTES)), ""]
    lines += [
        "## What the columns mean",
        "",
        "- tokens/s: new tokens over the method's wall time (prefill included), summed over prompts; each prompt's "
        "time is the median over its timed runs.",
        "- speedup: HF greedy's wall time over the method's, on the same prompts. A method whose output is different "
        "from HF greedy's on any prompt gets none.",
        "- identical (+ up to ties): prompts whose output equals HF greedy's token for token; then those where it "
        "differs, but the model, teacher-forced over the method's whole output in one forward, puts every token "
        f"within a numerical tie of its argmax ({tolerance_rule(st.dtype)}); in brackets, the tokens that such "
        "ties decided. Anything else is DIFFERS, with the first token outside the tolerance "
        "(skipsearch/engine/equivalence.py).",
        "- τ: tokens emitted per full-model forward after the first; acceptance: accepted over drafted tokens. For HF "
        "peers both are counted from the model's forward calls.",
        f"- memory: {st.memory_kind}; in brackets, the most one call added above what was in use before it.",
        "- environment: " + ", ".join(f"{k} {v}" for k, v in report.environment if v),
        "",
    ]
    return "\n".join(lines)


def _llama_lines(report: BenchReport) -> list[str]:
    """The llama.cpp section: its rows on the bench prompts (against HF greedy's row), then its sweep."""
    if report.llama is None:
        return []
    base = report.row(BASELINE)
    labels = [p.prompt_id for p in report.prompts if p.method == BASELINE]
    lines, n = [], report.settings.sweep_prompts
    for i, (result, sweep) in enumerate(((report.llama, report.llama_sweep), *report.llama_more)):
        title = "llama.cpp" if i == 0 and not report.llama_more else f"llama.cpp on `{result.target or '-'}`"
        lines += [f"## {title}", "", *llama_report.markdown_lines(
            result, labels=labels, baseline_tokens_per_s=base.tokens_per_s if base else None)]
        if sweep is not None:
            lines += [f"### {title} sweep ({n} prompt{'' if n == 1 else 's'} of the calib split; the chosen setting "
                      "then ran above)", "", *llama_report.markdown_lines(sweep)]
    return lines


def rich_tables(report: BenchReport, *, by_category: bool = False) -> list:
    """The main table (and, with ``by_category``, one per category) as rich Tables."""
    from rich.table import Table

    st = report.settings
    main = Table(*MAIN_COLUMNS, title=f"{st.model} on {st.device}: {st.n_prompts} prompts, "
                 f"{st.max_new_tokens} new tokens, baseline {BASELINE}")
    for r in report.rows:
        main.add_row(*main_cells(r), style="red" if r.flagged else None)
    tables = [main]
    if by_category:
        for cat, rows in report.categories:
            t = Table(*CATEGORY_COLUMNS, title=f"{cat} ({_count(rows)})")
            for r in rows:
                t.add_row(*category_cells(r), style="red" if r.flagged else None)
            tables.append(t)
    if report.batched is not None:
        tables.append(batched_report.rich_table(report.batched))
    return tables


def measured_for(report: BenchReport, row: BenchRow, previous: Measured | None = None) -> Measured:
    """A profile's ``measured`` block from its bench row (speedup against HF greedy, same run).

    What an earlier block recorded is kept, not lost: its extra keys (a search's α, c and v(k), a
    fractal grid) stay, and its headline figures and notes move under ``extra.before_bench``.
    """
    st = report.settings
    base = report.row(BASELINE)
    extra: tuple = ()
    if previous is not None:
        old_text = dict(previous.extra).get(OLD_BASELINE_KEY)  # an old file's baseline prose goes with its figures
        before = {k: v for k, v in (("speedup", previous.speedup), ("tau", previous.tau),
                                    ("baseline", previous.baseline or old_text), ("source", previous.source),
                                    ("dataset", previous.dataset), ("notes", previous.notes)) if v is not None}
        kept = tuple((k, v) for k, v in previous.extra if k not in ("before_bench", OLD_BASELINE_KEY))
        extra = kept + ((("before_bench", before),) if before else ())
    return Measured(extra=extra,
        speedup=row.speedup, tokens_per_s=row.tokens_per_s,
        baseline_tokens_per_s=base.tokens_per_s if base else None, tau=row.tau,
        acceptance_rate=row.acceptance_rate, wall_seconds=row.seconds,
        baseline=BASELINE_HF_GREEDY,
        device=dict(report.environment).get("device_name") or st.device, dataset=f"{st.dataset} ({st.split})",
        n_prompts=st.n_prompts, max_new_tokens=st.max_new_tokens, source="bench",
        notes=f"identical output {row.identical}/{row.prompts}"
              + (f", equal up to numerical ties on {row.ties} ({_tokens(row.tie_tokens)})" if row.ties else "")
              + f"; {_x(row.vs_ours_ar)} over skipsearch's own "
              f"autoregressive loop; {st.threads} torch thread(s)",
    )


def measured_updates(report: BenchReport,
                     profiles: Sequence[tuple[str, Profile]]) -> tuple[tuple[str, Profile | None], ...]:
    """``bench --write-measured``: each benched (path, profile) with its measured block filled from its row
    (``measured_for``), or None for one whose output differs from HF greedy: its block is left as it was."""
    rows = {r.setting: r for r in report.rows if r.family == "skipsearch"}
    return tuple((path, None if rows[path].flagged else
                  dataclasses.replace(prof, measured=measured_for(report, rows[path], prof.measured),
                                      kernel=report.settings.kernel, schedule=_schedule_of(report, path, prof)))
                 for path, prof in profiles)


def _schedule_of(report: BenchReport, path: str, prof: Profile):
    """The profile's schedule, re-chosen from the batched section's measurements where it benched this profile
    (``batched.measured_schedule``); else as it was."""
    from skipsearch.bench.batched import measured_schedule

    bench = report.batched
    if bench is None or bench.profile != path:
        return prof.schedule
    return measured_schedule(bench, prof.schedule)
