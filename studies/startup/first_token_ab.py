"""Seconds from a warm ``decode``'s start to the first byte on its stdout (its first token) and to its exit, the tree
before a change (OLD, a worktree of the commit before it, with its own cache folder OLD_CACHE: skipsearch's C++
extension is built from each tree's own source paths) and this tree, alternated, ROUNDS times each; run it alone.
(``first_token_ab.sh``, which earlier rounds ran, times the whole process of a one-token decode, its exit included.)

    OLD=/tmp/wt_head OLD_CACHE=/tmp/cache_old .venv/bin/python studies/startup/first_token_ab.py 5
"""

import os
import subprocess
import sys
import time
from pathlib import Path

NEW = Path(__file__).resolve().parents[2]
PROFILE = NEW / "profiles/smollm2-135m/cpu-float32-mixed-zen5-panel-c8.yaml"
TREES = {"old": (os.environ.get("OLD", "/tmp/wt"), os.environ.get("OLD_CACHE", "/tmp/cache_old")),
         "new": (str(NEW), os.environ.get("SKIPSEARCH_CACHE", os.path.expanduser("~/.cache/skipsearch")))}


def once(root: str, cache: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=root, SKIPSEARCH_CACHE=cache)
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "skipsearch", "decode", "--profile", str(PROFILE), "--prompt",
                          "def fib(n):", "--max-new-tokens", "16", "--threads", "2"], cwd="/", env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdout.read(1)
    first = time.perf_counter() - start
    p.stdout.read()
    if p.wait() != 0:
        raise SystemExit(f"{root}: decode failed ({p.returncode})")
    return first, time.perf_counter() - start


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in TREES}
    for r in range(rounds):
        for name, (root, cache) in TREES.items():
            seen[name].append(once(root, cache))
            print(f"round {r + 1} {name}: first token {seen[name][-1][0]:.2f} s, exit {seen[name][-1][1]:.2f} s",
                  flush=True)
    for name, runs in seen.items():
        first, end = sorted(f for f, _ in runs), sorted(e for _, e in runs)
        print(f"{name}: first token median {first[len(first) // 2]:.2f} s (min {first[0]:.2f}, max {first[-1]:.2f});"
              f" exit median {end[len(end) // 2]:.2f} s")


if __name__ == "__main__":
    main()
