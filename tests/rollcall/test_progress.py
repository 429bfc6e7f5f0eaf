"""Rank 0's progress lines while the roll call waits: over a real ``TCPStore``, one thread per rank, a test clock."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import pytest

from lightning_mpi_env.rollcall.claims import Claim, format_ranks
from lightning_mpi_env.rollcall.progress import PROGRESS_INTERVAL, SHOWN_RUNS, ArrivalProgress, progress_line
from lightning_mpi_env.rollcall.store import RendezvousResult, rendezvous
from lightning_mpi_env.rollcall.verdict import claim_key

HANG = 120.0
"""Every rank's rendezvous timeout, and the longest a test waits for an event: it only ends a hang."""
PREFIX = "lightning-mpi-env: roll call: "


class Clock:
    """Monotonic seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _wait_for(condition) -> None:
    deadline = time.monotonic() + HANG
    while not condition():
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.02)


@pytest.fixture
def server():
    """Rank 0's store, served by the test: rank 0's roll call serves from this same server (``multi_tenant``)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=HANG)
    )
    yield store
    del store


def _claims(world_size: int, port: int) -> list[Claim]:
    return [Claim(rank, world_size, "a", rank, 1000 + rank, "127.0.0.1", port) for rank in range(world_size)]


class Job:
    """The ranks of one roll call, each started on demand in a thread of its own, each with its progress reporter."""

    def __init__(self, claims: Sequence[Claim], clock: Clock, said: queue.Queue[str]) -> None:
        self.claims, self.clock, self.said = claims, clock, said
        self.results: dict[int, object] = {}
        self.threads: list[threading.Thread] = []

    def start(self, *ranks: int) -> None:
        for rank in ranks:
            # Every rank gets a reporter on the same clock: only rank 0's may speak.
            progress = ArrivalProgress(len(self.claims), HANG, clock=self.clock, say=self.said.put)
            thread = threading.Thread(target=self._run, args=(rank, progress))
            thread.start()
            self.threads.append(thread)

    def _run(self, rank: int, progress: ArrivalProgress) -> None:
        try:
            self.results[rank] = rendezvous(self.claims[rank], timeout=HANG, progress=progress)
        except Exception as error:  # noqa: BLE001  (the test inspects it)
            self.results[rank] = error

    def join(self) -> None:
        for thread in self.threads:
            thread.join(HANG + 30)
        assert not any(thread.is_alive() for thread in self.threads), "a rank was left hanging"


def _arrived(server) -> int:
    return sum(server.check([claim_key(rank)]) for rank in range(4))


def test_rank_zero_says_who_arrived_who_is_missing_and_the_time_left_once_per_interval(server):
    clock, said = Clock(), queue.Queue()
    job = Job(_claims(4, server.port), clock, said)
    job.start(0, 1)
    _wait_for(lambda: _arrived(server) == 2)
    clock.now = PROGRESS_INTERVAL  # the first interval is over: rank 0's next check of the store says it
    assert said.get(timeout=HANG) == (
        PREFIX + "2 of 4 ranks arrived, still waiting for ranks 2-3 (110 s left of the 120 s rendezvous timeout)"
    )
    job.start(2)
    _wait_for(lambda: _arrived(server) == 3)
    clock.now = 25.0
    assert said.get(timeout=HANG) == (
        PREFIX + "3 of 4 ranks arrived, still waiting for rank 3 (95 s left of the 120 s rendezvous timeout)"
    )
    job.start(3)
    job.join()
    assert all(isinstance(result, RendezvousResult) for result in job.results.values()), job.results
    assert sorted(job.results) == [0, 1, 2, 3]
    # One line per interval from rank 0 alone: none from the others, none when the last rank arrived.
    assert said.empty(), said.get()


def test_no_line_when_every_rank_arrives_within_the_first_interval(server):
    clock, said = Clock(), queue.Queue()
    job = Job(_claims(4, server.port), clock, said)
    job.start(0, 1, 2)
    _wait_for(lambda: _arrived(server) == 3)
    clock.now = PROGRESS_INTERVAL - 0.5  # rank 0 checks the store many times meanwhile, and says nothing
    job.start(3)
    job.join()
    assert all(isinstance(result, RendezvousResult) for result in job.results.values()), job.results
    assert said.empty(), said.get()


def test_the_line_is_due_only_once_an_interval_passed_and_reads_the_store_only_then():
    clock, said, reads = Clock(), [], []

    def arrived() -> set[int]:
        reads.append(clock.now)
        return {0, 1, 5}

    progress = ArrivalProgress(8, 120, interval=10, clock=clock, say=said.append)
    for now in (0.0, 9.9, 10.0, 15.0, 19.9, 20.5):
        clock.now = now
        progress.poll(arrived)
    assert reads == [10.0, 20.5]
    assert said == [
        PREFIX + "3 of 8 ranks arrived, still waiting for ranks 2-4, 6-7 (110 s left of the 120 s rendezvous timeout)",
        PREFIX + "3 of 8 ranks arrived, still waiting for ranks 2-4, 6-7 (100 s left of the 120 s rendezvous timeout)",
    ]


def test_nothing_is_said_when_all_arrived():
    clock, said = Clock(), []
    progress = ArrivalProgress(2, 120, interval=10, clock=clock, say=said.append)
    clock.now = 10.0
    progress.poll(lambda: {0, 1})  # everyone is in: rank 0 is judging the table
    assert said == []


def test_a_large_job_s_missing_ranks_stay_one_short_line():
    missing = range(1, 4096, 2)  # every other rank of 4,096: 2,048 runs
    line = progress_line(2048, 4096, missing, 70.4, 120)
    assert line == (
        PREFIX + "2048 of 4096 ranks arrived, still waiting for ranks 1, 3, 5, 7, 9, 11, 13, 15 and 2040 more "
        "(70 s left of the 120 s rendezvous timeout)"
    )
    assert "\n" not in line


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([3], "rank 3"),
        ([3, 4, 5, 9], "ranks 3-5, 9"),
        (range(100), "ranks 0-99"),
        ([0, 2, 4, 5, 6, 8, 10, 12, 14, 16, 18, 19], "ranks 0, 2, 4-6, 8, 10, 12, 14, 16 and 2 more"),
    ],
)
def test_some_ranks_names_the_first_runs_and_counts_the_rest(ranks, text):
    assert format_ranks(ranks, runs=SHOWN_RUNS) == text


def test_time_left_never_goes_below_zero():
    assert progress_line(1, 2, [1], -3.0, 20).endswith("(0 s left of the 20 s rendezvous timeout)")
