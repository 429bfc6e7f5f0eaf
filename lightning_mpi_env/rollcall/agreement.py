"""One step at which every rank stops for checkpoint-and-requeue, agreed through the store, with no collective.

The scheduler's warning signal may reach only some ranks (``scancel --signal`` reaches a job step's ranks only), yet
every rank must checkpoint at the same step. A collective would cost every step a round trip; instead the watchdog
thread agrees at its own interval, and the training loop only reads two local variables per step:

1. A rank whose handler noted the signal writes ``stop/requested`` (its thread, at its next interval).
2. Every rank's thread that sees it first sets :attr:`StopAgreement.seen`, then posts the step this rank will
   certainly reach: the last step its loop finished, plus one. The store keeps the highest post (``compare_set``).
3. When the last rank has posted, the highest post is the step every rank stops at.

Why no rank has passed that step: the loop checks ``seen`` after each step, and the thread sets it *before* reading
the loop's step; so a loop that finished its step ``n`` either was seen at ``n - 1`` (post ``n``) or sees ``seen``
at ``n`` and waits there for the agreed step, which is at least its own post. A rank waiting there holds no other
rank: the posts come from the threads, not from the loops. The wait is bounded by the slowest thread's interval.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RendezvousError, StallError
from lightning_mpi_env.rollcall.store_values import read
from lightning_mpi_env.rollcall.store_values import step as parse_step

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

KEY = "lightning_mpi_env/stop/"
REQUESTED = KEY + "requested"
AT = KEY + "at"
POSTED = KEY + "posted"
KNOWN = KEY + "known"


class AgreementState(enum.Enum):
    """Where this rank is in the agreement."""

    IDLE = "no signal seen"
    POSTED = "posted this rank's step, waiting for the others"
    KNOWN = "the step to stop at is known"


class StopAgreement:
    """This rank's part in agreeing on a step to stop at; ``signalled()`` is asked by the thread, never the handler."""

    def __init__(self, *, rank: int, world_size: int, signalled: Callable[[], bool]) -> None:
        self.rank, self.world_size = rank, world_size
        self._signalled = signalled
        self._announced = False
        self._seen = threading.Event()
        self._known = threading.Event()
        self._finished = 0  # the last step the loop finished; written by the loop, read by the thread
        self.state = AgreementState.IDLE
        self.stop_at: int | None = None
        self.failure: RendezvousError | None = None
        """A malformed value read from the store, once one was: the loop raises it instead of waiting."""

    def due(self, finished: int, wait: float) -> bool:
        """Whether to stop now; the loop calls it after each step with the steps finished (the same on every rank).

        Once a signal was seen, it waits up to ``wait`` seconds for every rank's post.

        Raises:
            StallError: Not every rank posted within ``wait`` seconds (a rank froze, or its thread ended).
            RendezvousError: The store held a malformed step (the key named).
        """
        self._finished = finished
        if not self._seen.is_set():
            return False
        if not self._known.wait(wait):
            raise StallError(
                f"The ranks did not agree on a step to checkpoint at within {wait:g} s of the requeue signal: some "
                "rank's watchdog thread did not answer in the store.",
                "Look for a rank that froze, or whose host lost the network; the checkpoint was not taken.",
            )
        if self.failure is not None:
            raise self.failure
        assert self.stop_at is not None  # set before _known
        return finished >= self.stop_at

    def poll(self, store: Store, events: int) -> int:
        """Advance the agreement (the thread, once per interval); returns how many events it added to the store.

        ``events`` is the store's event count as just read: ``0`` means no rank asked for a stop yet, so nothing more
        is read. A malformed stored step ends the agreement: :meth:`due` raises it instead of waiting.
        """
        if self.failure is not None:
            return 0
        try:
            return self._advance(store, events)
        except RendezvousError as error:
            self.failure = error
            self._seen.set()
            self._known.set()
            return 0

    def _advance(self, store: Store, events: int) -> int:
        added = 0
        if not self._announced and self._signalled():
            self._announced = True
            store.set(REQUESTED, str(self.rank))
            added = 1
        if self.state is AgreementState.IDLE and (added or events) and store.check([REQUESTED]):
            self._seen.set()  # first: the loop checks it after reading ... see the module docstring
            self._raise_to(self._finished + 1, store)
            if store.add(POSTED, 1) >= self.world_size:
                store.set(KNOWN, "1")
            self.state = AgreementState.POSTED
        if self.state is AgreementState.POSTED and store.check([KNOWN]):
            self.stop_at = read(AT, store.get(AT), parse_step)
            self.state = AgreementState.KNOWN
            self._known.set()
        return added

    @staticmethod
    def _raise_to(step: int, store: Store) -> None:
        """Make the stored ``AT`` at least ``step`` (``compare_set`` only writes over the value it was shown)."""
        shown = ""
        while True:
            stored = store.compare_set(AT, shown, str(step))
            if read(AT, stored, parse_step) >= step:
                return
            shown = stored.decode("ascii")
