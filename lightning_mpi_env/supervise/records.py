"""The supervisor's reading of a step's records (:mod:`~lightning_mpi_env.core.records`), bounded."""

from __future__ import annotations

import os

from lightning_mpi_env.core.errors import FailureRecordError
from lightning_mpi_env.core.records import (
    FAILURES,
    FIRST_STEP,
    PROGRESS,
    RECORD_NAME,
    STRAGGLERS,
    STRAGGLING,
    FailureRecord,
    FirstStep,
    Schema,
    StragglerRecord,
    malformed,
    parse_first_step,
    parse_record,
    parse_stragglers,
)
from lightning_mpi_env.core.state_files import read_capped, unreadable

MAX_RECORDS = 4096
"""The most failure records read from one folder."""


def read_records(folder: str) -> list[FailureRecord]:
    """Every failure record in ``folder`` (other files are ignored), oldest first; none where it does not exist.

    Raises:
        FailureRecordError: A record that is not a regular file, is too long, or is malformed, or too many records.
    """
    try:
        names = sorted(name for name in os.listdir(folder) if RECORD_NAME.match(name))
    except FileNotFoundError:
        return []
    except OSError as error:
        raise FailureRecordError(
            f"The state folder {folder} cannot be listed ({type(error).__name__}: {error.strerror}).",
            "Make it readable by the supervisor, or set LIGHTNING_MPI_ENV_STATE_DIR to another folder.",
            value=folder,
        ) from error
    if len(names) > MAX_RECORDS:
        raise FailureRecordError(
            f"The state folder {folder} holds {len(names)} failure records (at most {MAX_RECORDS} are read).",
            "Empty the folder: each step's records go to a folder of its own.",
            value=folder,
        )
    records = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            raw = read_capped(path, FAILURES.max_bytes)
        except OSError as error:
            raise malformed(FAILURES, path, unreadable(error)) from error
        records.append(parse_record(raw, path))
    return sorted(records, key=lambda record: record.when)


def read_first_step(folder: str) -> FirstStep | None:
    """The first-step record of the step whose state folder is ``folder``; ``None`` where there is none (yet).

    Raises:
        ProgressRecordError: The record is not a regular file, is too long, or is malformed.
    """
    raw = _read(os.path.join(folder, FIRST_STEP), PROGRESS)
    return None if raw is None else parse_first_step(raw, os.path.join(folder, FIRST_STEP))


def read_stragglers(folder: str) -> StragglerRecord | None:
    """The straggler record of the step whose state folder is ``folder``; ``None`` where no rank was named (yet).

    Raises:
        ProgressRecordError: The record is not a regular file, is too long, or is malformed.
    """
    raw = _read(os.path.join(folder, STRAGGLERS), STRAGGLING)
    return None if raw is None else parse_stragglers(raw, os.path.join(folder, STRAGGLERS))


def _read(path: str, schema: Schema) -> bytes | None:
    """The bytes of the record at ``path`` (at most the schema's); ``None`` where it does not exist."""
    try:
        return read_capped(path, schema.max_bytes)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise malformed(schema, path, unreadable(error)) from error
