"""What a training loop calls on ``MPIClusterEnvironment`` during a run: progress marks and the requeue."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from lightning_mpi_env.core.report import shows_errors_briefly
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.lightning.requeue import Requeue, requeue_due, requeue_now

if TYPE_CHECKING:
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
        """How this job checkpoints and requeues (``None``: it does not); the handler goes in when training starts."""
        self._watchdog: Watchdog | None = None  # started by the roll call, stopped at teardown
        self._steps_asked = 0  # requeue_requested() calls: a Fabric loop's steps

    def mark_progress(self, step: int, phase: int) -> None:
        """Tell the stall watchdog this rank reached ``PHASES[phase]`` of ``step``: two assignments, no I/O."""
        if self._watchdog is not None:
            self._watchdog.mark(step, phase)

    def progress(self, step: int) -> None:
        """For a Fabric loop with the plugin (not ``"ddp_mpi"``): call right before each ``fabric.backward()``."""
        self.mark_progress(step, 2)

    def watch_requeue_signal(self) -> None:
        """Install the requeue signal handler, chained to the one in place (idempotent; undone by teardown)."""
        plan = self.requeue
        if plan is None or Change.REQUEUE_HANDLER in self.changes:
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
        return self.requeue_due(self._steps_asked, fabric.strategy.reduce_boolean_decision)  # type: ignore[attr-defined]

    @shows_errors_briefly
    def requeue_now(self, fabric: object) -> NoReturn:
        """After a Fabric loop's checkpoint: rank 0 requeues, every rank exits; ``SettingError`` if none can requeue."""
        requeue_now(self.requeue, fabric)
