"""Failure records: what stopped a job step, on which ranks and hosts, as a file a supervisor can read.

When the roll call or the stall watchdog ends a job, the rank that reached the verdict writes one
:class:`FailureRecord` (JSON) into the state folder, ``LIGHTNING_MPI_ENV_STATE_DIR``, which the supervisor
(``lightning-mpi-env run``) sets for the step it launches, one folder per job and step. Without that setting nothing
is written: a program that does not use the supervisor sees no file.

Records are read as :mod:`~lightning_mpi_env.core.state_files` describes, in one place (:func:`read_records`):
anything else is one :class:`~lightning_mpi_env.core.errors.FailureRecordError` naming the file.
"""

from __future__ import annotations

import enum
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from lightning_mpi_env.core.errors import FailureRecordError
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
from lightning_mpi_env.core.values import MAX_WORLD_SIZE, shown

FORMAT = 1
"""The record's format version; a reader refuses any other."""
MAX_RECORD_BYTES = 1 << 20
"""The largest record read: a record is under a KiB, a missing half of a 100,000-rank job under 1 MiB."""
MAX_RECORDS = 4096
"""The most record files read from one folder (one per rank that concluded; a verdict is usually one)."""
MAX_HOSTS = 4096
"""The most hosts one record names."""
MAX_PROBLEM = 16384
"""The longest problem text kept (the verdict's one line)."""
RECORD_NAME = re.compile(r"^failure-rank(\d{1,8})-(\d{1,10})\.json$")
"""The name of a record file: the rank that wrote it and its process id."""
_HOST = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")  # a host name or an IPv4/IPv6 address, as the claims carry it
JOB_ID = re.compile(r"^[A-Za-z0-9._/\[\]-]{1,128}$")
"""A scheduler's job id as the state folder's records carry it: ``4242``, ``4242.pbs01``, ``77/3``, ``12[3]``."""
_LAUNCHER = re.compile(r"^[A-Za-z0-9 ._()/-]{1,64}$")  # "Slurm srun", "MPICH/Intel MPI (Hydra)"


class FailureKind(str, enum.Enum):
    """What stopped the step (the record's ``kind``)."""

    MISSING = "missing"
    DUPLICATE = "duplicate"
    MISMATCH = "mismatch"
    STALLED = "stalled"
    FROZEN = "frozen"
    STORE_UNREACHABLE = "store_unreachable"
    DIED = "died"


class KindRow(NamedTuple):
    """One kind of failure: what it means, and whether its hosts are to blame."""

    kind: FailureKind
    meaning: str
    blames_hosts: bool
    """A relaunch leaves the named hosts out. False where the launch itself is wrong (a duplicate or disagreeing
    rank): another host would fail the same way."""


KINDS: tuple[KindRow, ...] = (
    KindRow(FailureKind.MISSING, "ranks never arrived at the roll call", True),
    KindRow(FailureKind.DUPLICATE, "one rank claimed by two processes", False),
    KindRow(FailureKind.MISMATCH, "ranks disagree on the launch (world size, devices, versions, placement)", False),
    KindRow(FailureKind.STALLED, "ranks stopped making progress, alive", True),
    KindRow(FailureKind.FROZEN, "ranks stopped making progress and their watchdog fell silent", True),
    KindRow(FailureKind.STORE_UNREACHABLE, "rank 0's store (the main address) stopped answering", True),
    KindRow(FailureKind.DIED, "the step ended with no record (seen by the supervisor from the launcher's exit)", True),
)
"""Every kind of failure, one row each; a test keeps it equal to :class:`FailureKind`."""

BLAMES_HOSTS = {row.kind: row.blames_hosts for row in KINDS}


class Fault(NamedTuple):
    """What a verdict found, as the rank that reached it knows it."""

    kind: FailureKind
    ranks: tuple[int, ...] = ()
    """The ranks at fault (missing, stalled, frozen, duplicated, disagreeing); empty where none is one rank's."""
    hosts: tuple[str, ...] = ()
    """Their hosts, where known: what a relaunch leaves out when the kind :attr:`KindRow.blames_hosts`."""
    step: int | None = None
    """The training step the others reached, where the loop marks steps."""


