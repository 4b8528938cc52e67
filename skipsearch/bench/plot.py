"""Bench reports as a picture: each method's and each peer's speedup over HF greedy, one panel per workload (all
prompts, then each task category), one bar per report. It draws from the JSON document (``skipsearch bench --json``,
every version of it), so a report from an earlier run draws as well as the one just made."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from skipsearch.bench.report import JSON_FORMAT, report_to_dict
from skipsearch.bench.runner import BenchReport
from skipsearch.config import ConfigError
from skipsearch.files.figures import drawing, finite, new_figure, save_png

ALL = "all prompts"
FAMILY_COLOURS = {"hf": "tab:gray", "skipsearch": "tab:blue", "hf-profile": "tab:orange"}


def read_report(path: str | Path) -> dict:
    """A bench JSON report read and checked: one line (ConfigError) for a file that is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read a bench JSON report: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT or not isinstance(doc.get("rows"), list):
        raise ConfigError(f"{path}: not a skipsearch bench JSON report (skipsearch bench --json writes one)")
    return doc


def workloads(doc: dict) -> list[tuple[str, list[dict]]]:
    """(workload, its rows): every prompt first, then each category the report kept."""
    cats = doc.get("categories") or {}
    return [(ALL, doc["rows"]), *((name, rows) for name, rows in cats.items() if isinstance(rows, list))]


def _where(doc: dict) -> str:
    env, settings = doc.get("environment") or {}, doc.get("settings") or {}
    if env.get("gpu_name"):
        where = env["gpu_name"]
    else:
        where = f"{env.get('cpu_model') or 'CPU'} ({env.get('cpu_capability') or '?'}), " \
                f"{settings.get('threads') or '?'} threads"
    kernel = f", kernel {settings['kernel']}" if settings.get("kernel") else ""
    return f"{settings.get('model', '?')} in {settings.get('dtype', '?')} on {where}{kernel}"


def bench_figure(docs: Sequence[dict], *, labels: Sequence[str], title: str | None = None):
    """The figure (matplotlib ``Figure``) of ``docs``' rows: a panel per workload, methods down the side in the first
    report's order, a bar per report; a row whose output differs from HF greedy has no bar and says so."""
    panels: dict[str, None] = {}
    methods: dict[str, str] = {}  # method -> family, in order of appearance
    for doc in docs:
        for name, rows in workloads(doc):
            panels.setdefault(name)
            for r in rows:
                methods.setdefault(r["method"], r.get("family", ""))
    names, order = list(panels), list(methods)
    ncols = min(len(names), 3)
    nrows = math.ceil(len(names) / ncols)
    height = 0.8 / len(docs)
    fig = new_figure(figsize=(3.4 * ncols + 2.6, (0.2 + 0.16 * len(docs)) * len(order) * nrows + 1.4))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    top = 1.0
    for ax, name in zip(axes.flat, names, strict=False):
        counts = []
        for i, doc in enumerate(docs):
            rows = {r["method"]: r for r in dict(workloads(doc)).get(name, [])}
            counts.append(max((r.get("prompts") or 0 for r in rows.values()), default=0))
            for j, method in enumerate(order):
                row = rows.get(method)
                if row is None:
                    continue
                y = j + i * height
                colour = f"C{i}" if len(docs) > 1 else FAMILY_COLOURS.get(row.get("family"), "tab:purple")
                if row.get("speedup") is None:
                    ax.text(0.03, y, "output differs", va="center", fontsize=7, color="tab:red")
                    continue
                if not finite(row["speedup"]):  # a broken report: nothing to place
                    continue
                ax.barh(y, row["speedup"], height=height, color=colour)
                ax.text(row["speedup"], y, f" {row['speedup']:.2f}x", va="center", fontsize=7)
                top = max(top, row["speedup"])
        ax.axvline(1.0, color="black", linewidth=0.7, linestyle="--")
        prompts = " / ".join(str(c) for c in counts) if len(set(counts)) > 1 else str(counts[0])
        ax.set_title(f"{name} ({prompts} prompt{'' if prompts == '1' else 's'})", fontsize=9)
        ax.set_xlabel("speedup over HF greedy", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.flat:
        ax.set_xlim(0, top * 1.22)  # room for the figures at the ends of the bars
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    axes[0, 0].set_yticks([j + height * (len(docs) - 1) / 2 for j in range(len(order))], order)
    axes[0, 0].invert_yaxis()
    from matplotlib.patches import Patch

    if len(docs) > 1:
        keys = {f"C{i}": label for i, label in enumerate(labels)}
    else:
        names = {"hf": "HF peers", "skipsearch": "skipsearch", "hf-profile": "profile inside HF generate"}
        keys = {FAMILY_COLOURS.get(f, "tab:purple"): names.get(f, f) for f in dict.fromkeys(methods.values())}
    fig.legend(handles=[Patch(color=c) for c in keys], labels=list(keys.values()), fontsize=8,
               loc="outside lower center", ncols=len(keys))
    fig.suptitle(title or f"{_where(docs[0])}; every bar timed in the same run on the same prompts", fontsize=9)
    return fig


def plot_reports(reports: Sequence[str | Path | dict | BenchReport], out: str | Path, *,
                 labels: Sequence[str] | None = None, title: str | None = None) -> Path:
    """Draw bench reports (a run's ``BenchReport``, ``skipsearch bench --json`` files, or their documents) with
    ``bench_figure`` and write a PNG to ``out`` (labels: one per report; default the file names, else "run N")."""
    if not reports:
        raise ConfigError("no bench report to draw")
    docs = [report_to_dict(p) if isinstance(p, BenchReport) else p if isinstance(p, dict) else read_report(p)
            for p in reports]
    labels = list(labels or [Path(p).stem if isinstance(p, (str, Path)) else f"run {i + 1}"
                             for i, p in enumerate(reports)])
    if len(labels) != len(docs):
        raise ConfigError(f"{len(labels)} labels for {len(docs)} reports")
    with drawing(out):
        return save_png(bench_figure(docs, labels=labels, title=title), out)
