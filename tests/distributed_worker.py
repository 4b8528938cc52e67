"""One search worker for tests/test_distributed.py: a real process sharing a study through a storage.

Usage: python distributed_worker.py STORAGE STUDY_NAME STRATEGY BUDGET LOG
Evaluates a deterministic fake objective (slow enough that workers overlap) and appends every
config it actually evaluates (not reused) to LOG, one JSON line each.
"""

from __future__ import annotations

import json
import sys
import time

import optuna

from skipsearch.measure import Measurement
from skipsearch.search.space import SearchSpace
from skipsearch.search.strategies import make_strategy
from skipsearch.search.study import config_to_dict, open_study, run_search


class SlowObjective:
    def __init__(self, log: str) -> None:
        self.log = log

    def evaluate(self, candidate, *, kind):
        config = candidate.draft
        time.sleep(0.05)
        with open(self.log, "a") as f:
            f.write(json.dumps(config_to_dict(config)) + "\n")
        value = 1.0 + 0.05 * len(config.skip_attn) - 0.08 * len(config.skip_mlp) + 0.01 * config.max_draft_tokens
        return Measurement(kind=kind, speedup=value, seconds=0.05)


def main() -> None:
    storage, name, strategy_name, budget, log = sys.argv[1:6]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    strategy = make_strategy(strategy_name, SearchSpace(num_layers=6, max_draft_tokens=(1, 2, 4)), seed=0)
    study = open_study(storage=storage, study_name=name, strategy=strategy)
    run_search(study, strategy, SlowObjective(log), budget=int(budget))


if __name__ == "__main__":
    main()
