"""Progress records: how far a job step got, as a file the supervisor (``lightning-mpi-env run``) reads.

With ``LIGHTNING_MPI_ENV_STATE_DIR`` set (the supervisor sets one folder per job and step), rank 0 of a Trainer job
writes :data:`FIRST_STEP` once, after the first training batch of the fit: the global step it reached, and the
checkpoint the fit resumed from with its step. A relaunched step that says ``resumed_step: 10`` resumed from its
job's step-10 checkpoint; ``null``: it started afresh. Without the setting nothing is written.

Written by other processes on a shared file system, the file is read here only, bounded and checked
(:func:`read_first_step`): a regular file, at most :data:`MAX_RECORD_BYTES`, every field's type and range; anything
else is one :class:`~lightning_mpi_env.core.errors.ProgressRecordError` naming the file. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field

from lightning_mpi_env.core.errors import ProgressRecordError
from lightning_mpi_env.core.failures import JOB_ID
from lightning_mpi_env.core.values import shown

FORMAT = 1
"""The record's format version; a reader refuses any other."""
FIRST_STEP = "first-step.json"
"""The file name of the first-step record in the state folder."""
MAX_RECORD_BYTES = 1 << 16
"""The largest record read (one is under 300 bytes)."""
MAX_STEP = (1 << 63) - 1
"""The largest step believed."""
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
        os.makedirs(folder, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=".first-step-", dir=folder)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(record.to_json())
            os.replace(temporary, os.path.join(folder, FIRST_STEP))
        except BaseException:
            os.unlink(temporary)
            raise
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
        # O_NONBLOCK: a FIFO put there would block the open; fstat refuses it before any read.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise _malformed(path, f"it cannot be opened ({error.strerror})") from error
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise _malformed(path, "it is not a regular file")
    with os.fdopen(descriptor, "rb") as file:
        raw = file.read(MAX_RECORD_BYTES + 1)
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
    if len(raw) > MAX_RECORD_BYTES:
        raise _malformed(source, f"it is more than {MAX_RECORD_BYTES} bytes long")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except _Invalid as error:
        raise _malformed(source, str(error)) from None
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _malformed(source, f"it is not JSON ({type(error).__name__})") from None
    try:
        return _record(data)
    except _Invalid as error:
        raise _malformed(source, str(error)) from None


class _Invalid(ValueError):
    """One field's problem, for :func:`parse_first_step` to name with the file."""


def _no_constant(name: str) -> object:
    raise _Invalid(f"{name} is not a number")


def _record(data: object) -> FirstStep:
    if not isinstance(data, dict):
        raise _Invalid(f"it holds {type(data).__name__}, not an object")
    if data.get("format") != FORMAT:
        raise _Invalid(f"format={shown(str(data.get('format')))} is not {FORMAT}")
    unknown = sorted(set(data) - set(_FIELDS))
    missing = [name for name in _FIELDS if name not in data]
    if unknown or missing:
        raise _Invalid(f"fields {unknown or missing} are {'unknown' if unknown else 'missing'}")
    step = _step(data["step"], "step")
    resumed_from, resumed_step = data["resumed_from"], data["resumed_step"]
    if (resumed_from is None) != (resumed_step is None):
        raise _Invalid("resumed_from and resumed_step are not both set or both null")
    if resumed_from is not None:
        resumed_from, resumed_step = _file_name(resumed_from), _step(resumed_step, "resumed_step")
        if resumed_step > step:
            raise _Invalid(f"resumed_step {resumed_step} is past step {step}")
    job_id = data["job_id"]
    if job_id is not None and not (isinstance(job_id, str) and JOB_ID.match(job_id)):
        raise _Invalid(f"job_id holds {shown(str(job_id))}, which is not a job id")
    return FirstStep(step, resumed_from, resumed_step, _time(data["when"]), job_id)


def _step(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        raise _Invalid(f"{name} holds {shown(str(value))}, not a whole number from 0 to {MAX_STEP}")
    return value


def _file_name(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_NAME
        or value in (".", "..")
        or any(character == "/" or ord(character) < 32 or ord(character) == 127 for character in value)
    ):
        raise _Invalid(f"resumed_from holds {shown(str(value))}, which is not a file name")
    return value


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise _Invalid(f"when holds {shown(str(value))}, not a time in seconds")
    return float(value)


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
