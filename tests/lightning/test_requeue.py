"""Checkpoint and requeue: the plan each scheduler's row gives, and the signal handling for real under mpirun.

Grid Engine, PBS and LSF are not installed here: their requeue command is a stand-in on PATH that records its
arguments and how many HPC checkpoints existed when it ran (so: saved before the requeue). Slurm's requeue runs on
the real two-node Slurm cluster (tests/clusters/slurm.py), through the example job scripts, with srun and with
mpirun inside sbatch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from lightning_mpi_env import MPIClusterEnvironment
from lightning_mpi_env.core.errors import CheckpointError, CheckpointWarning, JobIdError, SettingError
from lightning_mpi_env.core.schedulers import LSF, PBS, SGE, SLURM, scheduler_job
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning import requeue as requeue_module
from lightning_mpi_env.lightning.checkpoints import Saved
from lightning_mpi_env.lightning.requeue import Requeue, checkpoint_and_requeue, hpc_checkpoint, newest_checkpoint
from lightning_mpi_env.tools.simcluster import SimulatedCluster, find_mpirun, processes_with, session_dir_arguments
from tests.conftest import TRAINER_JOB

EXAMPLES_JOBS = TRAINER_JOB.parents[1] / "jobs"
SLURM_TIMEOUT = 300  # two runs of a Lightning job on two (maybe busy) cores, and the requeue between them
HANG_LIMIT = 150  # one run of a Lightning job under mpirun on two (maybe busy) cores: only a hang takes longer
USER_JOB = ("--workers", "2", "--validate")
"""The instrumented job as users write theirs: data loader workers, a validation loop, a ``ModelCheckpoint``."""

# --- the plan ---------------------------------------------------------------------------------------------------------


def plan(env, **kwargs):
    # As MPIClusterEnvironment does: the settings record (LIGHTNING_MPI_ENV_REQUEUE), the argument taking precedence.
    return Requeue.plan(
        env,
        enabled=Settings.from_env(env).with_arguments(requeue=kwargs.get("enabled")).requeue,
        requeue_signal=kwargs.get("requeue_signal"),
        command=kwargs.get("command"),
    )


@pytest.mark.parametrize(
    ("env", "scheduler", "command", "exit_code", "signum"),
    [
        ({"SLURM_JOB_ID": "12"}, SLURM, ("scontrol", "requeue", "12"), 0, signal.SIGUSR1),
        # An array task by its array id: requeuing "37" would hit the whole array when 37 is the array's master id.
        (
            {"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "1"},
            SLURM,
            ("scontrol", "requeue", "36_1"),
            0,
            signal.SIGUSR1,
        ),
        # Grid Engine reschedules a job that exits 99; -notify sends SIGUSR2 before the kill.
        ({"JOB_ID": "5"}, SGE, (), 99, signal.SIGUSR2),
        ({"PBS_JOBID": "4242.pbs01"}, PBS, ("qrerun", "4242.pbs01"), 0, signal.SIGUSR1),
        ({"LSB_JOBID": "7"}, LSF, ("brequeue", "7"), 0, signal.SIGUSR2),  # LSF's signal at the run limit
        ({"LSB_JOBID": "7", "LSB_JOBINDEX": "3"}, LSF, ("brequeue", "7[3]"), 0, signal.SIGUSR2),
        ({"LSB_JOBID": "7", "LSB_JOBINDEX": "0"}, LSF, ("brequeue", "7"), 0, signal.SIGUSR2),  # 0: not an array
    ],
)
def test_each_scheduler_s_requeue(env, scheduler, command, exit_code, signum):
    requeue = plan(env)
    assert requeue is not None
    assert (requeue.scheduler, requeue.command, requeue.exit_code, requeue.signum) == (
        scheduler,
        command,
        exit_code,
        signum,
    )
    assert plan(env, requeue_signal=signal.SIGHUP).signum is signal.SIGHUP  # the user's choice wins


def test_no_scheduler_or_flux_or_off_means_no_requeue():
    assert plan({}) is None
    assert plan({"FLUX_ENCLOSING_ID": "ƒ2n7Sd1Ky"}) is None  # Flux puts no job back in its queue
    assert plan({"SLURM_JOB_ID": "12"}, enabled=False) is None
    assert plan({"SLURM_JOB_ID": "12", "LIGHTNING_MPI_ENV_REQUEUE": "0"}) is None
    assert plan({"SLURM_JOB_ID": "12", "LIGHTNING_MPI_ENV_REQUEUE": "0"}, enabled=True) is not None


def test_bad_requeue_variable_is_a_setting_error():
    with pytest.raises(SettingError, match=r"LIGHTNING_MPI_ENV_REQUEUE='later' is not one of 1, 0"):
        plan({"SLURM_JOB_ID": "12", "LIGHTNING_MPI_ENV_REQUEUE": "later"})


def test_a_command_of_the_user_s_own():
    # PBS's qrerun needs a manager on most sites: resubmit the job script instead.
    requeue = plan({"PBS_JOBID": "1.pbs"}, command=["qsub", "job.sh"])
    assert requeue is not None
    assert requeue.command == ("qsub", "job.sh")


def test_a_job_id_not_in_the_scheduler_s_syntax_never_reaches_the_command(tmp_path, monkeypatch):
    record = stand_ins(tmp_path, monkeypatch)
    with pytest.raises(JobIdError, match=r"SLURM_JOB_ID='--partition=evil' is not in Slurm's syntax for it") as raised:
        plan({"SLURM_JOB_ID": "--partition=evil"})
    assert (raised.value.variable, raised.value.value, raised.value.launcher) == (
        "SLURM_JOB_ID",
        "--partition=evil",
        "Slurm",
    )
    assert "do not set SLURM_JOB_ID by hand" in raised.value.hint
    with pytest.raises(JobIdError, match=r"SLURM_ARRAY_TASK_ID='1 -p x'"):
        plan({"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "1 -p x"})
    with pytest.raises(JobIdError, match=r"LSB_JOBINDEX='\\u0663'"):
        plan({"LSB_JOBID": "7", "LSB_JOBINDEX": chr(0x663)})  # int() reads an Arabic-Indic 3; LSF never writes it
    assert not record.exists()  # no command ran


def test_checkpoint_numbering_by_name(tmp_path):
    assert newest_checkpoint(str(tmp_path)) is None
    for name in ("hpc_ckpt_2.ckpt", "hpc_ckpt_10.ckpt", "last_ckpt_99.ckpt", "hpc_ckpt_x.ckpt"):
        (tmp_path / name).write_text("")
    (tmp_path / f"hpc_ckpt_{'7' * 200}.ckpt").write_text("")
    (tmp_path / f"hpc_ckpt_{chr(0x663) * 2}.ckpt").write_text("")  # int() reads 33; no hpc_ckpt_33.ckpt exists
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "hpc_ckpt_10.ckpt")


# --- a SIGTERM at the time limit, or a cancel ----------------------------------------------------------------------


def test_the_exported_end_time_tells_a_time_limit_from_a_cancel():
    # sbatch(1), Slurm 23.02 and newer: SLURM_JOB_END_TIME, "the UNIX timestamp for a job's projected end time".
    job = scheduler_job({"SLURM_JOB_ID": "12", "SLURM_JOB_END_TIME": "1000000"})
    never = lambda *args, **kwargs: pytest.fail("no command where the end time is exported")  # noqa: E731
    assert requeue_module.ended_by_time_limit(job, 1_000_005.0, run=never) is True
    assert requeue_module.ended_by_time_limit(job, 1_000_000.0 - requeue_module.END_TIME_SLACK, run=never) is True
    assert requeue_module.ended_by_time_limit(job, 1_000_000.0 - 3600, run=never) is False  # an hour early: cancelled
    with pytest.raises(JobIdError, match=r"SLURM_JOB_END_TIME='soon' is not in Slurm's syntax"):
        scheduler_job({"SLURM_JOB_ID": "12", "SLURM_JOB_END_TIME": "soon"})


@pytest.mark.parametrize(
    ("status", "printed", "expected"),
    [(0, "TimeLimit\n", True), (0, "None\n", False), (1, "", None), (0, "TimeLimit" + "x" * 200, False)],
    ids=["time-limit", "cancelled", "squeue-failed", "garbled"],
)
def test_without_an_end_time_slurm_s_reason_tells_them_apart(status, printed, expected):
    # Slurm 22.05 exports no end time: squeue's %r says TimeLimit at the limit, None after scancel (seen for real).
    calls = []

    def squeue(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, status, printed, "")

    job = scheduler_job({"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "1"})
    assert requeue_module.ended_by_time_limit(job, 0.0, run=squeue) is expected
    assert calls == [["squeue", "--noheader", "--jobs=36_1", "--format=%r"]]  # the array task by its array id


def test_without_the_client_or_on_another_scheduler_it_cannot_be_told():
    def missing(command, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", command[0])

    assert requeue_module.ended_by_time_limit(scheduler_job({"SLURM_JOB_ID": "12"}), 0.0, run=missing) is None
    assert requeue_module.ended_by_time_limit(scheduler_job({"PBS_JOBID": "1.pbs"}), 0.0, run=missing) is None


# --- the checkpoint, the record and the cap, in one process --------------------------------------------------------


class OneRankStrategy:
    """The strategy calls checkpoint_and_requeue makes, for a job of one rank."""

    def broadcast(self, obj, src=0):
        return obj

    def barrier(self, name=None):
        pass


class OneRankTrainer:
    """What checkpoint_and_requeue and hpc_checkpoint read of a Trainer; the save writes bytes as Lightning would."""

    def __init__(self, root, step=7):
        self.default_root_dir = str(root)
        self.global_rank = 0
        self.global_step = step
        self.strategy = OneRankStrategy()

    def save_checkpoint(self, path):
        with open(path, "wb") as file:
            file.write(b"PK" + b"\0" * 100)


def requeue_once(env, root, max_requeues, monkeypatch) -> int:
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        checkpoint_and_requeue(OneRankTrainer(root), plan(env), max_requeues)
    return exited.value.code


def test_the_cap_counts_restarts_of_this_job_not_files(tmp_path, monkeypatch, capsys):
    stand_ins(tmp_path, monkeypatch)
    root = tmp_path / "root"
    job = {"PBS_JOBID": "4242.pbs01"}  # PBS exports no restart count: the job's record keeps it
    assert [requeue_once(job, root, 2, monkeypatch) for _ in range(2)] == [0, 0]
    for path in root.glob("hpc_ckpt_*.ckpt"):
        path.unlink()  # deleting the checkpoints does not reset the count
    assert requeue_once(job, root, 2, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "not requeued: this would be requeue 3 of PBS job 4242.pbs01, past LIGHTNING_MPI_ENV_MAX_REQUEUES=2" in err
    assert "counted by the job's record" in err
    # Another job in the same folder has a count of its own.
    assert requeue_once({"PBS_JOBID": "4243.pbs01"}, root, 2, monkeypatch) == 0


def test_under_slurm_the_cap_is_slurm_s_restart_count(tmp_path, monkeypatch, capsys):
    stand_ins(tmp_path, monkeypatch)
    root = tmp_path / "root"
    # sbatch(1): SLURM_RESTART_COUNT, the times the job was restarted (requeued); no file can reset it.
    assert requeue_once({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "1"}, root, 2, monkeypatch) == 0
    assert requeue_once({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}, root, 2, monkeypatch) == 1
    assert "this would be requeue 3 of Slurm job 12, past" in capsys.readouterr().err
    assert sorted(path.name for path in root.glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt"]


def test_a_stray_checkpoint_name_does_not_stop_requeue(tmp_path, monkeypatch):
    record = stand_ins(tmp_path, monkeypatch)
    root = tmp_path / "root"
    root.mkdir()
    (root / f"hpc_ckpt_{'9' * 200}.ckpt").write_bytes(b"")  # once read as requeue 10**200, past any cap
    assert requeue_once({"SLURM_JOB_ID": "12"}, root, 20, monkeypatch) == 0
    assert (root / "hpc_ckpt_1.ckpt").stat().st_size > 0
    assert record.read_text().splitlines() == ["scontrol requeue 12 checkpoints=0"]  # REQUEUE_ROOT is tmp_path


def resume(root, env, monkeypatch, *, lightning_would=None):
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def lightning_s_own(trainer):  # compat.hpc_resume_path, tested on the real Trainers in test_compat.py
        if isinstance(lightning_would, Exception):
            raise lightning_would
        return lightning_would

    monkeypatch.setattr(requeue_module, "hpc_resume_path", lightning_s_own)
    return hpc_checkpoint(OneRankTrainer(root))


def test_a_second_job_in_the_folder_never_resumes_the_first_s(tmp_path, monkeypatch, capsys):
    stand_ins(tmp_path, monkeypatch)
    root = tmp_path / "root"
    first, second = {"SLURM_JOB_ID": "101"}, {"SLURM_JOB_ID": "202"}
    requeue_once(first, root, 20, monkeypatch)
    theirs = str(root / "hpc_ckpt_1.ckpt")
    assert resume(root, first, monkeypatch, lightning_would=theirs) == theirs
    # Outside Slurm Lightning resumes nothing by itself: the second job starts afresh.
    assert resume(root, second, monkeypatch) is None
    # Under Slurm, fit(ckpt_path=None) would let Lightning take the first job's: an error naming both, and the fix.
    with pytest.raises(CheckpointError, match=r"Slurm job 202 has no checkpoint of its own") as raised:
        resume(root, second, monkeypatch, lightning_would=theirs)
    assert f"Lightning would resume {theirs}, saved by Slurm job 101" in raised.value.problem
    assert "Give each job its own default_root_dir" in raised.value.hint
    assert "os.environ['SLURM_JOB_ID']" in raised.value.hint
    # Once the second job saved its own, it resumes that, though the first job's number may be higher.
    requeue_once(second, root, 20, monkeypatch)
    requeue_once(first, root, 20, monkeypatch)
    assert resume(root, second, monkeypatch, lightning_would=str(root / "hpc_ckpt_3.ckpt")) == str(
        root / "hpc_ckpt_2.ckpt"
    )
    assert "resuming from" in capsys.readouterr().err


def test_a_stray_file_lightning_would_resume_is_named(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    stray = str(root / f"hpc_ckpt_{'9' * 200}.ckpt")
    with pytest.raises(CheckpointError, match=r"with no record of the job that saved it"):
        resume(root, {"SLURM_JOB_ID": "12"}, monkeypatch, lightning_would=stray)
    # Lightning's own reading fails on a name with no ASCII digit: said before fit() would fail on it.
    with pytest.raises(CheckpointError, match=r"Lightning's own Slurm resume cannot read the checkpoint names"):
        resume(root, {"SLURM_JOB_ID": "12"}, monkeypatch, lightning_would=ValueError("invalid literal for int()"))


def test_an_empty_newest_own_checkpoint_is_skipped_for_the_one_before(tmp_path, monkeypatch):
    stand_ins(tmp_path, monkeypatch)
    root = tmp_path / "root"
    job = {"SLURM_JOB_ID": "12"}
    requeue_once(job, root, 20, monkeypatch)
    requeue_once(job, root, 20, monkeypatch)
    (root / "hpc_ckpt_2.ckpt").write_bytes(b"")
    with pytest.warns(CheckpointWarning, match=r"hpc_ckpt_2.ckpt is skipped: it is empty"):
        assert resume(root, job, monkeypatch, lightning_would=str(root / "hpc_ckpt_2.ckpt")) == str(
            root / "hpc_ckpt_1.ckpt"
        )


def test_the_environment_plans_from_its_environment():
    env = {"JOB_ID": "5", "MASTER_ADDR": "nodea"}
    assert MPIClusterEnvironment(env).requeue is not None
    assert MPIClusterEnvironment(env, auto_requeue=False).requeue is None
    assert MPIClusterEnvironment(env).requeue.signum is signal.SIGUSR2  # Grid Engine's -notify signal
    assert MPIClusterEnvironment(env, requeue_signal=signal.SIGUSR1).requeue.signum is signal.SIGUSR1
    assert MPIClusterEnvironment({}).requeue is None


def test_requeue_now_without_a_scheduler_says_so():
    with pytest.raises(SettingError, match=r"requeue_now\(\) was called, but this job has no scheduler"):
        MPIClusterEnvironment({}).requeue_now(object())


def test_the_handler_notes_the_signal_and_keeps_the_previous_one():
    program = textwrap.dedent(
        """
        import os, signal
        from lightning_mpi_env.lightning.requeue import Requeue
        seen = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
        plan = Requeue.plan({"JOB_ID": "5"}, enabled=True, requeue_signal=signal.SIGUSR1, command=None)
        plan.install()
        plan.install()  # twice: one handler
        assert not plan.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        print(plan.requested, seen)
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip() == "True [10]", result.stderr


