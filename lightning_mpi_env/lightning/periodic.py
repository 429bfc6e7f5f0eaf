"""Periodic HPC checkpoints and the first-step record: what a step relaunched inside its allocation resumes from.

``lightning-mpi-env run`` relaunches a failed ``srun`` step in the same allocation, so with the same job id; the
relaunched Trainer resumes with ``fit(ckpt_path=hpc_checkpoint(trainer))`` as a requeued one does. A rank that froze
or died cannot save on a signal, so the checkpoint has to be there already:

- ``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY=N`` (``N`` > 0; off by default) makes every rank save an HPC checkpoint every
  ``N`` global steps under a scheduler job, into the job's record marked ``periodic``
  (:func:`~lightning_mpi_env.lightning.checkpoints.save_recorded`); no requeue is counted. Rank 0 then keeps the
  job's newest :data:`KEEP` (:func:`pruned`); requeue checkpoints and other jobs' files are never deleted.
- With ``LIGHTNING_MPI_ENV_STATE_DIR`` set, rank 0 writes ``first-step.json`` once per fit, after its first training
  batch (:mod:`lightning_mpi_env.core.progress`): the step reached and the checkpoint resumed, for the supervisor.

Fabric gets neither: its checkpoint and its steps are its loop's own (``docs/preemption.md``, "Fabric").
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from lightning_mpi_env.core.progress import first_step, write_first_step
from lightning_mpi_env.core.schedulers import SchedulerJob, job_identity, scheduler_job
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning.checkpoints import Record

KEEP = 2
"""The job's complete periodic checkpoints kept: the newest, and the one before in case the newest is cut off."""


class Periodic(NamedTuple):
    """Periodic checkpoints of one job."""

    every: int
    """Global steps between two saves."""
    job: SchedulerJob
    """The job whose record holds them."""

    @classmethod
    def plan(cls, every: int, env: Mapping[str, str]) -> Periodic | None:
        """The plan for ``every`` steps; ``None`` when ``every`` is ``0`` or outside a scheduler job.

        Raises:
            JobIdError: A job variable is not in the scheduler's syntax.
        """
        job = scheduler_job(env) if every > 0 else None
        return None if job is None else cls(every, job)

    def due(self, step: int, last: int) -> bool:
        """Whether to save at global ``step``, the last save (or the fit's start) having been at ``last``.

        >>> plan = Periodic(5, None)  # type: ignore[arg-type]
        >>> [step for step in range(13) if plan.due(step, 0)]
        [5, 10]
        >>> plan.due(10, 10)  # gradient accumulation: one global step over several batches, saved once
        False
        """
        return step > last and step % self.every == 0


class PendingFirstStep(NamedTuple):
    """The first-step record rank 0 writes after the fit's first training batch."""

    folder: str
    """``LIGHTNING_MPI_ENV_STATE_DIR``."""
    resumed_from: str | None
    """The checkpoint the fit restored (``trainer.ckpt_path``)."""
    resumed_step: int | None
    """Its global step (the Trainer's when training starts)."""
    job_id: str | None
    """The scheduler's job id."""


class FitProgress(NamedTuple):
    """What the callback keeps over one fit, replaced as a whole after each training batch."""

    periodic: Periodic | None
    """Periodic checkpoints, where asked for under a scheduler job."""
    last_saved: int
    """The global step of the last periodic save, or the fit's first step."""
    first_step: PendingFirstStep | None
    """The record still to write (``None``: written, or none to write)."""

    @classmethod
    def start(cls, trainer: Any, settings: Settings, env: Mapping[str, str]) -> FitProgress:
        """At the start of training (the checkpoint restored): what this fit will save and record.

        Raises:
            JobIdError: A job variable is not in the scheduler's syntax.
        """
        pending = None
        if settings.state_dir and trainer.global_rank == 0:
            resumed = str(trainer.ckpt_path) if trainer.ckpt_path else None
            identity = job_identity(env)
            pending = PendingFirstStep(
                settings.state_dir,
                resumed,
                trainer.global_step if resumed is not None else None,
                None if identity is None else identity[0],
            )
        return cls(Periodic.plan(settings.checkpoint_every, env), trainer.global_step, pending)

    def after_batch(self, trainer: Any) -> FitProgress:
        """After a training batch (every rank): the first-step record, then a periodic checkpoint where due."""
        progress = self
        if progress.first_step is not None:
            pending = progress.first_step
            record = first_step(
                trainer.global_step, pending.resumed_from, pending.resumed_step, time.time(), pending.job_id
            )
            problem = write_first_step(pending.folder, record)
            if problem is not None:
                _say(problem)
            progress = progress._replace(first_step=None)
        if progress.periodic is not None and progress.periodic.due(trainer.global_step, progress.last_saved):
            checkpoint_periodically(trainer, progress.periodic)
            progress = progress._replace(last_saved=trainer.global_step)
        return progress


def checkpoint_periodically(trainer: Any, plan: Periodic) -> None:
    """Save a periodic HPC checkpoint on every rank (at the same step), and keep the job's newest :data:`KEEP`.

    Raises:
        CheckpointError: Rank 0 cannot read the job's record.
    """
    saved = checkpoints.save_recorded(trainer, plan.job, periodic=True)
    if saved.record is None:
        return
    _say(f"saved {saved.path} at step {trainer.global_step} (every {plan.every} steps)")
    record, dropped = pruned(saved.record)
    if not dropped:
        return
    directory = str(trainer.default_root_dir)
    checkpoints.write_record(directory, plan.job, record)  # first: the record never names a file that is gone
    for name in dropped:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        except OSError as error:  # a file we cannot delete costs disk, not the training
            _say(f"could not delete {name}, an older periodic checkpoint of {plan.job} ({error.strerror}).")


def pruned(record: Record, keep: int = KEEP) -> tuple[Record, tuple[str, ...]]:
    """``record`` with its newest ``keep`` complete periodic checkpoints, and the names of the periodic ones dropped.

    Dropped: every periodic checkpoint before the newest kept one that is not kept (older complete ones, and saves
    that never finished). Requeue checkpoints stay, whatever their age.

    >>> from lightning_mpi_env.lightning.checkpoints import Saved
    >>> saved = [Saved(f"hpc_ckpt_{n}.ckpt", 9, 5 * n, periodic=n != 2) for n in (1, 2, 3, 4)]
    >>> record = Record("slurm", "7", ("SLURM_JOB_ID",), None, 0, tuple(saved))
    >>> kept, dropped = pruned(record)
    >>> [item.file for item in kept.saved], dropped
    (['hpc_ckpt_2.ckpt', 'hpc_ckpt_3.ckpt', 'hpc_ckpt_4.ckpt'], ('hpc_ckpt_1.ckpt',))
    """
    complete = [index for index, item in enumerate(record.saved) if item.periodic and item.size is not None]
    if not complete:
        return record, ()
    kept = set(complete[-keep:]) if keep else set()
    newest = complete[-1]
    dropped = {
        index for index, item in enumerate(record.saved) if item.periodic and index < newest and index not in kept
    }
    remaining = tuple(item for index, item in enumerate(record.saved) if index not in dropped)
    return record._replace(saved=remaining), tuple(record.saved[index].file for index in sorted(dropped))


def _say(message: str) -> None:
    # One line on stderr, in one write: several ranks share the launcher's output.
    sys.stderr.write(f"lightning-mpi-env: checkpoint: {message}\n")
    sys.stderr.flush()


__all__ = ["KEEP", "FitProgress", "PendingFirstStep", "Periodic", "checkpoint_periodically", "pruned"]
