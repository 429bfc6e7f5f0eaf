"""Every rank stops at one step after a ``SIGTERM`` that reached any of them, agreed with no collective.

``kill -TERM`` of one process, or a node's own shutdown, signals some ranks only. A rank that stops by itself leaves
the others in their next collective with a peer that is gone: they end on the backend's error ("Connection closed by
peer"), status 1. So a handler only notes the signal (:meth:`SigtermStop.note`); the watchdog's thread agrees with
the other ranks' threads on a step through the store (a stop agreement under keys of its own); at that step every
rank stops with status 143 and runs no collective after it. The loop asks after each step: the Trainer's callback,
``"ddp_mpi"``'s ``backward`` under Fabric, or a Fabric loop with the plugin (``environment.exit_on_sigterm()``).

A scheduler signals every process of the step, the data loader workers too, and torch's worker dies of a ``SIGTERM``
that its parent did not send. Its end may reach the rank (torch's ``SIGCHLD`` handler raises "DataLoader worker ...
is killed by signal: Terminated" wherever the main thread is) before the rank's own signal does: a worker ended by
``SIGTERM`` counts as the signal reaching this rank (:meth:`SigtermStop.watch_workers`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from lightning_mpi_env.rollcall.agreement import SIGTERM_STOP, StopAgreement

SIGTERM_STATUS = 128 + signal.SIGTERM.value
"""The exit status of every rank stopped by ``SIGTERM`` (the shell's status for a process the signal ended)."""

WORKER_FAILED = "DataLoader worker (pid"
"""How torch's ``SIGCHLD`` handler's error starts ("... is killed by signal", "... exited unexpectedly")."""


class SigtermStop:
    """This rank's part: the signals noted, the agreement the watchdog's thread advances, and the loop's question."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self._noted = 0  # written by a handler (it may only count), read by the watchdog's thread and the loop
        self.on_note: Callable[[], object] | None = None
        """Called by the handler after it noted the signal (in the main thread, where Python runs handlers)."""
        self.stopped = False
        """Whether this rank reached the agreed step (and stops there)."""
        self._between = False  # whether the loop is between two steps (set by wait_between_steps)
        self.agreement = StopAgreement(
            rank=rank,
            world_size=world_size,
            signalled=self.noted,
            kind=SIGTERM_STOP,
            coming=self.coming,
            between=self.is_between_steps,
        )
        self._handler: Any = None  # the handler :meth:`install` put in, and the one it replaced
        self._replaced: Any = None
        self._child_handler: _ChildEnds | None = None  # the SIGCHLD handler :meth:`watch_workers` put in
        self.between_steps: Callable[[], object] | None = None
        """Set by the loop while it is between two steps: the stop (or not) to decide in the handler, right there."""

    def note(self) -> None:
        """A ``SIGTERM`` came to this process (called by a signal handler: a count, then :attr:`on_note`)."""
        self._noted += 1
        if self.on_note is not None:
            self.on_note()

    def stop_between_steps(self) -> None:
        """At the end of a handler that noted the signal: where the loop is between two steps, decide there.

        A batch may never come (the signal ended the data loader's workers too), so a loop waiting for one would not
        reach the end of its next step. Between steps it has left one step and started no other, and no collective is
        under way in its thread: it waits for the agreement there, as at a step's end, and stops there where every
        rank does (:attr:`between_steps` may raise). Once a signal, in the main thread.
        """
        stop, self.between_steps = self.between_steps, None
        if stop is not None and threading.current_thread() is threading.main_thread():
            stop()

    def wait_between_steps(self, stop: Callable[[], object] | None) -> None:
        """From now the loop is between two steps, ``stop`` its stop check (``None``: at a step again).

        A signal noted after the loop's check at the step's end found no stop to run in its handler: ``stop`` runs
        here, at once, where it would otherwise wait for a batch that may never come.
        """
        self.between_steps, self._between = stop, stop is not None
        if stop is not None and self.noted() and not self.stopped:
            self.stop_between_steps()

    def coming(self) -> bool:
        """Whether the loop, between two steps, is on its way to wait for the agreement there (asked by the thread).

        So it is where the signal came to this process: noted, or a loader worker it ended is not reaped yet and the
        ``SIGCHLD`` handler in place is :meth:`watch_workers`'s (it runs the stop). The thread holds this rank's post
        for it (``agreement.HOLD``), then posts this step all the same: the loop stops there before any further step.
        """
        if not self._between:
            return False
        return self.noted() or (self._watching() and child_ended_by_sigterm())

    def _watching(self) -> bool:
        """Whether :meth:`watch_workers`'s handler is the one in place (asked from any thread)."""
        handler = self._child_handler
        return handler is not None and signal.getsignal(signal.SIGCHLD) is handler

    def is_between_steps(self) -> bool:
        """Whether the loop is between two steps (asked by the thread: where a signal may still come, it waits)."""
        return self._between

    def noted(self) -> bool:
        """Whether a ``SIGTERM`` came to this process."""
        return self._noted > 0

    def due(self, finished: int, wait: float) -> bool:
        """Whether every rank stops now, after its ``finished``-th step (all ranks ask after each step, one count).

        Two local reads until a signal comes, then a wait of about one interval of the watchdog; a ``StallError``
        where not every rank answered within ``wait`` seconds.
        """
        if self.agreement.due(finished, wait):
            self.stopped = True
        return self.stopped

    def install(self) -> bool:
        """Put in a ``SIGTERM`` handler that notes the signal, chained to the one in place; whether it went in.

        For a Fabric loop (a Trainer's callback replaces Lightning's handler instead); from the main thread, once.
        """
        if self._handler is not None or threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGTERM)

        def note(signum: int, frame: FrameType | None) -> None:
            self.note()
            if callable(previous):  # the program's own handler still runs
                previous(signum, frame)

        self._handler, self._replaced = note, previous
        signal.signal(signal.SIGTERM, note)
        return True

    def uninstall(self) -> None:
        """Put back the handler from before :meth:`install`; a ``SIGTERM`` noted and never stopped for goes to it."""
        handler, self._handler = self._handler, None
        if handler is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._replaced is None else self._replaced)
        if self.noted() and not self.stopped:  # the loop ended before the agreed step: the signal still ends it
            os.kill(os.getpid(), signal.SIGTERM)

    def watch_workers(self) -> bool:
        """Put a ``SIGCHLD`` handler before torch's DataLoader's: a child ended by ``SIGTERM`` counts as :meth:`note`.

        Only over a Python handler (torch puts its own in, in the main thread, when the first loader with workers
        starts; before that a worker's end raises nothing) and before a signal was noted; once; whether it went in.
        """
        if self._child_handler is not None or self.noted() or threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGCHLD)
        if not callable(previous):
            return False
        handler = self._child_handler = _ChildEnds(self, previous)
        signal.signal(signal.SIGCHLD, handler)
        return True

    def unwatch_workers(self) -> None:
        """Put back the ``SIGCHLD`` handler from before :meth:`watch_workers`, if this one is still in place."""
        handler, self._child_handler = self._child_handler, None
        if handler is None or threading.current_thread() is not threading.main_thread():
            return
        previous = handler.previous
        if signal.getsignal(signal.SIGCHLD) is handler:
            signal.signal(signal.SIGCHLD, previous)

    def say(self, step: int) -> None:
        """One line on stderr, in one write (several ranks share the launcher's output): this rank stops."""
        sys.stderr.write(f"lightning-mpi-env: SIGTERM: rank {self.rank} stops after step {step}, as every rank does\n")
        sys.stderr.flush()

    def exit(self, step: int) -> NoReturn:
        """Say so, and end this rank with status 143 (a ``SystemExit``: exit hooks run, no traceback)."""
        self.say(step)
        raise SystemExit(SIGTERM_STATUS)


