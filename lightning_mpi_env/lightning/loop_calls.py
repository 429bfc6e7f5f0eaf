"""What a training loop calls on ``MPIClusterEnvironment`` during a run: progress marks, the requeue, ``SIGTERM``."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from lightning_mpi_env.core.report import shows_errors_briefly
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.lightning.requeue import Requeue, requeue_at_time_limit, requeue_due, requeue_now

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.sigterm import SigtermStop
    from lightning_mpi_env.rollcall.watchdog import Watchdog


class LoopCalls:
    """The environment's methods for a running loop (``changes`` is the environment's)."""

    changes: ProcessChanges

    def _plan_loop_calls(
        self,
        env: Mapping[str, str],
        enabled: bool,
        requeue_signal: signal.Signals | int | None,
        command: Sequence[str] | None,
    ) -> None:
        self.requeue = Requeue.plan(env, enabled=enabled, requeue_signal=requeue_signal, command=command)
        """How this job checkpoints and requeues (``None``: it does not); its handler goes in now."""
        self._watchdog: Watchdog | None = None  # started by the roll call, stopped at teardown
        self._steps_asked = 0  # requeue_requested() calls: a Fabric loop's steps
        self._sigterm_asks = 0  # exit_on_sigterm() calls: a Fabric loop's steps
        self._limit_pending: int | None = None  # the step a Fabric loop stops at on SIGTERM, pending the time limit
        # Now, before any data loader worker forks: a one-device Fabric calls nothing of the environment before its
        # loop's first requeue_requested(), and the workers of its first epoch, without the handler, die of the signal.
        self.watch_requeue_signal()

    def mark_progress(self, step: int, phase: int) -> None:
        """Tell the stall watchdog this rank reached ``PHASES[phase]`` of ``step``: two assignments, no I/O."""
        if self._watchdog is not None:
            self._watchdog.mark(step, phase)

    def progress(self, step: int) -> None:
        """For a Fabric loop with the plugin (not ``"ddp_mpi"``): call right before each ``fabric.backward()``."""
        self.mark_progress(step, 2)

    def watch_requeue_signal(self) -> None:
        """Install the requeue signal handler, chained to the one in place (idempotent; undone by teardown).

        Again in a process forked since (``ddp_fork``'s ranks): the one inherited is inert there.
        """
        plan = self.requeue
        if plan is None:
            return
        plan.install()
        self.changes.add(Change.REQUEUE_HANDLER, plan.restore)

    @shows_errors_briefly
    def requeue_due(self, finished: int, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """Whether every rank checkpoints and requeues now, after its ``finished``-th step (all ranks ask each step).

        Through the roll call's store (two local reads until a signal comes); without it, and for ``SIGTERM``, which
        ends ``fit()`` at the next step, a collective each call. A ``StallError`` where not every rank answers in time.
        """
        return requeue_due(self.requeue, self._watchdog, finished, reduce_boolean_decision)

    def requeue_requested(self, fabric: object) -> bool:
        """For a Fabric loop, every rank after each step: whether to checkpoint now, then call :meth:`requeue_now`."""
        self.watch_requeue_signal()
        self._steps_asked += 1
        reduce = fabric.strategy.reduce_boolean_decision  # type: ignore[attr-defined]
        pending, self._limit_pending = self._limit_pending, None
        if pending is not None:  # every rank stops after this step on SIGTERM: a time limit's saves and requeues
            stop = self.sigterm_stop
            if self.requeue_at_time_limit(int(fabric.global_rank), reduce):  # type: ignore[attr-defined]
                return True
            assert stop is not None  # pending only where there is one
            stop.exit(pending)
        return self.requeue_due(self._steps_asked, reduce)

    @property
    def sigterm_stop(self) -> SigtermStop | None:
        """Every rank's stop at one step after a ``SIGTERM`` to any of them; ``None`` without the watchdog's thread."""
        return None if self._watchdog is None else self._watchdog.sigterm

    def sigterm_due(self, finished: int) -> bool:
        """Whether every rank stops now, after its ``finished``-th step, on a ``SIGTERM`` that reached any of them."""
        stop, watchdog = self.sigterm_stop, self._watchdog
        return stop is not None and watchdog is not None and stop.due(finished, max(60.0, 10 * watchdog.interval))

    def exit_on_sigterm(self) -> None:
        """For a Fabric loop, every rank once per step before ``fabric.backward()`` (``"ddp_mpi"`` calls it itself).

        After a ``SIGTERM`` to any rank, every rank exits with status 143 at one step; where the loop asks
        :meth:`requeue_requested` and the job can requeue, that step goes on, and the ask after it decides whether it
        was the scheduler's time limit (checkpoint and requeue) or not (exit 143). The first call puts in the handler
        that notes it (undone at teardown); before, and without the watchdog, ``SIGTERM`` ends a process.
        """
        stop = self.sigterm_stop
        if stop is None:
            return
        if Change.SIGTERM_HANDLER not in self.changes and stop.install():
            self.changes.add(Change.SIGTERM_HANDLER, stop.uninstall)
        finished, self._sigterm_asks = self._sigterm_asks, self._sigterm_asks + 1
        if self._limit_pending is None and self.sigterm_due(finished):
            if self.requeue is None or not self._steps_asked:
                stop.exit(finished)
            self._limit_pending = finished

    def requeue_at_time_limit(self, rank: int, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """At the step every rank stops at on ``SIGTERM``: whether that is the job's time limit (a collective).

        Then every rank checkpoints and requeues instead of exiting 143; rank 0 asks the scheduler.
        """
        return requeue_at_time_limit(self.requeue, rank, reduce_boolean_decision)

    @shows_errors_briefly
    def requeue_now(self, fabric: object) -> NoReturn:
        """After a Fabric loop's checkpoint: rank 0 requeues, every rank exits; ``SettingError`` if none can requeue."""
        requeue_now(self.requeue, fabric)
