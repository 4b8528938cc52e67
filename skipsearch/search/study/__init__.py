"""The search loop and its record: an Optuna study that any strategy proposes into.

The study is the only state a search has. Every trial carries the config it evaluated and the
measurement it got as JSON user attrs, so a search resumes where it stopped, several workers
can share one storage, and ``show``/``compare`` read any strategy's study alike.
- ``record``: what a trial keeps and how it is read back (TrialRecord, best, shortlist, the table);
- ``storage``: the RDB storage with its atomic claim, the writes other workers may refuse, heartbeats;
- ``workers``: lost trials, and the other workers on this machine;
- ``opening``: a study created, resumed or only read, and checked against its strategy and model;
- ``runner``: the search loop (``run_search``);
- ``shipping``: after the search, the shortlist timed and what ships chosen, as one unit (``ship``).
"""

from __future__ import annotations

from skipsearch.search.study.opening import (
    check_or_stamp,
    check_storage,
    check_study_model,
    check_study_precision,
    load_records,
    load_study,
    open_study,
)
from skipsearch.search.study.record import (
    CONFIG_ATTR,
    ERROR_ATTR,
    EVALUATING_ATTR,
    KIND_ATTR,
    LOST,
    MEASUREMENT_ATTR,
    METHOD_ATTR,
    MODEL_ATTR,
    PARAMS_ATTR,
    REUSED_ATTR,
    SEED_ATTR,
    SEEDED_ATTR,
    SPACE_ATTR,
    STRATEGY_ATTR,
    STUDY_COLUMNS,
    WORKER_ATTR,
    SearchSummary,
    StudyError,
    TrialRecord,
    best,
    candidate_attrs,
    config_from_dict,
    config_to_dict,
    records,
    shortlist,
    study_table,
    trial_candidate,
)
from skipsearch.search.study.runner import run_search, seed_study
from skipsearch.search.study.shipping import Shipped, ship
from skipsearch.search.study.storage import (
    GRACE_SECONDS,
    HEARTBEAT_SECONDS,
    ClaimingRDBStorage,
    finish_trial,
    heartbeat,
    rdb_storage,
    set_trial_attr,
    stamp_model,
    storage_conflict,
)
from skipsearch.search.study.workers import contention, fail_lost_trials, other_local_workers, share_cores, worker_id

__all__ = ["CONFIG_ATTR", "ERROR_ATTR", "EVALUATING_ATTR", "GRACE_SECONDS", "HEARTBEAT_SECONDS", "KIND_ATTR", "LOST",
           "MEASUREMENT_ATTR", "METHOD_ATTR", "MODEL_ATTR", "PARAMS_ATTR", "REUSED_ATTR", "SEED_ATTR", "SEEDED_ATTR",
           "SPACE_ATTR", "STRATEGY_ATTR", "STUDY_COLUMNS", "WORKER_ATTR", "ClaimingRDBStorage", "SearchSummary",
           "Shipped", "StudyError", "TrialRecord", "best", "candidate_attrs", "check_or_stamp", "check_storage",
           "check_study_model", "check_study_precision", "config_from_dict", "config_to_dict", "contention",
           "fail_lost_trials", "finish_trial", "heartbeat", "load_records", "load_study", "open_study",
           "other_local_workers", "rdb_storage", "records", "run_search", "seed_study", "set_trial_attr", "ship",
           "shortlist", "share_cores", "stamp_model", "storage_conflict", "study_table", "trial_candidate", "worker_id"]
