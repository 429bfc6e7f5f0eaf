"""One step at which every rank stops, agreed through the store, with no collective.

A signal may reach only some ranks (``scancel --signal`` reaches a job step's ranks only; ``kill`` one process), yet
every rank must stop at the same step: to checkpoint and requeue on the scheduler's warning signal, or to end on
``SIGTERM``. Each purpose is a :class:`StopKind` with keys of its own. A collective would cost every step a round
trip; instead the watchdog thread agrees at its own interval, and the training loop only reads two local variables
per step:

1. A rank whose handler noted the signal writes ``<key>requested`` (its thread, at its next interval).
2. Every rank's thread that sees it first sets :attr:`StopAgreement.seen`, then posts the step this rank will
   certainly reach: the last step its loop finished, plus one; under a ``prompt`` kind, the last step itself where
   the loop already waits at its end, or between that step and the next (its handler waits there: ``sigterm.py``).
   A thread whose loop is between two steps with the signal in hand (its handler is on the way) holds its post until
   the loop waits, for at most :data:`HOLD` seconds, then posts that step all the same: posting the next step would
   send every rank to fetch a batch from data loader workers the signal ended. Between steps without it, it holds
   for :data:`GRACE` seconds first: a scheduler signals every rank, one node a moment after another. The store keeps
   the highest post (``compare_set``).
3. When the last rank has posted, the highest post is the step every rank stops at.

Why no rank has passed that step: the loop checks ``seen`` after each step, and the thread sets it *before* reading
the loop's step; so a loop that finished its step ``n`` either was seen at ``n - 1`` (post ``n``) or sees ``seen``
at ``n`` and waits there for the agreed step, which is at least its own post. A held post is made the same way,
only later; a loop between steps with the signal in hand runs its handler, and the stop, before any further step.
The posts come from the threads, not from the loops, so a rank waiting there holds another rank's loop only where
that rank's thread holds its post (at most :data:`HOLD`). The wait is bounded by the slowest thread's interval, plus
:data:`HOLD` where a thread holds its post.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RendezvousError, StallError
from lightning_mpi_env.rollcall.stall_verdict import say
from lightning_mpi_env.rollcall.store_values import read
from lightning_mpi_env.rollcall.store_values import step as parse_step

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

KEY = "lightning_mpi_env/stop/"
REQUESTED = KEY + "requested"
AT = KEY + "at"
POSTED = KEY + "posted"
KNOWN = KEY + "known"

HOLD = 15.0
"""Seconds a thread holds its post for its loop on the way to wait (a quarter of the least wait in ``due``, 60 s): a
main thread blocked in C code (a collective, a loader's 5 s poll) runs its handler late."""

GRACE = 5.0
"""Seconds of :data:`HOLD` a thread holds its post while its loop is between steps and the signal has not come to this
rank: the scheduler's signal to this rank's processes may come a moment after another rank's (its workers' ends take
a busy node a while), and a signal to one rank alone costs the others no more than this."""


@dataclass(frozen=True)
class StopKind:
    """What the ranks stop for: the store keys under ``key``, and the words of the error when they cannot agree."""

    key: str
    signal: str
    """The signal, as the error names it."""
    action: str
    """What the ranks were to do at the step, as the error names it."""
    missed: str
    """What did not happen for want of an agreement (the hint's last words), or ``""``."""
    prompt: bool = False
    """Whether a rank that got the signal itself waits for the agreement at its next step instead of going on: where
    something else would stop that rank alone at its next steps (Lightning's Trainer does on ``SIGTERM``), or a fast
    loop could end before its thread's next interval."""


REQUEUE_STOP = StopKind(KEY, "the requeue signal", "checkpoint", " The checkpoint was not taken.")
SIGTERM_STOP = StopKind("lightning_mpi_env/sigterm/", "SIGTERM", "stop", "", prompt=True)


class AgreementState(enum.Enum):
    """Where this rank is in the agreement."""

    IDLE = "no signal seen"
    POSTED = "posted this rank's step, waiting for the others"
    KNOWN = "the step to stop at is known"


class StopAgreement:
    """This rank's part in agreeing on a step to stop at; ``signalled()`` is asked by the thread, never the handler."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        signalled: Callable[[], bool],
        kind: StopKind = REQUEUE_STOP,
        coming: Callable[[], bool] | None = None,
        between: Callable[[], bool] | None = None,
    ) -> None:
        self.rank, self.world_size, self.kind = rank, world_size, kind
        self._coming = coming  # a prompt kind's: whether the loop is on its way to wait in due() (the thread asks)
        self._between = between  # a prompt kind's: whether the loop is between two steps (the thread asks)
        self._held_since: float | None = None
        self._requested, self._at, self._posted, self._known_key = (
            kind.key + name for name in ("requested", "at", "posted", "known")
        )
        self._signalled = signalled
        self._announced = False
        self._seen = threading.Event()
        self._known = threading.Event()
        self._finished = 0  # the last step the loop finished; written by the loop, read by the thread
        self._waiting = False  # whether the loop waits in due() at the end of step _finished (set after it)
        self.state = AgreementState.IDLE
        self.stop_at: int | None = None
        self.failure: RendezvousError | None = None
        """A malformed value read from the store, once one was: the loop raises it instead of waiting."""

    def due(self, finished: int, wait: float) -> bool:
        """Whether to stop now; the loop calls it after each step with the steps finished (the same on every rank).

        Once a signal was seen, it waits up to ``wait`` seconds for every rank's post; under a ``prompt`` kind, so
        does a rank whose own signal its thread has not announced yet (its thread does within an interval).

        Raises:
            StallError: Not every rank posted within ``wait`` seconds (a rank froze, or its thread ended).
            RendezvousError: The store held a malformed step (the key named).
        """
        self._finished = finished
        if not self._seen.is_set() and not (self.kind.prompt and self._signalled()):
            return False
        self._waiting = True
        try:
            known = self._known.wait(wait)
        finally:
            self._waiting = False
        if not known:
            raise StallError(
                f"The ranks did not agree on a step to {self.kind.action} at within {wait:g} s of {self.kind.signal}: "
                "some rank's watchdog thread did not answer in the store.",
                f"Look for a rank that froze, or whose host lost the network.{self.kind.missed}",
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
            store.set(self._requested, str(self.rank))
            added = 1
        if self.state is AgreementState.IDLE and (added or events) and store.check([self._requested]):
            self._seen.set()  # first: the loop checks it after reading ... see the module docstring
            # A loop waiting at the end of its step can stop right there (under a prompt kind: a SIGTERM that
            # reached the data loader workers too leaves no batch to fetch); else the next step's end.
            post = self._post()
            if post is None:
                return added
            self._raise_to(post, store, self._at)
            if store.add(self._posted, 1) >= self.world_size:
                store.set(self._known_key, "1")
            self.state = AgreementState.POSTED
        if self.state is AgreementState.POSTED and store.check([self._known_key]):
            self.stop_at = read(self._at, store.get(self._at), parse_step)
            self.state = AgreementState.KNOWN
            self._known.set()
        return added

    def _post(self) -> int | None:
        """The step this thread posts now, or ``None`` while it holds its post (for :data:`HOLD` seconds at most).

        It holds while its loop is on its way to wait; or, for :data:`GRACE` seconds, between steps where the signal
        may still come to this rank. A loop still on its way after :data:`HOLD` is held in C code with the signal in
        hand (a collective between two steps, as Lightning's own broadcast before each batch): its handler runs the
        stop as soon as it gets back, before any further step, so it stops at the step it finished, as the others do.
        The next step would send every rank to fetch a batch from workers the signal ended.
        """
        if self.kind.prompt and self._waiting:  # the loop waits at the end of its step
            return self._finished
        if self._coming is None or not self.kind.prompt:
            return self._finished + 1
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        held = now - self._held_since
        coming = self._coming()
        if held < HOLD and (coming or (held < GRACE and self._between is not None and self._between())):
            return None
        if not coming:
            return self._finished + 1
        say(
            f"lightning-mpi-env: SIGTERM: rank {self.rank}'s loop did not come to stop within {HOLD:g} s (its main "
            f"thread is held elsewhere, as in a collective): every rank stops after step {self._finished}, this one as "
            "soon as its main thread is back"
        )
        return self._finished

    @staticmethod
    def _raise_to(step: int, store: Store, key: str = AT) -> None:
        """Make the step stored under ``key`` at least ``step`` (``compare_set`` only writes over the value shown)."""
        shown = ""
        while True:
            stored = store.compare_set(key, shown, str(step))
            if read(key, stored, parse_step) >= step:
                return
            shown = stored.decode("ascii")
