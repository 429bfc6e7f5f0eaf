"""What a running loop calls on the environment: here, leaving stragglers' hosts out after a periodic checkpoint.

The real jobs (``run --leave-out-stragglers`` under srun and mpirun on the simulated Slurm cluster) are in
``tests/supervise/test_relaunch_slurm.py`` and ``test_relaunch_mpirun.py``; these tests hold each branch of rank 0's
decision with the watchdog's straggler watch fed by hand.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_mpi_env import MPIClusterEnvironment
from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.core.state_files import LEAVE_OUT, ask_to_leave_out
from lightning_mpi_env.rollcall.stragglers import StragglerWatch
from lightning_mpi_env.supervise.records import read_records
from tests.lightning.test_environment import open_mpi
from tests.rollcall.test_stragglers import WINDOW, reports


@pytest.fixture(autouse=True)
def _sigchld_put_back() -> Iterator[None]:
    """Leaving out ends the rank as a requeue does: its data loader workers' ``SIGCHLD`` handler changes first."""
    before = signal.getsignal(signal.SIGCHLD)
    yield
    signal.signal(signal.SIGCHLD, before)


def environment(folder: Path | None, rank: int = 0, works: tuple[float, ...] = (0.05, 0.05, 0.05, 0.1)):
    """Rank ``rank`` of a Slurm job's step with ``folder`` as its state folder; its watch judged ``works`` once."""
    env = open_mpi(rank=rank, world_size=4, local_size=2, SLURM_JOB_ID="77")
    if folder is not None:
        env["LIGHTNING_MPI_ENV_STATE_DIR"] = str(folder)
    made = MPIClusterEnvironment(env, roll_call=False)
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(reports(list(works)))
    made._watchdog = SimpleNamespace(stragglers=watch if rank == 0 else None)  # type: ignore[assignment]
    return made


class Broadcast:
    """The strategy's broadcast as rank 0 sees it (its own value back), or another rank's (``rank_0``'s value)."""

    def __init__(self, rank_0: object = None) -> None:
        self.rank_0, self.sent = rank_0, []

    def __call__(self, value: object, src: int) -> object:
        assert src == 0
        self.sent.append(value)
        return value if self.rank_0 is None else self.rank_0


def test_without_a_state_folder_nothing_is_asked_and_no_collective_runs():
    broadcast = Broadcast()
    environment(None).leave_out_stragglers(0, 10, broadcast)
    assert broadcast.sent == []


def test_without_run_s_request_rank_0_goes_on_after_one_broadcast(tmp_path, capsys):
    broadcast = Broadcast()
    environment(tmp_path).leave_out_stragglers(0, 10, broadcast)
    assert broadcast.sent == [False]
    assert read_records(str(tmp_path)) == []
    assert capsys.readouterr().err == ""


def test_asked_rank_0_records_the_straggler_s_host_says_so_and_every_rank_exits_1(tmp_path, capsys):
    assert ask_to_leave_out(str(tmp_path), 1) is None
    broadcast = Broadcast()
    with pytest.raises(SystemExit) as ended:
        environment(tmp_path).leave_out_stragglers(0, 10, broadcast)
    assert ended.value.code == 1
    assert broadcast.sent == [True]
    (record,) = read_records(str(tmp_path))
    assert (record.kind, record.ranks, record.hosts, record.step) == (FailureKind.STRAGGLER, (3,), ("node1",), 10)
    assert record.problem.startswith("leaving out node1 x2.0 (rank 3), still slower than the others")
    err = capsys.readouterr().err
    assert err.startswith("lightning-mpi-env: straggler: leaving out node1 x2.0 (rank 3)"), err
    assert "the step ends at the checkpoint of step 10" in err


def test_another_rank_exits_on_rank_0_s_word_and_writes_nothing(tmp_path):
    assert ask_to_leave_out(str(tmp_path), 1) is None
    broadcast = Broadcast(rank_0=True)
    with pytest.raises(SystemExit) as ended:
        environment(tmp_path, rank=2).leave_out_stragglers(2, 10, broadcast)
    assert ended.value.code == 1
    assert broadcast.sent == [False]  # its own value counts for nothing
    assert read_records(str(tmp_path)) == []


def test_a_straggler_that_no_longer_stands_out_keeps_its_host(tmp_path):
    assert ask_to_leave_out(str(tmp_path), 1) is None
    made = environment(tmp_path)
    made._watchdog.stragglers.judge(reports([0.05] * 4))  # type: ignore[union-attr]
    broadcast = Broadcast()
    made.leave_out_stragglers(0, 15, broadcast)
    assert broadcast.sent == [False]
    assert read_records(str(tmp_path)) == []


def test_a_forged_host_name_is_not_recorded_and_the_job_goes_on(tmp_path):
    assert ask_to_leave_out(str(tmp_path), 1) is None
    made = environment(tmp_path)
    forged = reports([0.05, 0.05, 0.05, 0.1])
    forged[3] = dataclasses.replace(forged[3], host="node1\nlightning")  # a report another program wrote
    watch = StragglerWatch(1.5, WINDOW)
    watch.judge(forged)
    made._watchdog = SimpleNamespace(stragglers=watch)  # type: ignore[assignment]
    broadcast = Broadcast()
    made.leave_out_stragglers(0, 10, broadcast)
    assert broadcast.sent == [False]
    assert read_records(str(tmp_path)) == []


def test_a_request_that_is_not_run_s_is_said_once_and_the_job_goes_on(tmp_path, capsys):
    (tmp_path / LEAVE_OUT).write_text('{"format": 1, "spares": "all"}')
    made = environment(tmp_path)
    broadcast = Broadcast()
    made.leave_out_stragglers(0, 10, broadcast)
    made.leave_out_stragglers(0, 15, broadcast)
    assert broadcast.sent == [False, False]
    err = capsys.readouterr().err
    assert err.count("the request to leave stragglers out is not read:") == 1, err
    assert f"{LEAVE_OUT}: spares holds 'all', not a whole number" in err, err
    assert "Delete the file: only lightning-mpi-env run writes it" in err, err
