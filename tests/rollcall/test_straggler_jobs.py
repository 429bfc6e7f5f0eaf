"""Stragglers named in real jobs: 4 ranks on 2 simulated nodes, under ``mpirun`` and ``srun``, Trainer and Fabric.

The jobs are shaped like users': data loader workers, and checkpoints (the Trainer's validation loop and
``ModelCheckpoint``; Fabric's ``fabric.save`` every 20 steps). Each step sleeps ``--step-seconds`` in its work (the
Trainer's ``training_step``, Fabric's loop before ``backward``); ``--slow-rank R:F`` makes rank R's sleep F times as
long. The default straggler settings apply (a factor of 1.5 over a window of 20 steps).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.settings import DEFAULT_STRAGGLER_WINDOW
from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.clusters.slurm import SlurmCluster
from tests.conftest import TRAINER_JOB

FABRIC_JOB = TRAINER_JOB.parent / "fabric_job.py"
STEPS = 60
STEP_SECONDS = 0.1
SAMPLES = 320
"""20 steps an epoch on 4 ranks of batches of 4: the Trainer validates and checkpoints at steps 20, 40 and 60."""
TIMEOUT = 300
"""Seconds a job may take at most: four Lightning processes on two (maybe busy) cores; a bound on a hang."""
NAMED = re.compile(r"straggler: rank (\d+) on (\S+) takes .* over its last (\d+) steps \(step (\d+)\)")


def job(api: str, root: Path, *extra: str) -> list[str]:
    """The Trainer's or Fabric's instrumented job under ``"ddp_mpi"``, 60 steps with checkpoints into ``root``."""
    common = ["--strategy", "ddp_mpi", "--samples", str(SAMPLES), "--step-seconds", str(STEP_SECONDS)]
    common += ["--steps", str(STEPS), "--workers", "2", "--root-dir", str(root), *extra]
    if api == "trainer":
        return [sys.executable, str(TRAINER_JOB), "--zero-config", "--validate", *common]
    return [sys.executable, str(FABRIC_JOB), "--save-every", "20", *common]


def named(stderr: str) -> list[tuple[int, str, int, int]]:
    """Each straggler line: the rank, its host, the steps it stood out over, and the step of the report."""
    return [(int(m[1]), m[2], int(m[3]), int(m[4])) for m in map(NAMED.search, stderr.splitlines()) if m is not None]


def assert_slow_rank_named(returncode: int, stdout: str, stderr: str, host: str) -> None:
    """Rank 3, twice as slow, is named once with ``host``, within its window and a report; summed up at the end."""
    output = stdout + stderr
    assert returncode == 0, output[-4000:]
    assert stdout.count("RESULT ") == 4, output[-4000:]
    lines = named(stderr)
    assert [(rank, where) for rank, where, _, _ in lines][:1] == [(3, host)], output[-4000:]
    assert {rank for rank, *_ in lines} == {3}, output[-4000:]  # nobody else, however busy the cores
    step = lines[0][3]
    assert step <= 2 * DEFAULT_STRAGGLER_WINDOW, f"named at step {step}: " + output[-4000:]
    assert f"lightning-mpi-env: stragglers in this run: {host} x" in stderr, output[-4000:]
    print(f"FIGURE straggler named at step {step}: {[line for line in stderr.splitlines() if 'straggler:' in line]}")


def assert_no_one_named(returncode: int, stdout: str, stderr: str) -> None:
    """The job trained, rank 0 saved slowly, and no rank was named."""
    output = stdout + stderr
    assert returncode == 0, output[-4000:]
    assert stdout.count("RESULT ") == 4, output[-4000:]
    assert "CHECKPOINT rank=0" in stdout, output[-4000:]  # rank 0's slow saves happened
    assert "straggler" not in stderr, output[-4000:]


# --- mpirun ---------------------------------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_mpirun_names_a_rank_twice_as_slow_with_its_host(cluster: SimulatedCluster, api: str, tmp_path: Path):
    done = cluster.run(job(api, tmp_path, "--slow-rank", "3:2"), timeout=TIMEOUT, export=cluster.job_environment())
    assert_slow_rank_named(done.returncode, done.stdout, done.stderr, host="127.0.0.3")  # --map-by slot: 2, 3 there


@pytest.mark.mpi
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_mpirun_names_no_one_when_every_rank_is_slow_and_rank_zero_saves_slowly(
    cluster: SimulatedCluster, api: str, tmp_path: Path
):
    # Every rank's work takes 3 steps' worth, and rank 0 takes 2 s more for each checkpoint while the others wait.
    slow = ["--slow-rank", "all:3", "--slow-eval" if api == "trainer" else "--slow-save", "2"]
    done = cluster.run(job(api, tmp_path, *slow), timeout=TIMEOUT, export=cluster.job_environment())
    assert_no_one_named(done.returncode, done.stdout, done.stderr)


# --- srun -----------------------------------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_srun_names_a_rank_twice_as_slow_with_its_host(slurm_cluster: SlurmCluster, api: str, tmp_path: Path):
    done = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=2", *job(api, tmp_path, "--slow-rank", "3:2")], timeout=TIMEOUT
    )
    assert_slow_rank_named(done.returncode, done.stdout, done.stderr, host="node2")  # block: ranks 2, 3 on node2


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_srun_names_no_one_when_every_rank_is_slow_and_rank_zero_saves_slowly(
    slurm_cluster: SlurmCluster, api: str, tmp_path: Path
):
    slow = ["--slow-rank", "all:3", "--slow-eval" if api == "trainer" else "--slow-save", "2"]
    done = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", *job(api, tmp_path, *slow)], timeout=TIMEOUT)
    assert_no_one_named(done.returncode, done.stdout, done.stderr)