def test_a_forked_worker_ignores_the_signal_and_a_handler_put_back_after_restore_is_inert():
    # A data loader worker is forked from its rank: the scheduler's signal reaches it too (every process of the
    # step). It must neither die of it nor act on it. Lightning's Trainer puts back the handlers it found when it
    # registered its own, ours among them, after our restore: that one must behave as what was there before.
    program = textwrap.dedent(
        """
        import os, signal, sys
        from lightning_mpi_env.lightning.requeue import Requeue
        seen = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(os.getpid()))
        plan = Requeue.plan({"SLURM_JOB_ID": "5"}, enabled=True, requeue_signal=None, command=None)
        plan.install()
        read, write = os.pipe()
        worker = os.fork()
        if worker == 0:
            os.kill(os.getpid(), signal.SIGUSR1)
            os.write(write, f"{plan.requested} {seen}".encode())
            os._exit(0)
        os.close(write)
        print("worker:", os.read(read, 100).decode(), os.waitpid(worker, 0)[1])
        print("rank:", plan.requested, seen)
        ours = signal.getsignal(signal.SIGUSR1)
        plan.restore()
        print("restored:", signal.getsignal(signal.SIGUSR1) is not ours)
        signal.signal(signal.SIGUSR1, ours)  # as Lightning's signal connector does at its teardown
        os.kill(os.getpid(), signal.SIGUSR1)
        print("inert:", len(seen))  # chained to what was there, not counted
        plan.restore()  # the callback's teardown, after Lightning's: what was there before is back
        print("again:", signal.getsignal(signal.SIGUSR1) is not ours)
        # A handler put back over the default action acts as the default action: the process ends of the signal.
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        plan.install()
        ours = signal.getsignal(signal.SIGUSR1)
        plan.restore()
        signal.signal(signal.SIGUSR1, ours)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGUSR1)
        print("not reached")
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == -signal.SIGUSR1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "worker: False [] 0", result.stderr  # not counted, not chained, not ended
    assert lines[1] == "rank: False []", result.stderr  # the worker's signal is not the rank's
    assert lines[2:] == ["restored: True", "inert: 1", "again: True"], result.stderr


def test_the_handler_is_in_place_once_the_environment_is_made_and_a_forked_rank_puts_in_its_own():
    # A one-device Fabric calls nothing of the environment before its loop's workers fork: the handler must already be
    # there when the environment is made. A rank forked from the process that made it (ddp_fork) inherits an inert
    # one and puts in its own when its start calls watch_requeue_signal(); teardown puts back what was there.
    program = textwrap.dedent(
        """
        import os, signal
        from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
        environment = MPIClusterEnvironment({"SLURM_JOB_ID": "5"})
        made = signal.getsignal(signal.SIGUSR1)
        print("made:", type(made).__name__)
        read, write = os.pipe()
        rank = os.fork()
        if rank == 0:
            environment.watch_requeue_signal()  # what the forked rank's start calls
            os.kill(os.getpid(), signal.SIGUSR1)
            os.write(write, f"{signal.getsignal(signal.SIGUSR1) is not made} {environment.requeue.requested}".encode())
            os._exit(0)
        os.close(write)
        print("rank:", os.read(read, 100).decode(), os.waitpid(rank, 0)[1])
        print("maker:", environment.requeue.requested)
        environment.teardown()
        print("after teardown:", signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)
        """
    )
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "made: _Note",
        "rank: True True 0",  # its own handler, which counted the signal there
        "maker: False",
        "after teardown: True",
    ], result.stderr


# --- for real, under mpirun ---------------------------------------------------------------------------------------

STAND_IN = """#!/bin/sh
# A scheduler's requeue command: record the call, and how many HPC checkpoints were saved by then.
saved=$(ls "$REQUEUE_ROOT" | grep -c '^hpc_ckpt_')
printf '%s %s checkpoints=%s\\n' "$(basename "$0")" "$*" "$saved" >> "$REQUEUE_RECORD"
"""


@pytest.fixture
def requeue_job(tmp_path):
    """Runs the instrumented job under mpirun on 2 simulated nodes; signals mpirun once it trains."""
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir()
    root.mkdir()
    for name in ("qrerun", "brequeue", "scontrol"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record"
    cluster = SimulatedCluster(tmp_path)

    def run(
        scheduler_env: dict[str, str],
        *,
        signal_it: bool,
        strategy: str = "ddp",
        signum: signal.Signals = signal.SIGUSR1,
    ) -> tuple[int, str, list[dict]]:
        export = {
            **scheduler_env,
            "MASTER_ADDR": "127.0.0.2",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "REQUEUE_RECORD": str(record),
            "REQUEUE_ROOT": str(root),
            "OMP_NUM_THREADS": "1",
        }
        job = [sys.executable, str(TRAINER_JOB), "--strategy", strategy, "--devices", "1", "--num-nodes", "2"]
        job += ["--samples", "160", "--step-seconds", "0.3", "--root-dir", str(root), *USER_JOB]
        process = subprocess.Popen(
            cluster.mpirun(job, np=2, map_by="node", export=export),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        training: set[str] = set()  # the ranks that started their first step
        trained = threading.Event()

        def read() -> None:
            for line in process.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if line.startswith("FIRST_STEP rank="):
                    training.add(line.split()[1])
                    if len(training) == 2:
                        trained.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if signal_it:
                # Every rank trains, so every rank has the requeue handler (from on_train_start): the signal finds
                # no rank still starting, where its default action would end it. It comes at once, while most of
                # the job's 20 steps of 0.3 s are still to run.
                assert trained.wait(HANG_LIMIT), _hung("no FIRST_STEP of both ranks", lines, root)
                process.send_signal(signum)  # mpirun forwards it to every rank
            try:
                process.wait(timeout=HANG_LIMIT)
            except subprocess.TimeoutExpired:
                pytest.fail(_hung("the job did not end", lines, root))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        reader.join(HANG_LIMIT)  # mpirun ended: the rest of its output is in the pipe
        assert not reader.is_alive(), _hung("its output did not end with mpirun", lines, root)
        output = "".join(lines)
        results = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("RESULT ")]
        return process.returncode, output, results

    run.record = record  # type: ignore[attr-defined]
    run.root = root  # type: ignore[attr-defined]
    return run


def _hung(what: str, lines: list[str], root) -> str:
    """A hang's report: what did not happen within HANG_LIMIT, the job's processes (by its root dir), its output."""
    processes = "\n".join(processes_with(str(root))) or "(none)"
    return f"{what} within {HANG_LIMIT} s. The job's processes:\n{processes}\nIts output:\n{''.join(lines)[-4000:]}"


def _recorded(run) -> list[str]:
    return run.record.read_text().splitlines() if run.record.exists() else []


@pytest.mark.mpi
def test_grid_engine_exits_99_after_the_checkpoint_and_the_job_resumes_from_it(requeue_job):
    # SIGUSR2: what -notify sends before h_rt's kill, the default signal under Grid Engine.
    returncode, output, results = requeue_job({"JOB_ID": "424242"}, signal_it=True, signum=signal.SIGUSR2)
    assert returncode == 99, output[-3000:]  # mpirun passes it on; the job script's `exit $?` reschedules the job
    assert not results  # no rank finished training
    assert "lightning-mpi-env: requeue: saved" in output
    assert (requeue_job.root / "hpc_ckpt_1.ckpt").exists()
    # Rescheduled, and warned again at once, with a cap of 1 requeue: the second checkpoint is saved, but the job
    # is not requeued again (status 1, not 99), and says why.
    capped = {"JOB_ID": "424242", "LIGHTNING_MPI_ENV_MAX_REQUEUES": "1"}
    returncode, output, results = requeue_job(capped, signal_it=True, signum=signal.SIGUSR2)
    assert returncode == 1, output[-3000:]
    expected = "not requeued: this would be requeue 2 of SGE job 424242, past LIGHTNING_MPI_ENV_MAX_REQUEUES=1"
    assert expected in output, output[-3000:]
    assert (requeue_job.root / "hpc_ckpt_2.ckpt").exists()
    # Started again: resumes from the newest checkpoint, past step 0, and finishes.
    returncode, output, results = requeue_job({"JOB_ID": "424242"}, signal_it=False)
    assert returncode == 0, output[-3000:]
    assert "lightning-mpi-env: requeue: resuming from" in output
    assert "hpc_ckpt_2.ckpt" in output
    assert len(results) == 2
    assert all(result["first_global_step"] > 0 for result in results), results


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("scheduler_env", "signum", "strategy", "expected"),
    [
        # PBS: SIGUSR1 (qsub -l signal or qsig), ddp_mpi; LSF: SIGUSR2 (bsub -wa USR2), the plugin with ddp.
        ({"PBS_JOBID": "4242.pbs01"}, signal.SIGUSR1, "ddp_mpi", "qrerun 4242.pbs01 checkpoints=1"),
        ({"LSB_JOBID": "7"}, signal.SIGUSR2, "ddp", "brequeue 7 checkpoints=1"),
    ],
    ids=["pbs", "lsf"],
)
def test_rank_0_runs_the_scheduler_s_requeue_command_after_the_checkpoint(
    requeue_job, scheduler_env, signum, strategy, expected
):
    returncode, output, results = requeue_job(scheduler_env, signal_it=True, strategy=strategy, signum=signum)
    assert returncode == 0, output[-3000:]
    assert not results
    assert _recorded(requeue_job) == [expected]  # once, by rank 0, after the checkpoint
    assert "the job goes back in the queue" in output
    assert "Error" not in output  # no rank waits on rank 0 after the requeue (there, the job is killed)


@pytest.mark.parametrize(
    ("scheduler_env", "expected"),
    [
        ({"PBS_JOBID": "4242.pbs01"}, "qrerun 4242.pbs01 checkpoints=0"),
        ({"LSB_JOBID": "7", "LSB_JOBINDEX": "3"}, "brequeue 7[3] checkpoints=0"),
    ],
)
def test_the_requeue_command_runs_as_planned(tmp_path, monkeypatch, capsys, scheduler_env, expected):
    record = stand_ins(tmp_path, monkeypatch)
    assert plan(scheduler_env).run_command()
    assert record.read_text().splitlines() == [expected]
    assert "the job goes back in the queue" in capsys.readouterr().err


def test_a_failed_requeue_command_is_reported(tmp_path, monkeypatch, capsys):
    stand_ins(tmp_path, monkeypatch, status=3)
    assert not plan({"PBS_JOBID": "4242.pbs01"}).run_command()
    assert "`qrerun 4242.pbs01` failed (exit status 3)" in capsys.readouterr().err


def stand_ins(tmp_path, monkeypatch, status: int = 0):
    """The schedulers' requeue commands as stand-ins on PATH that record their arguments; returns the record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("qrerun", "brequeue", "scontrol"):
        (bin_dir / name).write_text(STAND_IN + f"exit {status}\n")
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("REQUEUE_RECORD", str(record))
    monkeypatch.setenv("REQUEUE_ROOT", str(tmp_path))
    return record


# --- for real, on the two-node Slurm cluster -------------------------------------------------------------------------

SLURM_STEPS = 24  # 64 samples, batch 4, 2 ranks, 3 epochs


def wait_training(cluster, job: str) -> None:
    """Wait until both ranks of ``job`` (2 nodes, 1 rank each) started training, as a time limit's warning finds them.

    Then each rank has the requeue handler (from ``on_train_start``): a signal to a rank still starting would end it
    (USR1's default action), not requeue the job.
    """
    for rank in (0, 1):
        cluster.wait_output(job, f"FIRST_STEP rank={rank} ", timeout=SLURM_TIMEOUT)


def run_requeued_slurm_job(
    cluster,
    tmp_path,
    script: str,
    train_args: tuple[str, ...] = (),
    *,
    batch: bool = True,
    prefix: tuple[str, ...] = (),
) -> tuple[str, list[dict]]:
    """Runs an example job script (on 2 nodes, 1 rank each) with the instrumented job; signals it once it trains, as
    ``#SBATCH --signal=B:USR1@90`` does (``batch``): to the batch script only; else as ``--signal=USR1@90`` does: to
    every process of every step, data loader workers included. ``prefix`` goes before the training command.
    """
    root = tmp_path / "root"
    root.mkdir()
    text = (EXAMPLES_JOBS / script).read_text()
    text = "\n".join(line for line in text.splitlines() if "--gpus-per-node" not in line)  # no GPUs here
    train = [*prefix, sys.executable, str(TRAINER_JOB), "--samples", "64", "--epochs", "3", "--step-seconds", "0.3"]
    train += ["--root-dir", str(root), *USER_JOB, *train_args]
    env = {
        "TRAIN": " ".join(train),
        "MPIRUN": " ".join([find_mpirun(), "--allow-run-as-root", *session_dir_arguments(tmp_path / "prte")]),
        "OMP_NUM_THREADS": "1",
    }
    job = cluster.sbatch(text, ["--nodes=2", "--ntasks-per-node=1"], env=env)
    wait_training(cluster, job)
    signalled = cluster.signal(job, "USR1", batch=batch)
    assert signalled.returncode == 0, signalled.stderr
    state = cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = cluster.output(job)
    assert state == "COMPLETED", output[-4000:]
    [info] = cluster.job_info(job)
    assert info["Restarts"] == "1", output[-4000:]
    results = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("RESULT ")]
    return output, results


