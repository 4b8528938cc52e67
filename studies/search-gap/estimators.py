"""Three estimators of the cost model's ratios on the very same samples: the ratio of medians (what
``measure_costs`` and ``measure_stand_ins`` compute), the median of ratios paired within a round, and the ratio of
sums. ``measure_costs`` and the int8 scheme's ``measure_scheme`` are run N times (9 rounds each) in one process; the
spread of each estimator over the N. Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/estimators.py 10
"""

from __future__ import annotations

import json
import statistics
import sys

from _common import setup, spread


def main() -> None:
    from skipsearch.engine import surrogate
    from skipsearch.methods.precision.surrogate import measure_scheme

    sm, _, context = setup()
    captured = []
    timed_by = surrogate.time_interleaved

    def spy(calls, **kw):
        out = timed_by(calls, **kw)
        captured.append({k: t.seconds for k, t in out.items()})
        return out

    surrogate.time_interleaved = spy
    med = statistics.median
    rows = []
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
        captured.clear()
        surrogate.measure_costs(sm, context)
        measure_scheme(sm, context, "int8")
        costs, scheme = captured
        row = {}
        for name, s, num, den in (("v2", costs, "v2", "v1"), ("v6", costs, "v6", "v1"), ("v8", costs, "v8", "v1"),
                                  ("v9", costs, "v9", "v1"), ("c", scheme, "whole", "unit")):
            row[name + "_old"] = med(s[num]) / med(s[den])
            row[name + "_paired"] = med([x / y for x, y in zip(s[num], s[den], strict=True)])
            row[name + "_sums"] = sum(s[num]) / sum(s[den])
        row["unit_ms"] = med(costs["v1"]) * 1e3
        rows.append(row)
        print(json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    for k in rows[0]:
        print(spread(f"{k:10s}", [r[k] for r in rows]))
    units = [r["unit_ms"] for r in rows]
    for k in ("v8_old", "v9_old", "c_old"):
        print(f"correlation of the unit's ms with {k}: {statistics.correlation(units, [r[k] for r in rows]):.2f}")


if __name__ == "__main__":
    main()
