"""The stall watchdog's thread: a rank that stops making progress after ``init_process_group`` is named.

Per interval each rank writes one :class:`Report` (a ``set``) and reads the event count (an ``add``); rank 0 reads
every report, in batches (:mod:`~lightning_mpi_env.rollcall.batches`), and applies the rule of
:mod:`~lightning_mpi_env.rollcall.stall`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from lightning_mpi_env.core.errors import RendezvousError, StallError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.core.settings import DEFAULT_STALL_TIMEOUT, VARIABLE
from lightning_mpi_env.rollcall.agreement import StopAgreement
from lightning_mpi_env.rollcall.batches import multi_get, present
from lightning_mpi_env.rollcall.deadline import Deadline, Unanswered
from lightning_mpi_env.rollcall.sigterm import SigtermStop
from lightning_mpi_env.rollcall.stall import PHASES, Seen, Stall, interval_for, judge, observe
from lightning_mpi_env.rollcall.stall_verdict import (
    ENDS_WITHIN,
    EVENTS,
    KEY,
    VERDICT,
    end_at,
    say,
    step_end,
    store_silent,
    stored_verdict,
    write_verdict,
)
from lightning_mpi_env.rollcall.store_values import Report, read, report_of
from lightning_mpi_env.rollcall.stragglers import StragglerWatch, WorkTimes
from lightning_mpi_env.rollcall.verdict import record

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

    from lightning_mpi_env.core.rank_layout import RankLayout
    from lightning_mpi_env.rollcall.store import RendezvousResult

IN_BACKWARD = PHASES.index("in backward")
WORK_STARTS = (PHASES.index("in its training step"), PHASES.index("past backward"))
"""The marks a rank's work a step starts at: the Trainer's step start; Fabric's end of the last ``backward``."""

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

    ``timeout``: seconds without progress anywhere, ranks not level, before the job is stopped (``0``: no stall watch;
    the thread then only carries the stop agreements: the requeue's ``agreement`` and the ``sigterm`` one).
    ``soft_timeout``, when below it: seconds before rank 0 reports such a stall on stderr, once per stall, and lets
    the job go on. ``end_step``: the scheduler's command that ends this launch where the launcher would wait for a
    frozen rank; rank 0 runs it after a stall verdict, the ``stand_in`` rank when rank 0's store fell silent;
    ``end_hint``: what ends a step the command did not end. Every rank alive after that moment asks again while it
    lives (:func:`~lightning_mpi_env.rollcall.stall_verdict.end_at`), pausing with ``sleep``.

    ``straggler_window`` steps (``0``: none) of this rank's own work go with each report; rank 0 names a rank whose
    work stays above ``straggler_factor`` times the median (:mod:`~lightning_mpi_env.rollcall.stragglers`).
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
        sigterm: SigtermStop | None = None,
        end_step: Sequence[str] = (),
        end_hint: str = "",
        stand_in: bool = False,
        recorder: FailureRecorder | None = None,
        main_host: str = "",
        soft_timeout: float = 0.0,
        straggler_factor: float = 0.0,
        straggler_window: int = 0,
        exit: Callable[[int], object] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.rank, self.world_size, self.host, self.timeout = rank, world_size, host, timeout
        self.agreement, self.sigterm = agreement, sigterm
        self.end_step, self.end_hint, self.stand_in = tuple(end_step), end_hint, stand_in
        self.recorder, self.main_host = recorder, main_host
        self.soft_timeout = soft_timeout if timeout and 0 < soft_timeout < timeout else 0.0
        self.interval = interval_for(self.soft_timeout or timeout or DEFAULT_STALL_TIMEOUT, world_size)
        self._reported_at: float | None = None  # when rank 0 reported the stall now going on (soft timeout)
        self._connect, self._exit, self._clock, self._sleep = connect, exit, clock, sleep
        self._request_timeout = max(5.0, 2 * self.interval)
        self._progress, self._step, self._phase, self._beat, self._busy = 0, 0, 0, 0, 0
        watched = bool(timeout and straggler_window and straggler_factor)
        self.work = WorkTimes(straggler_window) if watched else None
        """This rank's work a step (``None``: no straggler watch)."""
        self._marked_at, self._timer = 0.0, timer  # when the last mark came, while work is measured
        self.stragglers = StragglerWatch(straggler_factor, straggler_window) if watched and rank == 0 else None
        """Rank 0's straggler watch."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._guarded, name="lightning-mpi-env-watchdog", daemon=True)
        self._requests = Deadline()
        self.verdict: str | None = None
        """The line this rank showed, once a stall was found (for the tests)."""
        self.named: dict[str, str] = {}
        """Each malformed key this thread skipped, with the line that named it (once per key)."""
        self.ended_by: str | None = None
        """The exception that ended the thread, when one did (named on stderr)."""

    def start(self) -> Watchdog:
        """Start the thread, and stop it at interpreter exit if nothing stopped it before; returns ``self``.

        A Fabric program has no teardown, and a daemon thread ended at exit inside a store request aborts the process.
        """
        self._thread.start()
        atexit.register(self.stop)
        return self

    def mark(self, step: int, phase: int) -> None:
        """One more progress mark: ``step`` reached ``PHASES[phase]``. Cheap: no I/O, read by the thread later.

        With the straggler watch, a mark before backward that follows the step's start or the last backward's end
        adds the time since as this rank's work (:mod:`~lightning_mpi_env.rollcall.stragglers`).
        """
        if self.work is not None:
            now = self._timer()
            if phase == IN_BACKWARD and self._phase in WORK_STARTS:
                self.work.add(now - self._marked_at)
            self._marked_at = now
        self._step, self._phase = step, phase
        self._progress += 1

    def busy(self) -> None:
        """Work done that is no mark (a validation batch): progress for the stall rule, not a mark to be level on."""
        self._busy += 1

    def stop(self) -> None:
        """Stop the thread (at teardown, or at exit), and wait for its store requests in flight to return.

        The wait is bounded by two requests' timeout; a thread showing a verdict, until it ends the process (its
        requests to end the step included).
        """
        self._stopped.set()
        atexit.unregister(self.stop)
        if not self._thread.is_alive() or self._thread is threading.current_thread():
            return
        self._thread.join(2 * self._request_timeout + 1.0)
        if self.verdict is not None:
            self._thread.join(ENDS_WITHIN)
        summary = None if self.stragglers is None or self.verdict else self.stragglers.summary()
        if summary is not None:
            say(summary)

    def _report(self, left: bool = False) -> Report:
        self._beat += 1
        where = main_thread_place()
        work, worked = (0.0, 0) if self.work is None else (self.work.median(), self.work.count)
        marks = (self._progress, self._step, self._phase, self._beat)
        return Report(self.rank, self.host, *marks, where, left, work, worked, self._busy)

    def _guarded(self) -> None:
        """The thread: :meth:`_run`, and any exception that would end it silently, named on stderr."""
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001  (a thread's exception is otherwise lost, or a bare traceback)
            self.ended_by = f"{type(error).__name__}: {error}"
            say(
                f"lightning-mpi-env: the stall watchdog of rank {self.rank} on {self.host} stopped on "
                f"{self.ended_by}; this rank's stalls and requeue signals are no longer watched (please report it)."
            )

    def _run(self) -> None:
        from torch.distributed import DistError

        seen: dict[int, Seen] = {}
        started = self._clock()
        silent_since: float | None = None
        store: TCPStore | None = None
        while not self._stopped.is_set():  # the first report at once: a rank may freeze within its first interval
            try:
                if store is None:  # a connection that timed out (rank 0 loaded or frozen) is tried again, as a request
                    store = self._requests.run(lambda: self._connect(self._request_timeout), self._request_timeout)
                exchange = functools.partial(self._exchange, store, seen, started)
                verdict = self._requests.run(exchange, self._request_timeout)
                if verdict is not None:
                    self._conclude(*verdict, ends_step=self.rank == 0)
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
                    silent = store_silent(self._clock() - silent_since, self.timeout)
                    if self.stand_in:  # one record, by the rank that ends the step
                        self._record(silent, Fault(FailureKind.STORE_UNREACHABLE, (0,), (self.main_host,)))
                    self._conclude(silent, time.time(), ends_step=self.stand_in)
                    return
            self._stopped.wait(self.interval)
        if self.timeout and store is not None:
            self._leave(store)

    def _leave(self, store: TCPStore) -> None:
        """The last report: this rank's watchdog stopped, so its silence from now on is no freeze."""
        from torch.distributed import DistError

        final = self._report(left=True)
        with contextlib.suppress(DistError, Unanswered):  # the store is gone or frozen: the job is ending anyway
            self._requests.run(lambda: store.set(KEY + str(self.rank), final.to_json()), self._request_timeout)

    def _exchange(self, store: TCPStore, seen: dict[int, Seen], started: float) -> tuple[StallError, float] | None:
        """One interval's requests: report, read the event count, answer the agreement, judge (rank 0)."""
        if self.timeout:
            store.set(KEY + str(self.rank), self._report().to_json())
        events = store.add(EVENTS, 0)
        if events and store.check([VERDICT]):
            verdict = self._parsed(VERDICT, store.get(VERDICT), stored_verdict)
            if verdict is not None:
                return verdict
        for agreement in (self.agreement, None if self.sigterm is None else self.sigterm.agreement):
            if agreement is not None and agreement.poll(store, events):
                store.add(EVENTS, 1)
        if self.rank == 0 and self.timeout:
            self._judge(store, seen, started)
        return None

    def _parsed(self, key: str, raw: bytes, parser: Callable[[object], _Parsed]) -> _Parsed | None:
        """``parser``'s record of ``raw``; ``None`` for a malformed value, which is named once per key."""
        try:
            return read(key, raw, parser)
        except RendezvousError as error:
            if key not in self.named:
                self.named[key] = error.one_line()
                say(f"lightning-mpi-env: the stall watchdog of rank {self.rank} skips {error.one_line()}")
            return None

    def _judge(self, store: TCPStore, seen: dict[int, Seen], started: float) -> None:
        unseen = present(store, _keys(rank for rank in range(self.world_size) if rank not in seen))
        keys = [*_keys(sorted(seen)), *unseen]  # a report once written stays: only the others are looked for
        reports = []
        for key, value in zip(keys, multi_get(store, keys), strict=True):
            report = self._parsed(key, value, report_of(int(key.rsplit("/", 1)[1])))
            if report is not None:
                reports.append(report)
        observe(seen, reports, self._clock())
        if self.stragglers is not None:
            self.stragglers.name(reports, say, self.recorder)
        found = judge(seen, self._clock(), self.timeout, 3 * self.interval, self.world_size, started)
        if found is None and self.soft_timeout:
            self._report_softly(
                judge(seen, self._clock(), self.soft_timeout, 3 * self.interval, self.world_size, started)
            )
        if found is not None:
            stall = found.error
            self._record(stall, found.fault)  # before the verdict: every rank ends soon after it
            # Every rank checks once per interval: all have seen it, and stop together, two intervals from now.
            exit_at = time.time() + 2 * self.interval
            write_verdict(store, stall, exit_at)

    def _report_softly(self, soft: Stall | None) -> None:
        """Past the soft timeout: report the stall once (the job goes on); say when it is over."""
        now = self._clock()
        if soft is not None and self._reported_at is None:
            self._reported_at = now
            say(
                f"lightning-mpi-env: stall watchdog: {soft.error.problem} The job goes on; it ends if no rank makes "
                f"progress for {self.timeout:g} s ({VARIABLE['stall_timeout']})."
            )
        elif soft is None and self._reported_at is not None:
            say(
                f"lightning-mpi-env: stall watchdog: the stall reported {now - self._reported_at:.0f} s ago is over: "
                "the ranks made progress."
            )
            self._reported_at = None

    def _record(self, error: StallError, fault: Fault) -> None:
        record(self.recorder, error, fault, self.rank)

    def _conclude(self, error: StallError, exit_at: float, *, ends_step: bool = False) -> None:
        """Show ``error`` and end this process at ``exit_at``; the rank that ``ends_step`` runs :attr:`end_step`."""
        self.verdict = error.one_line()
        end_at(
            error,
            exit_at,
            rank=self.rank,
            end_step=self.end_step,
            exit=self._exit,
            end_hint=self.end_hint,
            sends=ends_step,
            host=self.host,
            world_size=self.world_size,
            sleep=self._sleep,
        )