def assert_resumed_and_finished(output: str, results: list[dict], *, requeued_by_rank: bool = True) -> None:
    assert "lightning-mpi-env: requeue: saved" in output
    assert ("the job goes back in the queue: `scontrol requeue" in output) is requeued_by_rank
    assert "lightning-mpi-env: requeue: resuming from" in output
    # Only the restarted run finished: both ranks, past step 0, to the last step, with the same weights.
    assert sorted(result["global_rank"] for result in results) == [0, 1], output[-4000:]
    assert {result["restart_count"] for result in results} == {"1"}
    assert all(result["first_global_step"] > 0 for result in results), results
    assert {result["global_step"] for result in results} == {SLURM_STEPS}
    assert len({tuple(result["weights"]) for result in results}) == 1


@pytest.mark.mpi
@pytest.mark.slurm
def test_slurm_mpirun_job_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    # The example's trap passes the batch script's signal to mpirun, which forwards it to every rank.
    output, results = run_requeued_slurm_job(
        slurm_cluster, tmp_path, "slurm_mpirun.sbatch", train_args=("--strategy", "ddp_mpi", "--persistent-workers")
    )
    assert_resumed_and_finished(output, results)
    assert {result["strategy"] for result in results} == {"MPIDDPStrategy"}


def saved_only_by_ranks(output: str) -> list[str]:
    """The SAVE lines of ``output`` (one per rank and checkpoint), each checked to come from a rank's process."""
    # Anywhere in a line: mpirun forwards each rank's lines, and a line another process left open can come first.
    ranks = set(re.findall(r"FIT pid=(\d+)\n", output))
    saves = [line for line in output.splitlines() if line.startswith("SAVE ")]
    workers = [line for line in saves if line.split("pid=", 1)[1].split()[0] not in ranks]
    assert not workers, f"saved by a process that is no rank (a data loader worker): {workers}"
    return saves


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize(
    ("script", "persistent", "strategy"),
    [("slurm_srun.sbatch", True, "ddp_mpi"), ("slurm_mpirun.sbatch", False, "ddp")],
    ids=["srun-persistent", "mpirun-in-sbatch"],
)
def test_a_job_with_data_loader_workers_checkpoints_requeues_and_resumes(
    slurm_cluster, tmp_path, script, persistent, strategy
):
    # Lightning #20280: `--signal=USR1@N` signals every process of an srun step, the loader workers too. They
    # neither die of it nor save; each rank saves once at one step, the job requeues and resumes there. (mpirun's
    # job script takes `--signal=B:USR1@N` and passes it on to mpirun: its steps are Open MPI's daemons.)
    args = ("--strategy", strategy, *(("--persistent-workers",) if persistent else ()))
    batch = script == "slurm_mpirun.sbatch"
    output, results = run_requeued_slurm_job(slurm_cluster, tmp_path, script, train_args=args, batch=batch)
    assert_resumed_and_finished(output, results)
    assert "killed by signal" not in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    saves = saved_only_by_ranks(output)
    hpc = [line for line in saves if int(line.rsplit("step=", 1)[1]) == results[0]["first_global_step"]]
    assert sorted(line.split()[1] for line in hpc) == ["rank=0", "rank=1"], saves


