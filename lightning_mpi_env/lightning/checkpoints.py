"""Which HPC checkpoint a requeued job resumes from: its own, complete, newest one, told by the job's record.

Lightning's file name (``hpc_ckpt_<n>.ckpt``) says neither which job saved it nor whether the save finished, so each
job keeps a record beside them: its identity, its requeue count, and each checkpoint, pending and then with its size.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from lightning_mpi_env.core.errors import CheckpointError, CheckpointWarning
from lightning_mpi_env.core.schedulers import SCHEDULERS_BY_KEY, SchedulerJob, describe_job
from lightning_mpi_env.core.state_files import load_json, read_capped, write_whole
from lightning_mpi_env.lightning.compat import HPC_CHECKPOINT, hpc_checkpoint_name

RECORDS = ".lightning-mpi-env"
"""The records' folder in ``default_root_dir``; no ``hpc_ckpt_`` in it: Lightning's resume reads every such name."""
MAX_DIGITS = 9
"""The most digits of a checkpoint number this package reads or writes; longer names are not its checkpoints."""
MAX_RECORD_BYTES = 1 << 20
MAX_ENTRIES = 100_000
FORMAT = 1


class Saved(NamedTuple):
    """One checkpoint in a job's record: file name, size (``None`` while pending), global step, periodic or not."""

    file: str
    size: int | None
    step: int
    periodic: bool = False


class Record(NamedTuple):
    """What a job saved in one ``default_root_dir`` (oldest first), and how often this package requeued it."""

    scheduler: str
    job: str
    """The job's identity (``123``; ``77/3`` for an array task)."""
    variables: tuple[str, ...]
    name: str | None
    """The job as its scheduler's requeue command names it (a Slurm array task ``36_1``, an LSF element ``7[3]``)."""
    requeues: int
    saved: tuple[Saved, ...]

    @classmethod
    def new(cls, job: SchedulerJob) -> Record:
        """An empty record for ``job``."""
        return cls(job.scheduler.key, job.identity, job.variables, job.requeue_name, 0, ())

    def owner(self) -> str:
        """The job in words, as errors name it (``Slurm job 123``, ``SGE job 77 task 3``)."""
        row = SCHEDULERS_BY_KEY.get(self.scheduler)
        return describe_job(row.name if row is not None else self.scheduler, self.job)


def checkpoint_number(name: str) -> int | None:
    """The number of an HPC checkpoint's file name (ASCII digits, at most :data:`MAX_DIGITS`); ``None`` otherwise."""
    match = HPC_CHECKPOINT.match(name)
    return int(match.group(1)) if match and len(match.group(1)) <= MAX_DIGITS else None


def record_path(directory: str, job: SchedulerJob) -> str:
    """Where ``job``'s record is: ``<directory>/.lightning-mpi-env/<scheduler>-<job>.json`` (a safe name by syntax)."""
    return os.path.join(directory, RECORDS, f"{job.key}.json")


def read_record(directory: str, job: SchedulerJob) -> Record:
    """``job``'s record in ``directory``, empty where there is none; a ``CheckpointError`` where it cannot be read."""
    path = record_path(directory, job)
    try:
        record = _read(path)
    except FileNotFoundError:
        return Record.new(job)
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"The requeue record {path} of {job} cannot be read: {error}.",
            "Restore it, or delete it to start the job's requeue count and checkpoints afresh.",
            variable="default_root_dir",
            value=directory,
            launcher=job.scheduler.name,
        ) from error
    if (record.scheduler, record.job) != (job.scheduler.key, job.identity):
        raise CheckpointError(
            f"The requeue record {path} belongs to {record.owner()}, not to {job}.",
            "Delete it; it was copied or renamed from another job.",
            variable="default_root_dir",
            value=directory,
            launcher=job.scheduler.name,
        )
    return record


def write_record(directory: str, job: SchedulerJob, record: Record) -> None:
    """Write ``job``'s record whole (a temporary file, then ``os.replace``): a reader sees the old or the new one."""
    path = record_path(directory, job)
    data = {
        "format": FORMAT,
        "scheduler": record.scheduler,
        "job": record.job,
        "variables": list(record.variables),
        "name": record.name,
        "requeues": record.requeues,
        "saved": [
            {"file": item.file, "size": item.size, "step": item.step, "periodic": item.periodic}
            for item in record.saved
        ],
    }
    write_whole(os.path.dirname(path), os.path.basename(path), json.dumps(data))


def reserve_next(directory: str) -> str:
    """Create, empty, the HPC checkpoint after the highest in ``directory``, returning its name (``O_EXCL``: unique)."""
    os.makedirs(directory, exist_ok=True)
    number = max((n for name in names(directory) if (n := checkpoint_number(name)) is not None), default=0) + 1
    for candidate in range(number, number + 1000):
        name = hpc_checkpoint_name(candidate)
        try:
            os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue  # another job took it a moment ago
        return name
    raise CheckpointError(
        f"No free HPC checkpoint name in {directory} from {hpc_checkpoint_name(number)} on.",
        "Give each job its own default_root_dir.",
        variable="default_root_dir",
        value=directory,
    )


