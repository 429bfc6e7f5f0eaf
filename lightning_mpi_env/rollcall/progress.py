"""Rank 0's progress lines while the roll call waits: how many ranks arrived, which are missing, how long is left.

A roll call that waits for ranks still starting (or never started) would otherwise say nothing until its timeout.
Every :data:`PROGRESS_INTERVAL` seconds of the wait, rank 0 prints one line on stderr (:func:`progress_line`),
never one per rank. Nothing is printed when every rank arrives within the first interval, and nothing is written to
the store.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.rollcall.verdicts import format_ranks

PROGRESS_INTERVAL = 10.0
"""Seconds between two progress lines of rank 0, and before the first."""
SHOWN_RUNS = 8
"""The most runs of consecutive missing ranks a line names; the rest are counted (a line stays one line)."""


def some_ranks(ranks: Iterable[int], runs: int = SHOWN_RUNS) -> str:
    """Like :func:`~lightning_mpi_env.rollcall.verdicts.format_ranks`, naming the first ``runs`` runs only.

    >>> some_ranks([3, 4, 5, 9])
    'ranks 3-5, 9'
    >>> some_ranks(range(0, 20, 2), runs=3)
    'ranks 0, 2, 4 and 7 more'
    """
    ordered = sorted(set(ranks))
    shown: list[int] = []
    count = 0
    for rank in ordered:
        if not shown or rank != shown[-1] + 1:
            count += 1
            if count > runs:
                break
        shown.append(rank)
    left = len(ordered) - len(shown)
    return format_ranks(shown) + (f" and {left} more" if left else "")


def progress_line(arrived: int, world_size: int, missing: Iterable[int], left: float, timeout: float) -> str:
    """The progress line.

    >>> print(progress_line(2, 4, [2, 3], 110.2, 120).removeprefix("lightning-mpi-env: roll call: "))
    2 of 4 ranks arrived, still waiting for ranks 2-3 (110 s left of the 120 s rendezvous timeout)
    """
    return (
        f"lightning-mpi-env: roll call: {arrived} of {world_size} ranks arrived, still waiting for "
        f"{some_ranks(missing)} ({max(0.0, left):.0f} s left of the {timeout:g} s rendezvous timeout)"
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ArrivalProgress:
    """Says, every ``interval`` seconds from its creation, which ranks the roll call still waits for.

    Args:
        world_size: The job's number of ranks.
        timeout: The roll call's timeout, which started when this object was created.
        interval: Seconds between two lines, and before the first.
        clock: Monotonic seconds (injected by the tests).
        say: Prints one line (stderr).
    """

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
        """Print the line when it is due, with the ranks ``arrived()`` reads from the store; else do nothing.

        A malformed arrived-ranks list prints nothing: the verdict on missing ranks names its key at the timeout.
        """
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        try:
            present = arrived()
        except RendezvousError:
            return
        missing = set(range(self.world_size)) - present
        if missing:
            self._say(progress_line(len(present), self.world_size, missing, self._deadline - now, self.timeout))


__all__ = ["PROGRESS_INTERVAL", "SHOWN_RUNS", "ArrivalProgress", "progress_line", "some_ranks"]
