"""The stall watchdog: a rank that stops making progress after ``init_process_group`` is named while the job runs.

Once the roll call has met, every rank runs a daemon thread that, every :func:`interval_for` seconds, writes one
:class:`Report` to the roll call's store (the store ``init_process_group`` shares, over the roll call's own client:
no new port or connection): how far this rank got (a count of progress marks, with the step and phase for the
message), a heartbeat, and where its main thread is (``file:line in function``, read with ``sys._current_frames()``
to *report* it). Rank 0's thread reads every report and applies :func:`find_stall`; a verdict goes under one key,
announced by the store's event count, which every rank's thread reads. Each rank that sees it prints one line and
ends its process with exit status 1, so the launcher ends the job: the main thread is blocked in a collective, which
no exception can interrupt.

The same thread carries the requeue's :class:`~lightning_mpi_env.rollcall.agreement.StopAgreement` (also with the
stall timeout off), so a job that can requeue costs its training loop no collective per step.

**The rule.** A stall is *no progress anywhere for the timeout while ranks are not level*: some rank got further
(it waits in the next collective) and the ranks behind it have not moved. Work that is slow for everyone (a long
validation, a checkpoint written by rank 0 while the others wait in a barrier) leaves every rank level, so it is
never a stall. A rank behind whose heartbeat also stopped is *frozen* (``SIGSTOP``, a node swapping); else it is
*alive*, and its main thread's place is shown.

**Store traffic.** Per interval: one ``set`` and one ``add`` (the event count) per rank, and rank 0 reads every
report once (``multi_get``): linear in the world size, with an interval that widens with it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import FrameType
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.core.report import render
from lightning_mpi_env.core.settings import DEFAULT_STALL_TIMEOUT, VARIABLE
from lightning_mpi_env.rollcall.deadline import Deadline, Unanswered
from lightning_mpi_env.rollcall.verdicts import format_ranks

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

    from lightning_mpi_env.rollcall.agreement import StopAgreement
    from lightning_mpi_env.rollcall.store import RendezvousResult

KEY = "lightning_mpi_env/watchdog/"
"""Prefix of the watchdog's keys in the store."""
VERDICT = KEY + "verdict"
EVENTS = KEY + "events"
"""A count every rank's thread reads once per interval (``add(EVENTS, 0)``): zero until a verdict or a stop
request is written, so a healthy job reads nothing else."""

PHASES = ("between steps", "in its training step", "in backward", "past backward")
"""Where in a step a rank is, by its last mark: after a step (loading the next batch), after the step started,
before backward, after backward."""

READ_CHUNK = 4096
"""Reports read by one ``multi_get``: bounds one request's size at tens of thousands of ranks."""


def interval_for(timeout: float, world_size: int) -> float:
    """Seconds between reports: a quarter of the timeout, at least 0.5 s, and 1 s more per 1,000 ranks.

    >>> interval_for(20, 4), interval_for(300, 16384), interval_for(1, 2)
    (1.0, 16.384, 0.5)
    """
    return max(0.5, min(timeout / 4, max(1.0, world_size / 1000)))