@pytest.mark.mpi
@pytest.mark.slurm
def test_ranks_without_scontrol_exit_75_and_the_job_script_requeues(slurm_cluster, tmp_path):
    # Lightning #21404: the ranks run where Slurm's client is not (a container). The checkpoint is saved, every rank
    # exits 75 alike, and the example job script, outside the container, requeues the job; it resumes.
    no_client = ("env", f"PATH={tmp_path / 'empty'}")  # no scontrol on the ranks' PATH
    args = ("--strategy", "ddp_mpi", "--persistent-workers")
    output, results = run_requeued_slurm_job(
        slurm_cluster, tmp_path, "slurm_srun.sbatch", args, batch=False, prefix=no_client
    )
    assert "`scontrol` is not on PATH here: the checkpoint" in output, output[-4000:]
    assert "every rank exits 75" in output
    assert "the job goes back in the queue" not in output  # no rank ran it
    first_run = output.split("resuming from", 1)[0]
    assert sorted(re.findall(r"srun: error: (node\d): task \d: Exited with exit code 75", first_run)) == [
        "node1",
        "node2",
    ], first_run[-4000:]
    assert_resumed_and_finished(output, results, requeued_by_rank=False)


# --- for real on Slurm: whose checkpoint a requeued job resumes ------------------------------------------------------

