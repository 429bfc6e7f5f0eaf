"""The examples run: on the simulated cluster where they can, and through `simulate`/`from_env` for schedulers
that are absent here (PBS, LSF, Slurm), with the variables those schedulers set."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_mpi_env import from_env
from lightning_mpi_env.core.layout import Placement
from lightning_mpi_env.tools.simcluster import RSH_AGENT, SimulatedCluster
from lightning_mpi_env.tools.simulate import simulate
from tests.conftest import python_path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
MPI_TIMEOUT = 180
JOB_SCRIPTS = sorted(path for path in (EXAMPLES / "jobs").iterdir()) + [EXAMPLES / "torchrun_per_node.sh"]


def _results(stdout):
    return [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]


@pytest.mark.parametrize("script", JOB_SCRIPTS, ids=lambda path: path.name)
def test_job_scripts_parse(script):
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=60)


def _job_script_environment(**variables):
    """What a scheduler's job script would see, pointed at the simulated cluster's `mpirun`."""
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "PRTE_MCA_prte_ssh_agent": str(RSH_AGENT),  # `mpirun` reaches the simulated nodes through the agent
        "OMP_NUM_THREADS": "1",
        **variables,
    }
    if os.geteuid() == 0:
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return env


@pytest.mark.mpi
def test_sge_abci_job_script_trains_on_two_simulated_nodes(tmp_path):
    # The job script runs unchanged; SGE's host list and job id are the simulated cluster's.
    cluster = SimulatedCluster(tmp_path)
    env = _job_script_environment(**cluster.job_environment(), PER_NODE="2")
    result = subprocess.run(
        ["sh", str(EXAMPLES / "jobs" / "sge_abci.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=MPI_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = sorted(_results(result.stdout), key=lambda row: row["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in results] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 1, 0, 4),
        (3, 1, 1, 4),
    ]
    assert len({r["weight_sum"] for r in results}) == 1  # DDP kept the replicas identical


@pytest.mark.mpi
def test_fabric_example_one_rank_per_node(tmp_path):
    cluster = SimulatedCluster(tmp_path)
    result = cluster.run(
        [sys.executable, str(EXAMPLES / "fabric_train.py"), "--devices", "1", "--num-nodes", "2"],
        timeout=MPI_TIMEOUT,
        np=2,
        map_by="node",
        export=cluster.job_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = sorted(_results(result.stdout), key=lambda row: row["global_rank"])
    assert [(r["global_rank"], r["node_rank"], r["world_size"], r["all_reduce"]) for r in results] == [
        (0, 0, 2, 1.0),
        (1, 1, 2, 1.0),
    ]


def test_jax_example_without_jax_prints_its_arguments():
    env = {
        "PATH": os.environ["PATH"],
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_NAMESPACE": "prterun-nodea-1@1",
        "SLURM_JOB_NODELIST": "gpu[12-13]",
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "jax_distributed.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if "JAX is not installed" in result.stdout:
        kwargs = json.loads(result.stdout.split("would get: ", 1)[1])
        assert kwargs["coordinator_address"].startswith("gpu12:")
        assert (kwargs["num_processes"], kwargs["process_id"], kwargs["local_device_ids"]) == (4, 3, [1])


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("map_by", "hosts"), [("slot", [0, 0, 1, 1]), ("node", [0, 1, 0, 1])], ids=["block", "round-robin"]
)
def test_jax_example_sums_across_two_simulated_nodes(tmp_path, jax_python, map_by, hosts):
    # JAX for real (jax from PyPI, CPU): 4 processes on 2 simulated nodes, each initialized from
    # jax_distributed_kwargs() alone, meet at the coordinator and add 1 + 2 + 3 + 4 across processes. JAX's own
    # detection cannot: Open MPI 5 sets no OMPI_MCA_orte_hnp_uri (jax/_src/clusters/ompi_cluster.py).
    cluster = SimulatedCluster(tmp_path)
    result = cluster.run(
        [str(jax_python), str(EXAMPLES / "jax_distributed.py")],
        timeout=MPI_TIMEOUT,
        map_by=map_by,
        export={**cluster.job_environment(), "PYTHONPATH": python_path(ROOT), "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("process "))
    assert lines == [
        f"process {rank}/4 on {cluster.hosts[hosts[rank]]}: 1 local device(s), 4 in all; sum over processes 10"
        for rank in range(4)
    ], result.stdout + result.stderr[-3000:]


# --- schedulers absent here: their variables, resolved by the plugin's code ----------------------------------------


@pytest.mark.parametrize(
    ("scheduler", "script"), [("pbs", "pbs.sh"), ("lsf", "lsf.bsub"), ("slurm", "slurm_mpirun.sbatch")]
)
def test_scheduler_job_scripts_rank_math(scheduler, script):
    assert (EXAMPLES / "jobs" / script).exists()
    for map_by in ("slot", "node"):
        result = simulate("openmpi", nodes=2, ppn=4, map_by=map_by, scheduler=scheduler)
        assert result.ok, result.problems
        assert {row.layout.main_address for row in result.ranks} == {"node001"}


def test_pbs_nodefile_one_line_per_slot(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1001c0s0b0n0\n" * 4 + "x1001c0s0b1n0\n" * 4)
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "4242.pbs01",
    }
    layout = from_env(env)
    assert (layout.node_rank, layout.main_address, layout.sources["main_address"]) == (
        1,
        "x1001c0s0b0n0",
        "PBS_NODEFILE (first host)",
    )


def test_slurm_mpirun_inside_sbatch_ignores_the_batch_step():
    # Ranks started by Open MPI inside sbatch inherit the batch script's and the daemon step's SLURM_* variables.
    env = {
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    layout = from_env(env)
    assert (layout.launcher.key, layout.rank, layout.node_rank, layout.main_address) == ("openmpi", 5, 1, "gpu07")
    assert layout.placement is Placement.BLOCK


def test_lsf_hosts():
    env = {
        "PMI_RANK": "0",
        "PMI_SIZE": "8",
        "MPI_LOCALRANKID": "0",
        "MPI_LOCALNRANKS": "4",
        "LSB_MCPU_HOSTS": "batch1 4 batch2 4",
        "LSB_JOBID": "31",
    }
    assert from_env(env).main_address == "batch1"
