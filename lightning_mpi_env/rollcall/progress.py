"""Rank 0's progress lines on stderr while the roll call waits: how many ranks arrived, which are missing."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from lightning_mpi_env.rollcall.claims import format_ranks

PROGRESS_INTERVAL = 10.0
"""Seconds between two progress lines of rank 0, and before the first."""
SHOWN_RUNS = 8
"""The most runs of consecutive missing ranks a line names; the rest are counted (a line stays one line)."""


def progress_line(arrived: int, world_size: int, missing: Iterable[int], left: float, timeout: float) -> str:
    """The progress line: how many ranks arrived, the first :data:`SHOWN_RUNS` runs of those missing, time left."""
    return (
        f"lightning-mpi-env: roll call: {arrived} of {world_size} ranks arrived, still waiting for "
        f"{format_ranks(missing, runs=SHOWN_RUNS)} ({max(0.0, left):.0f} s left of the {timeout:g} s rendezvous "
        "timeout)"
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ArrivalProgress:
    """Says, every ``interval`` seconds from its creation (the roll call's start), which ranks it still waits for."""

    def __init__(
        self,
        world_size: int,
        timeout: float,
        *,
        interval: float = PROGRESS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], object] = _stderr,
    ) -> None:
        self.world_size, self.timeout, self.interval = world_size, timeout, interval
        self._clock, self._say = clock, say
        start = clock()
        self._deadline, self._next = start + timeout, start + interval

    def poll(self, arrived: Callable[[], set[int]]) -> None:
        """Print the line when it is due, with the ranks ``arrived()`` reads."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        present = arrived()
        missing = set(range(self.world_size)) - present
        if missing:
            self._say(progress_line(len(present), self.world_size, missing, self._deadline - now, self.timeout))
