"""The stall watchdog: the rule on its own, then real ``TCPStore`` clients on 127.0.0.1, one thread per rank."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder
from lightning_mpi_env.rollcall.stall import (
    BEFORE_THE_FIRST_STEP,
    PHASES,
    Seen,
    find_stall,
    interval_for,
    judge,
    observe,
)
from lightning_mpi_env.rollcall.stall_verdict import KEY
from lightning_mpi_env.rollcall.store_values import Report, read, report_of
from lightning_mpi_env.rollcall.watchdog import Watchdog, main_thread_place
from lightning_mpi_env.supervise.records import read_records

# --- the rule -------------------------------------------------------------------------------------------------------


def read_report(raw: bytes | str) -> Report:
    """A stored report, checked as rank 0 reads it."""
    return read("report", raw, report_of(None))


def report(rank: int, progress: int, beat: int = 1, where: str = "train.py:7 in training_step") -> Report:
    return Report(rank, f"node{rank // 2}", progress, progress // 4, progress % 4, beat, where)


def test_level_ranks_are_never_a_stall_however_long():
    # A long validation or a checkpoint: every rank stands at the same mark.
    seen = {rank: Seen(report(rank, 40), 0.0, 9_999.0) for rank in range(4)}
    assert find_stall(seen, now=10_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_a_rank_behind_is_a_stall_only_after_the_timeout():
    seen = {rank: Seen(report(rank, 41 if rank != 3 else 40), 0.0, 9.0) for rank in range(4)}
    assert find_stall(seen, now=19.0, timeout=20, frozen_after=3, world_size=4) is None
    stall = find_stall(seen, now=20.0, timeout=20, frozen_after=30, world_size=4)
    assert isinstance(stall, StallError)
    assert stall.problem.startswith(
        "Rank 3 stalled: no rank made progress for 20 s while ranks 0-2 wait for it at step 10."
    )
    assert "rank 3 on node1 at step 10 (between steps), alive, main thread at train.py:7 in training_step" in (
        stall.problem
    )
    assert stall.variable == "LIGHTNING_MPI_ENV_STALL_TIMEOUT"
    assert "0 turns the watchdog off" in stall.hint


def test_a_silent_heartbeat_is_frozen():
    seen = {0: Seen(report(0, 9), 0.0, 30.0), 1: Seen(report(1, 6), 0.0, 0.0)}
    stall = find_stall(seen, now=31.0, timeout=20, frozen_after=3, world_size=2)
    assert stall is not None
    assert stall.problem.startswith(
        "Rank 1 stalled: no rank made progress for 20 s while rank 0 waits for it at step 2."
    )
    assert "rank 1 on node0, frozen: its watchdog last reported 31 s ago, at step 1 (in backward)" in stall.problem


def test_a_frozen_rank_is_named_whatever_the_loop_marks():
    # A Fabric loop with the plugin that never calls environment.progress(step): every rank stands at mark 0, level
    # for ever. Rank 3's heartbeat stopped 25 s ago while the others' go on: it froze.
    seen = {rank: Seen(report(rank, 0), 0.0, 99.0) for rank in range(3)}
    seen[3] = Seen(report(3, 0), 0.0, 75.0)
    assert find_stall(seen, now=94.0, timeout=20, frozen_after=3, world_size=4) is None  # silent for 19 s only
    stall = find_stall(seen, now=100.0, timeout=20, frozen_after=3, world_size=4)
    assert stall is not None
    assert stall.problem.startswith("Rank 3 stalled: its watchdog fell silent 25 s ago while ranks 0-2 still report.")
    assert "rank 3 on node1, frozen: its watchdog last reported 25 s ago, at no step (the loop marks no progress)" in (
        stall.problem
    )


def test_the_verdict_gives_the_last_step_reported_and_how_long_ago():
    # Rank 3 reported at step 0, then ran to step 10 within one interval and froze there; the others wait at step 10.
    seen = {rank: Seen(report(rank, 42), 50.0, 99.0) for rank in range(3)}
    seen[3] = Seen(report(3, 1), 40.0, 40.0)
    stall = find_stall(seen, now=100.0, timeout=20, frozen_after=3, world_size=4)
    assert stall is not None
    assert "while ranks 0-2 wait for it at step 10." in stall.problem
    assert "rank 3 on node1, frozen: its watchdog last reported 60 s ago, at step 0 (in its training step)" in (
        stall.problem
    )


def test_a_rank_whose_watchdog_left_is_not_frozen():
    # Rank 3's fit ended and its watchdog stopped, saying so; rank 0 still writes a checkpoint for minutes.
    seen = {rank: Seen(report(rank, 40), 0.0, 999.0) for rank in range(3)}
    seen[3] = Seen(dataclasses.replace(report(3, 40), left=True), 0.0, 10.0)
    assert find_stall(seen, now=1_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_any_progress_anywhere_restarts_the_clock():
    seen: dict[int, Seen] = {}
    observe(seen, [report(0, 5), report(1, 4)], now=0.0)
    observe(seen, [report(0, 6, beat=2), report(1, 4, beat=2)], now=15.0)  # rank 0 moved on at 15 s
    assert find_stall(seen, now=30.0, timeout=20, frozen_after=3, world_size=2) is None
    assert find_stall(seen, now=35.0, timeout=20, frozen_after=30, world_size=2) is not None
    assert seen[1].beat_since == 15.0


def validating(rank: int, phase: str, busy: int = 0, beat: int = 1) -> Report:
    """Rank ``rank``'s report at step 8 after 32 marks of training, then ``phase`` of the validation after it."""
    marks = 32 + PHASES.index(phase) - PHASES.index("in validation") + 1
    return Report(rank, f"node{rank // 2}", marks, 8, PHASES.index(phase), beat, "eval.py:3 in step", busy=busy)


