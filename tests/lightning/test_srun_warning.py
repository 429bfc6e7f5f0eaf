"""Lightning's srun advice in real jobs: ``salloc`` on the two-node Slurm cluster, then ``srun``, 2 nodes x 1 task.

Lightning advises prepending `srun` ("The `srun` command is available on your system but is not used") wherever
`srun` is on ``PATH`` and ``SLURMEnvironment.detect()`` finds no step: it takes an allocation named ``interactive``
or ``bash`` for an interactive session, so a program that srun started in such an allocation gets the advice too.
Each job runs ``tests/jobs/srun_advice.py`` set up as users write it and reads rank 0's standard error: with this
package's strategy object or plugin the advice is gone; Lightning alone, and ``strategy="ddp_mpi"`` by name (Lightning
asks ``detect()`` before it builds a strategy from a name), still give it; a job name of the user's own avoids it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_mpi_env.lightning.compat import SRUN_NOT_USED
from tests.clusters.slurm import SlurmCluster

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

JOB = Path(__file__).parents[1] / "jobs" / "srun_advice.py"
TIMEOUT = 300  # two Lightning processes on two (maybe busy) cores
ALLOCATION = ["salloc", "-N2", "--ntasks-per-node=1", "--job-name=interactive"]
"""The allocation as users make one; ``interactive`` is also the name Slurm 22.05's salloc gives it by default."""


def run_in_allocation(cluster: SlurmCluster, api: str, setup: str, srun_options: str = "") -> str:
    """``salloc ... bash -c 'srun ... srun_advice.py'``: the job's whole output, after checking that both tasks ran."""
    step = f"srun {srun_options} '{sys.executable}' '{JOB}' --api {api} --setup {setup}"
    done = cluster.run([*ALLOCATION, "bash", "-c", f'echo "JOB_NAME=$SLURM_JOB_NAME"; {step}'], timeout=TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "JOB_NAME=interactive" in done.stdout, output[-4000:]
    # Both tasks ended their run (Lightning alone trains each task as its own rank 0).
    assert done.stdout.count(f" setup={setup}\n") == 2, output[-4000:]
    return output


@pytest.mark.parametrize(
    ("api", "setup"),
    [
        pytest.param("trainer", "instance", marks=pytest.mark.smoke),
        ("fabric", "instance"),
        ("trainer", "plugin"),
        ("fabric", "plugin"),
    ],
)
def test_no_srun_advice_with_the_package(slurm_cluster: SlurmCluster, api: str, setup: str):
    # The environment, made before the Trainer or Fabric (with MPIDDPStrategy() or as the plugin), silences the advice
    # that fit() would give through SLURMEnvironment.detect(); Fabric, given an environment, never asks.
    output = run_in_allocation(slurm_cluster, api, setup)
    assert SRUN_NOT_USED not in output, output[-4000:]


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_lightning_alone_still_gives_its_srun_advice(slurm_cluster: SlurmCluster, api: str):
    # The filter is the run's, not the machine's: a program that does not use the package gets Lightning's warning.
    output = run_in_allocation(slurm_cluster, api, "plain")
    assert output.count(SRUN_NOT_USED) == 1, output[-4000:]  # rank 0 only (rank_zero_warn)


def test_ddp_mpi_by_name_gets_the_advice_unless_the_step_has_a_name(slurm_cluster: SlurmCluster):
    # A Trainer asks SLURMEnvironment.detect() before it builds the strategy a name stands for, and no public hook of
    # Lightning runs before that: docs/troubleshooting.md names the fixes, the strategy object or a job name.
    assert SRUN_NOT_USED in run_in_allocation(slurm_cluster, "trainer", "name")
    output = run_in_allocation(slurm_cluster, "trainer", "name", srun_options="--job-name=train")
    assert SRUN_NOT_USED not in output, output[-4000:]