@dataclass(frozen=True)
class FailureRecord:
    """One failure of one job step, as written to the state folder."""

    kind: FailureKind
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    when: float
    """Wall-clock seconds (Unix time) when the verdict was reached."""
    step: int | None
    """The training step the job reached; ``None`` before training, or where the loop marks none."""
    launcher: str
    """The launcher's name (``"srun"``, ``"Open MPI"``), or ``"no launcher"``."""
    job_id: str | None
    """The scheduler's job id, where the job runs under one."""
    written_by: int
    """The rank that wrote the record."""
    problem: str
    """The verdict, as every rank showed it (one line)."""
    format: int = field(default=FORMAT)

    @property
    def blames_hosts(self) -> bool:
        """Whether a relaunch should leave :attr:`hosts` out (see :data:`KINDS`)."""
        return BLAMES_HOSTS[self.kind]

    def to_json(self) -> str:
        """The record as written: one JSON object."""
        data = {
            "format": self.format,
            "kind": self.kind.value,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "when": self.when,
            "step": self.step,
            "launcher": self.launcher,
            "job_id": self.job_id,
            "written_by": self.written_by,
            "problem": self.problem,
        }
        return json.dumps(data, separators=(",", ":"))

    def __repr__(self) -> str:
        hosts = ",".join(self.hosts) or "-"
        return (
            f"FailureRecord({self.kind.value}, ranks={list(self.ranks)}, hosts={hosts}, step={self.step}, "
            f"job={self.job_id}, by rank {self.written_by}, from={self.launcher})"
        )


_FIELDS = ("format", "kind", "ranks", "hosts", "when", "step", "launcher", "job_id", "written_by", "problem")


def parse_record(raw: bytes | str, source: str) -> FailureRecord:
    """The record in ``raw`` (a file's bytes), checked field by field.

    Args:
        raw: The file's content.
        source: Where it came from (a path), for the error.

    Raises:
        FailureRecordError: Naming ``source`` and what is wrong with it.

    >>> text = FailureRecord(FailureKind.FROZEN, (3,), ("node2",), 1.0, 10, "srun", "42", 0, "Rank 3 stalled").to_json()
    >>> parse_record(text, "f.json")
    FailureRecord(frozen, ranks=[3], hosts=node2, step=10, job=42, by rank 0, from=srun)
    >>> parse_record('{"format": 1, "kind": "bored"}', "f.json")
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.errors.FailureRecordError: The failure record f.json is malformed: kind='bored' is not one of missing, duplicate, mismatch, stalled, frozen, store_unreachable, died.
    HINT: Delete the file; it was not written by this version of lightning-mpi-env's roll call or watchdog.
    """  # noqa: E501
    try:
        return _record(load_json(raw, MAX_RECORD_BYTES))
    except FieldError as error:
        raise _malformed(source, str(error)) from None


def _record(value: object) -> FailureRecord:
    data = versioned_object(value, FORMAT)
    kinds = {kind.value: kind for kind in FailureKind}
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise FieldError(f"kind={shown(str(kind))} is not one of {', '.join(kinds)}")
    exact_fields(data, _FIELDS)
    return FailureRecord(
        kind=kinds[kind],
        ranks=tuple(whole_number(rank, "ranks", MAX_WORLD_SIZE - 1) for rank in _list(data["ranks"], "ranks")),
        hosts=tuple(_matching(host, "hosts", _HOST) for host in _list(data["hosts"], "hosts", MAX_HOSTS)),
        when=seconds(data["when"]),
        step=None if data["step"] is None else whole_number(data["step"], "step", MAX_STEP),
        launcher=_matching(data["launcher"], "launcher", _LAUNCHER),
        job_id=None if data["job_id"] is None else _matching(data["job_id"], "job_id", JOB_ID),
        written_by=whole_number(data["written_by"], "written_by", MAX_WORLD_SIZE - 1),
        problem=_text(data["problem"], "problem"),
    )


def _list(value: object, name: str, limit: int = MAX_WORLD_SIZE) -> list[object]:
    if not isinstance(value, list):
        raise FieldError(f"{name} is {type(value).__name__}, not a list")
    if len(value) > limit:
        raise FieldError(f"{name} holds {len(value)} items (at most {limit})")
    return value