GATE = """if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then  # the test's hold on the restart, before training
  echo "GATED job=$SLURM_JOB_ID"
  while [ ! -e "$GATE" ]; do sleep 0.2; done
fi
"""
GATED_SAMPLES = 256  # 96 steps of 0.3 s: a job still trains while the other one is signalled and saves
GATED_STEPS = 96


def submit_gated(cluster, root, gate, *extra: str, together: str | None = None, time_limit: str | None = None) -> str:
    """The srun example job script (2 nodes, 1 rank each), whose restart waits for the file ``gate``.

    Each rank writes its result to ``root/results`` as well: its RESULT line, longer than 1024 bytes after 96 steps,
    reaches the job's output in pieces that another rank's line can cut (Slurm's ``SLURM_IO_MAX_MSG_LEN``,
    ``src/common/io_hdr.h``).
    """
    (root / "results").mkdir(exist_ok=True)
    text = (EXAMPLES_JOBS / "slurm_srun.sbatch").read_text()
    text = "\n".join(line for line in text.splitlines() if "--gpus-per-node" not in line)
    if time_limit is not None:  # a job that asks for no warning signal: Slurm's SIGTERM at the limit is all it gets
        text = "\n".join(line for line in text.splitlines() if "--signal=" not in line and "--time=" not in line)
    text = text.replace("set -eu\n", "set -eu\n" + GATE)
    train = [sys.executable, str(TRAINER_JOB), "--samples", str(GATED_SAMPLES), "--epochs", "3"]
    train += ["--step-seconds", "0.3", "--root-dir", str(root), "--result-dir", str(root / "results"), *USER_JOB]
    train += extra
    env = {"TRAIN": " ".join(train), "GATE": str(gate), "OMP_NUM_THREADS": "1"}
    if together is not None:  # DIR:COUNT: no rank starts fit() before COUNT ranks reached it (tamper.start_gate)
        env["INSTRUMENTED_START_GATE"] = together
    limit = [] if time_limit is None else [f"--time={time_limit}"]
    return cluster.sbatch(text, ["--nodes=2", "--ntasks-per-node=1", *limit], env=env)


