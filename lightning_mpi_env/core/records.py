"""The records a job step's ranks leave in ``LIGHTNING_MPI_ENV_STATE_DIR`` for the supervisor: one JSON object each."""

from __future__ import annotations

import enum
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import NamedTuple, TypeVar

from lightning_mpi_env.core.errors import FailureRecordError, MpiEnvError, ProgressRecordError
from lightning_mpi_env.core.state_files import (
    MAX_STEP,
    FieldError,
    exact_fields,
    load_json,
    seconds,
    versioned_object,
    whole_number,
    write_whole,
)
from lightning_mpi_env.core.values import MAX_FACTOR, MAX_WORLD_SIZE, shown

FORMAT = 1
"""The records' format version; a reader refuses any other."""
MAX_RECORD_BYTES = 1 << 20
"""The largest failure record read: room for the missing half of a 100,000-rank job."""
MAX_FIRST_STEP_BYTES = 1 << 16
MAX_HOSTS = 4096
MAX_PROBLEM = 16384
MAX_NAME = 255  # the longest checkpoint file name believed (Linux's NAME_MAX)
RECORD_NAME = re.compile(r"^failure-rank(\d{1,8})-(\d{1,10})\.json$")
"""The name of a failure record's file: the rank that wrote it and its process id."""
FIRST_STEP = "first-step.json"
STRAGGLERS = "stragglers.json"
MAX_STRAGGLERS = 1024
"""The most ranks a straggler record names: the slowest (a record stays small whatever the job's size)."""
JOB_ID = re.compile(r"^[A-Za-z0-9._/\[\]-]{1,128}$")
"""A scheduler's job id as the records carry it: ``4242``, ``4242.pbs01``, ``77/3``, ``12[3]``."""
_HOST = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")  # a host name or an IPv4/IPv6 address, as the claims carry it
_LAUNCHER = re.compile(r"^[A-Za-z0-9 ._()/-]{1,64}$")  # "Slurm srun", "MPICH/Intel MPI (Hydra)"


class FailureKind(str, enum.Enum):
    """What stopped the step (the record's ``kind``)."""

    MISSING = "missing"
    """Ranks never arrived at the roll call."""
    DUPLICATE = "duplicate"
    """One rank claimed by two processes."""
    MISMATCH = "mismatch"
    """Ranks disagree on the launch (world size, devices, versions, placement)."""
    STALLED = "stalled"
    """Ranks stopped making progress, alive."""
    FROZEN = "frozen"
    """Ranks stopped making progress and their watchdog fell silent."""
    STORE_UNREACHABLE = "store_unreachable"
    """Rank 0's store (the main address) stopped answering."""
    DIED = "died"
    """The step ended with no record: the supervisor read the launcher's report of ranks a signal ended."""
    STRAGGLER = "straggler"
    """Ranks stayed slower than the others, and the step ended at a checkpoint for ``run`` to leave their hosts out."""
    RECOVERED = "recovered"
    """Ranks were lost, the others went on in their processes (``restartable``) and finished: the step is done."""

    @property
    def blames_hosts(self) -> bool:
        """Whether a relaunch leaves the named hosts out: not for a wrong launch, which fails on any host."""
        return self not in (FailureKind.DUPLICATE, FailureKind.MISMATCH)


class Fault(NamedTuple):
    """What a verdict found, as the rank that reached it knows it."""

    kind: FailureKind
    ranks: tuple[int, ...] = ()
    """The ranks at fault (missing, stalled, frozen, duplicated, disagreeing); empty where none is one rank's."""
    hosts: tuple[str, ...] = ()
    """Their hosts, where known: what a relaunch leaves out when the kind :attr:`FailureKind.blames_hosts`."""
    step: int | None = None
    """The training step the others reached, where the loop marks steps."""


def _names(record: type[FailureRecord | FirstStep]) -> tuple[str, ...]:
    """A record's fields as written: ``format`` first."""
    return ("format", *(item.name for item in fields(record) if item.name != "format"))


def _to_json(record: FailureRecord | FirstStep) -> str:
    """A record as written: one JSON object (a str enum is its value, a tuple a list)."""
    return json.dumps({name: getattr(record, name) for name in _names(type(record))}, separators=(",", ":"))