def test_a_rank_stuck_in_validation_is_behind_the_others_waiting_after_it():
    # Ranks 0-2 ended their validation batches and wait in the next collective (ModelCheckpoint's barrier, say);
    # rank 3 never got past its first validation batch (a data loader worker that hangs).
    seen = {rank: Seen(validating(rank, "past validation", busy=4), 0.0, 99.0) for rank in range(3)}
    seen[3] = Seen(validating(3, "in validation"), 0.0, 99.0)
    stall = find_stall(seen, now=100.0, timeout=20, frozen_after=3, world_size=4)
    assert stall is not None
    assert stall.problem.startswith(
        "Rank 3 stalled: no rank made progress for 20 s while ranks 0-2 wait for it at step 8."
    )
    assert "rank 3 on node1 at step 8 (in validation), alive, main thread at eval.py:3 in step" in stall.problem


def test_validation_batches_are_progress_though_ranks_need_not_do_as_many():
    # Rank 3 validates more batches than the others (or more slowly), longer than the timeout after they ended: each
    # of its batches is progress, so it is not stalled; once its batches stop coming, it is.
    seen: dict[int, Seen] = {}
    for busy, now in enumerate([0.0, 15.0, 30.0, 45.0]):
        waiting = [validating(rank, "past validation", busy=4, beat=busy) for rank in range(3)]
        observe(seen, [*waiting, validating(3, "in validation", busy=busy, beat=busy)], now=now)
        assert find_stall(seen, now=now + 5, timeout=20, frozen_after=30, world_size=4) is None
    waiting = [validating(rank, "past validation", busy=4, beat=9) for rank in range(3)]
    observe(seen, [*waiting, validating(3, "in validation", busy=3, beat=9)], now=60.0)
    stall = find_stall(seen, now=65.0, timeout=20, frozen_after=30, world_size=4)
    assert stall is not None
    assert stall.problem.startswith("Rank 3 stalled: no rank made progress for 20 s")


def test_ranks_that_never_reported_are_behind():
    # Ranks 2 and 3 froze before their watchdogs' first report: they are named with the rank that is behind.
    seen = {0: Seen(report(0, 9), 0.0, 0.0), 1: Seen(report(1, 8), 0.0, 0.0)}
    stall = find_stall(seen, now=30.0, timeout=20, frozen_after=60, world_size=4)
    assert stall is not None
    assert stall.problem.startswith(
        "Ranks 1-3 stalled: no rank made progress for 20 s while rank 0 waits for them at step 2."
    )
    assert stall.problem.endswith("rank 3 never reported (frozen, or stuck before its watchdog started).")


def test_a_rank_that_never_reported_waits_out_the_timeout_from_the_start_of_watching():
    # Every rank that reported is level: the silent rank is the stall, but only a timeout after watching began.
    seen = {rank: Seen(report(rank, 9), 0.0, 0.0) for rank in range(3)}
    assert find_stall(seen, now=25.0, timeout=20, frozen_after=3, world_size=4, started=10.0) is None
    stall = find_stall(seen, now=30.0, timeout=20, frozen_after=3, world_size=4, started=10.0)
    assert stall is not None
    assert "Rank 3 stalled" in stall.problem


def test_the_interval_widens_with_the_world_and_stays_below_the_timeout():
    assert interval_for(20, 4) == 1.0
    assert interval_for(300, 16_384) == pytest.approx(16.384)
    assert interval_for(20, 16_384) == 5.0  # a quarter of the timeout at most
    assert interval_for(1, 2) == 0.5


def test_report_round_trips():
    original = report(5, 21)
    assert read_report(original.to_json()) == original


def test_main_thread_place_names_where_the_main_thread_is():
    # As the watchdog does: another thread looks at the main thread, which waits here.
    places: list[str] = []
    looker = threading.Thread(target=lambda: places.append(main_thread_place()))
    looker.start()
    looker.join()
    assert "test_watchdog.py:" in places[0]
    assert places[0].endswith("in test_main_thread_place_names_where_the_main_thread_is")


# --- real clients of one TCPStore, a thread per rank -----------------------------------------------------------------


@pytest.fixture
def store_port():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield server.port
    del server


def _watchdogs(
    port: int, world: int, timeout: float, exits: list[tuple[int, int]], **options: object
) -> list[Watchdog]:
    import torch.distributed as dist

    def connect(rank: int):
        def open_client(seconds: float):
            return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=seconds))

        return open_client

    return [
        Watchdog(
            connect(rank),
            rank=rank,
            world_size=world,
            host=f"node{rank // 2}",
            timeout=timeout,
            exit=lambda status, rank=rank: exits.append((rank, status)),
            **options,  # type: ignore[arg-type]
        )
        for rank in range(world)
    ]