def signal_once_training(cluster, job) -> None:
    wait_training(cluster, job)
    signalled = cluster.signal(job, "USR1")
    assert signalled.returncode == 0, signalled.stderr


def finished_after_one_restart(cluster, job, root) -> tuple[str, list[dict]]:
    state = cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = cluster.output(job)
    assert state == "COMPLETED", output[-4000:]
    [info] = cluster.job_info(job)
    assert info["Restarts"] == "1", output[-4000:]
    results = [json.loads(path.read_text()) for path in (root / "results").glob(f"result-{job}-*.json")]
    assert sorted(result["global_rank"] for result in results) == [0, 1], output[-4000:]
    assert {result["global_step"] for result in results} == {GATED_STEPS}
    assert len({tuple(result["weights"]) for result in results}) == 1
    return output, results


def saved_step(root, job: str, name: str) -> int:
    record = json.loads((root / ".lightning-mpi-env" / f"slurm-{job}.json").read_text())
    [step] = [item["step"] for item in record["saved"] if item["file"] == name and item["size"]]
    return step


def cut_off_save(root, job: str) -> str:
    """What a save that the scheduler's kill cut off leaves: the next name reserved (an empty file), recorded as
    pending in the job's record. Lightning's own Slurm resume would take it (the highest number) and fail on it."""
    this = scheduler_job({"SLURM_JOB_ID": job})
    record = checkpoints.read_record(str(root), this)
    cut = checkpoints.reserve_next(str(root))
    checkpoints.write_record(str(root), this, record._replace(saved=(*record.saved, Saved(cut, None, 99))))
    assert (root / cut).stat().st_size == 0
    return cut