@dataclass(frozen=True)
class FailureRecord:
    """One failure of one job step."""

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
    written_by: int
    """The rank that wrote the record; ``-1``: the supervisor, from the launcher's output."""
    problem: str
    """The verdict, as every rank showed it (one line)."""
    format: int = field(default=FORMAT)

    @property
    def blames_hosts(self) -> bool:
        """Whether a relaunch should leave :attr:`hosts` out (:attr:`FailureKind.blames_hosts`)."""
        return self.kind.blames_hosts

    def to_json(self) -> str:
        """The record as written: one JSON object."""
        return _to_json(self)

    def __repr__(self) -> str:
        hosts = ",".join(self.hosts) or "-"
        return (
            f"FailureRecord({self.kind.value}, ranks={list(self.ranks)}, hosts={hosts}, step={self.step}, "
            f"job={self.job_id}, by rank {self.written_by}, from={self.launcher})"
        )


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
    format: int = field(default=FORMAT)

    def to_json(self) -> str:
        """The record as written: one JSON object."""
        return _to_json(self)


@dataclass(frozen=True)
class StragglerFinding:
    """A rank that rank 0 named as a straggler, as it last named it (:mod:`~lightning_mpi_env.rollcall.stragglers`)."""

    rank: int
    host: str
    factor: float
    """Its work a step over the median of all ranks'."""
    steps: int
    """The steps over which it stood out."""
    step: int
    """Its training step when it was named."""
    when: float


@dataclass(frozen=True)
class StragglerRecord:
    """The stragglers of one job step so far (``stragglers.json``, rewritten whole by rank 0 at each naming)."""

    stragglers: tuple[StragglerFinding, ...]
    job_id: str | None = None
    format: int = field(default=FORMAT)

    def to_json(self) -> str:
        """The record as written: one JSON object."""
        found = [{item.name: getattr(finding, item.name) for item in fields(finding)} for finding in self.stragglers]
        return json.dumps({"format": self.format, "stragglers": found, "job_id": self.job_id}, separators=(",", ":"))


class Schema(NamedTuple):
    """What one kind of record says of itself in errors, and how long a file of it may be."""

    what: str
    writer: str
    error: type[MpiEnvError]
    max_bytes: int


FAILURES = Schema("failure", "roll call or watchdog", FailureRecordError, MAX_RECORD_BYTES)
PROGRESS = Schema("progress", "callback", ProgressRecordError, MAX_FIRST_STEP_BYTES)
STRAGGLING = Schema("straggler", "stall watchdog", ProgressRecordError, MAX_RECORD_BYTES)

_Record = TypeVar("_Record")


def malformed(schema: Schema, source: str, reason: str) -> MpiEnvError:
    """The error for a file of ``schema`` at ``source`` that is not a record, ``reason`` saying why."""
    return schema.error(
        f"The {schema.what} record {source} is malformed: {reason}.",
        f"Delete the file; it was not written by this version of lightning-mpi-env's {schema.writer}.",
        value=source,
    )


def _parse(raw: bytes | str, source: str, schema: Schema, build: Callable[[object], _Record]) -> _Record:
    try:
        return build(load_json(raw, schema.max_bytes))
    except FieldError as error:
        raise malformed(schema, source, str(error)) from None


def _write(folder: str, name: str, text: str, schema: Schema) -> str | None:
    """Write a record whole; a record that cannot be written must not hide what it records: the reason, one line."""
    try:
        write_whole(folder, name, text)
    except OSError as error:
        return (
            f"lightning-mpi-env: could not write the {schema.what} record {name} into {folder} "
            f"({type(error).__name__}: {error.strerror or error})."
        )
    return None


def parse_record(raw: bytes | str, source: str) -> FailureRecord:
    """The failure record in ``raw``, checked field by field; else a :class:`FailureRecordError` naming ``source``."""
    return _parse(raw, source, FAILURES, _failure)


def _failure(value: object) -> FailureRecord:
    data = versioned_object(value, FORMAT)
    kinds = {kind.value: kind for kind in FailureKind}
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise FieldError(f"kind={shown(str(kind))} is not one of {', '.join(kinds)}")
    exact_fields(data, _names(FailureRecord))
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


def parse_first_step(raw: bytes | str, source: str) -> FirstStep:
    """The first-step record in ``raw``, checked field by field; else a :class:`ProgressRecordError`."""
    return _parse(raw, source, PROGRESS, _first_step)


def _first_step(value: object) -> FirstStep:
    data = versioned_object(value, FORMAT)
    exact_fields(data, _names(FirstStep))
    step = whole_number(data["step"], "step", MAX_STEP)
    if (data["resumed_from"] is None) != (data["resumed_step"] is None):
        raise FieldError("resumed_from and resumed_step are not both set or both null")
    resumed_from, resumed_step = None, None
    if data["resumed_from"] is not None:
        resumed_from = _file_name(data["resumed_from"])
        resumed_step = whole_number(data["resumed_step"], "resumed_step", MAX_STEP)
        if resumed_step > step:
            raise FieldError(f"resumed_step {resumed_step} is past step {step}")
    return FirstStep(step, resumed_from, resumed_step, seconds(data["when"]), _job_id_field(data["job_id"]))


