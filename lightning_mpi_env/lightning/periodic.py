"""Periodic HPC checkpoints and the first-step record: what a step relaunched inside its allocation resumes from.

A rank that froze or died cannot save on a signal, so ``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY=N`` saves every ``N``
global steps (rank 0 keeps the newest :data:`KEEP`); with a state folder rank 0 writes ``first-step.json``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from lightning_mpi_env.core.records import first_step, write_first_step
from lightning_mpi_env.core.schedulers import SchedulerJob, job_identity, scheduler_job
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning.checkpoints import Record

KEEP = 2
"""The job's complete periodic checkpoints kept: the newest, and the one before in case the newest is cut off."""


class Periodic(NamedTuple):
    """Periodic checkpoints of one job: every ``every`` global steps, into ``job``'s record."""

    every: int
    job: SchedulerJob

    @classmethod
    def plan(cls, every: int, env: Mapping[str, str]) -> Periodic | None:
        """The plan for ``every`` steps; ``None`` when ``every`` is ``0`` or outside a scheduler job."""
        job = scheduler_job(env) if every > 0 else None
        return None if job is None else cls(every, job)

    def due(self, step: int, last: int) -> bool:
        """Whether to save at global ``step``, the last save (or the fit's start) having been at ``last``."""
        return step > last and step % self.every == 0


class PendingFirstStep(NamedTuple):
    """The first-step record rank 0 writes into ``folder`` (the state folder) after the fit's first training batch."""

    folder: str
    resumed_from: str | None
    resumed_step: int | None
    job_id: str | None


class FitProgress(NamedTuple):
    """What the callback keeps over one fit, replaced as a whole after each training batch."""

    periodic: Periodic | None
    last_saved: int
    """The global step of the last periodic save, or the fit's first step."""
    first_step: PendingFirstStep | None
    """The record still to write (``None``: written, or none to write)."""

    @classmethod
    def start(cls, trainer: Any, settings: Settings, env: Mapping[str, str]) -> FitProgress:
        """At the start of training (the checkpoint restored): what this fit will save and record."""
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
    """Save a periodic HPC checkpoint on every rank (at the same step), and keep the job's newest :data:`KEEP`."""
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

    Unfinished saves before the newest kept one go too; requeue checkpoints stay, whatever their age.
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
    sys.stderr.write(f"lightning-mpi-env: checkpoint: {message}\n")
    sys.stderr.flush()
