"""Periodic HPC checkpoints (``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY``) and the first-step record, for a relaunched step.

The record logic and the pruning run on a one-rank stand-in Trainer (as ``test_requeue.py`` does); Lightning's real
Trainer (the installed Lightning and the oldest supported, 2.1.4) runs them in one process under a faked one-rank
Open MPI launch inside a PBS job; and on the simulated Slurm cluster, a job step whose rank 1 kills or freezes itself
at step 12 is run again in the same allocation (same job id) and resumes from the step-10 checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_mpi_env.core.schedulers import scheduler_job
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning.checkpoints import Record, Saved
from lightning_mpi_env.lightning.periodic import KEEP, FitProgress, Periodic, checkpoint_periodically, pruned
from lightning_mpi_env.lightning.requeue import checkpoint_and_requeue, hpc_checkpoint
from lightning_mpi_env.supervise.records import read_first_step, read_records
from tests.clusters.lightning_versions import INSTALLED, Lightning, oldest_lightning  # noqa: F401  (a fixture)
from tests.conftest import TRAINER_JOB
from tests.lightning.test_requeue import OneRankTrainer, plan, stand_ins

JOB = {"SLURM_JOB_ID": "4242"}

# --- the plan ---------------------------------------------------------------------------------------------------------


def test_no_plan_when_off_or_outside_a_scheduler_job():
    assert Periodic.plan(0, JOB) is None  # the default: off
    assert Periodic.plan(5, {}) is None  # no job: no record to keep them in
    periodic = Periodic.plan(5, JOB)
    assert periodic is not None
    assert (periodic.every, periodic.job.identity) == (5, "4242")


def test_due_every_n_global_steps_once_each():
    periodic = Periodic.plan(5, JOB)
    assert periodic is not None
    assert [step for step in range(1, 21) if periodic.due(step, 0)] == [5, 10, 15, 20]
    assert not periodic.due(10, 10)  # accumulated batches share a global step: one save
    assert not periodic.due(10, 12)  # resumed past it


# --- the record and its pruning ---------------------------------------------------------------------------------------


def saved(number: int, *, periodic: bool = True, size: int | None = 9) -> Saved:
    return Saved(f"hpc_ckpt_{number}.ckpt", size, 5 * number, periodic)


def record_of(*items: Saved) -> Record:
    return Record("slurm", "4242", ("SLURM_JOB_ID",), None, 0, items)


@pytest.mark.parametrize(
    ("items", "kept", "dropped"),
    [
        ([saved(1), saved(2)], [1, 2], []),
        ([saved(1), saved(2), saved(3)], [2, 3], [1]),
        # requeue checkpoints stay, whatever their age
        ([saved(1, periodic=False), saved(2), saved(3), saved(4)], [1, 3, 4], [2]),
        # a periodic save that never finished (a frozen rank), older than the newest: dropped with the old ones
        ([saved(1), saved(2, size=None), saved(3)], [1, 3], [2]),
        ([saved(1), saved(2), saved(3, size=None), saved(4)], [2, 4], [1, 3]),
    ],
)
def test_pruning_keeps_the_newest_complete_periodic_ones(items, kept, dropped):
    record, names = pruned(record_of(*items))
    assert [checkpoints.checkpoint_number(item.file) for item in record.saved] == kept
    assert [checkpoints.checkpoint_number(name) for name in names] == dropped
    assert KEEP == 2


def test_a_record_without_periodic_marks_reads_as_requeue_checkpoints(tmp_path):
    # Records of older versions have no "periodic": their checkpoints were requeues', never pruned.
    job = scheduler_job(JOB)
    assert job is not None
    path = Path(checkpoints.record_path(str(tmp_path), job))
    path.parent.mkdir()
    data = {"format": 1, "scheduler": "slurm", "job": "4242", "variables": ["SLURM_JOB_ID"], "name": "4242"}
    data |= {"requeues": 1, "saved": [{"file": "hpc_ckpt_1.ckpt", "size": 3, "step": 7}]}
    path.write_text(json.dumps(data))
    assert checkpoints.read_record(str(tmp_path), job).saved == (Saved("hpc_ckpt_1.ckpt", 3, 7, False),)
    data["saved"][0]["periodic"] = "yes"
    path.write_text(json.dumps(data))
    with pytest.raises(checkpoints.CheckpointError, match="periodic is not true or false"):
        checkpoints.read_record(str(tmp_path), job)


def periodic_saves(root: Path, steps: list[int], env=JOB) -> None:
    periodic = Periodic.plan(5, env)
    assert periodic is not None
    for step in steps:
        checkpoint_periodically(OneRankTrainer(root, step=step), periodic)


def test_periodic_saves_go_through_the_requeue_s_record_and_keep_two(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    root = tmp_path / "root"
    root.mkdir()
    other = root / "hpc_ckpt_1.ckpt"  # another job's checkpoint in the same folder: never touched
    other.write_bytes(b"theirs")
    periodic_saves(root, [5, 10, 15])
    job = scheduler_job(JOB)
    assert job is not None
    record = checkpoints.read_record(str(root), job)
    assert [(item.file, item.step, item.periodic) for item in record.saved] == [
        ("hpc_ckpt_3.ckpt", 10, True),
        ("hpc_ckpt_4.ckpt", 15, True),
    ]
    assert all(item.size == (root / item.file).stat().st_size for item in record.saved)
    assert record.requeues == 0  # not a requeue
    assert sorted(path.name for path in root.glob("hpc_ckpt_*")) == [
        "hpc_ckpt_1.ckpt",
        "hpc_ckpt_3.ckpt",
        "hpc_ckpt_4.ckpt",
    ]
    assert other.read_bytes() == b"theirs"
    assert "lightning-mpi-env: checkpoint: saved" in capsys.readouterr().err
    assert hpc_checkpoint(OneRankTrainer(root)) == str(root / "hpc_ckpt_4.ckpt")


def test_a_requeue_checkpoint_is_never_pruned_and_resumes_when_newest(tmp_path, monkeypatch):
    stand_ins(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    root = tmp_path / "root"
    periodic_saves(root, [5])
    with pytest.raises(SystemExit):
        checkpoint_and_requeue(OneRankTrainer(root, step=7), plan(JOB), 20)
    periodic_saves(root, [10, 15, 20])
    job = scheduler_job(JOB)
    assert job is not None
    record = checkpoints.read_record(str(root), job)
    assert [(item.step, item.periodic) for item in record.saved] == [(7, False), (15, True), (20, True)]
    assert record.requeues == 1  # the requeue counted once; the periodic saves not at all
    assert sorted(path.name for path in root.glob("hpc_ckpt_*")) == [
        "hpc_ckpt_2.ckpt",
        "hpc_ckpt_4.ckpt",
        "hpc_ckpt_5.ckpt",
    ]


class Resumed(OneRankTrainer):
    def __init__(self, root, step, ckpt_path, rank=0):
        super().__init__(root, step)
        self.ckpt_path = ckpt_path
        self.global_rank = rank


def test_the_first_step_record_is_written_once_by_rank_0(tmp_path):
    state = tmp_path / "state"
    settings = Settings.from_env({"LIGHTNING_MPI_ENV_STATE_DIR": str(state)})
    trainer = Resumed(tmp_path, 10, str(tmp_path / "hpc_ckpt_2.ckpt"))
    progress = FitProgress.start(trainer, settings, JOB)
    assert progress.periodic is None  # LIGHTNING_MPI_ENV_CHECKPOINT_EVERY unset
    assert read_first_step(str(state)) is None
    trainer.global_step = 11
    progress = progress.after_batch(trainer)
    record = read_first_step(str(state))
    assert record is not None
    assert (record.step, record.resumed_from, record.resumed_step, record.job_id) == (11, "hpc_ckpt_2.ckpt", 10, "4242")
    trainer.global_step = 12
    progress.after_batch(trainer)
    assert read_first_step(str(state)) == record  # once per fit
    assert [path.name for path in state.iterdir()] == ["first-step.json"]  # no temporary file left
    # Other ranks write nothing; without the setting nobody does.
    FitProgress.start(Resumed(tmp_path, 0, None, rank=1), settings, JOB).after_batch(trainer)
    assert FitProgress.start(trainer, Settings(), JOB).first_step is None


def test_a_first_step_record_that_cannot_be_written_is_said_not_raised(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("")
    settings = Settings.from_env({"LIGHTNING_MPI_ENV_STATE_DIR": str(blocked / "state")})
    trainer = Resumed(tmp_path, 0, None)
    trainer.global_step = 1
    FitProgress.start(Resumed(tmp_path, 0, None), settings, JOB).after_batch(trainer)
    assert "could not write the progress record first-step.json" in capsys.readouterr().err


# --- Lightning's real Trainer, one rank, in one process ---------------------------------------------------------------

MODEL = textwrap.dedent(
    """
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.steps = []

        def training_step(self, batch, index):
            self.steps.append(self.trainer.global_step)
            return self.layer(batch).sum()

        def validation_step(self, batch, index):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    """
)
"""The one-rank programs' model, recording the global step of each training step (indented for their text)."""

