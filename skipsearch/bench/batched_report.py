"""The batched section of a bench report (``bench.batched``) as JSON, Markdown and a rich table. Nothing here runs a
model.

Per batch size B a row per contender: aggregate tokens/s (all rows' new tokens over the calls' seconds), its speedup
over plain batched decoding at the same B (none where its output differs from plain's on some row), acceptance and
the rows' verdicts against plain's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skipsearch.bench.batched import PLAIN, SCHEDULE, BatchedBench, BatchedRow

COLUMNS = ("B", "contender", "setting", "tokens/s", "speedup vs plain", "acceptance", "verify steps", "peak MiB",
           "identical rows (+ up to ties)")


# -- JSON --------------------------------------------------------------------------------------------
def to_dict(section: BatchedBench) -> dict:
    """The section as the bench JSON's ``batched`` value: its fields, each row with its flag and verdict."""
    doc = dataclasses.asdict(section)
    doc["rows"] = [{**dataclasses.asdict(r), "flagged": r.flagged, "verdict": r.verdict} for r in section.rows]
    return doc


def from_dict(doc: dict) -> BatchedBench:
    """``to_dict`` read back (the flags and verdicts it adds are derived, so they are dropped)."""
    fields = {f.name for f in dataclasses.fields(BatchedRow)}
    rows = tuple(BatchedRow(**{k: v for k, v in r.items() if k in fields}) for r in doc["rows"])
    return BatchedBench(**{**doc, "ks": tuple(doc["ks"]), "batch_sizes": tuple(doc["batch_sizes"]), "rows": rows})


# -- for people ----------------------------------------------------------------------------------------
def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cells(r: BatchedRow) -> tuple[str, ...]:
    ties = f" + {r.ties} up to ties ({r.tie_tokens} tokens)" if r.ties else ""
    return (str(r.batch_size), r.contender, r.setting, _f(r.tokens_per_s, 1),
            "no (output differs)" if r.flagged else _x(r.speedup), _f(r.acceptance_rate),
            "-" if r.verify_steps is None else str(r.verify_steps), _f(r.peak_memory_mib, 0),
            f"{r.identical}/{r.rows}{ties}" + (" DIFFERS" if r.flagged else ""))


def summary_lines(section: BatchedBench) -> list[str]:
    """Per B: the schedule against plain and against the best fixed K there, from the rows whose output agrees."""
    lines = []
    for size in section.batch_sizes:
        plain, sched = section.row(size, PLAIN), section.row(size, SCHEDULE)
        fixed = [r for r in section.rows if r.batch_size == size and r.k is not None
                 and r.contender not in (PLAIN, SCHEDULE) and r.speedup is not None]
        best = max(fixed, key=lambda r: r.speedup, default=None)
        if plain is None or sched is None:
            continue
        text = f"B={size}: plain {plain.tokens_per_s:.1f} tok/s; schedule (k={sched.k}) "
        if sched.speedup is None:
            text += "output differs from plain: no speedup"
        else:
            text += f"{sched.speedup:.2f}x plain"
            if sched.k == 0:  # the same decode as plain: what separates them is this run's timing noise
                text += " (k=0 decodes as plain does: the gap between them is this run's timing noise)"
            if best is not None:
                text += (f"; best fixed K {best.contender} {best.speedup:.2f}x (the schedule at "
                         f"{sched.speedup / best.speedup:.3f} of it)")
        lines.append(text)
    flagged = [f"{r.contender} at B={r.batch_size}" for r in section.rows if r.flagged]
    if flagged:
        lines.append("Output differs from plain batched decoding: " + ", ".join(flagged) + ".")
    return lines


def intro(section: BatchedBench) -> str:
    """The paragraph above the section's table: what ran, on what, against what."""
    s = section
    return (
        f"Profile `{s.profile}` ({s.method}). Per batch size B, the {s.n_prompts} bench prompts are decoded B at a "
        f"time (the last batch cycles through them again), {s.repeats} timed run(s) per batch and contender, "
        "interleaved batch by batch with the order rotated, after a warm-up. `plain` is plain batched greedy decoding "
        "(the engine's generate_batch with no drafter), the baseline and the reference output; `schedule` runs "
        f"{s.schedule}; `k=<K>` each fixed K ({s.ks_source}: {', '.join(map(str, s.ks)) or 'none'}); "
        "`hf-batched-greedy` is HF generate on the same rows, left-padded."
        + (" The run was strict: it stops at the first batch whose output differs." if s.strict else ""))


NOTES = (
    "tokens/s: all rows' new tokens over the calls' wall time (prefill included), summed over the batches; each "
    "batch's time is the median over its timed runs. speedup: plain's time over the contender's at the same B; none "
    "where some row's output differs from plain's.",
    "identical rows: rows whose output equals plain's token for token (every repeat); then those equal up to "
    "numerical ties (the model teacher-forced over the row's output; skipsearch/engine/equivalence.py).",
)


def rich_table(section: BatchedBench):
    from rich.table import Table

    table = Table(*COLUMNS, title=f"by batch size: {section.profile} ({section.method}), baseline {PLAIN}")
    for r in section.rows:
        table.add_row(*cells(r), style="red" if r.flagged else None)
    return table


def flagged_lines(rows: Sequence[BatchedRow]) -> list[str]:
    """A warning per contender and batch size whose output differs from plain's, for stderr."""
    return [f"warning: {r.contender} at B={r.batch_size} output differs from plain batched decoding "
            f"({r.first_mismatch})" for r in rows if r.flagged]
