"""Progress records: how far a job step got, as a file the supervisor (``lightning-mpi-env run``) reads.

With ``LIGHTNING_MPI_ENV_STATE_DIR`` set (the supervisor sets one folder per job and step), rank 0 of a Trainer job
writes :data:`FIRST_STEP` once, after the first training batch of the fit: the global step it reached, and the
checkpoint the fit resumed from with its step (:class:`FirstStep`). Without the setting nothing is written.

The record is read as :mod:`~lightning_mpi_env.core.state_files` describes (:func:`read_first_step`): anything else
is one :class:`~lightning_mpi_env.core.errors.ProgressRecordError` naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from lightning_mpi_env.core.errors import ProgressRecordError
from lightning_mpi_env.core.failures import JOB_ID
from lightning_mpi_env.core.state_files import (
    MAX_STEP,
    FieldError,
    exact_fields,
    load_json,
    read_capped,
    seconds,
    unreadable,
    versioned_object,
    whole_number,
    write_whole,
)
from lightning_mpi_env.core.values import shown

FORMAT = 1
"""The record's format version; a reader refuses any other."""
FIRST_STEP = "first-step.json"
"""The file name of the first-step record in the state folder."""
MAX_RECORD_BYTES = 1 << 16
"""The largest record read (one is under 300 bytes)."""
MAX_NAME = 255
"""The longest checkpoint file name believed (Linux's ``NAME_MAX``)."""
_FIELDS = ("format", "step", "resumed_from", "resumed_step", "when", "job_id")


@dataclass(frozen=True)
class FirstStep:
    """The first training batch of a job step's fit, as rank 0 saw it once that batch finished."""

    step: int
    """The global step after that batch (``resumed_step + 1`` after a resume, ``1`` on a fresh start)."""
    resumed_from: str | None
    """The file name of the checkpoint the fit resumed from (``hpc_ckpt_3.ckpt``); ``None``: a fresh start."""
    resumed_step: int | None
    """The global step of that checkpoint; ``None`` with :attr:`resumed_from`."""
    when: float
    """Wall-clock seconds (Unix time) when the batch finished."""
    job_id: str | None = None
    """The scheduler's job id, where the job runs under one."""
    format: int = field(default=FORMAT)

    def to_json(self) -> str:
        """The record as written: one JSON object."""
        data = {
            "format": self.format,
            "step": self.step,
            "resumed_from": self.resumed_from,
            "resumed_step": self.resumed_step,
            "when": self.when,
            "job_id": self.job_id,
        }
        return json.dumps(data, separators=(",", ":"))


def first_step(
    step: int, resumed_from: str | None, resumed_step: int | None, when: float, job_id: str | None
) -> FirstStep:
    """The record to write: ``resumed_from`` cut to its file name; a job id not in any scheduler's syntax left out.

    >>> first_step(11, "/runs/7/hpc_ckpt_2.ckpt", 10, 5.0, "7")
    FirstStep(step=11, resumed_from='hpc_ckpt_2.ckpt', resumed_step=10, when=5.0, job_id='7', format=1)
    """
    name = None if resumed_from is None else os.path.basename(resumed_from)
    return FirstStep(
        step=step,
        resumed_from=name,
        resumed_step=None if name is None else resumed_step,
        when=when,
        job_id=job_id if job_id is not None and JOB_ID.match(job_id) else None,
    )


def write_first_step(folder: str, record: FirstStep) -> str | None:
    """Write ``record`` as ``folder/first-step.json``, atomically (``mkstemp`` + ``os.replace``).

    A record that cannot be written must not end the training: the reason is returned as one line for the caller to
    print, never raised. Returns ``None`` when written.
    """
    try:
        write_whole(folder, FIRST_STEP, record.to_json())
    except OSError as error:
        return (
            f"lightning-mpi-env: could not write the progress record {FIRST_STEP} into {folder} "
            f"({type(error).__name__}: {error.strerror or error})."
        )
    return None


def read_first_step(folder: str) -> FirstStep | None:
    """The first-step record of the step whose state folder is ``folder``; ``None`` where there is none (yet).

    Raises:
        ProgressRecordError: The record is not a regular file, is too long, or is malformed; or the folder cannot be
            read.
    """
    path = os.path.join(folder, FIRST_STEP)
    try:
        raw = read_capped(path, MAX_RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise _malformed(path, unreadable(error)) from error
    return parse_first_step(raw, path)


def parse_first_step(raw: bytes | str, source: str) -> FirstStep:
    """The record in ``raw`` (a file's bytes), checked field by field.

    Raises:
        ProgressRecordError: Naming ``source`` and what is wrong with it.

    >>> parse_first_step(first_step(11, "hpc_ckpt_2.ckpt", 10, 5.0, "7").to_json(), "f.json").resumed_step
    10
    >>> parse_first_step('{"format": 1, "step": -1}', "f.json")
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.errors.ProgressRecordError: The progress record f.json is malformed: fields ['resumed_from', 'resumed_step', 'when', 'job_id'] are missing.
    HINT: Delete the file; it was not written by this version of lightning-mpi-env's callback.
    """  # noqa: E501
    try:
        return _record(load_json(raw, MAX_RECORD_BYTES))
    except FieldError as error:
        raise _malformed(source, str(error)) from None


def _record(value: object) -> FirstStep:
    data = versioned_object(value, FORMAT)
    exact_fields(data, _FIELDS)
    step = whole_number(data["step"], "step", MAX_STEP)
    if (data["resumed_from"] is None) != (data["resumed_step"] is None):
        raise FieldError("resumed_from and resumed_step are not both set or both null")
    resumed_from, resumed_step = None, None
    if data["resumed_from"] is not None:
        resumed_from = _file_name(data["resumed_from"])
        resumed_step = whole_number(data["resumed_step"], "resumed_step", MAX_STEP)
        if resumed_step > step:
            raise FieldError(f"resumed_step {resumed_step} is past step {step}")
    job_id = data["job_id"]
    if job_id is not None and not (isinstance(job_id, str) and JOB_ID.match(job_id)):
        raise FieldError(f"job_id holds {shown(str(job_id))}, which is not a job id")
    return FirstStep(step, resumed_from, resumed_step, seconds(data["when"]), job_id)


def _file_name(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_NAME
        or value in (".", "..")
        or any(character == "/" or ord(character) < 32 or ord(character) == 127 for character in value)
    ):
        raise FieldError(f"resumed_from holds {shown(str(value))}, which is not a file name")
    return value


def _malformed(source: str, reason: str) -> ProgressRecordError:
    return ProgressRecordError(
        f"The progress record {source} is malformed: {reason}.",
        "Delete the file; it was not written by this version of lightning-mpi-env's callback.",
        value=source,
    )


__all__ = [
    "FIRST_STEP",
    "FORMAT",
    "MAX_RECORD_BYTES",
    "FirstStep",
    "first_step",
    "parse_first_step",
    "read_first_step",
    "write_first_step",
]
