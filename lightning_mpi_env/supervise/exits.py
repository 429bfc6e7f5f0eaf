"""What the launcher's standard error says of ranks that died, for a step that ended with no failure record.

A rank a signal killed blames its host (the out-of-memory killer, a node going away); one that exited with an error
blames none: that is the program's doing, which the restart policy's same-fault rule stops.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from lightning_mpi_env.core.records import FailureKind, FailureRecord
from lightning_mpi_env.core.values import MAX_WORLD_SIZE

_DEATH = re.compile(r"^srun: error: ([A-Za-z0-9._-]{1,255}): tasks? ([0-9,-]{1,4096}): (.{1,200})$")
_OPEN_MPI = re.compile(
    r"noticed that process rank (\d{1,8}) with PID \d{1,10} on node ([A-Za-z0-9._:-]{1,255}) exited on\s+"
    r"signal (\d{1,3}) \(([^)\n]{1,100})\)"
)
_HYDRA = re.compile(
    r"RANK (\d{1,8}) PID \d{1,10} RUNNING AT ([A-Za-z0-9._:-]{1,255})\s*\n"
    r"=\s+KILLED BY SIGNAL: (\d{1,3}) \(([^)\n]{1,100})\)"
)
EXITED = "Exited with exit code "
"""How srun starts the line of a task that exited (rather than one a signal ended)."""
SUPERVISOR = -1
"""``written_by`` of a record the supervisor made from the launcher's output (no rank wrote it)."""


@dataclass(frozen=True)
class TaskExit:
    """One ``srun: error: <host>: task <ranks>: <how>`` line."""

    host: str
    ranks: tuple[int, ...]
    how: str

    @property
    def signalled(self) -> bool:
        """Whether a signal ended the tasks (rather than their own exit)."""
        return not self.how.startswith(EXITED)


def read_task_exit(line: str) -> TaskExit | None:
    """The death an srun error line reports, or ``None`` for any other line (or one past the bounds)."""
    match = _DEATH.match(line.rstrip("\r\n"))
    if match is None:
        return None
    ranks: list[int] = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        first, last = int(low), int(high or low)
        if not first <= last < MAX_WORLD_SIZE or len(ranks) + last - first >= MAX_WORLD_SIZE:
            return None
        ranks.extend(range(first, last + 1))
    return TaskExit(match.group(1), tuple(ranks), match.group(3))


def srun_exits(errors: str) -> list[TaskExit]:
    """Every srun line of ``errors`` about tasks that died (:func:`read_task_exit`)."""
    return [death for line in errors.splitlines() if (death := read_task_exit(line)) is not None]


def mpirun_exits(errors: str) -> list[TaskExit]:
    r"""The ranks Open MPI or Hydra says a signal ended, in ``errors``.

    >>> mpirun_exits("prterun noticed that process rank 3 with PID 26321 on node n3 exited on\nsignal 9 (Killed).")
    [TaskExit(host='n3', ranks=(3,), how='Killed')]
    >>> mpirun_exits("=   RANK 2 PID 77 RUNNING AT node2\n=   KILLED BY SIGNAL: 11 (Segmentation fault)")
    [TaskExit(host='node2', ranks=(2,), how='Segmentation fault')]
    """
    found = [*_OPEN_MPI.finditer(errors), *_HYDRA.finditer(errors)]
    return [
        TaskExit(match.group(2), (int(match.group(1)),), match.group(4))
        for match in found
        if int(match.group(1)) < MAX_WORLD_SIZE
    ]


def died_record(deaths: Iterable[TaskExit], *, launcher: str, job_id: str | None) -> FailureRecord | None:
    """The ``died`` record blaming the hosts of tasks a signal ended; ``None`` where no signal ended one."""
    signalled = [death for death in deaths if death.signalled]
    if not signalled:
        return None
    problem = "; ".join(f"rank(s) {','.join(map(str, d.ranks))} on {d.host}: {d.how}" for d in signalled)
    return FailureRecord(
        kind=FailureKind.DIED,
        ranks=tuple(sorted({rank for death in signalled for rank in death.ranks})),
        hosts=tuple(dict.fromkeys(death.host for death in signalled)),
        when=time.time(),
        step=None,
        launcher=launcher,
        job_id=job_id,
        written_by=SUPERVISOR,
        problem=problem,
    )
