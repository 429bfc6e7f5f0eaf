"""Failure records from real mpirun jobs on two simulated nodes: the roll call's and the watchdog's verdicts on file.

With ``LIGHTNING_MPI_ENV_STATE_DIR`` set (as a supervisor sets it for its step), the rank whose verdict stands
writes one record naming the ranks and hosts; the jobs and faults are those of ``test_fail_fast.py``.
"""

import pytest

from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.supervise.records import read_records
from tests.rollcall.test_fail_fast import STALL_TIMEOUT, _command, _run


@pytest.mark.mpi
def test_a_missing_rank_is_recorded_with_its_host(cluster, tmp_path):
    state = tmp_path / "state"
    # Rank 3 (on 127.0.0.3, the second node) exits before the roll call: the others wait out the timeout.
    job = _run(cluster, _command("trainer-ddp_mpi", fault=["--exit"]), LIGHTNING_MPI_ENV_STATE_DIR=str(state))
    assert job.returncode != 0, job.tail()
    (record,) = read_records(str(state))  # one record, however many ranks reached the verdict
    assert record.kind is FailureKind.MISSING, record
    # On a loaded machine a rank still importing torch may be named beside rank 3 (test_fail_fast says why).
    assert 3 in record.ranks, record
    assert "127.0.0.3" in record.hosts, record
    assert record.blames_hosts
    assert record.launcher == "Open MPI", record
    assert record.step is None  # before training
    assert f"RendezvousError: rank {record.written_by} on " in job.text, job.tail()
    assert record.problem in job.text.replace("\n", " "), job.tail()


@pytest.mark.mpi
def test_a_frozen_rank_is_recorded_by_rank_zero(cluster, tmp_path):
    state = tmp_path / "state"
    job = _run(
        cluster,
        _command("trainer-ddp_mpi", fault=["--stall", "2:freeze"]),
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
        LIGHTNING_MPI_ENV_STATE_DIR=str(state),
    )
    assert job.returncode != 0, job.tail()
    assert "STALL: rank 3 freezes at step 2\n" in job.output, job.tail()
    (record,) = read_records(str(state))
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.FROZEN, (3,), ("127.0.0.3",)), record
    assert record.step == 2, record  # where ranks 0-2 wait for it
    assert record.written_by == 0, record  # rank 0's watchdog judges
    assert "Rank 3 stalled: " in record.problem


@pytest.mark.mpi
def test_a_healthy_job_writes_no_record(cluster, tmp_path):
    state = tmp_path / "state"
    job = _run(cluster, _command("fabric-ddp_mpi"), LIGHTNING_MPI_ENV_STATE_DIR=str(state))
    assert job.returncode == 0, job.tail()
    assert "RESULT" in job.text, job.tail()
    assert not state.exists()
