"""The one timer: its clock can be swapped for a block (tests), and the real one measures what ran."""

from __future__ import annotations

import threading
import time

import pytest
from clocks import ManualClock, work_clock
from conftest import make_tiny_model

from skipsearch.engine import timing


def test_a_swapped_clock_is_read_inside_its_block_only_and_always_put_back():
    clock = ManualClock(start=5.0)
    with timing.use_clock(clock) as given:
        assert given is clock and timing.now() == 5.0
        clock.advance(2.5)
        assert timing.now() == 7.5
        with timing.use_clock(ManualClock(start=0.0)):  # blocks nest
            assert timing.now() == 0.0
        assert timing.now() == 7.5
        timed, result = timing.time_call(lambda: clock.advance(0.25) or "done", repeats=3, warmup=2)
        assert timed.seconds == (0.25, 0.25, 0.25) and result == "done"
    with pytest.raises(RuntimeError), timing.use_clock(clock):
        raise RuntimeError("a failing block")
    real = timing.now()
    assert real != clock() and abs(real - time.perf_counter()) < 60  # perf_counter again, after the failure too


def test_another_thread_keeps_the_real_clock():
    seen = []
    with timing.use_clock(ManualClock(start=-1.0)):
        worker = threading.Thread(target=lambda: seen.append(timing.now()))
        worker.start()
        worker.join()
    assert seen[0] >= 0  # a heartbeat thread of a search never reads a test's clock


def test_a_manual_clock_never_goes_back():
    with pytest.raises(ValueError, match="never goes back"):
        ManualClock().advance(-1.0)


def test_the_work_clock_charges_what_ran_and_nothing_else():
    import torch

    sm = make_tiny_model(num_layers=2)
    with work_clock(sm):
        t0 = timing.now()
        time.sleep(0.01)  # the machine's time is not the work clock's
        assert timing.now() == t0
        cache = sm.new_cache()
        sm.forward(torch.tensor([1, 2, 3]), start=0, cache=cache)  # 3 rows through everything
        three = timing.now() - t0
        sm.forward(torch.tensor([4]), start=3, cache=cache, last_only=True)
        one = timing.now() - t0 - three
    assert one == pytest.approx(0.0005 + 2 * (0.001 + 0.002) + 0.001)  # embedding, 2 layers, head: one row each
    assert three == pytest.approx(one * 1.10)  # each of 3 rows adds 5 %


def test_the_real_clock_times_what_runs():
    # What holds under any load: a call that sleeps 20 ms takes at least that long, every time.
    timed, _ = timing.time_call(lambda: time.sleep(0.02), repeats=3, warmup=0)
    assert len(timed.seconds) == 3 and timed.best >= 0.019 and timed.median >= timed.best