@dataclass(frozen=True)
class Report:
    """What one rank says about itself each interval."""

    rank: int
    host: str
    progress: int
    """Progress marks made so far; ranks running the same program make the same marks."""
    step: int
    """The training step (for the message)."""
    phase: int
    """Index in :data:`PHASES` of the last mark (for the message)."""
    beat: int
    """Increases every interval while this rank's watchdog thread runs."""
    where: str
    """``file:line in function`` of the main thread, as its own watchdog thread saw it."""

    def to_json(self) -> str:
        """The report as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: bytes | str) -> Report:
        """A stored report."""
        return cls(**json.loads(text))


@dataclass
class Seen:
    """What rank 0 remembers of one rank: its last report, and since when its progress and heartbeat stood still."""

    report: Report
    progress_since: float
    beat_since: float


def observe(seen: dict[int, Seen], reports: Sequence[Report], now: float) -> None:
    """Take the latest reports into ``seen``."""
    for report in reports:
        before = seen.get(report.rank)
        if before is None:
            seen[report.rank] = Seen(report, now, now)
            continue
        progress_since = now if report.progress != before.report.progress else before.progress_since
        beat_since = now if report.beat != before.report.beat else before.beat_since
        seen[report.rank] = Seen(report, progress_since, beat_since)


def find_stall(
    seen: Mapping[int, Seen], now: float, timeout: float, frozen_after: float, world_size: int, started: float = 0.0
) -> StallError | None:
    """The stall in ``seen`` (see the module docstring), as the error every rank shows; ``None`` when there is none.

    A rank that never reported (it froze, or its main thread held it, before its watchdog's first report) counts as
    behind, from ``started``, when rank 0 began watching.

    >>> r = lambda rank, progress: Report(rank, "n", progress, progress // 4, progress % 4, 1, "t.py:1 in f")
    >>> level = {0: Seen(r(0, 9), 0.0, 0.0), 1: Seen(r(1, 9), 0.0, 0.0)}
    >>> find_stall(level, now=100.0, timeout=20, frozen_after=3, world_size=2) is None  # slow for everyone
    True
    >>> behind = {0: Seen(r(0, 9), 0.0, 99.0), 1: Seen(r(1, 8), 0.0, 99.0)}
    >>> print(find_stall(behind, now=100.0, timeout=20, frozen_after=3, world_size=2).problem[:46])
    Rank 1 stalled: no rank made progress for 20 s
    """
    if not seen:
        return None
    top = max(entry.report.progress for entry in seen.values())
    silent = [rank for rank in range(world_size) if rank not in seen]
    behind = sorted([rank for rank, entry in seen.items() if entry.report.progress < top] + silent)
    last_progress = max([started] + [entry.progress_since for entry in seen.values()])
    if not behind or now - last_progress < timeout:
        return None
    waiting = sorted(rank for rank, entry in seen.items() if entry.report.progress == top)
    lines = []
    for rank in behind:
        entry = seen.get(rank)
        if entry is None:
            lines.append(f"rank {rank} never reported (frozen, or stuck before its watchdog started)")
            continue
        report, quiet = entry.report, now - entry.beat_since
        state = (
            f"frozen (its watchdog silent for {quiet:.0f} s)"
            if quiet >= frozen_after
            else f"alive, main thread at {report.where}"
        )
        lines.append(f"rank {rank} on {report.host} at step {report.step} ({PHASES[report.phase]}), {state}")
    wait = "waits" if len(waiting) == 1 else "wait"
    return StallError(
        f"{format_ranks(behind).capitalize()} stalled: no rank made progress for {timeout:g} s while "
        f"{format_ranks(waiting)} {wait} for {'it' if len(behind) == 1 else 'them'}. " + "; ".join(lines) + ".",
        f"Look at the stalled rank's host: a data loader or file system that blocks, a deadlock in the training "
        f"step, or a frozen node. {VARIABLE['stall_timeout']}={timeout:g} sets the timeout (0 turns the watchdog "
        "off); a step that takes longer on some ranks than others needs a larger one.",
        variable=VARIABLE["stall_timeout"],
        value=f"{timeout:g}",
    )


_NOT_THE_PLACE = ("<", os.path.dirname(os.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
"""Frames that never say where a rank is stuck: the import system, the standard library, this package."""


def main_thread_place() -> str:
    """``file:line in function`` of the main thread's innermost frame outside the standard library and torch."""
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
    innermost = frame
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_NOT_THE_PLACE) and f"{os.sep}torch{os.sep}" not in filename:
            break
        frame = frame.f_back
    chosen = frame or innermost
    if chosen is None:
        return "unknown"
    return f"{chosen.f_code.co_filename}:{chosen.f_lineno} in {chosen.f_code.co_name}"


class Watchdog:
    """This rank's watchdog thread. Start it with :meth:`start`; mark progress with :meth:`mark`.

    Args:
        connect: Opens this thread's own client of the roll call's store (a new connection, not a new port).
        rank: This process's global rank.
        world_size: Number of ranks.
        host: This process's host name, for the message.
        timeout: Seconds without progress anywhere, ranks not level, before the job is stopped; ``0``: no stall
            watch (the thread then only carries ``agreement``).
        agreement: The requeue's stop agreement, when the job can requeue.
        exit: Ends the process after the line is printed (``os._exit``; injected by the tests).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        connect: Callable[[float], TCPStore],
        *,
        rank: int,
        world_size: int,
        host: str,
        timeout: float,
        agreement: StopAgreement | None = None,
        exit: Callable[[int], object] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank, self.world_size, self.host, self.timeout = rank, world_size, host, timeout
        self.agreement = agreement
        self.interval = interval_for(timeout or DEFAULT_STALL_TIMEOUT, world_size)
        self._connect, self._exit, self._clock = connect, exit, clock
        self._request_timeout = max(5.0, 2 * self.interval)
        self._progress, self._step, self._phase, self._beat = 0, 0, 0, 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning-mpi-env-watchdog", daemon=True)
        self._requests = Deadline()
        self.verdict: str | None = None
        """The line this rank showed, once a stall was found (for the tests)."""

    def start(self) -> Watchdog:
        """Start the thread, and stop it at interpreter exit if nothing stopped it before; returns ``self``.

        At exit, Python ends a daemon thread that is inside a store request when the request returns, by unwinding
        its C++ frames, which aborts the process ("terminate called without an active exception", status 134): a
        rank that finished its work would look crashed. So :meth:`stop` runs from :mod:`atexit` too (a Fabric
        program ends without a teardown that would stop it), before Python ends the daemon threads.
        """
        self._thread.start()
        atexit.register(self.stop)
        return self

    def mark(self, step: int, phase: int) -> None:
        """One more progress mark: ``step`` reached ``PHASES[phase]``. Cheap: no I/O, read by the thread later."""
        self._step, self._phase = step, phase
        self._progress += 1

    def stop(self) -> None:
        """Stop the thread (at teardown, or at exit), and wait for its store request in flight to return.

        A finished rank is not a stalled one. The wait is bounded by one request's timeout; a thread that is
        showing a verdict is waited for until it ends the process, with the status that says why.
        """
        self._stopped.set()
        atexit.unregister(self.stop)
        if not self._thread.is_alive() or self._thread is threading.current_thread():
            return
        self._thread.join(self._request_timeout + 1.0)
        if self.verdict is not None:
            self._thread.join(35.0)  # _conclude ends the process within 30 s

    def _report(self) -> Report:
        self._beat += 1
        where = main_thread_place()
        return Report(self.rank, self.host, self._progress, self._step, self._phase, self._beat, where)

    def _run(self) -> None:
        from torch.distributed import DistError

        try:
            store = self._connect(self._request_timeout)
        except DistError:
            return  # the job is ending already
        seen: dict[int, Seen] = {}
        started = self._clock()
        silent_since: float | None = None
        while not self._stopped.is_set():  # the first report at once: a rank may freeze within its first interval
            try:
                verdict = self._requests.run(lambda: self._exchange(store, seen, started), self._request_timeout)
                if verdict is not None:
                    self._conclude(*verdict)
                    return
                silent_since = None
            except (DistError, Unanswered) as error:
                timed_out = (
                    isinstance(error, Unanswered)
                    or "timeout" in str(error).lower()
                    or ("timed out" in str(error).lower())
                )
                if not timed_out or not self.timeout:
                    return  # rank 0 ended and its store with it: the launcher ends the job, not us
                silent_since = silent_since if silent_since is not None else self._clock()
                if self._clock() - silent_since >= self.timeout:
                    self._conclude(self._store_silent(silent_since), time.time())
                    return
            self._stopped.wait(self.interval)

    def _exchange(self, store: TCPStore, seen: dict[int, Seen], started: float) -> tuple[StallError, float] | None:
        """One interval's requests: report, read the event count, answer the agreement, judge (rank 0)."""
        if self.timeout:
            store.set(KEY + str(self.rank), self._report().to_json())
        events = store.add(EVENTS, 0)
        if events and store.check([VERDICT]):
            return _verdict_from(store.get(VERDICT))
        if self.agreement is not None and self.agreement.poll(store, events):
            store.add(EVENTS, 1)
        if self.rank == 0 and self.timeout:
            self._judge(store, seen, started)
        return None

    def _judge(self, store: TCPStore, seen: dict[int, Seen], started: float) -> None:
        keys = [KEY + str(rank) for rank in range(self.world_size)]
        present = [key for key in keys if key.rsplit("/", 1)[1] in _known(seen) or store.check([key])]
        reports = []
        for start in range(0, len(present), READ_CHUNK):
            reports += [Report.from_json(value) for value in store.multi_get(present[start : start + READ_CHUNK])]
        observe(seen, reports, self._clock())
        stall = find_stall(seen, self._clock(), self.timeout, 3 * self.interval, self.world_size, started)
        if stall is not None:
            # Every rank checks once per interval: all have seen it, and stop together, two intervals from now.
            exit_at = time.time() + 2 * self.interval
            fields = {"problem": stall.problem, "hint": stall.hint, "value": stall.value, "exit_at": exit_at}
            store.set(VERDICT, json.dumps(fields))
            store.add(EVENTS, 1)

    def _store_silent(self, since: float) -> StallError:
        return StallError(
            f"Rank 0's store (the main address) has not answered this rank's watchdog for "
            f"{self._clock() - since:.0f} s: rank 0 or its node froze or is overloaded.",
            "Look at rank 0's host.",
            variable=VARIABLE["stall_timeout"],
            value=f"{self.timeout:g}",
        )

    def _conclude(self, error: StallError, exit_at: float) -> None:
        """Say why, then end this process at ``exit_at`` (wall clock), when every rank ends too.

        Ranks that ended at different moments would wake the others' collectives with "connection closed by peer"
        tracebacks that bury the cause; so every rank waits for the common moment, and what its blocked main thread
        might still print before then goes nowhere: the process is being ended for the reason just printed.
        """
        self.verdict = error.one_line()
        sys.stderr.write(render(error) or f"StallError: {self.verdict}\n")
        sys.stderr.flush()
        if self._exit is os._exit:
            silence = os.open(os.devnull, os.O_WRONLY)
            os.dup2(silence, 1)
            os.dup2(silence, 2)
        time.sleep(max(0.0, min(exit_at - time.time(), 30.0)))
        self._exit(1)


def watch(result: RendezvousResult, timeout: float, signalled: Callable[[], bool] | None) -> Watchdog:
    """This rank's watchdog thread, on the roll call's own client of its store, which the roll call is done with.

    No new connection: rank 0's store then holds two per rank (this one, and ``init_process_group``'s), as without
    the watchdog, which matters at tens of thousands of ranks. It watches for stalls when ``timeout`` is not 0, and
    carries the requeue's stop agreement when ``signalled`` is given (the job can requeue; it says whether this
    rank's requeue signal came).
    """
    from datetime import timedelta

    from lightning_mpi_env.rollcall.agreement import StopAgreement

    claim = result.claim

    def connect(seconds: float) -> TCPStore:
        result.store.set_timeout(timedelta(seconds=seconds))  # each request's; the roll call waited longer
        return result.store

    agreement = None
    if signalled is not None:
        agreement = StopAgreement(rank=claim.rank, world_size=claim.world_size, signalled=signalled)
    return Watchdog(
        connect, rank=claim.rank, world_size=claim.world_size, host=claim.host, timeout=timeout, agreement=agreement
    ).start()


def _verdict_from(stored: bytes) -> tuple[StallError, float]:
    fields = json.loads(stored)
    error = StallError(fields["problem"], fields["hint"], variable=VARIABLE["stall_timeout"], value=fields["value"])
    return error, float(fields["exit_at"])


def _known(seen: Mapping[int, Seen]) -> set[str]:
    return {str(rank) for rank in seen}


__all__ = [
    "EVENTS",
    "KEY",
    "PHASES",
    "Report",
    "Seen",
    "Watchdog",
    "find_stall",
    "interval_for",
    "main_thread_place",
    "observe",
    "watch",
]