_Parsed = TypeVar("_Parsed")


def watch(
    result: RendezvousResult,
    timeout: float,
    signalled: Callable[[], bool] | None,
    launch: RankLayout | None = None,
    recorder: FailureRecorder | None = None,
    soft_timeout: float = 0.0,
    sigterm: bool = False,
    own_client: bool = False,
    stragglers: tuple[float, int] = (0.0, 0),
) -> Watchdog:
    """This rank's watchdog thread, started, on the roll call's client of its store, which the roll call is done with.

    ``own_client``: the process group is to be opened on that client, so the thread, not started, will open a client
    of its own when its caller starts it (:meth:`~lightning_mpi_env.rollcall.store.RendezvousResult.client`).

    ``signalled`` says whether this rank's requeue signal came (``None``: no stop agreement for it); ``sigterm``: the
    thread also carries the stop after a ``SIGTERM`` to any rank. ``launch`` says how to end the step where the
    launcher would wait for a frozen rank; where nothing would, rank 0 says what to add. ``stragglers``: the factor
    and the window of the straggler watch (a ``0``: none).
    """
    from datetime import timedelta

    claim, nodes = result.claim, result.nodes
    launcher = None if launch is None else launch.launcher
    end_step, end_hint = step_end(launch)
    if claim.rank == 0 and timeout and launcher is not None and not launcher.ends_on_failure and not end_step:
        add = launcher.end_hint or "your launcher's option that ends every rank when one exits non-zero"
        say(
            f"lightning-mpi-env: stall watchdog: {launcher.name} may wait for a frozen rank after the others ended "
            f"on a stall; to end the job then, add {add}."
        )

    def connect(seconds: float) -> TCPStore:
        if own_client:
            return result.client(seconds)
        result.store.set_timeout(timedelta(seconds=seconds))  # each request's; the roll call waited longer
        return result.store

    agreement = None
    if signalled is not None:
        agreement = StopAgreement(rank=claim.rank, world_size=claim.world_size, signalled=signalled)
    stop_on_sigterm = SigtermStop(rank=claim.rank, world_size=claim.world_size) if sigterm else None
    # When rank 0 is silent, the lowest rank off its node ends the step (on one node: rank 1).
    stand_in = (nodes.node_rank == 1 and nodes.local_rank == 0) if nodes.num_nodes > 1 else claim.rank == 1
    watchdog = Watchdog(
        connect,
        rank=claim.rank,
        world_size=claim.world_size,
        host=claim.host,
        timeout=timeout,
        agreement=agreement,
        sigterm=stop_on_sigterm,
        end_step=end_step,
        end_hint=end_hint,
        stand_in=stand_in,
        recorder=recorder,
        main_host=claim.main_address,
        soft_timeout=soft_timeout,
        straggler_factor=stragglers[0],
        straggler_window=stragglers[1],
    )
    return watchdog if own_client else watchdog.start()


def _keys(ranks: Iterable[int]) -> list[str]:
    """The report keys of ``ranks``."""
    return [KEY + str(rank) for rank in ranks]
