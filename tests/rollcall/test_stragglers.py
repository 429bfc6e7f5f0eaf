"""The straggler rule (``rollcall/stragglers.py``), and the watchdog's measure of each rank's work a step."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from lightning_mpi_env.core.records import FailureRecorder
from lightning_mpi_env.rollcall.stall import PHASES
from lightning_mpi_env.rollcall.store_values import Report
from lightning_mpi_env.rollcall.stragglers import (
    MIN_EXCESS,
    WORSE,
    StragglerWatch,
    WorkTimes,
    leave_out_line,
    seconds_text,
    to_leave_out,
)
from lightning_mpi_env.rollcall.watchdog import Watchdog
from lightning_mpi_env.supervise.records import read_stragglers
from tests.rollcall.test_watchdog import HANG, _Clock, _shows, _wait_for, _watchdogs, store_port  # noqa: F401

WINDOW = 20


def reports(works: list[float], worked: int = WINDOW, step: int = 40) -> list[Report]:
    """One report per rank, rank ``i`` on ``node{i // 2}`` with the median work ``works[i]``."""
    return [
        Report(rank, f"node{rank // 2}", 4 * step, step, 0, 1, "train.py:7", work=work, worked=worked)
        for rank, work in enumerate(works)
    ]


def test_a_rank_twice_as_slow_is_named_with_its_host_and_factor():
    watch = StragglerWatch(1.5, WINDOW)
    found = watch.judge(reports([0.05, 0.05, 0.05, 0.10]))
    assert [(straggler.rank, straggler.host) for straggler in found] == [(3, "node1")]
    line = found[0].line(watch.factor)
    assert "rank 3 on node1 takes 100 ms of its own work a step, x2.0 the median of all ranks (50 ms)" in line
    assert f"over its last {WINDOW} steps (step 40)" in line
    assert "LIGHTNING_MPI_ENV_STRAGGLER_FACTOR=1.5" in line


def test_every_rank_equally_slow_names_no_one():
    watch = StragglerWatch(1.5, WINDOW)
    assert watch.judge(reports([0.5, 0.5, 0.5, 0.5])) == []
    assert watch.judge(reports([0.5, 0.52, 0.49, 0.51])) == []
    assert watch.summary() is None


def test_a_rank_below_the_factor_or_within_the_noise_is_not_named():
    watch = StragglerWatch(1.5, WINDOW)
    assert watch.judge(reports([0.05, 0.05, 0.05, 0.074])) == []  # x1.48
    tiny = 0.0005
    assert watch.judge(reports([tiny, tiny, tiny, tiny + MIN_EXCESS / 2])) == []  # x3, but a millisecond


def test_a_rank_is_judged_only_once_its_window_is_full():
    watch = StragglerWatch(1.5, WINDOW)
    early = reports([0.05, 0.05, 0.05, 0.10])
    early[3] = dataclasses.replace(early[3], worked=WINDOW - 1)
    assert watch.judge(early) == []
    assert watch.judge(reports([0.05, 0.10], worked=WINDOW - 1)) == []  # nor with fewer than two full windows


def test_a_rank_whose_watchdog_left_is_not_judged_nor_counted():
    watch = StragglerWatch(1.5, WINDOW)
    gone = reports([0.05, 0.05, 0.05, 0.10])
    gone[3] = dataclasses.replace(gone[3], left=True)
    assert watch.judge(gone) == []


def test_a_single_slow_step_moves_no_median():
    times = WorkTimes(WINDOW)
    for _ in range(WINDOW - 1):
        times.add(0.05)
    times.add(30.0)  # rank 0 saving a checkpoint inside its step
    assert times.median() == pytest.approx(0.05)
    assert times.count == WINDOW


def test_the_window_keeps_only_the_last_steps():
    times = WorkTimes(4)
    assert times.median() == 0.0
    for seconds in (9.0, 9.0, 9.0, 1.0, 1.0, 1.0):
        times.add(seconds)
    assert times.median() == 1.0  # the slow start is out of the window
    assert times.count == 6


def test_a_rank_is_named_once_and_again_only_when_it_got_worse():
    watch = StragglerWatch(1.5, WINDOW)
    assert len(watch.judge(reports([0.05, 0.05, 0.05, 0.10]))) == 1
    assert watch.judge(reports([0.05, 0.05, 0.05, 0.11], worked=WINDOW + 10, step=50)) == []  # x2.2 < x2.0 * WORSE
    worse = watch.judge(reports([0.05, 0.05, 0.05, 0.10 * WORSE + 0.001], worked=WINDOW + 30, step=70))
    assert [straggler.rank for straggler in worse] == [3]
    assert worse[0].steps == WINDOW + 30  # it stood out from its first full window on
    assert worse[0].step == 70


def test_a_rank_that_recovered_and_slowed_again_counts_its_steps_afresh():
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(reports([0.05, 0.05, 0.05, 0.10], worked=WINDOW))
    watch.judge(reports([0.05, 0.05, 0.05, 0.05], worked=WINDOW + 40))  # recovered
    again = watch.judge(reports([0.05, 0.05, 0.05, 0.20], worked=WINDOW + 80))  # x4: worse than x2.0 named
    assert again[0].steps == WINDOW


def test_the_summary_names_the_slowest_hosts_first_with_their_ranks():
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(reports([0.05, 0.05, 0.05, 0.05, 0.08, 0.05, 0.20, 0.05]))
    watch.judge(reports([0.05, 0.05, 0.05, 0.05, 0.09, 0.05, 0.15, 0.05]))  # rank 6 was worse before
    summary = watch.summary()
    assert summary is not None
    assert "stragglers in this run: node3 x4.0 (rank 6), node2 x1.8 (rank 4);" in summary


def test_work_times_read_while_the_loop_adds_them():
    times, stop = WorkTimes(50), threading.Event()

    def add() -> None:
        while not stop.is_set():
            times.add(0.01)

    adder = threading.Thread(target=add)
    adder.start()
    try:
        medians = [times.median() for _ in range(2000)]
    finally:
        stop.set()
        adder.join()
    assert set(medians) <= {0.0, 0.01}


@pytest.mark.parametrize(
    ("marks", "measured"),
    [
        ([1, 2, 3, 0, 1, 2, 3, 0], [1.0, 1.0]),  # the Trainer: from the step's start to backward
        ([4, 2, 3, 2, 3, 2, 3], [1.0, 1.0]),  # Fabric under "ddp_mpi": from one backward's end to the next's start
        ([2, 2, 2], []),  # the plugin's progress(): one mark a step, waits included: nothing measured
        ([1, 3, 0], []),  # no mark before backward (manual optimization without it): nothing measured
    ],
)
def test_the_watchdog_measures_work_between_the_marks_that_bound_it(marks, measured):
    ticks = iter(range(100))
    dog = Watchdog(
        lambda seconds: None,  # type: ignore[arg-type,return-value]  (never started)
        rank=1,
        world_size=4,
        host="node0",
        timeout=300.0,
        straggler_factor=1.5,
        straggler_window=WINDOW,
        timer=lambda: float(next(ticks)),
    )
    for step, phase in enumerate(marks):
        dog.mark(step, phase)
    assert dog.work is not None
    assert dog.work.count == len(measured)
    assert dog.work.median() == (measured[0] if measured else 0.0)
    assert dog.stragglers is None  # rank 0 alone judges


@pytest.mark.parametrize(("timeout", "factor", "window"), [(0.0, 1.5, 20), (300.0, 0.0, 20), (300.0, 1.5, 0)])
def test_no_straggler_watch_without_the_stall_watch_a_factor_or_a_window(timeout, factor, window):
    dog = Watchdog(
        lambda seconds: None,  # type: ignore[arg-type,return-value]
        rank=0,
        world_size=4,
        host="node0",
        timeout=timeout,
        straggler_factor=factor,
        straggler_window=window,
    )
    dog.mark(1, PHASES.index("in its training step"))
    dog.mark(1, PHASES.index("in backward"))
    assert dog.work is None
    assert dog.stragglers is None


def test_rank_zero_names_a_slow_rank_over_a_real_store_and_sums_up_at_the_end(store_port, capfd, tmp_path):  # noqa: F811
    # Four watchdog threads on one real TCPStore, the reports as the job writes them; rank 3's work takes 3 units a
    # step, the others' 1. Rank 0 says the straggler line once, records it for the supervisor, and sums up when it
    # stops.
    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    now = [0.0]
    dogs = _watchdogs(
        store_port, 4, timeout=60.0, exits=exits, clock=clock, straggler_factor=1.5, straggler_window=5,
        timer=lambda: now[0], recorder=FailureRecorder.plan(str(tmp_path), "Open MPI", "77"),
    )  # fmt: skip
    for dog in dogs:
        dog.start()
    for step in range(1, 8):
        for dog in dogs:
            dog.mark(step, PHASES.index("in its training step"))
            now[0] += 3.0 if dog.rank == 3 else 1.0
            dog.mark(step, PHASES.index("in backward"))
    err: list[str] = []
    assert clock.advance(dogs, 10.0, until=_shows(capfd, "straggler: rank 3 on node1", err)), err
    clock.advance(dogs, 3.0)
    for dog in dogs:
        dog.stop()
    assert _wait_for(_shows(capfd, "stragglers in this run: node1 x3.0 (rank 3)", err), HANG), err
    shown = "".join(err)
    assert shown.count("straggler: rank") == 1
    assert "x3.0 the median of all ranks (1.00 s)" in shown
    assert exits == []
    assert seconds_text(3.0) in shown
    record = read_stragglers(str(tmp_path))
    assert record is not None
    assert [(found.rank, found.host, found.factor, found.step) for found in record.stragglers] == [(3, "node1", 3.0, 7)]


def test_a_forged_host_cannot_forge_a_line():
    watch = StragglerWatch(1.5, WINDOW)
    forged = reports([0.05, 0.05, 0.05, 0.10])
    forged[3] = dataclasses.replace(forged[3], host="node1\nlightning-mpi-env: all is well")
    (found,) = watch.judge(forged)
    assert "\n" not in found.line(watch.factor)
    assert "rank 3 on 'node1\\nlightning-mpi-env: all is well'" in found.line(watch.factor)
    summary = watch.summary()
    assert summary is not None
    assert "\n" not in summary


def test_the_stragglers_standing_are_those_named_that_still_stand_out_slowest_first():
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(reports([0.05, 0.05, 0.05, 0.05, 0.10, 0.15]))  # ranks 4 and 5, on node2
    assert [straggler.rank for straggler in watch.standing()] == [5, 4]
    watch.judge(reports([0.05, 0.05, 0.05, 0.05, 0.05, 0.15]))  # rank 4 recovered: it no longer stands
    assert [straggler.rank for straggler in watch.standing()] == [5]
    watch.judge(reports([0.05] * 6))
    assert watch.standing() == []
    assert set(watch.named) == {4, 5}  # named once, whatever came after


def test_the_hosts_left_out_are_the_slowest_first_at_most_the_spares_each_with_its_ranks():
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(reports([0.05, 0.05, 0.15, 0.05, 0.10, 0.12, 0.05, 0.05]))  # node1: rank 2; node2: ranks 4, 5
    standing = watch.standing()
    assert [(s.rank, s.host) for s in to_leave_out(standing, 1)] == [(2, "node1")]
    assert [(s.rank, s.host) for s in to_leave_out(standing, 2)] == [(2, "node1"), (5, "node2"), (4, "node2")]
    assert to_leave_out(standing, 0) == []
    line = leave_out_line(to_leave_out(standing, 2), 30)
    assert line.startswith("leaving out node1 x3.0 (rank 2), node2 x2.4 (ranks 4-5), still slower than the others")
    assert "the step ends at the checkpoint of step 30" in line