HANG = 60.0
"""Seconds a test waits for a thread's next report or verdict at most: a bound on a hang (one interval is 0.5-1 s)."""


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class _Clock:
    """The clock the watchdogs judge by (``Watchdog(clock=...)``), moved by the test, one interval per step.

    A step is taken only once every watchdog given has written a newer report to the store. So rank 0 misses no
    rank's reports for more than two steps, however slowly the threads run: no rank looks silent for the three
    intervals that make it frozen, nor stays behind in rank 0's eyes for a timeout, unless it truly stopped. What
    the watchdogs find depends on what the ranks did, never on how fast the threads ran.
    """

    def __init__(self, port: int) -> None:
        import torch.distributed as dist

        self.now = 0.0
        self._store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))

    def __call__(self) -> float:
        return self.now

    def _beats(self, dogs: Sequence[Watchdog]) -> list[int]:
        """The beat of each dog's report in the store; 0 before its first (or while a forged one stands there)."""
        beats = []
        for key in (KEY + str(dog.rank) for dog in dogs):
            try:
                beats.append(read_report(self._store.get(key)).beat if self._store.check([key]) else 0)
            except ValueError:  # a malformed report (store_values.Malformed)
                beats.append(0)
        return beats

    def reported(self, dogs: Sequence[Watchdog], until: Callable[[], bool] = lambda: False) -> bool:
        """Wait until each of ``dogs`` wrote a report newer than now, or ``until()`` holds; whether it held."""
        before = self._beats(dogs)
        newer = lambda: all(now > then for then, now in zip(before, self._beats(dogs), strict=True))  # noqa: E731
        assert _wait_for(lambda: until() or newer(), HANG), "a watchdog stopped reporting"
        return until()

    def advance(self, dogs: Sequence[Watchdog], seconds: float, until: Callable[[], bool] = lambda: False) -> bool:
        """Move the clock ``seconds`` on, a report of each of ``dogs`` per step; whether ``until()`` came to hold.

        First every dog reports what the test did before (marks); at the end, rank 0 has judged at the new time.
        A verdict ends the reports: pass ``until`` to stop there.
        """
        target = self.now + seconds
        if self.reported(dogs, until):
            return True
        while self.now < target:
            self.now = min(self.now + dogs[0].interval, target)
            if self.reported(dogs, until):
                return True
        return self.reported(dogs, until)  # rank 0 began a judge at the last step; it ended when it reported again


def test_a_first_connection_that_times_out_is_tried_again_and_the_rank_reports():
    # Rank 0's store does not take the thread's first connection within its timeout (a loaded rank 0: here, a port
    # bound but not listening, so each attempt is refused until the client gives up). The thread tries again at its
    # next interval, as after a request that timed out, and reports once the store answers; before, it ended there,
    # and the rank went unwatched.
    import socket

    import torch.distributed as dist

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # no listen(): a connection is refused, and no other process takes the port
    port = holder.getsockname()[1]
    calls: list[float] = []

    def connect(seconds: float):
        calls.append(seconds)
        return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=seconds))

    exits: list[int] = []
    dog = Watchdog(connect, rank=0, world_size=1, host="node0", timeout=60.0, exit=exits.append).start()
    try:
        assert _wait_for(lambda: len(calls) >= 2, HANG), calls  # the first attempt timed out; the second runs
        holder.close()
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        assert _wait_for(lambda: server.check([KEY + "0"]), HANG), calls
        report = read_report(server.get(KEY + "0"))
        assert (report.rank, report.host) == (0, "node0")
        assert dog.verdict is None
        assert exits == []
    finally:
        dog.stop()
        holder.close()


def test_a_healthy_job_that_pauses_level_never_trips(store_port):
    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 3, timeout=1.0, exits=exits, clock=clock)
    for dog in dogs:
        dog.start()
    for step in range(3):
        for dog in dogs:
            dog.mark(step, 1)
        clock.advance(dogs, dogs[0].interval)
    # Every rank pauses at the same mark for 3 timeouts: a long validation, say. The clock moves only while every
    # thread reports, so the pause is 3 timeouts of level ranks however slowly the threads run.
    found = clock.advance(dogs, 3 * dogs[0].timeout, until=lambda: any(dog.verdict for dog in dogs))
    for dog in dogs:
        dog.stop()
    assert not found
    assert exits == []
    assert all(dog.verdict is None for dog in dogs)


def test_a_blocked_rank_is_named_alive_by_every_rank(store_port, tmp_path):
    exits: list[tuple[int, int]] = []
    recorder = FailureRecorder(str(tmp_path), "srun", "42")
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 3, timeout=1.0, exits=exits, recorder=recorder, clock=clock)
    for dog in dogs:
        dog.start()
    for dog in dogs[:2]:
        dog.mark(5, 2)  # ranks 0 and 1 reached backward; rank 2 did not
    assert clock.advance(dogs, 10 * dogs[0].timeout, until=lambda: any(dog.verdict for dog in dogs))
    assert _wait_for(lambda: len(exits) == 3, HANG), exits
    assert sorted(exits) == [(0, 1), (1, 1), (2, 1)]
    verdicts = {dog.verdict for dog in dogs}
    assert len(verdicts) == 1
    (verdict,) = verdicts
    assert "Rank 2 stalled" in verdict
    assert "ranks 0-1 wait for it" in verdict
    assert "rank 2 on node1 at no step yet (before its first step), alive, main thread at " in verdict
    # Rank 0 found it and wrote the one record: rank 2, alive, on node1, while the others reached step 5.
    (record,) = read_records(str(tmp_path))
    assert (record.kind, record.ranks, record.hosts, record.step) == (FailureKind.STALLED, (2,), ("node1",), 5)
    assert (record.written_by, record.job_id) == (0, "42")
    assert record.problem in verdict