def _job_id_field(job_id: object) -> str | None:
    if job_id is not None and not (isinstance(job_id, str) and JOB_ID.match(job_id)):
        raise FieldError(f"job_id holds {shown(str(job_id))}, which is not a job id")
    return job_id


def parse_stragglers(raw: bytes | str, source: str) -> StragglerRecord:
    """The straggler record in ``raw``, checked field by field; else a :class:`ProgressRecordError`."""
    return _parse(raw, source, STRAGGLING, _stragglers)


def _stragglers(value: object) -> StragglerRecord:
    data = versioned_object(value, FORMAT)
    exact_fields(data, ("format", "stragglers", "job_id"))
    found = []
    for item in _list(data["stragglers"], "stragglers", MAX_STRAGGLERS):
        if not isinstance(item, dict):
            raise FieldError(f"a straggler is {type(item).__name__}, not an object")
        exact_fields(item, tuple(entry.name for entry in fields(StragglerFinding)))
        factor = item["factor"]
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor <= MAX_FACTOR:
            raise FieldError(f"factor holds {shown(str(factor))}, not a factor from 1 to {MAX_FACTOR:g}")
        found.append(
            StragglerFinding(
                rank=whole_number(item["rank"], "rank", MAX_WORLD_SIZE - 1),
                host=_matching(item["host"], "hosts", _HOST),
                factor=float(factor),
                steps=whole_number(item["steps"], "steps", MAX_STEP),
                step=whole_number(item["step"], "step", MAX_STEP),
                when=seconds(item["when"]),
            )
        )
    return StragglerRecord(tuple(found), _job_id_field(data["job_id"]))


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


def _file_name(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_NAME
        or value in (".", "..")
        or any(character == "/" or ord(character) < 32 or ord(character) == 127 for character in value)
    ):
        raise FieldError(f"resumed_from holds {shown(str(value))}, which is not a file name")
    return value


def _job_id(job_id: str | None) -> str | None:
    return job_id if job_id is not None and JOB_ID.match(job_id) else None


@dataclass(frozen=True)
class FailureRecorder:
    """Writes this job's failure records into ``folder`` (``LIGHTNING_MPI_ENV_STATE_DIR``), where it is set."""

    folder: str
    launcher: str
    job_id: str | None

    @classmethod
    def plan(cls, folder: str, launcher: str, job_id: str | None) -> FailureRecorder | None:
        """A recorder for ``folder``; ``None`` where it is empty (the setting is unset: nothing is written)."""
        if not folder:
            return None
        return cls(folder, launcher if _LAUNCHER.match(launcher) else "unknown", _job_id(job_id))

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
        """Write the record of ``fault`` whole; ``None``, or why it could not be written (one line, never raised)."""
        record = self.record(fault, problem=problem, written_by=written_by)
        return _write(self.folder, f"failure-rank{written_by}-{os.getpid()}.json", record.to_json(), FAILURES)


def first_step(
    step: int, resumed_from: str | None, resumed_step: int | None, when: float, job_id: str | None
) -> FirstStep:
    """The record to write: ``resumed_from`` cut to its file name; a job id not in any scheduler's syntax left out."""
    name = None if resumed_from is None else os.path.basename(resumed_from)
    return FirstStep(step, name, None if name is None else resumed_step, when, _job_id(job_id))


def write_first_step(folder: str, record: FirstStep) -> str | None:
    """Write ``record`` as ``folder/first-step.json`` whole; ``None``, or why it could not be (never raised)."""
    return _write(folder, FIRST_STEP, record.to_json(), PROGRESS)


def write_stragglers(folder: str, found: Iterable[StragglerFinding], job_id: str | None) -> str | None:
    """Write the straggler record of ``found`` (the slowest :data:`MAX_STRAGGLERS`) whole; ``None``, or why not."""
    slowest = sorted(found, key=lambda finding: -finding.factor)[:MAX_STRAGGLERS]
    kept = tuple(finding for finding in slowest if _HOST.match(finding.host))
    return _write(folder, STRAGGLERS, StragglerRecord(kept, _job_id(job_id)).to_json(), STRAGGLING)


def hosts_of(ranks: Iterable[int], host_of: Mapping[int, str]) -> tuple[str, ...]:
    """The hosts of ``ranks`` that ``host_of`` knows, in rank order, each once."""
    return tuple(dict.fromkeys(host_of[rank] for rank in sorted(ranks) if rank in host_of))
