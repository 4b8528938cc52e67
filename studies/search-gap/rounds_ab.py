"""The cost model (``measure_costs``, and the int8 scheme's ``measure_scheme``) timed in 9 rounds and in 45,
alternated 9, 45, 9 in one process, N times; the spread of v(k), c and the unit each way, and the seconds each took.
Alone on the machine.

    PYTHONPATH=. .venv/bin/python studies/search-gap/rounds_ab.py 4
"""

from __future__ import annotations

import json
import sys
import time

from _common import setup, spread


def main() -> None:
    from skipsearch.engine import surrogate
    from skipsearch.methods.precision.surrogate import measure_scheme

    sm, _, context = setup()
    rows: dict[int, list[dict]] = {9: [], 45: []}
    for _ in range(int(sys.argv[1])):
        for rounds in (9, 45, 9):
            t = time.perf_counter()
            cm = surrogate.measure_costs(sm, context, repeats=rounds)
            sc = measure_scheme(sm, context, "int8", repeats=rounds)
            v = cm.verify_ratio
            row = {"v6": v[5], "v8": v[7], "v9": v[8], "c": sc.whole_seconds / sc.unit,
                   "unit_ms": cm.step_seconds * 1e3, "s": time.perf_counter() - t}
            rows[rounds].append(row)
            print(rounds, json.dumps({k: round(x, 3) for k, x in row.items()}), flush=True)
    for rounds, got in rows.items():
        for k in got[0]:
            print(spread(f"R={rounds} {k:8s}", [r[k] for r in got]))


if __name__ == "__main__":
    main()
