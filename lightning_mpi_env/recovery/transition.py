"""Rank 0's store, watched while a survivor goes on from the agreement to the next generation's group.

Between the list of the lost and the next group, a survivor waits on rank 0: for its choice of spare nodes, for the
replacements it starts, for the group it opens. A request to a frozen rank 0's store never returns (the client's
timeout does not cover a server that accepted the connection and stopped answering), and rank 0 may take long there
while alive (a replacement's start). So a thread asks the store on a client of its own, several times within the
process group's timeout (each :data:`GRACE` seconds at most). Where no request was answered for that timeout, it
calls ``store_lost`` (which ends rank 0 and shuts this process's connections to the store, so that the waiting
request fails), and the survivor raises the :class:`RecoveryError` it made instead of that request's error.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.agreement import GRACE
from lightning_mpi_env.recovery.worlds import World
from lightning_mpi_env.rollcall.deadline import Deadline, Unanswered
from lightning_mpi_env.rollcall.store import client_of

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed's

PROBE_KEY = "lightning_mpi_env/recovery/probe"
"""A key no one writes: the watch asks whether it exists, the cheapest request the store answers."""


class Transition:
    """A survivor's watch on rank 0's store from the agreement on ``world``'s lost ranks to the next group."""

    def __init__(
        self,
        store: TCPStore,
        world: World,
        rank: int,
        *,
        timeout: float,
        store_lost: Callable[[RecoveryError], object],
    ) -> None:
        """Watch ``store`` for the survivor ``rank`` of ``world``, once :meth:`start` is called.

        ``timeout``: how long the store may answer nothing (the process group's timeout). ``store_lost``: what ends
        rank 0, called once with the error, from the watch's thread.
        """
        self._store, self._world, self._rank = store, world, rank
        self._timeout, self._store_lost = timeout, store_lost
        self._period = min(GRACE, timeout / 4)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning-mpi-env-transition", daemon=True)
        self.failure: RecoveryError | None = None
        """The error the survivor raises, once rank 0's store answered nothing for ``timeout`` seconds."""

    def start(self) -> Transition:
        """Start the watch's thread; this watch."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch (the next group is open, or the survivor leaves); a request under way is left to its end."""
        self._stopped.set()
        self._thread.join(GRACE)

    def _run(self) -> None:
        requests = Deadline("lightning-mpi-env-transition-request")
        client: TCPStore | None = None
        answered = time.monotonic()
        while not self._stopped.wait(self._period):
            try:
                if client is None:
                    client = requests.run(functools.partial(client_of, self._store, GRACE), self._period + GRACE)
                requests.run(functools.partial(client.check, [PROBE_KEY]), self._period + GRACE)
                answered = time.monotonic()
            except (RuntimeError, OSError, Unanswered):  # torch's errors (DistError among them), or no answer
                pass
            silent = time.monotonic() - answered
            if silent >= self._timeout and not self._stopped.is_set():
                self.failure = RecoveryError(
                    f"rank {self._rank} of generation {self._world.number} lost rank 0's store on the way to"
                    f" generation {self._world.number + 1}: it answered no request for {silent:.0f} s",
                    "rank 0 serves the job's store and starts the next generation; it froze or its node hung,"
                    " so the job is started again (`lightning-mpi-env run` does that)",
                )
                self._store_lost(self.failure)
                return


@contextlib.contextmanager
def watched(watch: Transition | None) -> Iterator[None]:
    """Run the block; where ``watch`` gave up on rank 0's store, raise its error (from the block's, if one came)."""
    try:
        yield
    except Exception as error:
        if watch is not None and watch.failure is not None:
            raise watch.failure from error
        raise
    if watch is not None and watch.failure is not None:
        raise watch.failure
