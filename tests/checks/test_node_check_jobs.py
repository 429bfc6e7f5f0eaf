"""The node check in real jobs: 4 ranks on 2 simulated nodes, the checkpoint folder read-only on one node only.

Each job is the instrumented Trainer job as users write it (data loader workers, a validation loop, a
``ModelCheckpoint``) under Open MPI's ``mpirun``; ``jobs/read_only_node.sh`` gives the ranks of one node a mount
namespace of their own in which the folder is bound read-only, as a node whose mount of a shared folder went
read-only. Rank 0 runs on 127.0.0.2 (``--map-by slot``, 2 slots a node).
"""

import sys

import pytest

from tests.conftest import JOBS, TRAINER_JOB
from tests.lightning.test_deepspeed import JOB as DEEPSPEED_JOB

READ_ONLY_NODE = JOBS / "read_only_node.sh"
TIMEOUT = 600  # a hang's bound, not an expected time: the jobs end in well under a minute


def run_job(cluster, tmp_path, read_only_host: str, strategy: str):
    root = tmp_path / "checkpoints"
    root.mkdir()
    job = [str(READ_ONLY_NODE), read_only_host, str(root), sys.executable, str(TRAINER_JOB), "--strategy", strategy]
    job += ["--root-dir", str(root), "--validate", "--workers", "2", "--samples", "32"]
    result = cluster.run(job, timeout=TIMEOUT, export={"MASTER_ADDR": "127.0.0.2", "OMP_NUM_THREADS": "1"})
    return result, root


@pytest.mark.mpi
def test_under_ddp_a_node_without_rank_0_is_named_and_the_job_goes_on(cluster, tmp_path):
    result, root = run_job(cluster, tmp_path, "127.0.0.3", "ddp_mpi")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count("NodeCheckWarning") <= 1  # rank 0 alone says it
    line = next(line for line in output.splitlines() if "The node check before the first step found" in line)
    assert "on node 1 (host 127.0.0.3, rank 2)" in line
    assert f"the checkpoint folder {str(root)!r} cannot be written (Read-only file system)" in line
    assert "a relaunch that puts rank 0 on 127.0.0.3" in line
    assert output.count("RESULT ") == 4
    assert (root / "checkpoints" / "last.ckpt").exists()  # rank 0 saved from its own node


@pytest.mark.mpi
def test_rank_0_s_node_without_the_folder_stops_every_rank_before_the_first_step(cluster, tmp_path):
    result, root = run_job(cluster, tmp_path, "127.0.0.2", "ddp")  # the plugin under Lightning's own DDP
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "FIRST_STEP" not in output
    stops = [line for line in output.splitlines() if line.startswith("NodeCheckError: rank ")]
    assert len(stops) == 4, output[-4000:]  # every rank, one line each, no traceback
    for line in stops:
        assert "on node 0 (host 127.0.0.2, rank 0) the checkpoint folder" in line
        assert f"{str(root)!r} cannot be written (Read-only file system)" in line
        assert "rank 0, which writes the checkpoints, runs there" in line
        assert "HINT: Make the folder writable" in line


@pytest.mark.mpi
def test_under_deepspeed_a_node_without_rank_0_that_cannot_write_stops_every_rank(cluster, deepspeed, tmp_path):
    # Lightning's own DeepSpeedStrategy (ZeRO 2) with the plugin, under a scheduler (the requeue is on, so its folder,
    # default_root_dir, is checked): every rank writes its shard there, so a node that cannot stops the job.
    root = tmp_path / "checkpoints"
    root.mkdir()
    job = [str(READ_ONLY_NODE), "127.0.0.3", str(root), str(deepspeed.python), str(DEEPSPEED_JOB)]
    job += ["--samples", "32", "--root-dir", str(root)]
    export = {**cluster.job_environment(), **deepspeed.environ({}), "OMP_NUM_THREADS": "1"}
    result = cluster.run(job, timeout=TIMEOUT, export=export)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "RESULT " not in output, output[-4000:]
    stops = [line for line in output.splitlines() if line.startswith("NodeCheckError: rank ")]
    assert len(stops) == 4, output[-4000:]
    for line in stops:
        assert "on node 1 (host 127.0.0.3, rank 2) the checkpoint folder" in line, line
        assert f"{str(root)!r} cannot be written (Read-only file system)" in line, line
        assert "every rank writes its shard there" in line, line


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize(("read_only", "stops"), [("node2", False), ("node1", True)])
def test_under_srun_the_node_that_cannot_write_is_named_before_the_first_step(
    slurm_cluster, tmp_path, read_only: str, stops: bool
):
    # srun waits for every task: where the job stops, every rank raises the same error and exits, so the step ends.
    root = tmp_path / "checkpoints"
    root.mkdir()
    job = [str(READ_ONLY_NODE), read_only, str(root), sys.executable, str(TRAINER_JOB), "--strategy", "ddp_mpi"]
    job += ["--zero-config", "--root-dir", str(root), "--validate", "--workers", "2", "--samples", "32"]
    done = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", *job], timeout=TIMEOUT)
    output = done.stdout + done.stderr
    node = "node 0 (host node1, rank 0)" if stops else "node 1 (host node2, rank 2)"
    if stops:
        assert done.returncode != 0, output[-4000:]
        assert "FIRST_STEP" not in output, output[-4000:]
        stopped = [line for line in done.stderr.splitlines() if line.startswith("NodeCheckError: rank ")]
        assert len(stopped) == 4, output[-4000:]
        assert all(f"on {node} the checkpoint folder {str(root)!r} cannot be written" in line for line in stopped)
    else:
        assert done.returncode == 0, output[-4000:]
        assert output.count("RESULT ") == 4, output[-4000:]
        line = next(line for line in output.splitlines() if "The node check before the first step found" in line)
        assert f"on {node} the checkpoint folder {str(root)!r} cannot be written" in line, line