def _shows(capfd, text: str, seen: list[str]) -> Callable[[], bool]:
    """Whether ``text`` showed on stderr (threads write there) by now, collecting what came in ``seen``."""

    def shown() -> bool:
        seen.append(capfd.readouterr().err)
        return text in "".join(seen)

    return shown


def test_the_soft_timeout_reports_a_stall_and_the_job_goes_on(store_port, capfd):
    # Rank 2 stays behind for several soft timeouts, well inside the hard one: rank 0 reports it once, the job goes
    # on, and when rank 2 catches up rank 0 says the stall is over. Nobody exits.
    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 3, timeout=60.0, exits=exits, soft_timeout=1.0, clock=clock)
    assert dogs[0].interval == interval_for(1.0, 3)  # the soft timeout sets the pace
    for dog in dogs:
        dog.start()
    for dog in dogs[:2]:
        dog.mark(5, 2)  # ranks 0 and 1 reached backward of step 5; rank 2 is alone at step 5 (rank 0 sampling, say)
    err: list[str] = []
    assert clock.advance(dogs, 10.0, until=_shows(capfd, "Rank 2 stalled", err)), err
    clock.advance(dogs, 3.0)  # three more soft timeouts: no second report
    dogs[2].mark(5, 2)
    assert _wait_for(_shows(capfd, "is over: the ranks made progress", err), HANG), err
    for dog in dogs:
        dog.stop()
    assert "".join(err).count("Rank 2 stalled") == 1
    assert exits == []
    assert all(dog.verdict is None for dog in dogs)


def test_the_soft_report_line_names_the_rank_and_the_hard_timeout(store_port, capfd):
    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 2, timeout=60.0, exits=exits, soft_timeout=1.0, clock=clock)
    for dog in dogs:
        dog.start()
    dogs[0].mark(3, 1)
    err: list[str] = []
    assert clock.advance(dogs, 10.0, until=_shows(capfd, "stall watchdog: Rank 1 stalled", err)), err
    clock.advance(dogs, 2.5)  # the stall goes on: rank 0 does not say it again
    for dog in dogs:
        dog.stop()
    err.append(capfd.readouterr().err)
    (line,) = [line for line in "".join(err).splitlines() if "stall watchdog: Rank 1 stalled" in line]  # once
    assert line.startswith("lightning-mpi-env: stall watchdog: Rank 1 stalled: no rank made progress for 1 s")
    assert "rank 1 on node0 at no step yet (before its first step), alive, main thread at " in line
    assert line.endswith(
        "The job goes on; it ends if no rank makes progress for 60 s (LIGHTNING_MPI_ENV_STALL_TIMEOUT)."
    )
    assert exits == []


@pytest.mark.parametrize(("soft", "hard"), [(5.0, 5.0), (9.0, 5.0), (0.0, 5.0), (3.0, 0.0)])
def test_a_soft_timeout_not_below_the_hard_one_is_no_report(soft, hard):
    dog = Watchdog(lambda seconds: None, rank=0, world_size=2, host="a", timeout=hard, soft_timeout=soft)  # type: ignore[arg-type, return-value]
    assert dog.soft_timeout == 0.0


STORE_HOST = """
import time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(120)
"""

FROZEN_RANK = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
from lightning_mpi_env.rollcall.watchdog import Watchdog