def _matching(value: object, name: str, form: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not form.match(value):
        raise FieldError(f"{name} holds {shown(str(value))}, which is not a {name.rstrip('s')} name")
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_PROBLEM:
        raise FieldError(f"{name} is not a text of at most {MAX_PROBLEM} characters")
    return value


def _malformed(source: str, reason: str) -> FailureRecordError:
    return FailureRecordError(
        f"The failure record {source} is malformed: {reason}.",
        "Delete the file; it was not written by this version of lightning-mpi-env's roll call or watchdog.",
        value=source,
    )


def read_records(folder: str) -> list[FailureRecord]:
    """Every failure record in ``folder``, oldest first; none where the folder does not exist.

    Only files named like a record (:data:`RECORD_NAME`) are read, at most :data:`MAX_RECORDS` of them; other files
    are left alone.

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
    records = [parse_record(_read_capped(os.path.join(folder, name)), os.path.join(folder, name)) for name in names]
    return sorted(records, key=lambda record: record.when)


def _read_capped(path: str) -> bytes:
    try:
        return read_capped(path, MAX_RECORD_BYTES)
    except OSError as error:
        raise _malformed(path, unreadable(error)) from error


@dataclass(frozen=True)
class FailureRecorder:
    """Writes this job's failure records into the state folder; built only where the setting names one.

    Args:
        folder: ``LIGHTNING_MPI_ENV_STATE_DIR``.
        launcher: The launcher's name.
        job_id: The scheduler's job id, where there is one.
    """

    folder: str
    launcher: str
    job_id: str | None

    @classmethod
    def plan(cls, folder: str, launcher: str, job_id: str | None) -> FailureRecorder | None:
        """A recorder for ``folder``; ``None`` where it is empty (the setting is unset: nothing is written)."""
        if not folder:
            return None
        shown_id = job_id if job_id is not None and JOB_ID.match(job_id) else None
        return cls(folder, launcher if _LAUNCHER.match(launcher) else "unknown", shown_id)

    def record(self, fault: Fault, *, problem: str, written_by: int, when: float | None = None) -> FailureRecord:
        """The record of ``fault``, as :meth:`write` writes it (hosts that are no host names are left out)."""
        hosts = tuple(dict.fromkeys(host for host in fault.hosts if _HOST.match(host)))[:MAX_HOSTS]
        return FailureRecord(
            kind=fault.kind,
            ranks=tuple(sorted(set(fault.ranks))),
            hosts=hosts,
            when=time.time() if when is None else when,
            step=fault.step,
            launcher=self.launcher,
            job_id=self.job_id,
            written_by=written_by,
            problem=" ".join(problem.split())[:MAX_PROBLEM],
        )

    def write(self, fault: Fault, *, problem: str, written_by: int) -> str | None:
        """Write the record of ``fault`` (atomically: a reader sees all of it or nothing); its path.

        A record that cannot be written must not hide the failure it records: the reason is returned as one line
        for the caller to print, never raised. Returns ``None`` when written.
        """
        record = self.record(fault, problem=problem, written_by=written_by)
        name = f"failure-rank{written_by}-{os.getpid()}.json"
        try:
            write_whole(self.folder, name, record.to_json())
        except OSError as error:
            return (
                f"lightning-mpi-env: could not write the failure record {name} into {self.folder} "
                f"({type(error).__name__}: {error.strerror or error})."
            )
        return None


def hosts_of(ranks: Iterable[int], host_of: Mapping[int, str]) -> tuple[str, ...]:
    """The hosts of ``ranks`` that ``host_of`` knows, in rank order, each once.

    >>> hosts_of([3, 2, 5], {2: "node1", 3: "node1", 4: "node2"})
    ('node1',)
    """
    return tuple(dict.fromkeys(host_of[rank] for rank in sorted(ranks) if rank in host_of))


def summary(records: Sequence[FailureRecord]) -> str:
    """One line for a step's records: the kinds, ranks and hosts named.

    >>> r = FailureRecord(FailureKind.MISSING, (2, 3), ("node2",), 1.0, None, "srun", "7", 0, "...")
    >>> summary([r, r])
    'missing: ranks [2, 3] on node2'
    """
    seen = dict.fromkeys(f"{r.kind.value}: ranks {list(r.ranks)} on {','.join(r.hosts) or '?'}" for r in records)
    return "; ".join(seen)


__all__ = [
    "BLAMES_HOSTS",
    "FORMAT",
    "JOB_ID",
    "KINDS",
    "MAX_HOSTS",
    "MAX_RECORDS",
    "MAX_RECORD_BYTES",
    "RECORD_NAME",
    "FailureKind",
    "FailureRecord",
    "FailureRecorder",
    "Fault",
    "KindRow",
    "hosts_of",
    "parse_record",
    "read_records",
    "summary",
]
