"""The Trainer and Fabric with ``strategy="ddp_mpi"`` under ``restartable``, in real jobs on the simulated Slurm
cluster: 4 ranks, rank 2 killed or frozen before step 10 of 16, the survivors going on in their processes, alone (two
nodes) or with a new process on the spare node in rank 2's place (three).

The Trainer's state is the one ``"ddp_mpi"`` keeps in memory (``lightning_mpi_env/recovery/trainer_state.py``) and loads
for ``ckpt_path=generation.ckpt_path``; Fabric's, the program's own. The data are a pure function of the index
(``tests/jobs/restartable_job.py``), so the weights each job must end with are computed here. Under a strategy that
shards the state (Lightning's FSDP and DeepSpeed) none is kept: the survivors end, and ``lightning-mpi-env run`` starts
the job again from its last checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch
from torch.utils.data import DistributedSampler

from lightning_mpi_env import RecoveryError
from lightning_mpi_env.recovery.restart import KEPT_CHECKPOINT, Generation
from lightning_mpi_env.recovery.trainer_state import kept_checkpoint
from tests.clusters.deepspeed_venv import DeepSpeed
from tests.clusters.slurm import SlurmCluster
from tests.jobs.restartable_job import BATCH, LR, MOMENTUM, item, model
from tests.recovery.test_restart import (
    SRUN,
    TIMEOUT,
    expected_weights,
    group_timeout,
    read_records,
    run_relaunched_once,
    run_replaced,
    started,
)

JOB = Path(__file__).parents[1] / "jobs" / "restartable_lightning_job.py"
STEPS = 16
FAULT_STEP = 10
EPOCH_ITEMS = 192  # the job's epoch: 12 batches a rank on 4 ranks, 16 on 3


def run_job(cluster: SlurmCluster, out: Path, api: str, *args: str) -> tuple[int, str, dict[int, dict]]:
    out.mkdir()
    command = [*SRUN, sys.executable, str(JOB), "--api", api, "--out", str(out), "--steps", str(STEPS), *args]
    done = cluster.run(command, timeout=TIMEOUT, env={"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(group_timeout(args))})
    return done.returncode, done.stdout + done.stderr, read_records(out)


def rank_batch(world_size: int, rank: int, epoch: int, batch: int) -> list[int]:
    """Batch ``batch`` of ``rank`` in ``epoch``: Lightning gives a training loader torch's ``DistributedSampler``,
    shuffling with seed 0 (``PL_GLOBAL_SEED`` unset) and ``set_epoch`` at each epoch."""
    sampler = DistributedSampler(range(EPOCH_ITEMS), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)[batch * BATCH : (batch + 1) * BATCH]


def sampler_batch(world_size: int, epoch: int, batch: int) -> list[int]:
    """The items of one global batch: batch ``batch`` of every rank's share."""
    return [index for rank in range(world_size) for index in rank_batch(world_size, rank, epoch, batch)]