port = int(sys.argv[1])
dog = Watchdog(
    lambda seconds: dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=seconds)),
    rank=1, world_size=2, host="nodeb", timeout=2.0, exit=lambda status: None,
).start()
print("READY", flush=True)
time.sleep(120)
"""


def test_a_frozen_rank_is_named_frozen(store_port, tmp_path):
    exits: list[tuple[int, int]] = []
    recorder = FailureRecorder(str(tmp_path), "srun", None)
    clock = _Clock(store_port)
    (rank_zero,) = _watchdogs(store_port, 2, timeout=2.0, exits=exits, recorder=recorder, clock=clock)[:1]
    frozen = subprocess.Popen([sys.executable, "-c", FROZEN_RANK, str(store_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "READY"
        import torch.distributed as dist

        client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=30))
        assert _wait_for(lambda: client.check([KEY + "1"]), HANG)  # rank 1's thread reported once
        rank_zero.start()
        os.kill(frozen.pid, signal.SIGSTOP)
        # Rank 0 moves ahead only now: the stall is found a timeout later (by rank 0's clock, which moves only while
        # rank 0 reports), when rank 1 has been silent for longer than the three intervals that make it frozen.
        rank_zero.mark(7, 1)
        assert clock.advance([rank_zero], 10 * rank_zero.timeout, until=lambda: rank_zero.verdict is not None)
        assert _wait_for(lambda: exits == [(0, 1)], HANG), exits
        assert rank_zero.verdict is not None
        assert "Rank 1 stalled: " in rank_zero.verdict
        assert "rank 1 on nodeb, frozen: its watchdog last reported " in rank_zero.verdict
        assert "s ago, at no step yet (before its first step)" in rank_zero.verdict
        (record,) = read_records(str(tmp_path))
        assert (record.kind, record.ranks, record.hosts, record.step) == (FailureKind.FROZEN, (1,), ("nodeb",), 7)
    finally:
        os.kill(frozen.pid, signal.SIGKILL)
        frozen.wait()


def test_a_frozen_store_host_is_named_by_the_others(tmp_path):
    # The store lives in rank 0's process: frozen, it answers no request, and the client's timeout does not end one.
    # The watchdog sees the silence anyway and names it once the stall timeout has passed.
    exits: list[tuple[int, int]] = []
    host = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert host.stdout is not None
        import torch.distributed as dist

        # As in a job: the roll call's client, connected before the host froze.
        client = dist.TCPStore("127.0.0.1", int(host.stdout.readline()), is_master=False)
        dog = Watchdog(
            lambda seconds: client,
            rank=1,
            world_size=2,
            host="nodeb",
            timeout=2.0,
            exit=lambda status: exits.append((1, status)),
            stand_in=True,
            recorder=FailureRecorder(str(tmp_path), "srun", None),
            main_host="nodea",
        )
        os.kill(host.pid, signal.SIGSTOP)
        dog.start()
        assert _wait_for(lambda: exits == [(1, 1)], 2 * HANG), exits  # a request's 5 s, then the timeout
        assert dog.verdict is not None
        assert "Rank 0's store (the main address) has not answered this rank's watchdog for" in dog.verdict
        (record,) = read_records(str(tmp_path))  # by the stand-in, the one rank that ends the step
        assert (record.kind, record.ranks, record.hosts) == (FailureKind.STORE_UNREACHABLE, (0,), ("nodea",))
    finally:
        host.kill()
        host.wait()


def test_the_verdict_key_is_under_the_prefix():
    assert KEY.startswith("lightning_mpi_env/")


def test_stop_ends_the_thread(store_port):
    (dog,) = _watchdogs(store_port, 1, timeout=1.0, exits=[])
    dog.start()
    dog.stop()
    dog._thread.join(5)
    assert not dog._thread.is_alive()


# A rank that finished while its watchdog's request was in flight: the request must not return into a finalizing
# interpreter, where Python unwinds the daemon thread through C++ frames: "terminate called without an active
# exception", status 134. Here the request waits on a paused store host, which a timer resumes a second after the main
# thread ends, while a module global's __del__ holds the interpreter in finalization for four more.
REQUEST_IN_FLIGHT_AT_EXIT = """
import os, signal, subprocess, sys, threading, time, types
from datetime import timedelta
import torch.distributed as dist
from lightning_mpi_env.rollcall.watchdog import Watchdog

