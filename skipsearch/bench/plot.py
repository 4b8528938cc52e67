"""A bench report as a picture: each row's speedup over HF greedy, one group of bars per report (matplotlib)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def plot_reports(reports: Sequence[str | Path | dict], out: str | Path, *, labels: Sequence[str] | None = None,
                 title: str | None = None) -> Path:
    """Draw the rows of bench reports (``skipsearch bench --json`` files, or their documents) as horizontal bars of
    speedup over HF greedy, grouped by report (``labels``, default: the file names), and write a PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [p if isinstance(p, dict) else json.loads(Path(p).read_text()) for p in reports]
    labels = list(labels or [f"run {i + 1}" if isinstance(p, dict) else Path(p).stem for i, p in enumerate(reports)])
    methods = [r["method"] for r in docs[0]["rows"]]
    height = 0.8 / len(docs)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(methods) * max(len(docs), 1) + 1.2))
    for i, (doc, label) in enumerate(zip(docs, labels, strict=True)):
        speed = {r["method"]: r["speedup"] for r in doc["rows"]}
        ys = [j + i * height for j in range(len(methods))]
        bars = ax.barh(ys, [speed.get(m, 0.0) for m in methods], height=height, label=label)
        ax.bar_label(bars, fmt="%.2fx", padding=2, fontsize=8)
    ax.set_yticks([j + height * (len(docs) - 1) / 2 for j in range(len(methods))], methods, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("speedup over HF greedy (same run, same prompts)")
    env, settings = docs[0].get("environment", {}), docs[0].get("settings", {})
    where = env.get("gpu_name") or f"{env.get('cpu_model', 'CPU')} ({env.get('cpu_capability', '')}), " \
        f"{settings.get('threads', '?')} threads"
    ax.set_title(title or f"{settings.get('model', '')} in {settings.get('dtype', '')} on {where}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
