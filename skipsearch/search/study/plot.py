"""A study as a picture (``skipsearch study show --plot``): three panels drawn from the trials' records.

1. search history: every trial's speedup by trial number (surrogate predictions and timed measurements apart) and the
   best so far of each kind;
2. predicted against measured: each timed trial's surrogate prediction against its timed speedup, beside the line
   where they would agree;
3. the cost-acceptance front: each trial's draft cost c (one draft step over one full step) against its acceptance
   α (per-position agreement with the full model), coloured by speedup, with the trials no other beats on both.

The records are what ``study.load_records`` reads through Optuna's public API (``optuna.load_study``, the trials'
user attrs); nothing here opens a storage.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from skipsearch.files.figures import drawing, finite, new_figure, save_png
from skipsearch.search.study.record import TrialRecord

MARKERS = {"surrogate": "o", "timed": "s"}
COLOURS = {"surrogate": "tab:blue", "timed": "tab:red"}
NO_COST_ACCEPTANCE = "no trial recorded both c and α\n(their method's surrogate does not model them)"


def cost_acceptance_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (c, α) points no other point beats on both (lower c and higher α, one of them strictly), by rising c."""
    front: list[tuple[float, float]] = []
    for c, a in sorted(set(points), key=lambda p: (p[0], -p[1])):
        if not front or a > front[-1][1]:
            front.append((c, a))
    return front


def _framed(ax, title: str, xlabel: str, ylabel: str, *, empty: str | None = None) -> bool:
    """A panel's title and axis labels; with ``empty``, the panel says that instead of drawing (False)."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if empty:
        ax.text(0.5, 0.5, empty, ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes)
    return not empty


def _history(ax, done: list[TrialRecord]) -> None:
    for kind in ("surrogate", "timed"):
        pts = [(r.number, r.measurement.speedup) for r in done if r.measurement.kind == kind]
        if not pts:
            continue
        surrogate = kind == "surrogate"
        ax.scatter(*zip(*pts, strict=True), marker=MARKERS[kind], s=10 if surrogate else 28,
                   alpha=0.45 if surrogate else 0.9, color=COLOURS[kind], label=f"{kind} ({len(pts)})", linewidths=0)
        best, curve = float("-inf"), []
        for number, speedup in pts:
            best = max(best, speedup)
            curve.append((number, best))
        ax.step(*zip(*curve, strict=True), where="post", color=COLOURS[kind], linewidth=1.2,
                label="best predicted so far" if kind == "surrogate" else "best measured so far")
    ax.axhline(1.0, color="black", linewidth=0.7, linestyle="--")
    if _framed(ax, "search history", "trial", "speedup over autoregressive decoding",
               empty=None if done else "no trial measured yet"):
        ax.legend(fontsize=7)


def _predicted_vs_measured(ax, done: list[TrialRecord]) -> None:
    pts = [(r.measurement.predicted_speedup, r.measurement.speedup, r.number) for r in done
           if r.measurement.kind == "timed" and finite(r.measurement.predicted_speedup)]
    if not _framed(ax, "predicted vs measured (timed trials)", "surrogate's predicted speedup", "measured speedup",
                   empty=None if pts else "no timed trial with a surrogate prediction"):
        return
    xs, ys, numbers = zip(*pts, strict=True)
    lo, hi = min(*xs, *ys), max(*xs, *ys)
    pad = 0.05 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", linewidth=0.8, linestyle="--",
            label="measured = predicted")
    ax.scatter(xs, ys, marker=MARKERS["timed"], color=COLOURS["timed"], s=30)
    for x, y, n in pts:
        ax.annotate(f"#{n}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.legend(fontsize=7, loc="upper left")


def _cost_acceptance(fig, ax, done: list[TrialRecord]) -> None:
    pts = [(r.measurement.cost_ratio, r.measurement.alpha, r.measurement.speedup, r.measurement.kind) for r in done
           if finite(r.measurement.cost_ratio) and finite(r.measurement.alpha)]
    if not _framed(ax, "cost-acceptance front", "draft cost c (draft step / full step)",
                   "acceptance α (agreement with the full model)",
                   empty=None if pts else NO_COST_ACCEPTANCE):
        return
    speeds = [s for _, _, s, _ in pts]
    scatter = None
    for kind in ("surrogate", "timed"):
        mine = [p for p in pts if p[3] == kind]
        if mine:
            scatter = ax.scatter([p[0] for p in mine], [p[1] for p in mine], c=[p[2] for p in mine],
                                 vmin=min(speeds), vmax=max(speeds), cmap="viridis", marker=MARKERS[kind],
                                 s=12 if kind == "surrogate" else 34, edgecolors="none" if kind == "surrogate" else
                                 "black", linewidths=0.6, label=kind)
    front = cost_acceptance_front([(c, a) for c, a, _, _ in pts])
    ax.step(*zip(*front, strict=True), where="post", color="black", linewidth=0.9,
            label="front (no trial beats on both)")
    fig.colorbar(scatter, ax=ax, label="speedup")
    ax.legend(fontsize=7, loc="lower right")


def study_figure(recs: Sequence[TrialRecord], *, title: str | None = None):
    """The three panels (a matplotlib ``Figure``) of a study's trial records (``study.load_records``). A figure that is
    not a finite number (a hostile or broken record) is left out of every panel."""
    done = sorted((r for r in recs if r.measurement is not None and finite(r.measurement.speedup)),
                  key=lambda r: r.number)
    fig = new_figure(figsize=(15, 4.3))
    history, versus, front = fig.subplots(1, 3, width_ratios=(1.25, 1, 1.2))
    _history(history, done)
    _predicted_vs_measured(versus, done)
    _cost_acceptance(fig, front, done)
    failed = sum(r.state == "FAIL" for r in recs)
    fig.suptitle(f"{title or 'study'}: {len(recs)} trials, {len(done)} measured, {failed} failed", fontsize=10)
    return fig


def plot_study(recs: Sequence[TrialRecord], out: str | os.PathLike, *, title: str | None = None) -> Path:
    """Draw ``study_figure`` and write it as a PNG to ``out``."""
    with drawing(out):
        return save_png(study_figure(recs, title=title), out)