host = subprocess.Popen(
    [sys.executable, "-c", "import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, "
     "is_master=True, wait_for_workers=False); print(s.port, flush=True); time.sleep(120)"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
)
store = dist.TCPStore("127.0.0.1", int(host.stdout.readline()), is_master=False, timeout=timedelta(seconds=30))


class HoldFinalizing:
    def __del__(self, kill=os.kill, pid=host.pid, end=signal.SIGKILL, sleep=time.sleep):
        sleep(4.0)
        kill(pid, end)


class Announced:  # the store, saying when the thread's first request goes out
    def __init__(self):
        self.sent = threading.Event()

    def add(self, key, amount):
        self.sent.set()
        return store.add(key, amount)


# In a module of its own: the watchdog thread holds __main__'s globals, which then outlive finalization.
holder = sys.modules["holder"] = types.ModuleType("holder")
holder.hold = HoldFinalizing()
os.kill(host.pid, signal.SIGSTOP)
announced = Announced()
Watchdog(lambda seconds: announced, rank=1, world_size=2, host="nodeb", timeout=0).start()
assert announced.sent.wait(120)  # the thread's first request, sent at once, waits on the paused host
# The scenario's own times: the host answers a second after the main thread ended, when, without stop() at exit, the
# interpreter would be finalizing (held there 4 s); with it, at exit stop() waits for the request (up to 5 s).
subprocess.Popen(["sh", "-c", f"sleep 1; kill -CONT {host.pid}"])
print("MAIN DONE", flush=True)
"""


def test_a_request_in_flight_when_the_program_ends_does_not_abort_the_process():
    # The limit only ends a hang: on 2 cores with busy loops and 4 test workers the script (two torch imports, two
    # processes) once did not print its last line within 60 s.
    script = [sys.executable, "-c", REQUEST_IN_FLIGHT_AT_EXIT]
    done = subprocess.run(script, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "MAIN DONE"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


# --- what the thread reads, and what would end it ------------------------------------------------------------------


def test_a_malformed_report_is_skipped_and_named_once(store_port, capsys):
    import torch.distributed as dist

    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    rank_zero, rank_one = _watchdogs(store_port, 2, timeout=2.0, exits=exits, clock=clock)
    forger = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    forger.set(KEY + "1", report(1, 0).to_json().replace('"beat":1', '"beat":"x"'))
    rank_zero.start()
    assert _wait_for(lambda: rank_zero.named, HANG)
    for _ in range(3):  # at least two more of rank 0's reads find it (each read ends before its next report)
        clock.reported([rank_zero])
    assert rank_zero._thread.is_alive()
    assert list(rank_zero.named) == [KEY + "1"]
    named = [line for line in capsys.readouterr().err.splitlines() if "skips" in line]
    assert len(named) == 1
    assert named[0].startswith(
        "lightning-mpi-env: the stall watchdog of rank 0 skips The rendezvous store holds a malformed value under "
        "'lightning_mpi_env/watchdog/1': beat is str, not an integer"
    )
    # Rank 1's own reports then come through: rank 0 judges on, and finds the stall when rank 1 falls behind.
    rank_one.start()
    rank_zero.mark(3, 1)
    assert clock.advance([rank_zero, rank_one], 10 * rank_zero.timeout, until=lambda: rank_zero.verdict is not None)
    assert _wait_for(lambda: (0, 1) in exits, HANG), exits
    assert rank_zero.verdict is not None
    assert "Rank 1 stalled" in rank_zero.verdict
    rank_one.stop()


def test_a_malformed_verdict_is_skipped_and_named_by_every_rank(store_port):
    import torch.distributed as dist

    exits: list[tuple[int, int]] = []
    dogs = _watchdogs(store_port, 2, timeout=30.0, exits=exits)
    forger = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    forger.set(KEY + "verdict", '{"problem": "p", "hint": "h", "exit_at": "now"}')
    forger.add(KEY + "events", 1)
    clock = _Clock(store_port)
    for dog in dogs:
        dog.start()
    assert _wait_for(lambda: all(dog.named for dog in dogs), HANG)
    for _ in range(3):  # each thread goes on: it reads the verdict again at least twice
        clock.reported(dogs)
    assert all(dog._thread.is_alive() for dog in dogs)
    assert exits == []
    for dog in dogs:
        assert "exit_at is str, not a finite number" in dog.named[KEY + "verdict"]
        dog.stop()


def test_an_exception_that_ends_the_thread_is_named(capsys):
    def broken(seconds: float):
        raise OSError("no route to the store")

    dog = Watchdog(broken, rank=2, world_size=4, host="nodeb", timeout=5.0, exit=lambda status: None).start()
    dog._thread.join(120)  # a bound on a hang only: the thread imports torch.distributed first (seconds under load)
    assert not dog._thread.is_alive()
    assert dog.ended_by == "OSError: no route to the store"
    assert (
        "lightning-mpi-env: the stall watchdog of rank 2 on nodeb stopped on OSError: no route to the store; this "
        "rank's stalls and requeue signals are no longer watched" in capsys.readouterr().err
    )


def test_a_stopped_watchdog_says_it_left(store_port):
    import torch.distributed as dist

    (dog,) = _watchdogs(store_port, 1, timeout=2.0, exits=[])
    client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    dog.start()
    assert _wait_for(lambda: client.check([KEY + "0"]), HANG)  # its first report, which does not say it left
    assert not read_report(client.get(KEY + "0")).left
    dog.stop()
    assert read_report(client.get(KEY + "0")).left


def test_rank_zero_ends_the_step_after_the_verdict_and_every_rank_alive_asks_again(store_port, tmp_path, capsys):
    # Where the launcher would wait for the frozen rank (srun), rank 0 runs the scheduler's command at the moment
    # every rank would end. Here the command ends nothing, so every rank outlives it and asks on its own plan (the
    # test's sleep returns at once); at the bound each rank says what ends the step instead, and exits.
    asked = tmp_path / "asked"
    exits: list[tuple[int, int]] = []
    dogs = _watchdogs(store_port, 3, timeout=1.0, exits=exits, sleep=lambda seconds: None)
    for dog in dogs:  # a command of its own per rank: the requests say who asked (and no rank shares a node turn)
        dog.end_step = (sys.executable, "-c", f"open({str(asked)!r}, 'a').write('{dog.rank}\\n')")
    for dog in dogs:
        dog.start()
    for dog in dogs[:2]:
        dog.mark(5, 2)
    assert _wait_for(lambda: len(exits) == 3, HANG), exits
    assert sorted(exits) == [(0, 1), (1, 1), (2, 1)]
    requests = asked.read_text().split()
    assert {rank: requests.count(rank) for rank in "012"} == {"0": 5, "1": 3, "2": 3}
    err = capsys.readouterr().err
    assert err.count("ends the job step: ") == 1
    assert "lightning-mpi-env: rank 0 ends the job step: " in err
    outlived = [line for line in err.splitlines() if "the job step still runs " in line]
    assert len(outlived) == 3
    assert sum(" after 5 requests `" in line for line in outlived) == 1


@pytest.mark.parametrize(
    ("env", "command"),
    [
        ({"SLURM_STEP_ID": "3", "SLURM_JOB_ID": "42"}, ("scancel", "--signal=KILL", "42.3")),
        ({"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "--partition=evil"}, None),  # never an option on the command line
        ({"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "٤٢"}, None),  # ASCII digits only
        ({"OMPI_COMM_WORLD_RANK": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "42"}, None),  # mpirun ends its job
        ({}, None),
    ],
)
def test_the_command_that_ends_the_step_comes_from_the_launchers_row(env, command):
    from lightning_mpi_env.core.launchers import LAUNCHERS, detect_launcher, end_step_command

    assert end_step_command(detect_launcher(env), env) == command
    # A launcher with a command to end its step does not end the job by itself (else the command is not needed).
    assert not [row.key for row in LAUNCHERS if row.end_step and row.ends_on_failure]


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (
            {"FLUX_TASK_RANK": "0", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "0", "FLUX_JOB_NNODES": "2"},
            "Flux may wait for a frozen rank after the others ended on a stall; to end the job ",
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
            | {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
            "add `srun --kill-on-bad-exit=1` (or `scancel` on the compute",
        ),
        (  # mpirun ends the job itself
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
            | {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            None,
        ),
    ],
)
def test_rank_zero_says_at_the_start_what_to_add_where_nothing_would_end_the_job(
    store_port, capsys, monkeypatch, tmp_path, environ, said
):
    import torch.distributed as dist

    from lightning_mpi_env.core.layout import from_env
    from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import watch

    monkeypatch.setenv("PATH", str(tmp_path))  # no scancel here
    client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    result = RendezvousResult(client, Claim(0, 4, "a", 0, 1, "a", store_port), NodeAssignment(0, 2, 0, 2))
    # The launch as read once (its launcher and its step), carried to the watchdog: it reads no environment.
    dog = watch(result, 30.0, None, from_env({**environ, "MASTER_ADDR": "a"}))
    dog.stop()
    lines = [line for line in capsys.readouterr().err.splitlines() if "stall watchdog:" in line]
    if said is None:
        assert lines == []
    else:
        assert len(lines) == 1
        assert said in lines[0]
    assert dog.end_step == ()
    assert not dog.stand_in  # rank 0 ends the step itself; the lowest rank of node 1 stands in for it


def test_the_watchdog_ends_the_step_the_layout_read(store_port, capsys, monkeypatch, tmp_path):
    # The step comes from the layout read once; the environment the watchdog starts in no longer matters.
    import torch.distributed as dist

    from lightning_mpi_env.core.layout import from_env
    from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import watch

    scancel = tmp_path / "scancel"
    scancel.write_text("#!/bin/sh\nexit 0\n")
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "99")  # another job's id in os.environ is not read
    layout = from_env(
        {"SLURM_STEP_ID": "2", "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}
        | {"SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "MASTER_ADDR": "a"}
    )
    client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    result = RendezvousResult(client, Claim(0, 4, "a", 0, 1, "a", store_port), NodeAssignment(0, 2, 0, 2))
    dog = watch(result, 30.0, None, layout)
    dog.stop()
    assert dog.end_step == ("scancel", "--signal=KILL", "7.2")
    assert "stall watchdog:" not in capsys.readouterr().err  # the step can be ended: nothing to add


def test_the_lowest_rank_off_rank_zeros_node_stands_in(store_port):
    import torch.distributed as dist

    from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import watch

    stand_ins = []
    for rank, nodes in [
        (1, NodeAssignment(0, 2, 1, 2)),
        (2, NodeAssignment(1, 2, 0, 2)),
        (3, NodeAssignment(1, 2, 1, 2)),
    ]:
        client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
        dog = watch(RendezvousResult(client, Claim(rank, 4, "a", 0, 1, "a", store_port), nodes), 30.0, None)
        dog.stop()
        stand_ins.append(dog.stand_in)
    assert stand_ins == [False, True, False]


# --- before the first progress mark ---------------------------------------------------------------------------------


def first_marks(rank: int, marks: int, beat: int = 1) -> Report:
    """A report after ``marks`` marks before the first step (setup, the sanity check), and none in a step."""
    where = "data.py:3 in load" if marks < 3 else "distributed_c10d.py:9 in all_reduce"
    phase = BEFORE_THE_FIRST_STEP if marks else 0
    return Report(rank, f"node{rank // 2}", marks, 0, phase, beat, where)


def test_every_rank_slow_before_the_first_step_is_no_stall():
    # Every rank loads its data (or validates in the sanity check) for far longer than the timeout, at the same mark.
    for marks in (0, 2):
        seen = {rank: Seen(first_marks(rank, marks), 0.0, 999.0) for rank in range(4)}
        assert find_stall(seen, now=1_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_rank_zero_alone_in_prepare_data_is_no_stall():
    # Rank 0 prepares the data while the others wait in Lightning's barrier: before the first mark of any rank.
    seen = {rank: Seen(first_marks(rank, 0, beat=400), 0.0, 999.0) for rank in range(4)}
    assert find_stall(seen, now=1_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_a_rank_behind_before_the_first_step_is_named_before_the_first_step():
    # Ranks 0-2 passed the sanity check (3 marks) and wait in the next collective; rank 3's first batch never came.
    seen = {rank: Seen(first_marks(rank, 3), 80.0, 99.0) for rank in range(3)}
    seen[3] = Seen(first_marks(3, 1), 0.0, 99.0)
    assert find_stall(seen, now=99.0, timeout=20, frozen_after=3, world_size=4) is None  # 19 s only
    stall = judge(seen, now=100.0, timeout=20, frozen_after=3, world_size=4)
    assert stall is not None
    assert stall.error.problem == (
        "Rank 3 stalled: no rank made progress for 20 s while ranks 0-2 wait for it before the first step. "
        "rank 3 on node1 at no step yet (before its first step), alive, main thread at data.py:3 in load."
    )
    assert (stall.fault.kind, stall.fault.ranks, stall.fault.hosts, stall.fault.step) == (
        FailureKind.STALLED,
        (3,),
        ("node1",),
        None,
    )


def test_a_rank_before_its_first_step_while_the_others_train_is_named_at_their_step():
    seen = {rank: Seen(dataclasses.replace(report(rank, 9), step=2, phase=1), 0.0, 99.0) for rank in range(3)}
    seen[3] = Seen(first_marks(3, 2), 0.0, 99.0)
    stall = judge(seen, now=100.0, timeout=20, frozen_after=3, world_size=4)
    assert stall is not None
    assert "ranks 0-2 wait for it at step 2. rank 3 on node1 at no step yet (before its first step)," in (
        stall.error.problem
    )
    assert stall.fault.step == 2


def test_after_the_first_step_a_rank_alone_outside_a_collective_is_no_stall():
    # Rank 0 writes a checkpoint for longer than the timeout while the others wait for it in Lightning's barrier:
    # a barrier marks nothing, so the ranks stay level.
    seen = {rank: Seen(report(rank, 40), 0.0, 999.0) for rank in range(4)}
    assert find_stall(seen, now=1_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_a_report_of_a_mark_before_the_first_step_round_trips():
    marked = first_marks(1, 4)
    assert read_report(marked.to_json()) == marked


def test_a_rank_that_stops_marking_before_the_first_step_is_named_over_a_real_store(store_port, tmp_path):
    # Real watchdogs on one store: every rank marks setup's end; ranks 0-2 mark the sanity check's batches and its
    # end, then wait in the next collective; rank 3's first batch never comes. Every rank names rank 3.
    exits: list[tuple[int, int]] = []
    recorder = FailureRecorder(str(tmp_path), "srun", "42")
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 4, timeout=2.0, exits=exits, recorder=recorder, clock=clock)
    for dog in dogs:
        dog.start()
    for dog in dogs:
        dog.mark(0, BEFORE_THE_FIRST_STEP)  # on_fit_start
    clock.advance(dogs, dogs[0].interval)
    for dog in dogs[:3]:
        for _ in range(3):  # a batch's start and end, the sanity check's end
            dog.mark(0, BEFORE_THE_FIRST_STEP)
    assert clock.advance(dogs, 10 * dogs[0].timeout, until=lambda: any(dog.verdict for dog in dogs))
    assert _wait_for(lambda: len(exits) == 4, HANG), exits
    assert sorted(exits) == [(rank, 1) for rank in range(4)]
    for dog in dogs:
        assert dog.verdict is not None
        assert "Rank 3 stalled: no rank made progress for 2 s while ranks 0-2 wait for it before the first step." in (
            dog.verdict
        )
        assert "rank 3 on node1 at no step yet (before its first step), alive, main thread at " in dog.verdict
    (record,) = read_records(str(tmp_path))
    assert (record.kind, record.ranks, record.step) == (FailureKind.STALLED, (3,), None), record


def test_every_rank_marking_alike_before_the_first_step_is_no_stall_over_a_real_store(store_port):
    # Real watchdogs, the same marks on every rank, then six timeouts of slow work everywhere: no verdict.
    exits: list[tuple[int, int]] = []
    clock = _Clock(store_port)
    dogs = _watchdogs(store_port, 4, timeout=2.0, exits=exits, clock=clock)
    for dog in dogs:
        dog.start()
    try:
        for dog in dogs:
            for _ in range(3):
                dog.mark(0, BEFORE_THE_FIRST_STEP)
        assert not clock.advance(dogs, 6 * dogs[0].timeout, until=lambda: bool(exits))
    finally:
        for dog in dogs:
            dog.stop()
    assert exits == []
    assert all(dog.verdict is None for dog in dogs)


# --- the roll call's verdict ends the step too -----------------------------------------------------------------------


def test_rank_zero_ends_the_step_once_the_roll_calls_verdict_was_read(store_port, tmp_path, capsys):
    import torch.distributed as dist

    from lightning_mpi_env.rollcall.verdict import READ, serve_verdict

    ended = tmp_path / "ended"
    command = (sys.executable, "-c", f"open({str(ended)!r}, 'a').write('ended\\n')")
    client = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=10))
    client.add(READ, 3)  # rank 3 never came: the 3 ranks that did have read the verdict
    serve_verdict(client, 4, time.monotonic(), command, "`srun --kill-on-bad-exit=1`", retries=0)
    assert ended.read_text() == "ended\n"  # once: this process outlives the command, which ends no real step
    assert "lightning-mpi-env: rank 0 ends the job step: " in capsys.readouterr().err
