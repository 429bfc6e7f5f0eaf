"""What a training loop calls on ``MPIClusterEnvironment`` during a run: progress marks, the requeue, ``SIGTERM``.

After a periodic checkpoint, a Trainer's callback also asks whether to end the step there and leave stragglers'
hosts out (``lightning-mpi-env run --leave-out-stragglers``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.core.report import shows_errors_briefly
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.core.state_files import FieldError, spares_given
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.lightning.requeue import (
    Requeue,
    let_workers_end,
    requeue_at_time_limit,
    requeue_due,
    requeue_now,
)
from lightning_mpi_env.rollcall.stall_verdict import say
from lightning_mpi_env.rollcall.stragglers import leave_out_line, to_leave_out

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.sigterm import SigtermStop
    from lightning_mpi_env.rollcall.watchdog import Watchdog


class LoopCalls:
    """The environment's methods for a running loop (``changes`` is the environment's)."""

    changes: ProcessChanges
    settings: Settings
    _recorder: FailureRecorder | None

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
        self._request_unreadable = False  # run's request to leave stragglers out could not be read, and that was said
        # Now, before any data loader worker forks: a one-device Fabric calls nothing of the environment before its
        # loop's first requeue_requested(), and the workers of its first epoch, without the handler, die of the signal.
        self.watch_requeue_signal()

    def mark_progress(self, step: int, phase: int) -> None:
        """Tell the stall watchdog this rank reached ``PHASES[phase]`` of ``step``: two assignments, no I/O."""
        if self._watchdog is not None:
            self._watchdog.mark(step, phase)

    def mark_busy(self) -> None:
        """Tell the stall watchdog this rank did work that is no mark (a validation batch): one addition, no I/O."""
        if self._watchdog is not None:
            self._watchdog.busy()

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
        self.watch_worker_ends()
        finished, self._sigterm_asks = self._sigterm_asks, self._sigterm_asks + 1
        if self._limit_pending is None and self.sigterm_due(finished):
            if self.requeue is None or not self._steps_asked:
                stop.exit(finished)
            self._limit_pending = finished

    def between_steps(self, stop: Callable[[], object] | None) -> None:
        """``stop`` (every rank's stop check, as after a step) while the loop is between two steps; ``None`` at a step.

        A ``SIGTERM`` noted between steps runs it in the handler (``SigtermStop.stop_between_steps``): the signal may
        have ended the data loader's workers too, and with them the batch the loop waits for.
        """
        if self.sigterm_stop is not None:
            self.sigterm_stop.wait_between_steps(stop)

    def watch_worker_ends(self) -> None:
        """Each step, until it goes in: a loader worker ended by ``SIGTERM`` stops every rank as the signal would.

        The scheduler's signal may end a worker before it reaches its rank (``SigtermStop.watch_workers``). Undone at
        teardown; without the watchdog, nothing.
        """
        stop = self.sigterm_stop
        if stop is not None and Change.WORKER_SIGTERM not in self.changes and stop.watch_workers():
            self.changes.add(Change.WORKER_SIGTERM, stop.unwatch_workers)

    def requeue_at_time_limit(self, rank: int, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """At the step every rank stops at on ``SIGTERM``: whether that is the job's time limit (a collective).

        Then every rank checkpoints and requeues instead of exiting 143; rank 0 asks the scheduler.
        """
        return requeue_at_time_limit(self.requeue, rank, reduce_boolean_decision)

    @shows_errors_briefly
    def requeue_now(self, fabric: object) -> NoReturn:
        """After a Fabric loop's checkpoint: rank 0 requeues, every rank exits; ``SettingError`` if none can requeue."""
        requeue_now(self.requeue, fabric)

    def leave_out_stragglers(self, rank: int, step: int, broadcast: Callable[..., Any]) -> None:
        """Every rank, after a periodic checkpoint at ``step``: exit 1 where rank 0 leaves stragglers' hosts out.

        ``lightning-mpi-env run --leave-out-stragglers`` asks for it in the state folder when the allocation has
        spare hosts; rank 0 then records the hosts of the ranks that still stand out (at most as many as are spare)
        as failed, and ``run`` relaunches the step without them, from this checkpoint. ``broadcast``: the strategy's
        (a collective, only where a state folder is set).
        """
        if not self.settings.state_dir:
            return
        if not broadcast(rank == 0 and self._stragglers_left_out(step), src=0):
            return
        let_workers_end()
        raise SystemExit(1)  # every rank, after the collective: the checkpoint is saved

    def _stragglers_left_out(self, step: int) -> bool:
        """Rank 0: whether it recorded stragglers' hosts to leave out (and said so)."""
        watch = None if self._watchdog is None else self._watchdog.stragglers
        if watch is None or self._recorder is None:
            return False
        try:
            spares = spares_given(self.settings.state_dir)
        except FieldError as error:
            if not self._request_unreadable:
                self._request_unreadable = True
                say(
                    f"lightning-mpi-env: straggler: the request to leave stragglers out is not read: {error}; no host "
                    "is left out. Delete the file: only lightning-mpi-env run writes it, one state folder per step."
                )
            return False
        left_out = to_leave_out(watch.standing(), spares) if spares else []
        if not left_out:
            return False
        text = leave_out_line(left_out, step)
        ranks, hosts = [s.rank for s in left_out], [s.host for s in left_out]
        fault = Fault(FailureKind.STRAGGLER, tuple(ranks), tuple(dict.fromkeys(hosts)), step)
        if not self._recorder.record(fault, problem=text, written_by=0).hosts:
            return False  # no host name the record keeps (a forged report's): nothing for run to leave out
        problem = self._recorder.write(fault, problem=text, written_by=0)
        if problem is not None:  # without the record, run would not know whom to leave out: train on
            say(f"lightning-mpi-env: straggler: no host is left out: {problem}")
            return False
        say(f"lightning-mpi-env: straggler: {text}")
        return True