@pytest.mark.mpi
@pytest.mark.slurm
def test_slurm_jobs_in_one_folder_each_resume_only_a_checkpoint_of_their_own(slurm_cluster, tmp_path):
    # The srun example job script, requeued for real: two jobs in one folder, each requeued once, resume their own
    # checkpoint, the newest of one cut off (empty) and skipped; then a new job there, which has none, is refused.
    root, gate = tmp_path / "root", tmp_path / "gate"
    root.mkdir()
    # Both jobs start training together, before either saves: a job still starting when the other's checkpoint
    # appears has none of its own, and hpc_checkpoint() rightly refuses to let Lightning resume the other's.
    together = f"{tmp_path / 'started'}:4"
    first = submit_gated(slurm_cluster, root, gate, together=together)
    second = submit_gated(slurm_cluster, root, gate, together=together)
    for job in (first, second):
        wait_training(slurm_cluster, job)
    # The second job saves hpc_ckpt_1 and is requeued; then the first saves hpc_ckpt_2, which Lightning's own Slurm
    # resume would take for the second job too; then the second job's next save is cut off: hpc_ckpt_3, empty.
    signal_once_training(slurm_cluster, second)
    slurm_cluster.wait_output(second, "lightning-mpi-env: requeue: saved", timeout=SLURM_TIMEOUT)
    signal_once_training(slurm_cluster, first)
    for job in (first, second):
        slurm_cluster.wait_output(job, f"GATED job={job}", timeout=SLURM_TIMEOUT)
    cut = cut_off_save(root, second)
    assert sorted(path.name for path in root.glob("hpc_ckpt_*")) == [f"hpc_ckpt_{n}.ckpt" for n in (1, 2, 3)]
    gate.touch()
    for job, own in ((second, "hpc_ckpt_1.ckpt"), (first, "hpc_ckpt_2.ckpt")):
        output, results = finished_after_one_restart(slurm_cluster, job, root)
        assert "the job goes back in the queue: `scontrol requeue" in output, output[-4000:]
        assert f"lightning-mpi-env: requeue: resuming from {root / own}\n" in output, output[-4000:]
        assert {result["first_global_step"] for result in results} == {saved_step(root, job, own)}
        assert {result["strategy"] for result in results} == {"DDPStrategy"}  # the plugin, under srun
    # Lightning's warning format leaves out the class (CheckpointWarning, checked in test_checkpoints.py).
    assert f"Slurm job {second}: the checkpoint {root / cut} is skipped: it is empty" in slurm_cluster.output(second)
    (root / cut).unlink()  # below, Lightning's own resume takes the highest number: a real checkpoint of the first
    # A new job in the same folder has no checkpoint of its own, and fit(ckpt_path=None) would let Lightning's own
    # Slurm resume take another job's: it stops before training, naming both jobs and the fix.
    third = submit_gated(slurm_cluster, root, gate)
    state = slurm_cluster.wait(third, timeout=SLURM_TIMEOUT)
    output = slurm_cluster.output(third)
    assert state == "FAILED", output[-4000:]
    assert f"Slurm job {third} has no checkpoint of its own in default_root_dir={root}" in output, output[-4000:]
    assert f"Lightning would resume {root / 'hpc_ckpt_2.ckpt'}, saved by Slurm job {first}" in output
    assert "Give each job its own default_root_dir" in output
    assert "FIRST_STEP" not in output
    assert "resuming from" not in output
    # A program that leaves the resume to Lightning (fit(model), no ckpt_path) gets another job's checkpoint
    # restored by Lightning itself: the callback stops it when training starts, before its first step.
    fourth = submit_gated(slurm_cluster, root, gate, "--lightning-resume")
    state = slurm_cluster.wait(fourth, timeout=SLURM_TIMEOUT)
    output = slurm_cluster.output(fourth)
    assert state == "FAILED", output[-4000:]
    assert f"Slurm job {fourth} resumed {root / 'hpc_ckpt_2.ckpt'}, saved by Slurm job {first}, not by this job" in (
        output
    ), output[-4000:]
    assert "ckpt_path=lightning_mpi_env.hpc_checkpoint(trainer)" in output
    assert "FIRST_STEP" not in output


# --- for real on Slurm: a time limit with SIGTERM only, and a cancel --------------------------------------------------

LIMITED_STEPS = 400  # 0.3 s a step: training outlasts the one-minute limit, which the controller finds within 30 s


@pytest.mark.mpi
@pytest.mark.slurm
def test_a_time_limit_s_sigterm_checkpoints_and_requeues_and_a_cancel_does_not(slurm_cluster, tmp_path):
    # Lightning #20542: `--time` and `--requeue`, no `--signal`. At the limit Slurm sends SIGTERM to every process of
    # the step (the loader workers too), then SIGKILL after KillWait: every rank saves at one step and the job is
    # requeued. Slurm 22.05 exports no end time: `squeue`'s reason (TimeLimit) tells it from a cancel.
    root, gate = tmp_path / "root", tmp_path / "gate"
    root.mkdir()
    steps = ("--strategy", "ddp_mpi", "--persistent-workers", "--epochs", "1000", "--steps", str(LIMITED_STEPS))
    job = submit_gated(slurm_cluster, root, gate, *steps, time_limit="1")
    wait_training(slurm_cluster, job)
    slurm_cluster.wait_output(job, f"GATED job={job}", timeout=SLURM_TIMEOUT)  # requeued: held before it trains
    first_run = slurm_cluster.output(job)
    assert "DUE TO TIME LIMIT" in first_run, first_run[-4000:]
    assert "requeue: saved" in first_run, first_run[-4000:]
    assert "after SIGTERM at the time limit" in first_run, first_run[-4000:]
    assert "the job goes back in the queue: `scontrol requeue" in first_run
    assert "Traceback" not in first_run, first_run[-4000:]
    assert "killed by signal" not in first_run, first_run[-4000:]
    saved_only_by_ranks(first_run)  # no data loader worker saved
    after = first_run.split("DUE TO TIME LIMIT", 1)[1]  # the HPC save; no validation or ModelCheckpoint after it
    saved = [line for line in after.splitlines() if line.startswith("SAVE ")]
    assert sorted(line.split()[1] for line in saved) == ["rank=0", "rank=1"], saved  # one save a rank, one step
    assert len({line.rsplit("step=", 1)[1] for line in saved}) == 1, saved
    updated = slurm_cluster.run(["scontrol", "update", f"JobId={job}", "TimeLimit=30"], timeout=15)
    assert updated.returncode == 0, updated.stderr  # the restart gets the time to finish
    gate.touch()
    state = slurm_cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = slurm_cluster.output(job)
    assert state == "COMPLETED", output[-4000:]
    [info] = slurm_cluster.job_info(job)
    assert info["Restarts"] == "1", output[-4000:]
    results = [json.loads(path.read_text()) for path in (root / "results").glob(f"result-{job}-*.json")]
    assert sorted(result["global_rank"] for result in results) == [0, 1], output[-4000:]
    step = int(saved[0].rsplit("step=", 1)[1])
    assert {result["first_global_step"] for result in results} == {step}, results  # resumed at the saved step
    assert {result["global_step"] for result in results} == {LIMITED_STEPS}
    # The same job cancelled by a person: every rank stops at one step with 143, nothing saved, nothing requeued.
    elsewhere = tmp_path / "cancelled"  # its own default_root_dir: the first job's checkpoint is not its own
    elsewhere.mkdir()
    cancelled = submit_gated(slurm_cluster, elsewhere, gate, *steps, time_limit="30")
    wait_training(slurm_cluster, cancelled)
    assert slurm_cluster.cancel(cancelled).returncode == 0
    assert slurm_cluster.wait(cancelled, timeout=SLURM_TIMEOUT) == "CANCELLED"
    output = slurm_cluster.output(cancelled)
    stops = re.findall(r"SIGTERM: rank (\d) stops after step (\d+)", output)
    assert sorted(rank for rank, _ in stops) == ["0", "1"], output[-4000:]
    assert len({at for _, at in stops}) == 1, output[-4000:]
    assert "requeue: saved" not in output, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert slurm_cluster.job_info(cancelled)[0]["Restarts"] == "0"


FABRIC_EXAMPLE = TRAINER_JOB.parents[1] / "fabric_train.py"


