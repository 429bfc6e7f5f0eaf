"""SIGTERM to one rank only: every rank stops at the same step, with status 143 and no traceback, for real.

A scheduler or an operator may signal one process of a job (``kill -TERM`` of one rank, a node's own shutdown). Under
this package's environment the ranks agree on the step through the roll call's store (``rollcall/sigterm.py``), so
the one signalled rank does not leave the others in a collective with a peer that is gone. Jobs run under ``mpirun``
on two simulated nodes and under ``srun`` on the two-node Slurm cluster; the simulated nodes are processes of this
machine, so the test signals one rank's process by its pid, found from the rank variable in its environment.

A scheduler signals every process of the step, one after another: the data loader workers may get it first. torch's
worker dies of it, and its end may reach the rank before the rank's own signal: the tests send it in that order, the
workers first and each rank once they ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_mpi_env.rollcall.agreement import SIGTERM_STOP
from lightning_mpi_env.rollcall.sigterm import SIGTERM_STATUS
from lightning_mpi_env.rollcall.stall_verdict import KEY as WATCHDOG_KEY
from lightning_mpi_env.tools.simcluster import SimulatedCluster, processes_with
from tests.clusters.hydra import free_port
from tests.conftest import INSTRUMENTED, TRAINER_JOB

FABRIC_JOB = INSTRUMENTED / "fabric_job.py"
HANG_LIMIT = 240  # one run of a Lightning job of two ranks on two (maybe busy) cores: only a hang takes longer
SLURM_TIMEOUT = 300
STOPPED = re.compile(r"lightning-mpi-env: SIGTERM: rank (\d+) stops after step (\d+)")
RAISED = re.compile(r"^(?:\[rank\d+\]: )?(?:\w+\.)*\w*(?:Error|Exception)\b.*$", re.MULTILINE)
"""A line naming an exception a rank raised (with the rank's prefix where torch's elastic launch put one)."""

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


def loader_workers(pid: int) -> list[int]:
    """The children of process ``pid`` (a rank's data loader workers), from ``/proc/<pid>/task/*/children``."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(child) for child in children.read_text().split()]
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` ended: gone, or a zombie (its parent was sent ``SIGCHLD``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def workers_first(*ranks: int, variable: str) -> Callable[[str], None]:
    """How the scheduler signals, at its worst: ``SIGTERM`` to every loader worker of ``ranks``, then to the ranks.

    Each rank's signal is sent once its workers ended, so that their ends reach it first.
    """

    def send(output: str) -> None:
        pids = [pid_of_rank(output, rank, variable) for rank in ranks]
        workers = [worker for pid in pids for worker in loader_workers(pid)]
        assert workers, f"no data loader worker of ranks {ranks} to signal:\n{output[-3000:]}"
        for worker in workers:
            os.kill(worker, signal.SIGTERM)
        deadline = time.monotonic() + HANG_LIMIT
        while not all(ended(worker) for worker in workers):
            assert time.monotonic() < deadline, f"workers {workers} did not end on SIGTERM"
            time.sleep(0.01)
        for pid in pids:
            os.kill(pid, signal.SIGTERM)

    return send


def one_node_after_the_other(port: int, variable: str) -> Callable[[str], None]:
    """As :func:`workers_first` to rank 0's processes; to rank 1's once rank 1's watchdog thread saw rank 0's stop.

    The scheduler signals one node a moment after another. The test reads rank 0's store on ``port``: rank 0's request
    is there, and rank 1's thread wrote two reports since (an interval's report, then its look at the request).
    """
    first, second = workers_first(0, variable=variable), workers_first(1, variable=variable)

    def send(output: str) -> None:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.2", port, is_master=False, timeout=timedelta(seconds=HANG_LIMIT))
        first(output)
        report = f"{WATCHDOG_KEY}1"
        deadline = time.monotonic() + HANG_LIMIT
        try:
            while not store.check([f"{SIGTERM_STOP.key}requested"]):
                assert time.monotonic() < deadline, f"no rank asked to stop:\n{output[-3000:]}"
                time.sleep(0.01)
            beat = json.loads(store.get(report))["beat"]
            while json.loads(store.get(report))["beat"] < beat + 2:
                assert time.monotonic() < deadline, f"rank 1's watchdog stopped reporting:\n{output[-3000:]}"
                time.sleep(0.01)
        except dist.DistError:  # rank 0 ended, and its store with it: mpirun ends the job, the status tells why
            return
        second(output)

    return send


def assert_stopped_together(status: int, output: str, *, every_line: bool = True) -> None:
    """Status 143, each rank's one line naming the same step, and no traceback anywhere.

    Not ``every_line``: mpirun ends the other ranks once the first exits 143, maybe before they said so.
    """
    # Each rank's own lines before the tail, and every exception raised (a chained one's cause first): a failure in a
    # long run shows both ranks' side of the stop.
    said = "\n".join(line for line in output.splitlines() if not line.lstrip().startswith(("File ", "[rank", "^")))
    raised = "\n".join(dict.fromkeys(found[:400] for found in RAISED.findall(output)))
    shown = f"{said[-6000:]}\n--- raised ---\n{raised[-3000:]}\n--- the output's end ---\n{output[-3000:]}"
    assert status == SIGTERM_STATUS, shown
    assert "Traceback" not in output, shown
    stops = [(int(rank), int(step)) for rank, step in STOPPED.findall(output)]
    ranks = sorted(rank for rank, _ in stops)
    assert ranks == [0, 1] if every_line else ranks in ([0], [1], [0, 1]), output[-4000:]
    assert len({step for _, step in stops}) == 1, stops
    assert "RESULT" not in output, output[-4000:]  # no rank trained to the end


def run_under_mpirun(
    tmp_path: Path,
    job: Path,
    args: tuple[str, ...],
    strategy: str,
    send: Callable[[str], None],
    started: str | None = None,
    count: int = 1,
    port: int | None = None,
) -> tuple[int, str]:
    """Run ``job`` on 2 simulated nodes, one rank each; once both train, ``send(output)`` sends the signals.

    A Trainer notes the signal from its first step on; Fabric under ``"ddp_mpi"`` from its first ``backward``.
    ``started``, ``count``: instead, once each rank printed a line starting so ``count`` times. ``port``: the job's
    ``MASTER_PORT`` (else derived from the launch).
    """
    cluster = SimulatedCluster(tmp_path)
    tag = f"sigterm-{uuid.uuid4().hex[:10]}"
    command = [sys.executable, str(job), *args, "--strategy", strategy, "--tag", tag]
    started = started or ("FIRST_STEP rank=" if job == TRAINER_JOB else "FIRST_BACKWARD rank=")
    if job == TRAINER_JOB:
        command += ["--root-dir", str(tmp_path / "root")]
    export = {"MASTER_ADDR": "127.0.0.2", "OMP_NUM_THREADS": "1"}
    if port is not None:
        export["MASTER_PORT"] = str(port)
    process = subprocess.Popen(
        cluster.mpirun(command, np=2, map_by="node", export=export),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    seen: dict[str, int] = {}
    trained = threading.Event()

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith(started):
                rank = line.split()[1]
                seen[rank] = seen.get(rank, 0) + 1
                if len(seen) == 2 and min(seen.values()) >= count:
                    trained.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert trained.wait(HANG_LIMIT), f"no {started} of both ranks:\n{''.join(lines)[-4000:]}"
        send("".join(lines))
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
    one_rank = lambda output: os.kill(pid_of_rank(output, rank, "OMPI_COMM_WORLD_RANK"), signal.SIGTERM)  # noqa: E731
    status, output = run_under_mpirun(tmp_path, job, args, strategy, one_rank)
    assert_stopped_together(status, output)


@pytest.mark.mpi
def test_sigterm_that_ends_the_loader_workers_first_stops_every_rank_at_one_step(tmp_path):
    # Without it, torch's SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal: Terminated" in the
    # rank wherever its main thread is; its peers end on "Connection closed by peer" (Lightning #20542's time limit).
    send = workers_first(0, 1, variable="OMPI_COMM_WORLD_RANK")
    args = (*TRAINER_ARGS, "--persistent-workers")  # the sanity check's workers live on
    status, output = run_under_mpirun(tmp_path, TRAINER_JOB, args, "ddp_mpi", send)
    assert_stopped_together(status, output, every_line=False)  # with no worker left to end, teardown is quick
    assert "killed by signal" not in output, output[-4000:]


# Every rank waits for a batch that never comes once the signal ends the workers. Without the stop between steps,
# each rank raises "DataLoader worker (pid(s) N) exited unexpectedly" (torch's check after a 5 s wait). Training: each
# worker loads 8 samples (2 batches of 4) and stalls, so every rank waits for its fifth batch after its fourth step's
# end; validation: the loader sets the pace (0.25 s a sample), and the signal comes at the first validation's first
# batch.
WAITING = (*TRAINER_ARGS, "--persistent-workers", "--step-seconds", "0")
STALLED = (*WAITING, "--stall-loader-after", "8")
VALIDATING = (*WAITING, "--load-seconds", "0.25", "--samples", "48")


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "started", "count"),
    [(STALLED, "STEP_END rank=", 4), (VALIDATING, "VALIDATE rank=", 2)],  # the sanity check's VALIDATE first
    ids=["next-training-batch", "next-validation-batch"],
)
def test_sigterm_while_every_rank_waits_for_its_next_batch_stops_every_rank_at_one_step(tmp_path, args, started, count):
    send = workers_first(0, 1, variable="OMPI_COMM_WORLD_RANK")
    status, output = run_under_mpirun(tmp_path, TRAINER_JOB, args, "ddp_mpi", send, started, count)
    assert_stopped_together(status, output, every_line=False)
    assert "exited unexpectedly" not in output, output[-4000:]


@pytest.mark.mpi
def test_sigterm_that_reaches_one_rank_a_moment_after_another_while_both_wait_for_a_batch_stops_both(tmp_path):
    # Rank 1's thread sees rank 0's stop before the signal reached rank 1; it waits for it, for a while, instead of
    # sending both ranks to fetch batch 5 from ended workers ("DataLoader worker (pid(s) N) exited unexpectedly").
    port = free_port()
    send = one_node_after_the_other(port, variable="OMPI_COMM_WORLD_RANK")
    status, output = run_under_mpirun(tmp_path, TRAINER_JOB, STALLED, "ddp_mpi", send, "STEP_END rank=", 4, port)
    assert_stopped_together(status, output, every_line=False)
    assert "exited unexpectedly" not in output, output[-4000:]


SRUN_SCRIPT = """#!/bin/sh
srun --kill-on-bad-exit=0 {train}
echo "SRUN_STATUS=$?"
"""


def run_under_srun(
    cluster,
    tmp_path: Path,
    send: Callable[[str], None],
    args: tuple[str, ...] = TRAINER_ARGS,
    then: tuple[str, int] | None = None,
) -> tuple[int, str]:
    """Run the Trainer job with ``srun`` on the 2-node cluster; once both tasks train, ``send(output)`` signals.

    The simulated nodes' tasks are processes of this machine, found by their FIT lines and ``SLURM_PROCID``.
    """
    train = [sys.executable, str(TRAINER_JOB), *args, "--strategy", "ddp_mpi", "--root-dir", str(tmp_path)]
    script = SRUN_SCRIPT.format(train=" ".join(train))
    job = cluster.sbatch(script, ["--nodes=2", "--ntasks-per-node=1"], env={"OMP_NUM_THREADS": "1"})
    for rank in (0, 1):
        output = cluster.wait_output(job, f"FIRST_STEP rank={rank} ", timeout=SLURM_TIMEOUT)
    if then is not None:  # a line, and how many of it, to wait for as well
        output = cluster.wait_output(job, then[0], timeout=SLURM_TIMEOUT, count=then[1])
    send(output)
    cluster.wait_output(job, "SRUN_STATUS=", timeout=SLURM_TIMEOUT)
    cluster.wait(job, timeout=SLURM_TIMEOUT)
    output = cluster.output(job)
    return int(re.findall(r"^SRUN_STATUS=(\d+)$", output, flags=re.MULTILINE)[0]), output


@pytest.mark.mpi
@pytest.mark.slurm
def test_sigterm_to_one_srun_task_stops_every_task_at_one_step(slurm_cluster, tmp_path):
    status, output = run_under_srun(
        slurm_cluster, tmp_path, lambda output: os.kill(pid_of_rank(output, 1, "SLURM_PROCID"), signal.SIGTERM)
    )
    assert_stopped_together(status, output)


@pytest.mark.mpi
@pytest.mark.slurm
def test_sigterm_that_ends_the_loader_workers_first_stops_every_task_at_one_step(slurm_cluster, tmp_path):
    # srun waits for every task (no mpirun abort): each says it stops
    status, output = run_under_srun(slurm_cluster, tmp_path, workers_first(0, 1, variable="SLURM_PROCID"))
    assert_stopped_together(status, output)
    assert "killed by signal" not in output, output[-4000:]


@pytest.mark.mpi
@pytest.mark.slurm
def test_sigterm_while_every_task_waits_for_its_next_batch_stops_every_task_at_one_step(slurm_cluster, tmp_path):
    send = workers_first(0, 1, variable="SLURM_PROCID")
    status, output = run_under_srun(slurm_cluster, tmp_path, send, STALLED, ("STEP_END rank=", 8))
    assert_stopped_together(status, output)
    assert "exited unexpectedly" not in output, output[-4000:]
