"""A failure record under a real srun on the two-node simulated Slurm cluster: Slurm's node names, the job's id.

The relaunch excludes hosts with ``srun --exclude``, so the record must name them as Slurm does (``node2``, not an
address). The job and its freeze are ``test_slurm.py``'s (a Fabric loop under ``ddp_mpi``, rank 3 on node2 stops
itself with ``SIGSTOP`` at step 10).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.supervise.records import read_records
from tests.clusters.slurm import SlurmCluster
from tests.test_slurm import FABRIC_FREEZE, LIGHTNING_TIMEOUT, PLACEMENTS, STALL_TIMEOUT

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]


def test_a_frozen_rank_under_srun_is_recorded_with_its_slurm_node_and_job(slurm_cluster: SlurmCluster, tmp_path: Path):
    state = tmp_path / "state"
    tag = f"record-{tmp_path.name}"
    command = [sys.executable, str(FABRIC_FREEZE), "--strategy", "ddp_mpi", "--freeze", "3:10", "--tag", tag]
    variables = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT), "LIGHTNING_MPI_ENV_STATE_DIR": str(state)}
    done = slurm_cluster.run(["srun", *PLACEMENTS["block"], *command], timeout=LIGHTNING_TIMEOUT, env=variables)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    (step,) = [line.split("id=", 1)[1] for line in done.stdout.splitlines() if line.startswith("JOB id=")]
    (record,) = read_records(str(state))
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.FROZEN, (3,), ("node2",)), record
    assert record.job_id == step.split(".")[0], record  # SLURM_JOB_ID: the state folder's key
    assert record.launcher == "Slurm srun", record
    assert record.written_by == 0, record