@pytest.mark.mpi
@pytest.mark.parametrize(("ends_in", "limit"), [(-10, True), (3600, False)], ids=["time-limit", "cancelled"])
def test_a_fabric_loop_requeues_on_the_time_limit_s_sigterm_and_stops_on_a_cancel(tmp_path, ends_in, limit):
    # The Fabric example under mpirun on two simulated nodes, in a Slurm job whose exported end time (Slurm 23.02+:
    # SLURM_JOB_END_TIME) has passed, or is an hour away: SIGTERM to every rank, as the time limit or scancel sends it.
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(STAND_IN)
    (bin_dir / "scontrol").chmod(0o755)
    export = {
        "SLURM_JOB_ID": "5150",
        "SLURM_JOB_END_TIME": str(int(time.time()) + ends_in),
        "MASTER_ADDR": "127.0.0.2",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "REQUEUE_RECORD": str(tmp_path / "record"),
        "REQUEUE_ROOT": str(root),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        str(FABRIC_EXAMPLE),
        "--steps",
        "10000000",
        "--save-every",
        "100",
        "--root-dir",
        str(root),
    ]
    process = subprocess.Popen(
        SimulatedCluster(tmp_path).mpirun(command, np=2, map_by="node", export=export),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    training = threading.Event()

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("saved "):  # rank 0 saved after 100 steps: both ranks train
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(HANG_LIMIT), _hung("no save", lines, root)
        ranks = [int(line.split()[0]) for line in processes_with(str(root)) if "fabric_train.py" in line]
        ranks = [pid for pid in ranks if b"OMPI_COMM_WORLD_RANK=" in Path(f"/proc/{pid}/environ").read_bytes()]
        assert len(ranks) == 2, processes_with(str(root))
        for pid in ranks:
            os.kill(pid, signal.SIGTERM)
        try:
            process.wait(timeout=HANG_LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(_hung("the job did not end", lines, root))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(HANG_LIMIT)
    output = "".join(lines)
    assert "Traceback" not in output, output[-4000:]
    assert "RESULT" not in output, output[-4000:]
    stops = re.findall(r"SIGTERM: rank (\d) stops after step (\d+)", output)
    if limit:  # the loop saved at the agreed step; rank 0 requeued; every rank exits 0
        assert process.returncode == 0, output[-4000:]
        assert (tmp_path / "record").read_text().splitlines() == ["scontrol requeue 5150 checkpoints=0"], output
        assert "after SIGTERM at the time limit" not in output  # the loop saves: its own line, "saved ..."
        assert not stops, output[-4000:]
    else:  # scancel: every rank stops at one step with 143, nothing requeued
        assert process.returncode == 143, output[-4000:]
        assert not (tmp_path / "record").exists(), output[-4000:]
        assert sorted(rank for rank, _ in stops) == ["0", "1"], output[-4000:]
        assert len({at for _, at in stops}) == 1, output[-4000:]


# --- Fabric: the signal and the requeue, the checkpoint left to the loop ------------------------------------------

FABRIC_LOOP = """
import os, signal, sys
import lightning.fabric as F
from lightning_mpi_env import MPIClusterEnvironment

environment = MPIClusterEnvironment()
fabric = F.Fabric(accelerator="cpu", devices=1, plugins=[environment])
fabric.launch()
for step in range(100):
    if step == 3:
        os.kill(os.getpid(), signal.SIGUSR1)  # as the scheduler would
    if environment.requeue_requested(fabric):
        fabric.save(os.path.join(sys.argv[1], "state.ckpt"), {"step": step})
        print(f"CHECKPOINT at step {step}", flush=True)
        environment.requeue_now(fabric)
"""


FABRIC_LOOP_WITH_WORKERS = """
import os, signal, sys
import torch
import lightning.fabric as F
from lightning_mpi_env import MPIClusterEnvironment

environment = MPIClusterEnvironment()
fabric = F.Fabric(accelerator="cpu", devices=1, plugins=[environment])
fabric.launch()
data = torch.utils.data.DataLoader(range(64), batch_size=4, num_workers=2, persistent_workers=sys.argv[2] == "1")
data = fabric.setup_dataloaders(data)
for step, batch in enumerate(data):  # the workers fork here, before the loop's first requeue_requested()
    if step == 3:
        os.killpg(0, signal.SIGUSR1)  # as the scheduler does: every process of the step, the workers too
    if environment.requeue_requested(fabric):
        fabric.save(os.path.join(sys.argv[1], "state.ckpt"), {"step": step, "pid": os.getpid()})
        print(f"CHECKPOINT at step {step}", flush=True)
        environment.requeue_now(fabric)
"""


@pytest.mark.parametrize("persistent", ["1", "0"], ids=["persistent", "not-persistent"])
def test_fabric_loop_with_data_loader_workers_checkpoints_and_requeues(tmp_path, persistent):
    # Lightning #20280: the scheduler's signal reaches the loader workers too; they neither die of it nor save.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(STAND_IN)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "loop.py").write_text(FABRIC_LOOP_WITH_WORKERS)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "31",
        "REQUEUE_RECORD": str(tmp_path / "record"),
        "REQUEUE_ROOT": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, str(tmp_path / "loop.py"), str(tmp_path), persistent],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        start_new_session=True,  # its own process group, for killpg(0)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["CHECKPOINT at step 3"], result.stderr[-3000:]
    assert "killed by signal" not in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "record").read_text().splitlines() == ["scontrol requeue 31 checkpoints=0"]


def test_fabric_loop_checkpoints_and_requeues(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(STAND_IN)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "loop.py").write_text(FABRIC_LOOP)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "31",
        "REQUEUE_RECORD": str(tmp_path / "record"),
        "REQUEUE_ROOT": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, str(tmp_path / "loop.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CHECKPOINT at step 3" in result.stdout
    assert (tmp_path / "state.ckpt").exists()
    assert (tmp_path / "record").read_text().splitlines() == ["scontrol requeue 31 checkpoints=0"]


def test_a_worker_s_end_that_comes_with_the_sigterm_is_no_race_condition_line():
    # Slurm's time limit signals every process of the step: a data loader worker's SIGCHLD is often pending with the
    # rank's SIGTERM. Python runs the SIGTERM handler first (the lower number), which swaps torch's SIGCHLD handler
    # for the package's; a SIG_DFL there made Python print "Signal 17 ignored due to race condition" with a traceback.
    code = """
        import os, signal, sys
        from lightning_mpi_env.lightning.requeue import let_workers_end
        seen = []
        sys.unraisablehook = lambda unraisable: seen.append(str(unraisable.exc_value))
        signal.signal(signal.SIGCHLD, lambda signum, frame: seen.append("torch's handler"))
        signal.signal(signal.SIGTERM, lambda signum, frame: let_workers_end())
        both = {signal.SIGTERM, signal.SIGCHLD}
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGCHLD)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both handlers run at the next bytecode, SIGTERM's first
        print(seen, signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, signal.SIG_IGN))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] True", done.stdout + done.stderr