def resumable(directory: str, record: Record, *, report: bool = True) -> str | None:
    """The newest checkpoint of ``record`` that finished and checks out, or ``None``; newer ones warn if ``report``."""
    for item in reversed(record.saved):
        path = os.path.join(directory, item.file)
        problem = _problem(path, item)
        if problem is None:
            return path
        if not report:
            continue
        warnings.warn(
            CheckpointWarning(
                f"{record.owner()}: the checkpoint {path} is skipped: {problem}.",
                "An older checkpoint of this job is used where there is one. A save cut off by the scheduler's kill "
                "leaves such a file: give the job more time between its warning signal and its kill.",
                variable="default_root_dir",
                value=directory,
                launcher=record.scheduler,
            ),
            stacklevel=3,  # the caller of hpc_checkpoint()
        )
    return None


class Checkpointed(NamedTuple):
    """One checkpoint :func:`save_recorded` saved: its path, the same on every rank."""

    path: str
    requeues: int
    """The job's requeue count before this save (rank 0's, on every rank)."""
    record: Record | None
    """Rank 0: the job's record as written; ``None`` on the other ranks."""


def save_recorded(
    trainer: Any, job: SchedulerJob, *, periodic: bool = False, finish: Callable[[Record], Record] | None = None
) -> Checkpointed:
    """Save an HPC checkpoint and record it in ``job``'s record; every rank calls this at the same step.

    Rank 0 records it as pending before the save, and finished after every rank's save and a barrier, applying
    ``finish`` last. No collective follows the barrier: a requeued job's ranks may be ended from there on.
    """
    directory = str(trainer.default_root_dir)
    record = read_record(directory, job) if trainer.global_rank == 0 else None
    decided = None
    if record is not None:
        name = reserve_next(directory)
        record = record._replace(saved=(*record.saved, Saved(name, None, trainer.global_step, periodic)))
        write_record(directory, job, record)
        decided = (os.path.join(directory, name), record.requeues)
    path, requeues = trainer.strategy.broadcast(decided, src=0)  # one name and one count on every rank
    trainer.save_checkpoint(path)
    trainer.strategy.barrier("lightning_mpi_env.lightning.checkpoints.saved")
    if record is None:
        return Checkpointed(path, requeues, None)
    finished = Saved(os.path.basename(path), os.path.getsize(path), trainer.global_step, periodic)
    record = record._replace(saved=(*record.saved[:-1], finished))
    if finish is not None:
        record = finish(record)
    write_record(directory, job, record)
    return Checkpointed(path, requeues, record)


def owner_of(directory: str, name: str) -> str | None:
    """The job whose record lists the checkpoint ``name`` in ``directory``, in words; ``None``: no record does."""
    for record in _records(directory):
        if any(item.file == name for item in record.saved):
            return record.owner()
    return None


def _problem(path: str, item: Saved) -> str | None:
    try:
        info = os.stat(path)
    except OSError as error:
        return f"it cannot be read ({error.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_size == 0:
        return "it is empty" + (" (its save never finished)" if item.size is None else "")
    if item.size is None:
        return "its save never finished"
    if info.st_size != item.size:
        return f"it has {info.st_size} bytes, where the job saved {item.size}"
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as error:
        return f"it cannot be read ({error.strerror})"
    return None


def names(directory: str) -> Iterator[str]:
    """The names in ``directory`` (at most :data:`MAX_ENTRIES`; none where it cannot be listed)."""
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    return
                yield entry.name
    except OSError:
        return


def _records(directory: str) -> Iterator[Record]:
    folder = os.path.join(directory, RECORDS)
    for name in names(folder):
        if name.endswith(".json"):
            try:
                yield _read(os.path.join(folder, name))
            except (OSError, ValueError):
                continue  # another job's record we cannot read names no owner


def _read(path: str) -> Record:
    # Regular files only, at most MAX_RECORD_BYTES: a link, a FIFO or a huge file in its place is an error, not a hang.
    return _parse(load_json(read_capped(path, MAX_RECORD_BYTES, follow_links=False), MAX_RECORD_BYTES))


def _parse(data: Any) -> Record:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a requeue record of format {FORMAT}")
    scheduler, job, variables, name, requeues, saved = (
        data.get(key) for key in ("scheduler", "job", "variables", "name", "requeues", "saved")
    )
    if not (isinstance(scheduler, str) and isinstance(job, str) and isinstance(variables, list)):
        raise ValueError("no scheduler, job or variables")
    if not (name is None or isinstance(name, str)):
        raise ValueError("a job name that is not text")
    if not (isinstance(requeues, int) and requeues >= 0 and isinstance(saved, list)):
        raise ValueError("no requeue count or checkpoints")
    return Record(scheduler, job, tuple(map(str, variables)), name, requeues, tuple(map(_parse_saved, saved)))


def _parse_saved(item: Any) -> Saved:
    if not isinstance(item, dict):
        raise ValueError("a checkpoint that is not an object")
    file, size, step, periodic = item.get("file"), item.get("size"), item.get("step"), item.get("periodic", False)
    if not (isinstance(file, str) and checkpoint_number(file) is not None):
        raise ValueError(f"a checkpoint named {file!r}, not hpc_ckpt_<n>.ckpt")
    if not ((size is None or (isinstance(size, int) and size >= 0)) and isinstance(step, int)):
        raise ValueError(f"{file}: a size or step that is not a count")
    if not isinstance(periodic, bool):  # absent in records of older versions: a requeue's checkpoint
        raise ValueError(f"{file}: periodic is not true or false")
    return Saved(file, size, step, periodic)
