"""srun's lines about tasks that died, and the died record they make (only for tasks a signal ended)."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.core.values import MAX_WORLD_SIZE
from lightning_mpi_env.supervise.exits import SUPERVISOR, TaskExit, died_record, read_task_exit

# As srun printed them on the simulated cluster (Slurm 22.05): a task killed by SIGKILL, two that exited.
KILLED = "srun: error: node2: task 3: Killed"
EXITED = "srun: error: node1: tasks 0-1: Exited with exit code 1"


def test_srun_s_lines_are_read_with_their_host_ranks_and_how():
    assert read_task_exit(KILLED) == TaskExit("node2", (3,), "Killed")
    assert read_task_exit(EXITED) == TaskExit("node1", (0, 1), "Exited with exit code 1")
    assert read_task_exit("srun: error: node1: tasks 0,2-3: Segmentation fault\n") == TaskExit(
        "node1", (0, 2, 3), "Segmentation fault"
    )


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: node2: task 3 Killed",  # not srun's form
        "srun: error: Unable to create step for job 7: More processors requested than permitted",
        "srun: error: node2: tasks 5-2: Killed",  # a range backwards
        f"srun: error: node2: tasks 0-{MAX_WORLD_SIZE}: Killed",  # past the bound of ranks
        "srun: error: no de: task 1: Killed",
        "RESULT {}",
    ],
)
def test_other_lines_are_no_deaths(line):
    assert read_task_exit(line) is None


def test_only_tasks_a_signal_ended_blame_their_host():
    record = died_record([read_task_exit(KILLED), read_task_exit(EXITED)], launcher="Slurm srun", job_id="42")
    assert record is not None
    assert record.kind is FailureKind.DIED
    assert record.ranks == (3,)
    assert record.hosts == ("node2",)
    assert record.blames_hosts
    assert record.written_by == SUPERVISOR
    assert record.job_id == "42"
    assert record.problem == "rank(s) 3 on node2: Killed"


def test_tasks_that_only_exited_make_no_record():
    assert died_record([read_task_exit(EXITED)], launcher="Slurm srun", job_id=None) is None