class _ChildEnds:
    """The ``SIGCHLD`` handler of :meth:`SigtermStop.watch_workers`, chained to ``previous`` (torch's).

    Python runs a handler between two bytecodes of the main thread, its own handlers' too: a worker's end may run it
    again inside itself, and ``signal.signal`` (``on_note`` swapping handlers) first runs the ones pending, this one
    among them. So once the signal is noted, by whichever call, no worker's end goes to torch's; and where torch's,
    looking after this one did, names a worker that ended by ``SIGTERM`` meanwhile, that is the signal as well.
    """

    def __init__(self, stop: SigtermStop, previous: Callable[[int, FrameType | None], Any]) -> None:
        self.stop = stop
        self.previous = previous
        self.owner = os.getpid()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.owner:
            self.previous(signum, frame)
            return
        if not self.stop.noted() and not child_ended_by_sigterm():
            try:
                self.previous(signum, frame)
                return
            except RuntimeError as error:  # the loop's stop, run by a call inside, raises its own: never taken
                if not str(error).startswith(WORKER_FAILED) or not (self.stop.noted() or child_ended_by_sigterm()):
                    raise
        if not self.stop.noted():
            self.stop.note()  # its on_note lets the other workers end too
            self.stop.stop_between_steps()


def child_ended_by_sigterm() -> bool:
    """Whether a child of this process ended by ``SIGTERM`` and is not reaped yet (``WNOWAIT``: left to its owner)."""
    for pid in _children():
        try:
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped meanwhile
            continue
        if ended is not None and ended.si_code == os.CLD_KILLED and ended.si_status == signal.SIGTERM:
            return True
    return False


def _children() -> set[int]:
    """This process's children, from each thread's ``/proc/self/task/<tid>/children`` (none where Linux has no list)."""
    found: set[int] = set()
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return found
    for thread in threads:
        try:
            text = Path("/proc/self/task", thread, "children").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        found.update(int(word) for word in text.split() if word.isdigit())
    return found
