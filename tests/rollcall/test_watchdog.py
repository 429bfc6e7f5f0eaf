"""The stall watchdog: the rule on its own, then real ``TCPStore`` clients on 127.0.0.1, one thread per rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.rollcall.watchdog import (
    KEY,
    Report,
    Seen,
    Watchdog,
    find_stall,
    interval_for,
    main_thread_place,
    observe,
)

# --- the rule -------------------------------------------------------------------------------------------------------


def report(rank: int, progress: int, beat: int = 1, where: str = "train.py:7 in training_step") -> Report:
    return Report(rank, f"node{rank // 2}", progress, progress // 4, progress % 4, beat, where)


def test_level_ranks_are_never_a_stall_however_long():
    # A long validation or a checkpoint: every rank stands at the same mark.
    seen = {rank: Seen(report(rank, 40), 0.0, 0.0) for rank in range(4)}
    assert find_stall(seen, now=10_000.0, timeout=20, frozen_after=3, world_size=4) is None


def test_a_rank_behind_is_a_stall_only_after_the_timeout():
    seen = {rank: Seen(report(rank, 41 if rank != 3 else 40), 0.0, 9.0) for rank in range(4)}
    assert find_stall(seen, now=19.0, timeout=20, frozen_after=3, world_size=4) is None
    stall = find_stall(seen, now=20.0, timeout=20, frozen_after=30, world_size=4)
    assert isinstance(stall, StallError)
    assert stall.problem.startswith("Rank 3 stalled: no rank made progress for 20 s while ranks 0-2 wait for it.")
    assert "rank 3 on node1 at step 10 (between steps), alive, main thread at train.py:7 in training_step" in (
        stall.problem
    )
    assert stall.variable == "LIGHTNING_MPI_ENV_STALL_TIMEOUT"
    assert "0 turns the watchdog off" in stall.hint


def test_a_silent_heartbeat_is_frozen():
    seen = {0: Seen(report(0, 9), 0.0, 30.0), 1: Seen(report(1, 6), 0.0, 0.0)}
    stall = find_stall(seen, now=31.0, timeout=20, frozen_after=3, world_size=2)
    assert stall is not None
    assert "rank 1 on node0 at step 1 (in backward), frozen (its watchdog silent for 31 s)" in stall.problem


def test_any_progress_anywhere_restarts_the_clock():
    seen: dict[int, Seen] = {}
    observe(seen, [report(0, 5), report(1, 4)], now=0.0)
    observe(seen, [report(0, 6, beat=2), report(1, 4, beat=2)], now=15.0)  # rank 0 moved on at 15 s
    assert find_stall(seen, now=30.0, timeout=20, frozen_after=3, world_size=2) is None
    assert find_stall(seen, now=35.0, timeout=20, frozen_after=30, world_size=2) is not None
    assert seen[1].beat_since == 15.0


def test_ranks_that_never_reported_are_behind():
    # Ranks 2 and 3 froze before their watchdogs' first report: they are named with the rank that is behind.
    seen = {0: Seen(report(0, 9), 0.0, 0.0), 1: Seen(report(1, 8), 0.0, 0.0)}
    stall = find_stall(seen, now=30.0, timeout=20, frozen_after=60, world_size=4)
    assert stall is not None
    assert stall.problem.startswith("Ranks 1-3 stalled: no rank made progress for 20 s while rank 0 waits for them.")
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
    assert Report.from_json(original.to_json()) == original


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


def _watchdogs(port: int, world: int, timeout: float, exits: list[tuple[int, int]]) -> list[Watchdog]:
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
        )
        for rank in range(world)
    ]


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_healthy_job_that_pauses_level_never_trips(store_port):
    exits: list[tuple[int, int]] = []
    dogs = _watchdogs(store_port, 3, timeout=1.0, exits=exits)
    for dog in dogs:
        dog.start()
    for step in range(3):
        for dog in dogs:
            dog.mark(step, 1)
        time.sleep(0.3)
    time.sleep(3.0)  # every rank pauses at the same mark for 3 timeouts: a long validation, say
    for dog in dogs:
        dog.stop()
    assert exits == []
    assert all(dog.verdict is None for dog in dogs)


def test_a_blocked_rank_is_named_alive_by_every_rank(store_port):
    exits: list[tuple[int, int]] = []
    dogs = _watchdogs(store_port, 3, timeout=1.0, exits=exits)
    for dog in dogs:
        dog.start()
    for dog in dogs[:2]:
        dog.mark(5, 2)  # ranks 0 and 1 reached backward; rank 2 did not
    assert _wait_for(lambda: len(exits) == 3, 20), exits
    assert sorted(exits) == [(0, 1), (1, 1), (2, 1)]
    verdicts = {dog.verdict for dog in dogs}
    assert len(verdicts) == 1
    (verdict,) = verdicts
    assert "Rank 2 stalled" in verdict
    assert "ranks 0-1 wait for it" in verdict
    assert "rank 2 on node1 at step 0 (between steps), alive, main thread at " in verdict


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


def test_a_frozen_rank_is_named_frozen(store_port):
    exits: list[tuple[int, int]] = []
    (rank_zero,) = _watchdogs(store_port, 2, timeout=2.0, exits=exits)[:1]
    frozen = subprocess.Popen([sys.executable, "-c", FROZEN_RANK, str(store_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "READY"
        rank_zero.start()
        time.sleep(1.5)  # rank 1's thread reports at least once
        os.kill(frozen.pid, signal.SIGSTOP)
        # Rank 0 moves ahead only now: the stall is found a timeout later, when rank 1 has been silent for longer
        # than the three intervals that make it frozen, however late the threads run on a busy machine.
        rank_zero.mark(7, 1)
        assert _wait_for(lambda: exits == [(0, 1)], 30), exits
        assert rank_zero.verdict is not None
        assert "rank 1 on nodeb at step 0 (between steps), frozen (its watchdog silent for" in rank_zero.verdict
    finally:
        os.kill(frozen.pid, signal.SIGKILL)
        frozen.wait()


def test_a_frozen_store_host_is_named_by_the_others():
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
        )
        os.kill(host.pid, signal.SIGSTOP)
        dog.start()
        assert _wait_for(lambda: exits == [(1, 1)], 60), exits
        assert dog.verdict is not None
        assert "Rank 0's store (the main address) has not answered this rank's watchdog for" in dog.verdict
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
import os, signal, subprocess, sys, time, types
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


# In a module of its own: the watchdog thread holds __main__'s globals, which then outlive finalization.
holder = sys.modules["holder"] = types.ModuleType("holder")
holder.hold = HoldFinalizing()
os.kill(host.pid, signal.SIGSTOP)
Watchdog(lambda seconds: store, rank=1, world_size=2, host="nodeb", timeout=0).start()
time.sleep(0.5)  # the thread's first request, sent at once, waits on the paused host
subprocess.Popen(["sh", "-c", f"sleep 1; kill -CONT {host.pid}"])
print("MAIN DONE", flush=True)
"""


def test_a_request_in_flight_when_the_program_ends_does_not_abort_the_process():
    done = subprocess.run([sys.executable, "-c", REQUEST_IN_FLIGHT_AT_EXIT], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "MAIN DONE"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
