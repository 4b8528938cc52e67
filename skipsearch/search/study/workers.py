"""The workers that share a study: who runs where, which trials lost their worker, and the other skipsearch
workers on this machine, whose decoding shares its cores (a timing taken beside them is not the machine's own)."""

from __future__ import annotations

import os
import socket

import optuna

from skipsearch.search.study.record import WORKER_ATTR
from skipsearch.search.study.storage import quiet_optuna, storage_conflict, storage_of

_STATES = optuna.trial.TrialState


def fail_lost_trials(study: optuna.Study) -> None:
    """Fail the RUNNING trials whose worker is provably gone (no heartbeat for GRACE_SECONDS)."""
    if isinstance(storage_of(study), optuna.storages.RDBStorage):
        with quiet_optuna():
            try:
                optuna.storages.fail_stale_trials(study)
            except Exception as e:  # a busy storage: the next look tries again
                if not storage_conflict(e):
                    raise


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def other_local_workers(study: optuna.Study) -> list[str]:
    """Other live skipsearch workers on this machine, seen through the study's running trials.

    Their decoding shares this machine's cores and memory bandwidth, so timings taken now are not
    the machine's own: the caller flags or refuses them."""
    host, me = socket.gethostname(), worker_id()
    fail_lost_trials(study)
    running = study.get_trials(deepcopy=False, states=(_STATES.RUNNING,))
    found = {t.user_attrs.get(WORKER_ATTR) for t in running}
    return sorted(w for w in found if w and w != me and w.split(":", 1)[0] == host)


def share_cores(workers: int) -> str | None:
    """Give this process its share of the machine's cores when ``workers`` skipsearch workers run on it: each
    taking every core (torch's default) oversubscribes them, and all of them crawl (on 2 cores, two default
    workers took over 4x as long as one). Returns the one line that says so, or None when nothing changed
    (one worker, or already at most its share, e.g. under OMP_NUM_THREADS=1)."""
    try:
        import torch
    except ImportError:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fair, have = max(1, cores // max(workers, 1)), torch.get_num_threads()
    if workers <= 1 or have <= fair:
        return None
    torch.set_num_threads(fair)
    return (f"{workers} skipsearch workers share this machine's {cores} cores: this one now uses {fair} torch "
            f"thread(s), not {have}")


def contention(study: optuna.Study) -> str | None:
    """Why a timing taken now would not be this machine's own, or None."""
    others = other_local_workers(study)
    if others:
        return f"timed while another skipsearch worker ran on this machine ({', '.join(others)})"
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores + 0.5:  # this process accounts for about one
        return f"timed under load average {load:.1f} on {cores} cores"
    return None

