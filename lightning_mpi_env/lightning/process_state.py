"""What an ``MPIClusterEnvironment`` changes process-wide for one run, and how each change goes back.

Each :class:`Change` goes back at ``teardown()``, which a Trainer calls after every run, also a failed one; a Fabric
program calls it itself, else it runs at interpreter exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from enum import Enum


class Change(Enum):
    """A process-wide change the environment can make, undone at the end of the run."""

    SRUN_FILTER = "filter for Lightning's srun advice"
    ENTRY_POINT_LINE = "filter for Lightning's line about this package's entry point, on ranks other than 0"
    FABRIC_EXPORTS = "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME"
    WATCHDOG = "the stall watchdog's thread"
    SETTLE_AT_EXIT = "the exit hook that settles collectives"
    REQUEUE_HANDLER = "the requeue signal handler"
    SIGTERM_HANDLER = "the SIGTERM handler of a Fabric loop that stops every rank at one step"
    WORKER_SIGTERM = "the SIGCHLD handler before torch's that takes a loader worker's end by SIGTERM as the rank's"


class ProcessChanges:
    """The changes one environment made for its run, each with its undo; the first registers :meth:`undo` at exit."""

    def __init__(self) -> None:
        self._undo: dict[Change, Callable[[], object]] = {}

    @property
    def made(self) -> list[Change]:
        """The changes in place now, oldest first."""
        return list(self._undo)

    def __contains__(self, change: Change) -> bool:
        return change in self._undo

    def add(self, change: Change, undo: Callable[[], object]) -> None:
        """Record ``change`` (made just now) and how to undo it; a change already recorded keeps its first undo."""
        if not self._undo:
            atexit.register(self.undo)
        self._undo.setdefault(change, undo)

    def undo(self) -> None:
        """Undo every change, newest first (the end of the run)."""
        while self._undo:
            change = next(reversed(self._undo))
            self._undo.pop(change)()
        atexit.unregister(self.undo)

    def __reduce__(self) -> tuple[type[ProcessChanges], tuple[()]]:
        # The changes are this process's: a copy Lightning pickles into a worker (ddp_spawn) starts with none.
        return ProcessChanges, ()

    def __repr__(self) -> str:
        return f"ProcessChanges({', '.join(change.name for change in self._undo) or 'none'})"
