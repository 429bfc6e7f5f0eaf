"""SIGTERM to one rank only: every rank stops at the same step, with status 143 and no traceback, for real.

A scheduler or an operator may signal one process of a job (``kill -TERM`` of one rank, a node's own shutdown). Under
this package's environment the ranks agree on the step through the roll call's store (``rollcall/sigterm.py``), so
the one signalled rank does not leave the others in a collective with a peer that is gone. Jobs run under ``mpirun``
on two simulated nodes and under ``srun`` on the two-node Slurm cluster; the simulated nodes are processes of this
machine, so the test signals one rank's process by its pid, found from the rank variable in its environment.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from lightning_mpi_env.rollcall.sigterm import SIGTERM_STATUS
from lightning_mpi_env.tools.simcluster import SimulatedCluster, processes_with
from tests.conftest import INSTRUMENTED, TRAINER_JOB

FABRIC_JOB = INSTRUMENTED / "fabric_job.py"
HANG_LIMIT = 240  # one run of a Lightning job of two ranks on two (maybe busy) cores: only a hang takes longer
SLURM_TIMEOUT = 300
STOPPED = re.compile(r"lightning-mpi-env: SIGTERM: rank (\d+) stops after step (\d+)")

# A job as users write it (data loader workers, validation, a ModelCheckpoint), long enough that the signal comes
# while most of its steps are still to run: 400 samples, 2 ranks, batch 4, 0.3 s a step.
TRAINER_ARGS = ("--devices", "1", "--num-nodes", "2", "--samples", "400", "--step-seconds", "0.3")
TRAINER_ARGS += ("--workers", "2", "--validate")
FABRIC_ARGS = ("--devices", "1", "--num-nodes", "2", "--samples", "400", "--step-seconds", "0.3", "--workers", "2")


def rank_of(pid: int, variable: str) -> int | None:
    """The rank the launcher gave process ``pid`` (``variable`` in its environment), or ``None`` if it has none."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{variable}=".encode()
    values = [entry[len(prefix) :] for entry in environ if entry.startswith(prefix)]
    return int(values[0]) if values else None


def pid_of_rank(output: str, rank: int, variable: str) -> int:
    """The pid of ``rank``'s process, among the ``FIT pid=...`` lines of ``output`` (one per rank)."""
    pids = [int(pid) for pid in re.findall(r"^FIT pid=(\d+)$", output, flags=re.MULTILINE)]
    found = [pid for pid in pids if rank_of(pid, variable) == rank]
    assert len(found) == 1, f"rank {rank} among FIT pids {pids}: {found}\n{output[-3000:]}"
    return found[0]


def assert_stopped_together(status: int, output: str) -> None:
    """Status 143, each rank's one line naming the same step, and no traceback anywhere."""
    assert status == SIGTERM_STATUS, output[-4000:]
    assert "Traceback" not in output, output[-6000:]
    stops = [(int(rank), int(step)) for rank, step in STOPPED.findall(output)]
    assert sorted(rank for rank, _ in stops) == [0, 1], output[-4000:]
    assert len({step for _, step in stops}) == 1, stops
    assert "RESULT" not in output, output[-4000:]  # no rank trained to the end


def run_under_mpirun(tmp_path: Path, job: Path, args: tuple[str, ...], strategy: str, rank: int) -> tuple[int, str]:
    """Run ``job`` on 2 simulated nodes, one rank each; once both train, SIGTERM to ``rank``'s process only.

    A Trainer notes the signal from its first step on; Fabric under ``"ddp_mpi"`` from its first ``backward``.
    """
    cluster = SimulatedCluster(tmp_path)
    tag = f"sigterm-{uuid.uuid4().hex[:10]}"
    command = [sys.executable, str(job), *args, "--strategy", strategy, "--tag", tag]
    started = "FIRST_STEP rank=" if job == TRAINER_JOB else "FIRST_BACKWARD rank="
    if job == TRAINER_JOB:
        command += ["--root-dir", str(tmp_path / "root")]
    export = {"MASTER_ADDR": "127.0.0.2", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        cluster.mpirun(command, np=2, map_by="node", export=export),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    training: set[str] = set()
    trained = threading.Event()

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith(started):
                training.add(line.split()[1])
                if len(training) == 2:
                    trained.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert trained.wait(HANG_LIMIT), f"no {started} of both ranks:\n{''.join(lines)[-4000:]}"
        os.kill(pid_of_rank("".join(lines), rank, "OMPI_COMM_WORLD_RANK"), signal.SIGTERM)
        try:
            process.wait(timeout=HANG_LIMIT)
        except subprocess.TimeoutExpired:
            left = "\n".join(processes_with(tag))
            pytest.fail(f"the job did not end. Its processes:\n{left}\nIts output:\n{''.join(lines)[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(HANG_LIMIT)  # mpirun ended: the rest of its output is in the pipe
    return process.returncode, "".join(lines)


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("job", "args", "strategy", "rank"),
    [
        (TRAINER_JOB, TRAINER_ARGS, "ddp_mpi", 0),
        (TRAINER_JOB, TRAINER_ARGS, "ddp", 1),  # Lightning's DDPStrategy with the plugin
        (FABRIC_JOB, FABRIC_ARGS, "ddp_mpi", 1),
    ],
    ids=["trainer-rank0", "trainer-plugin-rank1", "fabric-rank1"],
)
def test_sigterm_to_one_rank_stops_every_rank_at_one_step(tmp_path, job, args, strategy, rank):
    status, output = run_under_mpirun(tmp_path, job, args, strategy, rank)
    assert_stopped_together(status, output)


SRUN_SCRIPT = """#!/bin/sh
srun --kill-on-bad-exit=0 {train}
echo "SRUN_STATUS=$?"
"""


@pytest.mark.mpi
@pytest.mark.slurm
def test_sigterm_to_one_srun_task_stops_every_task_at_one_step(slurm_cluster, tmp_path):
    train = [sys.executable, str(TRAINER_JOB), *TRAINER_ARGS, "--strategy", "ddp_mpi", "--root-dir", str(tmp_path)]
    script = SRUN_SCRIPT.format(train=" ".join(train))
    job = slurm_cluster.sbatch(script, ["--nodes=2", "--ntasks-per-node=1"], env={"OMP_NUM_THREADS": "1"})
    for rank in (0, 1):
        output = slurm_cluster.wait_output(job, f"FIRST_STEP rank={rank} ", timeout=SLURM_TIMEOUT)
    # The simulated nodes' tasks are processes of this machine: rank 1's, by its FIT line and SLURM_PROCID.
    os.kill(pid_of_rank(output, 1, "SLURM_PROCID"), signal.SIGTERM)
    slurm_cluster.wait_output(job, "SRUN_STATUS=", timeout=SLURM_TIMEOUT)
    slurm_cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = slurm_cluster.output(job)
    status = int(re.findall(r"^SRUN_STATUS=(\d+)$", output, flags=re.MULTILINE)[0])
    assert_stopped_together(status, output)