ONE_RANK = textwrap.dedent(
    """
    import json, sys
    import torch
    import lightning.pytorch as pl
    from lightning_mpi_env import MPIClusterEnvironment, hpc_checkpoint

    root, max_steps = sys.argv[1], int(sys.argv[2])

    {MODEL}
    trainer = pl.Trainer(
        strategy="ddp", plugins=[MPIClusterEnvironment()], accelerator="cpu", devices=1, max_steps=max_steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root,
    )
    model = Model()
    trainer.fit(model, torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2), ckpt_path=hpc_checkpoint(trainer))
    print("STEPS " + json.dumps(model.steps))
    """
).replace("{MODEL}", MODEL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def one_rank_fit(tmp_path: Path, root: Path, state: Path, max_steps: int, lightning: Lightning) -> list[int]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "OMPI_", "PMI"))}
    env |= {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PBS_JOBID": "4242.pbs01",
        "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": "2",
        "LIGHTNING_MPI_ENV_STATE_DIR": str(state),
        "OMP_NUM_THREADS": "1",
    }
    return run_program(ONE_RANK, tmp_path, root, max_steps, lightning.environ(env))[0]


def run_program(program: str, cwd: Path, root: Path, max_steps: int, env: dict[str, str]) -> tuple[list[int], str]:
    """Run one of the one-rank programs to ``max_steps``; the global step of each training step, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", program, str(root), str(max_steps)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("STEPS ")]
    return json.loads(line.split(" ", 1)[1]), done.stderr


@pytest.mark.parametrize("version", ["installed", pytest.param("oldest", marks=pytest.mark.slow)])
def test_a_real_trainer_saves_every_n_steps_and_a_second_fit_of_the_job_resumes(tmp_path, request, version):
    lightning = INSTALLED if version == "installed" else request.getfixturevalue("oldest_lightning")
    root = tmp_path / "root"
    assert one_rank_fit(tmp_path, root, tmp_path / "first", 7, lightning) == list(range(7))
    job = scheduler_job({"PBS_JOBID": "4242.pbs01"})
    assert job is not None
    record = checkpoints.read_record(str(root), job)
    assert [(item.file, item.step, item.periodic) for item in record.saved] == [
        ("hpc_ckpt_2.ckpt", 4, True),
        ("hpc_ckpt_3.ckpt", 6, True),
    ]
    first = read_first_step(str(tmp_path / "first"))
    assert first is not None
    assert (first.step, first.resumed_from, first.resumed_step, first.job_id) == (1, None, None, "4242.pbs01")
    # The same job's next fit resumes from step 6, goes on to 10, and keeps the newest two.
    assert one_rank_fit(tmp_path, root, tmp_path / "second", 10, lightning) == list(range(6, 10))
    second = read_first_step(str(tmp_path / "second"))
    assert second is not None
    assert (second.step, second.resumed_from, second.resumed_step) == (7, "hpc_ckpt_3.ckpt", 6)
    record = checkpoints.read_record(str(root), job)
    assert [(item.file, item.step) for item in record.saved] == [("hpc_ckpt_4.ckpt", 8), ("hpc_ckpt_5.ckpt", 10)]
    assert sorted(path.name for path in root.glob("hpc_ckpt_*")) == ["hpc_ckpt_4.ckpt", "hpc_ckpt_5.ckpt"]


OUTSIDE_A_JOB = textwrap.dedent(
    """
    import json, sys
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning_mpi_env.pytorch import MPIDDPStrategy, hpc_checkpoint

    root, max_steps = sys.argv[1], int(sys.argv[2])

    {MODEL}
    data = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2, num_workers=1)
    trainer = pl.Trainer(
        strategy=MPIDDPStrategy(), accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root, callbacks=[ModelCheckpoint(dirpath=root, save_last=True)],
    )
    model = Model()
    trainer.fit(model, data, data, ckpt_path=hpc_checkpoint(trainer))
    print("STEPS " + json.dumps(model.steps))
    """
).replace("{MODEL}", MODEL)


def test_outside_a_scheduler_a_second_run_resumes_the_last_checkpoint(tmp_path):
    """``python train.py`` twice, no scheduler: the second run goes on from the first's last checkpoint."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    runs = [run_program(OUTSIDE_A_JOB, tmp_path, tmp_path / "root", max_steps, env) for max_steps in (4, 8)]
    assert [steps for steps, _ in runs] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    said = "lightning-mpi-env: requeue: no scheduler job here ("
    assert all(said in stderr and "resuming as ckpt_path='last' does" in stderr for _, stderr in runs)


