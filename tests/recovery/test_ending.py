"""Ending a lost rank's process: the script, and a survivor on the lost rank's node, kill only the process that started
when the rank's did; what a rank posted about itself is read back checked; the launcher's prefix is filled only with
values it can take."""

from __future__ import annotations

import signal
import socket
import subprocess
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.launchers import SRUN, on_node_command
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.recovery.ending import KEY, SCRIPT, end_here, process_start, read_task


def run_script(pid: int, start: str) -> int:
    return subprocess.run(["sh", "-c", SCRIPT, "sh", str(pid), start], timeout=30).returncode


@pytest.fixture
def stopped():
    child = subprocess.Popen(["sleep", "300"])
    child.send_signal(signal.SIGSTOP)  # as a frozen rank is
    yield child
    child.kill()
    child.wait()


def test_the_script_ends_the_frozen_process_that_started_at_that_time(stopped):
    assert run_script(stopped.pid, process_start(stopped.pid)) == 0
    assert stopped.wait(timeout=30) == -signal.SIGKILL


def test_the_script_leaves_alone_a_process_that_reused_the_id(stopped):
    start = process_start(stopped.pid)
    assert run_script(stopped.pid, str(int(start) + 1)) == 0  # not that process: nothing of the rank is left
    assert stopped.poll() is None  # still there, untouched


def test_the_script_succeeds_for_a_process_already_gone():
    child = subprocess.Popen(["true"])
    start = process_start(child.pid)
    child.wait()
    assert run_script(child.pid, start or "1") == 0


def test_a_survivor_on_the_lost_rank_s_node_ends_its_frozen_process_and_nothing_else(stopped):
    # Under mpirun no command runs beside the job on a node: a survivor there sends the signal itself.
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    here, start = socket.gethostname(), process_start(stopped.pid)
    elsewhere = subprocess.Popen(["sleep", "300"])
    reused = subprocess.Popen(["sleep", "300"])
    try:
        store.set(f"{KEY}2", f"{here} {stopped.pid} {start}")
        store.set(f"{KEY}3", f"another-node {elsewhere.pid} {process_start(elsewhere.pid)}")
        store.set(f"{KEY}4", f"{here} {reused.pid} {int(process_start(reused.pid)) + 1}")  # a process id reused
        store.set(f"{KEY}5", "forged")
        end_here(store, from_env({}), {}, [2, 3, 4, 5, 6])  # 6 posted nothing
        assert stopped.wait(timeout=30) == -signal.SIGKILL
        assert elsewhere.poll() is None
        assert reused.poll() is None
    finally:
        for child in (elsewhere, reused):
            child.kill()
            child.wait()


def test_process_start_reads_this_process():
    assert process_start().isdigit()
    assert process_start(2**22 + 12345) == ""  # no such process


@pytest.mark.parametrize(
    "raw",
    [b"node2 4242", b"node2 4242 99 1", b"-n 4242 99", b"node2 42x 99", b"node\x1b[2K 1 2", b"a" * 301, b""],
)
def test_a_forged_task_is_one_named_error(raw):
    with pytest.raises(RecoveryError) as caught:
        read_task(raw, "lightning_mpi_env/task/2")
    assert caught.value.variable == "lightning_mpi_env/task/2"
    assert "\x1b" not in str(caught.value)


def test_a_task_reads_back_as_posted():
    assert read_task(b"node2 4242 123456", "k") == ("node2", "4242", "123456")


def test_srun_runs_a_command_on_one_node_beside_the_step():
    # srun(1): --overlap lets a step share the running step's resources; --nodelist picks the node.
    env = {"SLURM_JOB_ID": "1681700"}
    assert on_node_command(SRUN, env, "node2") == (
        "srun",
        "--jobid=1681700",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=node2",
    )
    assert on_node_command(SRUN, env, "-w") is None  # an option, not a node
    assert on_node_command(SRUN, {"SLURM_JOB_ID": "17; rm"}, "node2") is None
    assert on_node_command(None, env, "node2") is None