def weights_after(batches: list[list[int]]) -> list[float]:
    """The weights after one momentum SGD step on the mean loss of each global batch of ``batches``."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    for indices in batches:
        pairs = [item(index) for index in indices]
        x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
    return [float(v) for v in torch.cat([p.detach().flatten() for p in net.parameters()])]


@pytest.mark.mpi
@pytest.mark.slurm
def test_the_trainer_without_a_fault_trains_as_ddp_mpi(slurm_cluster: SlurmCluster, tmp_path: Path):
    code, output, records = run_job(slurm_cluster, tmp_path / "out", "trainer")
    assert code == 0, output[-4000:]
    assert sorted(records) == [0, 1, 2, 3], output[-4000:]
    # 12 batches an epoch on 4 ranks: steps 12 to 15 are the second epoch's first 4.
    expected = weights_after([sampler_batch(4, step // 12, step % 12) for step in range(STEPS)])
    for launch_rank, record in records.items():
        assert record["generations"] == [[1, launch_rank, 4, 0, None]]
        assert record["items"] == [rank_batch(4, launch_rank, step // 12, step % 12) for step in range(STEPS)]
        assert record["weights"] == pytest.approx(expected, abs=1e-9)


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_the_trainer_goes_on_with_the_survivors_from_the_state_kept_in_memory(
    slurm_cluster: SlurmCluster, tmp_path: Path, fault: str
):
    freeze = ["--freeze"] if fault == "frozen" else []
    out = tmp_path / "out"
    code, output, records = run_job(
        slurm_cluster, out, "trainer", "--shrink", "--fault-rank", "2", "--fault-step", str(FAULT_STEP), *freeze
    )
    assert "srun: error: node2: task 2: Killed" in output, output[-4000:]
    assert sorted(records) == [0, 1, 3], output[-4000:]
    assert started(out) == {rank: [records[rank]["pid"]] for rank in (0, 1, 3)} | {2: [ANY]}
    for launch_rank, record in records.items():
        new_rank = {0: 0, 1: 1, 3: 2}[launch_rank]
        # Generation 2 resumed at step 10 from the state handed over in memory, not from a file.
        assert record["generations"] == [[1, launch_rank, 4, 0, None], [2, new_rank, 3, FAULT_STEP, KEPT_CHECKPOINT]]
        assert record["worlds"] == [4] * FAULT_STEP + [3] * (STEPS - FAULT_STEP)
    # Lightning's mid-epoch semantics for a plain DataLoader: the step count goes on from 10, while the epoch's data
    # start again from its first batch, now shared by 3 ranks (16 batches an epoch: steps 10 to 15 are its batches
    # 0 to 5). Momentum and weights are those of the 10 steps done on 4 ranks (the lost step was done again).
    expected = weights_after(
        [sampler_batch(4, 0, step) for step in range(FAULT_STEP)]
        + [sampler_batch(3, 0, batch) for batch in range(STEPS - FAULT_STEP)]
    )
    for launch_rank, record in records.items():
        new_rank = {0: 0, 1: 1, 3: 2}[launch_rank]
        assert record["items"] == [rank_batch(4, launch_rank, 0, step) for step in range(FAULT_STEP + 1)] + [
            rank_batch(3, new_rank, 0, batch) for batch in range(STEPS - FAULT_STEP)
        ], "generation 1's steps 0 to 10 (10 failed), then generation 2's"
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    assert output.count("goes on with the 3 survivors") == 1, output[-4000:]
    took = max(record["recovered_at"] for record in records.values()) - float((out / "fault").read_text())
    timeout = group_timeout(tuple(freeze))
    print(f"FIGURE Trainer, shrink, {fault}, group timeout {timeout} s: fault to the next step {took:.2f} s")


@pytest.mark.mpi
@pytest.mark.slurm
def test_fabric_goes_on_with_the_survivors_from_its_own_kept_state(slurm_cluster: SlurmCluster, tmp_path: Path):
    out = tmp_path / "out"
    code, output, records = run_job(
        slurm_cluster, out, "fabric", "--shrink", "--fault-rank", "2", "--fault-step", str(FAULT_STEP)
    )
    assert sorted(records) == [0, 1, 3], output[-4000:]
    assert started(out) == {rank: [records[rank]["pid"]] for rank in (0, 1, 3)} | {2: [ANY]}
    expected = expected_weights([4] * FAULT_STEP + [3] * (STEPS - FAULT_STEP))
    for launch_rank, record in records.items():
        # Fabric's ranks and world size are the generation's: ddp_mpi took them, and the group restartable opened.
        assert record["generations"] == [
            [1, launch_rank, 4, 0, None],
            [2, {0: 0, 1: 1, 3: 2}[launch_rank], 3, 10, None],
        ]
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    assert output.count("goes on with the 3 survivors") == 1, output[-4000:]


def test_the_kept_path_outside_restartable_is_one_named_error():
    with pytest.raises(RecoveryError, match="outside restartable's main") as caught:
        kept_checkpoint(None)
    assert "ckpt_path=generation.ckpt_path" in caught.value.hint


def test_a_state_that_is_no_trainer_checkpoint_is_one_named_error():
    generation = Generation(2, 0, 3, resumed={"model": {}, "step": 4})
    assert generation.ckpt_path == KEPT_CHECKPOINT
    with pytest.raises(RecoveryError, match="generation 2 resumed no Trainer checkpoint from rank 0"):
        kept_checkpoint(generation)


def test_no_state_kept_resumes_nothing():
    assert Generation(1, 0, 4).ckpt_path is None
    assert Generation(2, 0, 3, resumed=None).ckpt_path is None  # no step had finished: the fit starts afresh


@pytest.mark.mpi
@pytest.mark.slurm
def test_the_trainer_with_a_stateful_loader_goes_on_in_the_epoch(slurm_cluster: SlurmCluster, tmp_path: Path):
    out = tmp_path / "out"
    code, output, records = run_job(
        slurm_cluster, out, "trainer", "--stateful", "--shrink", "--fault-rank", "2", "--fault-step", str(FAULT_STEP)
    )
    assert sorted(records) == [0, 1, 3], output[-4000:]
    # torchdata's loader resumes rank 0's position (10 batches taken) in each rank's share of the new world: batches
    # 10 to 15 of the 3 ranks' shares (so this epoch's items are not each seen once: the shares changed).
    expected = weights_after(
        [sampler_batch(4, 0, step) for step in range(FAULT_STEP)]
        + [sampler_batch(3, 0, batch) for batch in range(FAULT_STEP, STEPS)]
    )
    for launch_rank, record in records.items():
        new_rank = {0: 0, 1: 1, 3: 2}[launch_rank]
        assert record["items"] == [rank_batch(4, launch_rank, 0, step) for step in range(FAULT_STEP + 1)] + [
            rank_batch(3, new_rank, 0, batch) for batch in range(FAULT_STEP, STEPS)
        ], record["items"]
        assert record["generations"][1] == [2, new_rank, 3, FAULT_STEP, KEPT_CHECKPOINT]
        assert record["weights"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_a_replacement_on_the_spare_node_ends_with_the_weights_of_a_job_that_never_failed(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, api: str, fault: str
):
    # The allocation has a spare node: the world keeps its 4 ranks, a new process on node3 taking rank 2's place from
    # rank 0's state in memory (the Trainer's kept checkpoint, with torchdata's loader position; Fabric's own).
    records = check_replaced(slurm_cluster_with_spare, tmp_path / "out", api, fault, sys.executable)
    assert {value for record in records.values() for value in record["reconfigured"]} == {False}


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_on_torch_2_14_the_replacement_joins_the_group_reconfigured_in_place(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, api: str, newer_torch: Path
):
    # torch 2.14.1's reconfigure API: the survivors keep their one group, and "ddp_mpi" runs the Trainer or Fabric over
    # it again, the new process in rank 2's place (tests/recovery/test_groups.py has the group alone).
    records = check_replaced(slurm_cluster_with_spare, tmp_path / "out", api, "killed", str(newer_torch))
    assert {value for record in records.values() for value in record["reconfigured"]} == {True}


def check_replaced(cluster: SlurmCluster, out: Path, api: str, fault: str, python: str) -> dict[int, dict]:
    """Run the job on ``python``, rank 2 lost and replaced; check its generations, items and weights; its records."""
    job = [python, str(JOB), "--api", api, *(["--stateful"] if api == "trainer" else [])]
    output, records = run_replaced(cluster, out, job, fault)
    resumed = KEPT_CHECKPOINT if api == "trainer" else None
    for launch_rank, record in records.items():
        mine = [[2, launch_rank, 4, FAULT_STEP, resumed]]
        assert record["generations"] == ([] if launch_rank == 2 else [[1, launch_rank, 4, 0, None]]) + mine
    if api == "trainer":  # 12 batches an epoch on 4 ranks: steps 12 to 15 are the second epoch's first 4
        expected = weights_after([sampler_batch(4, step // 12, step % 12) for step in range(STEPS)])
        for launch_rank, record in records.items():
            done_steps = range(FAULT_STEP, STEPS) if launch_rank == 2 else [*range(FAULT_STEP + 1), *range(10, STEPS)]
            assert record["items"] == [rank_batch(4, launch_rank, step // 12, step % 12) for step in done_steps]
    else:
        expected = expected_weights([4] * STEPS)
    for record in records.values():
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    took = max(record["recovered_at"] for record in records.values()) - float((out / "fault").read_text())
    print(f"FIGURE {api}, replace, {fault}, {python}: fault to the next step {took:.2f} s")
    return records


@pytest.mark.mpi
@pytest.mark.slurm
def test_under_fsdp_no_state_is_kept_and_a_lost_rank_starts_the_job_again_from_its_last_checkpoint(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # Lightning's FSDPStrategy on CPU (gloo) shards the state: rank 0 holds a part. With a spare node there, the
    # survivors still do not go on in their processes: each ends with the error that says why, and run starts the job
    # again, which resumes the last checkpoint (step 8; the fault comes before step 10, once).
    job = [sys.executable, str(JOB), "--api", "trainer", "--fsdp"]
    check_resumed_last(slurm_cluster_with_spare, tmp_path, job, "FSDPStrategy")


@pytest.mark.mpi
@pytest.mark.slurm
def test_under_deepspeed_no_state_is_kept_and_a_lost_rank_starts_the_job_again_from_its_last_checkpoint(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, deepspeed: DeepSpeed
):
    # Lightning's DeepSpeedStrategy (ZeRO stage 2, on DeepSpeed's CPU accelerator with gloo) shards the optimizer state:
    # as under FSDP, each survivor ends with the error that says why, and run starts the job again, which resumes the
    # last checkpoint (a folder, each rank's part in it). `env` hands each rank DeepSpeed's built ops
    # (TORCH_EXTENSIONS_DIR), so that none compiles them.
    extensions = [f"{name}={value}" for name, value in deepspeed.environ({}).items()]
    job = ["env", *extensions, str(deepspeed.python), str(JOB), "--api", "trainer", "--deepspeed"]
    records = check_resumed_last(slurm_cluster_with_spare, tmp_path, job, "DeepSpeedStrategy")
    assert (tmp_path / "out" / "checkpoints" / "last.ckpt").is_dir()  # DeepSpeed's checkpoint: a folder
    assert len({tuple(record["weights"]) for record in records.values()}) == 1, records  # ZeRO's replicas agree


def check_resumed_last(cluster: SlurmCluster, tmp_path: Path, job: list[str], strategy: str) -> dict[int, dict]:
    """Run ``job`` under ``run``, rank 2 lost once before step 10; check that each survivor's error names ``strategy``,
    none was replaced, and each rank of the relaunch resumed ``last.ckpt`` (step 8) and did the steps from there."""
    output, records = run_relaunched_once(cluster, tmp_path, job)
    said = (
        f"generation 1 of 4 ranks lost rank 2, and no rank kept the state in memory: {strategy} shards the model and"
        " optimizer state over the ranks"
    )
    assert output.count(said) == 3, output[-4000:]  # each survivor's error
    assert "in its place" not in output, output[-4000:]
    last = str(tmp_path / "out" / "checkpoints" / "last.ckpt")
    assert sorted(records) == [0, 1, 2, 3], output[-4000:]
    for launch_rank, record in records.items():
        assert record["generations"] == [[1, launch_rank, 4, 8, last]], record
        assert record["worlds"] == [4] * (STEPS - 8), record
    return records
