"""Draw bench reports (``skipsearch bench --json-out`` files) as one picture of speedups over HF greedy, by workload.

The picture ``skipsearch bench --plot`` draws of its own run, here for reports of earlier runs, side by side:

    python scripts/plot_bench.py studies/bench-smollm2-cpu-2threads.json studies/bench-smollm2-cpu-2threads-run2.json \\
        --labels "run A" "run B" --out docs/img/bench.png
"""

from __future__ import annotations

import argparse

from skipsearch.bench.plot import plot_reports
from skipsearch.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="bench JSON files")
    ap.add_argument("--labels", nargs="+", default=None, help="one per report (default: the file names)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--out", required=True, help="PNG to write")
    a = ap.parse_args(argv)
    if a.labels is not None and len(a.labels) != len(a.reports):
        raise SystemExit(f"--labels: {len(a.labels)} labels for {len(a.reports)} reports")
    try:
        print(f"wrote {plot_reports(a.reports, a.out, labels=a.labels, title=a.title)}")
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
