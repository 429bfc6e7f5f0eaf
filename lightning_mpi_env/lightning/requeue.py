"""Checkpoint and requeue on a scheduler's warning signal, on Slurm, Grid Engine, PBS and LSF.

Lightning requeues only for its own ``SLURMEnvironment`` (``isinstance`` of it). Here the scheduler's row
(:mod:`lightning_mpi_env.core.schedulers`) says how its job goes back in the queue, and the plan for one job is a
:class:`Requeue`:

1. The signal handler only notes that the signal came (heavy work in a signal handler can stop halfway).
2. The ranks agree on one step to stop at (under ``mpirun`` inside a batch job, only the ranks a job step started
   get ``scancel --signal``): through the roll call's store, from the watchdog thread, so the training loop pays
   nothing per step (:mod:`lightning_mpi_env.rollcall.agreement`); without the roll call, by a collective after
   every step (:meth:`Requeue.agree`).
3. At that step all ranks save Lightning's HPC checkpoint, ``<default_root_dir>/hpc_ckpt_<n>.ckpt``; then rank 0
   runs the scheduler's requeue command (``scontrol requeue``, ``qrerun``, ``brequeue``), and every rank exits with
   the scheduler's requeue exit status (Grid Engine reschedules a job that exits 99). Past
   ``LIGHTNING_MPI_ENV_MAX_REQUEUES`` requeues (counted by the HPC checkpoints, ``n``), the checkpoint is saved but
   the job is not requeued, and every rank exits with status 1: a job that is warned again right after each
   restart does not requeue forever.
4. The job, started again, resumes from the newest HPC checkpoint in ``default_root_dir``: Lightning does this by
   itself under Slurm; elsewhere ``trainer.fit(model, ckpt_path=hpc_checkpoint(trainer))`` does (Lightning offers no
   public hook that sets a Trainer's checkpoint before ``fit()`` chooses it).

Step 2 runs in :class:`~lightning_mpi_env.lightning.callbacks` (added to every Trainer by Lightning itself through
the ``callbacks_factory`` entry point) and, in a Fabric loop, in ``MPIClusterEnvironment.requeue_requested()``.

``auto_requeue=False`` or ``LIGHTNING_MPI_ENV_REQUEUE=0`` turns it off; without a scheduler it does nothing.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.schedulers import SCHEDULERS, Scheduler
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.lightning.compat import HPC_CHECKPOINT, hpc_checkpoint_name

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.watchdog import Watchdog

log = logging.getLogger(__name__)

_received: dict[int, int] = {}  # signal number -> how many times it came; written by the handler only
_replaced: dict[int, Any] = {}  # signal number -> the handler `install` replaced, for `restore`


class Requeue(NamedTuple):
    """How this job checkpoints and goes back in the queue."""

    scheduler: Scheduler
    """The scheduler that runs the job."""
    signum: signal.Signals
    """The signal that asks for it."""
    command: tuple[str, ...]
    """The command rank 0 runs after the checkpoint (empty: the exit status does it)."""
    exit_code: int
    """The exit status of every rank afterwards."""

    @classmethod
    def plan(
        cls,
        env: Mapping[str, str],
        *,
        enabled: bool,
        requeue_signal: signal.Signals | int | None,
        command: Sequence[str] | None,
    ) -> Requeue | None:
        """The plan for the job this process runs in, or ``None`` (off, or no scheduler, or none that requeues).

        Args:
            env: The launch environment (for the scheduler's job variables).
            enabled: The ``requeue`` setting (:class:`~lightning_mpi_env.core.settings.Settings`).
            requeue_signal: The signal that asks for it; the scheduler's warning signal by default.
            command: The command that requeues the job; the scheduler's by default.
        """
        if not enabled:
            return None
        scheduler = next((row for row in SCHEDULERS if all(env.get(v) for v in row.job_id)), None)
        if scheduler is None:
            return None
        if command is None:
            job = job_name(scheduler, env)
            command = () if job is None else tuple(part.format(job=job) for part in scheduler.requeue_command)
        if not command and not scheduler.requeue_exit_code:
            return None  # Flux: nothing puts a job back in its queue
        signum = scheduler.warning_signal if requeue_signal is None else signal.Signals(requeue_signal)
        return cls(scheduler, signum, tuple(command), scheduler.requeue_exit_code)

    def install(self) -> None:
        """Note the signal when it comes (in the main thread only; Python allows handlers nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            log.debug("Not in the main thread: no requeue signal handler.")
            return
        previous = signal.getsignal(self.signum)
        if getattr(previous, "_lightning_mpi_env", False):
            return

        def note(signum: int, frame: FrameType | None) -> None:
            _received[signum] = _received.get(signum, 0) + 1
            if callable(previous):  # keep the handler that was there (the user's, submitit's, Lightning's)
                previous(signum, frame)

        note._lightning_mpi_env = True  # type: ignore[attr-defined]
        _replaced[int(self.signum)] = previous
        signal.signal(self.signum, note)

    def restore(self) -> None:
        """Put back the handler :meth:`install` replaced, if this package's is still the one in place."""
        if threading.current_thread() is not threading.main_thread() or int(self.signum) not in _replaced:
            return
        previous = _replaced.pop(int(self.signum))
        if getattr(signal.getsignal(self.signum), "_lightning_mpi_env", False):
            signal.signal(self.signum, signal.SIG_DFL if previous is None else previous)

    @property
    def requested(self) -> bool:
        """Whether the signal came to this process."""
        return _received.get(int(self.signum), 0) > 0

    def agree(self, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """Whether the signal came to any rank (a collective: every rank must call it, at the same step)."""
        return bool(reduce_boolean_decision(self.requested, all=False))

    def run_command(self) -> bool:
        """Put the job back in the queue (rank 0 calls this, after the checkpoint); whether that worked."""
        if not self.command:
            return True
        # Said first: the scheduler may end this job the moment its command returns (Slurm does, under load).
        _say(f"the job goes back in the queue: `{' '.join(self.command)}`")
        try:
            done = subprocess.run(self.command, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            _say(f"`{' '.join(self.command)}` could not run ({error}).")
            return False
        if done.returncode != 0:
            _say(f"`{' '.join(self.command)}` failed (exit status {done.returncode}): {done.stderr.strip()}")
            return False
        return True


def job_name(scheduler: Scheduler, env: Mapping[str, str]) -> str | None:
    """The job as the scheduler's requeue command names it (an array task by its array id).

    >>> from lightning_mpi_env.core.schedulers import SLURM
    >>> job_name(SLURM, {"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "1"})
    '36_1'
    """
    for template in scheduler.requeue_job:
        names = re.findall(r"\{(\w+)\}", template)
        if all(env.get(name) and not (name in scheduler.nonzero and env[name] == "0") for name in names):
            return template.format(**{name: env[name] for name in names})
    return None


def newest_checkpoint(directory: str) -> str | None:
    """The HPC checkpoint with the highest number in ``directory``, or ``None``.

    >>> newest_checkpoint("/nonexistent") is None
    True
    """
    numbers = _numbers(directory)
    return os.path.join(directory, hpc_checkpoint_name(max(numbers))) if numbers else None


def hpc_checkpoint(trainer: Any) -> str | None:
    """The newest HPC checkpoint in ``trainer.default_root_dir``, for ``trainer.fit(model, ckpt_path=...)``.

    Lightning resumes from it by itself only under Slurm; under Grid Engine, PBS and LSF a requeued job resumes when
    it passes this (``None`` on the first run: start afresh). Under Slurm passing it changes nothing. Rank 0 says
    which checkpoint it resumes from.
    """
    checkpoint = newest_checkpoint(str(trainer.default_root_dir))
    if checkpoint is not None and trainer.global_rank == 0:
        _say(f"resuming from {checkpoint}")
    return checkpoint


def next_checkpoint(directory: str) -> str:
    """Where the next HPC checkpoint goes: one past the highest number in ``directory``."""
    numbers = _numbers(directory)
    return os.path.join(directory, hpc_checkpoint_name(max(numbers, default=0) + 1))


def checkpoint_number(path: str) -> int:
    """The number ``n`` of an HPC checkpoint's file name; 0 for any other name.

    >>> checkpoint_number("/runs/a/hpc_ckpt_3.ckpt"), checkpoint_number("/runs/a/last.ckpt")
    (3, 0)
    """
    match = HPC_CHECKPOINT.match(os.path.basename(path))
    return int(match.group(1)) if match else 0


def _numbers(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [int(match.group(1)) for name in names if (match := HPC_CHECKPOINT.match(name))]


def _say(message: str) -> None:
    # One line on stderr, in one write: several ranks share the launcher's output.
    sys.stderr.write(f"lightning-mpi-env: requeue: {message}\n")
    sys.stderr.flush()


def checkpoint_and_requeue(trainer: Any, plan: Requeue, max_requeues: int) -> None:
    """Save the HPC checkpoint on every rank, have rank 0 requeue the job, and end every rank.

    Called by every rank at the same step, once the ranks agreed to stop there.

    Args:
        trainer: The Trainer.
        plan: How this job requeues.
        max_requeues: The most requeues (HPC checkpoints in ``default_root_dir``); ``0``: no limit.

    Raises:
        SystemExit: Always, with the plan's exit status (Grid Engine: 99); 1 past ``max_requeues``, and on rank 0
            when the requeue command failed.
    """
    strategy = trainer.strategy
    path = strategy.broadcast(next_checkpoint(trainer.default_root_dir), src=0)  # one name on every rank
    trainer.save_checkpoint(path)
    strategy.barrier("lightning_mpi_env.lightning.requeue.saved")
    number = checkpoint_number(path)
    over = bool(max_requeues) and number > max_requeues
    if trainer.global_rank != 0:
        # No collective after this: Slurm, PBS and LSF end every rank of a requeued job at once, and a rank still
        # waiting on rank 0 would print a connection error. Rank 0's status says whether the requeue worked.
        raise SystemExit(1 if over else plan.exit_code)
    _say(f"saved {path} at step {trainer.global_step} after {plan.signum.name}")
    if over:
        _say(
            f"not requeued: this would be requeue {number}, past {VARIABLE['max_requeues']}={max_requeues} (the "
            f"HPC checkpoints in {trainer.default_root_dir} count them). Submit the job again to resume from {path}, "
            f"or raise {VARIABLE['max_requeues']} (0: no limit)."
        )
        raise SystemExit(1)
    if plan.run_command():
        raise SystemExit(plan.exit_code)
    _say(f"the checkpoint {path} is saved: submit the job again to resume from it.")
    raise SystemExit(1)


def requeue_due(
    plan: Requeue | None, stall_watchdog: Watchdog | None, finished: int, reduce_boolean_decision: Callable[..., bool]
) -> bool:
    """Whether every rank checkpoints and requeues now, after its ``finished``-th step.

    Through the roll call's store when the watchdog has an agreement (two local reads until a signal comes), else
    by the strategy's collective ``reduce_boolean_decision``, also for ``SIGTERM`` (see
    ``MPIClusterEnvironment.requeue_due``).

    Raises:
        StallError: A signal came, and not every rank answered the agreement in time.
    """
    if plan is None:
        return False
    agreement = stall_watchdog.agreement if stall_watchdog is not None else None
    if agreement is None or plan.signum == signal.SIGTERM:
        return plan.agree(reduce_boolean_decision)
    assert stall_watchdog is not None
    return agreement.due(finished, wait=max(60.0, 10 * stall_watchdog.interval))


def requeue_now(plan: Requeue | None, fabric: object) -> NoReturn:
    """For a Fabric loop, after the checkpoint: rank 0 requeues the job, then every rank exits.

    Raises:
        SystemExit: With the scheduler's requeue exit status (on rank 0, 1 when the requeue command failed).
        SettingError: Outside a scheduler that can requeue, or with requeue turned off.
    """
    if plan is None:
        raise SettingError(
            "requeue_now() was called, but this job has no scheduler that can requeue it, or requeue is off.",
            "Call it only when requeue_requested() said so.",
        )
    fabric.barrier("lightning_mpi_env.lightning.requeue.saved")  # type: ignore[attr-defined]  # every rank's save is done
    # No collective after this: the scheduler ends every rank of a requeued job at once (see the module docstring).
    if fabric.global_rank != 0 or plan.run_command():  # type: ignore[attr-defined]
        raise SystemExit(plan.exit_code)
    raise SystemExit(1)


__all__ = [
    "hpc_checkpoint",
    "Requeue",
    "checkpoint_and_requeue",
    "checkpoint_number",
    "job_name",
    "newest_checkpoint",
    "next_checkpoint",
    "requeue_due",
    "requeue_now",
]