# --- for real on Slurm: a step killed, and run again in the same allocation -------------------------------------------

STEPS = 20
EVERY = 5
FAULT_AT = 12
RELAUNCH = """set -u
for step in 1 2; do
  export LIGHTNING_MPI_ENV_STATE_DIR="$STATE/step-$step"  # one folder per step, as lightning-mpi-env run sets it
  srun $TRAIN
  echo "STEP $step status=$?"
done
"""


@pytest.mark.mpi
@pytest.mark.slurm
def test_slurm_a_step_run_again_in_its_allocation_resumes_from_the_last_periodic_checkpoint(slurm_cluster, tmp_path):
    fault = "freeze"
    root, state, once = tmp_path / "root", tmp_path / "state", tmp_path / "fault-once"
    (root / "results").mkdir(parents=True)
    # 64 samples, batch 4, 2 ranks: 8 steps an epoch; rank 1 freezes itself at global step 12, the first time only,
    # and the stall watchdog, which finds it, records it and ends the step. A killed rank's step, which Slurm ends
    # itself, resumes the same way in tests/supervise/test_relaunch_slurm.py.
    train = [sys.executable, str(TRAINER_JOB), "--devices", "1", "--num-nodes", "2", "--samples", "64"]
    train += ["--steps", str(STEPS), "--step-seconds", "0.2", "--root-dir", str(root)]
    train += ["--result-dir", str(root / "results"), f"--{fault}", f"1:{FAULT_AT}", "--freeze-once", str(once)]
    env = {
        "TRAIN": " ".join(train),
        "STATE": str(state),
        "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": str(EVERY),
        "LIGHTNING_MPI_ENV_STALL_TIMEOUT": "10",  # a frozen rank 1 (or rank 0 left alone): the step ends
        "OMP_NUM_THREADS": "1",
    }
    job = slurm_cluster.sbatch(RELAUNCH, ["--nodes=2", "--ntasks-per-node=1"], env=env)
    final = slurm_cluster.wait(job, timeout=600)
    output = slurm_cluster.output(job)
    assert final == "COMPLETED", output[-6000:]
    assert f"{fault.upper()} rank=1 step={FAULT_AT}" in output, output[-6000:]
    assert "STEP 1 status=0" not in output, output[-6000:]
    assert "STEP 2 status=0" in output, output[-6000:]
    # The first step started afresh; the second resumed this job's step-10 checkpoint (not step 5's, not afresh).
    started = read_first_step(str(state / "step-1"))
    assert started is not None
    assert (started.step, started.resumed_from, started.resumed_step, started.job_id) == (1, None, None, job)
    relaunched = read_first_step(str(state / "step-2"))
    assert relaunched is not None
    assert (relaunched.resumed_from, relaunched.resumed_step, relaunched.step) == ("hpc_ckpt_2.ckpt", 10, 11)
    assert f"lightning-mpi-env: requeue: resuming from {root / 'hpc_ckpt_2.ckpt'}\n" in output, output[-6000:]
    # Both ranks of the second step went on from step 10 to the last, the step counter continuing: 2 steps redone.
    results = [json.loads(path.read_text()) for path in (root / "results").glob(f"result-{job}-*.json")]
    assert sorted(result["global_rank"] for result in results) == [0, 1], output[-6000:]
    for result in results:
        assert result["steps"] == list(range(10, STEPS)), result["steps"]
        assert result["global_step"] == STEPS
    assert len({tuple(result["weights"]) for result in results}) == 1
    assert FAULT_AT - results[0]["steps"][0] <= EVERY
    # The job's record keeps its newest two periodic checkpoints (steps 15 and 20); the older files are gone.
    record = json.loads((root / ".lightning-mpi-env" / f"slurm-{job}.json").read_text())
    assert [(item["file"], item["step"], item["periodic"]) for item in record["saved"]] == [
        ("hpc_ckpt_3.ckpt", 15, True),
        ("hpc_ckpt_4.ckpt", 20, True),
    ]
    assert record["requeues"] == 0
    assert sorted(path.name for path in root.glob("hpc_ckpt_*")) == ["hpc_ckpt_3.ckpt", "hpc_ckpt_4.ckpt"]
    if fault == "freeze":  # what the supervisor reads to leave the host out
        [frozen] = read_records(str(state / "step-1"))
        assert (frozen.kind.value, frozen.ranks, frozen.job_id) == ("frozen", (1,), job), frozen
    marker = f"{fault.upper()} rank=1"
    [fault_at] = [float(line.rsplit("time=", 1)[1]) for line in output.splitlines() if line.startswith(marker)]
    print(
        f"FIGURE periodic checkpoints every {EVERY} steps, srun, 2 ranks on 2 nodes: rank 1 {fault} at step "
        f"{FAULT_AT} (stall timeout 10 s); the same srun line run again finished its first step (step "
        f"{relaunched.step}) {relaunched.when - fault_at:.1f} s after the fault (Lightning's start included), "
        f"{FAULT_AT - relaunched.resumed_step} steps redone"
    )
