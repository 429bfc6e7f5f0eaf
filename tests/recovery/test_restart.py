"""``restartable`` in real jobs: 4 ranks of plain PyTorch DDP, one killed or frozen, on the simulated two-node Slurm
cluster (the survivors go on alone), on the three-node one (a new process on the spare node takes the lost rank's
place) and under Open MPI 5's ``mpirun --with-ft ulfm`` on two simulated nodes.

srun runs the step with ``--kill-on-bad-exit=0`` (its default: the other tasks go on when one dies), as in-process
recovery needs. The job (``tests/jobs/restartable_job.py``) trains from data that is a pure function of the index, so
the weights a job must end with are computed here, step by step, for the world size each step had. With a killed
rank, the process group's timeout is longer than the test's limit: the job ends in time only if no survivor waits for
it (DDP over gloo would, without the connections shut down and not inherited: ``recovery/connections.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch

from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.clusters.slurm import SlurmCluster
from tests.jobs.restartable_job import BATCH, LR, MOMENTUM, item, model

pytestmark = [pytest.mark.mpi]

JOB = Path(__file__).parents[1] / "jobs" / "restartable_job.py"
TIMEOUT = 120  # four torch processes and their loader workers on two (maybe busy) cores
STEPS = 16
FAULT_STEP = 10
SRUN = ["srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=0"]
FROZEN_GROUP_TIMEOUT = 10  # the stall timeout, which restartable makes the process group's: how long the survivors
# wait on a frozen peer, whose connections stay open
KILLED_GROUP_TIMEOUT = 600  # beyond TIMEOUT: with a killed rank, the job ends in time only if no survivor waits for it


def group_timeout(args: tuple[str, ...]) -> int:
    return FROZEN_GROUP_TIMEOUT if "--freeze" in args else KILLED_GROUP_TIMEOUT


@pytest.fixture(params=["2.13", "2.14.1"], ids=["torch 2.13", "torch 2.14.1"])
def torch_python(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The Python a job runs on, and whether its groups are reconfigured in place: the installed torch opens each
    generation's group anew, 2.14.1 (:mod:`tests.clusters.torch_venv`) reconfigures the one group."""
    if request.param == "2.13":
        return sys.executable, False
    return str(request.getfixturevalue("newer_torch")), True


def run_job(
    cluster: SlurmCluster, out: Path, *args: str, python: str = sys.executable
) -> tuple[int, str, dict[int, dict]]:
    out.mkdir()
    command = [*SRUN, python, str(JOB), "--out", str(out), "--steps", str(STEPS), *args]
    stall = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(group_timeout(args))}
    done = cluster.run(command, timeout=TIMEOUT, env=stall)
    return done.returncode, done.stdout + done.stderr, read_records(out)


def read_records(out: Path) -> dict[int, dict]:
    return {int(path.stem.split("-")[1]): json.loads(path.read_text()) for path in out.glob("rank-*.json")}


def started(out: Path) -> dict[int, list[int]]:
    """The process ids that ever started for each launch rank (a relaunched rank would add one)."""
    pids: dict[int, list[int]] = {}
    for path in out.glob("started-*"):
        _, rank, pid = path.name.split("-")
        pids.setdefault(int(rank), []).append(int(pid))
    return pids


def python_version(records: dict[int, dict]) -> str:
    return ",".join(sorted({record["torch"] for record in records.values()}))


def expected_weights(worlds: list[int]) -> list[float]:
    """The weights after one step per entry of ``worlds`` (its world size), each on the next global batch."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    position = 0
    for size in worlds:
        pairs = [item(index) for index in range(position, position + size * BATCH)]
        x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        position += size * BATCH
    return [float(v) for v in torch.cat([p.detach().flatten() for p in net.parameters()])]


@pytest.mark.slurm
def test_without_a_fault_the_job_trains_as_plain_ddp(slurm_cluster: SlurmCluster, tmp_path: Path):
    code, output, records = run_job(slurm_cluster, tmp_path / "out")
    assert code == 0, output[-4000:]
    assert sorted(records) == [0, 1, 2, 3], output[-4000:]
    expected = expected_weights([4] * STEPS)
    for record in records.values():
        assert record["generations"] == [[1, record["generations"][0][1], 4, 0]]
        assert record["weights"] == pytest.approx(expected, abs=1e-9)
    assert "goes on with the" not in output


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_shrink_goes_on_with_the_survivors_in_their_processes(
    slurm_cluster: SlurmCluster, tmp_path: Path, fault: str, torch_python: tuple[str, bool]
):
    # Frozen (SIGSTOP): the survivors wait the group's timeout in DDP's all-reduce, rank 2's lookout cannot answer,
    # and rank 0 ends its process on node2 (srun --overlap), without which srun would wait for it to the end.
    freeze = ["--freeze"] if fault == "frozen" else []
    python, reconfigured = torch_python
    code, output, records = run_job(
        slurm_cluster,
        tmp_path / "out",
        "--shrink",
        "--fault-rank",
        "2",
        "--fault-step",
        str(FAULT_STEP),
        *freeze,
        python=python,
    )
    # srun reports the task that died or was ended; the three others finished the job.
    assert "srun: error: node2: task 2: Killed" in output, output[-4000:]
    assert sorted(records) == [0, 1, 3], output[-4000:]
    assert "could not end lost rank" not in output, output[-4000:]
    # One process per rank in the whole job: the survivors' own processes ran both generations, none was started again.
    assert started(tmp_path / "out") == {rank: [records[rank]["pid"]] for rank in (0, 1, 3)} | {2: ANY}
    assert len(started(tmp_path / "out")[2]) == 1
    for launch_rank, record in records.items():
        new_rank = {0: 0, 1: 1, 3: 2}[launch_rank]
        assert record["generations"] == [[1, launch_rank, 4, 0], [2, new_rank, 3, FAULT_STEP]], record
        assert record["reconfigured"] == [reconfigured, reconfigured], record
        assert record["worlds"] == [4] * FAULT_STEP + [3] * (STEPS - FAULT_STEP)
        parts = record["recovered"]  # when each part of the recovery ended, in the order they happen
        assert list(parts) == ["failed", "left", "agreed", "opened", "restored"], parts
        assert sorted(parts.values()) == list(parts.values()), parts
    # The step the loss interrupted is done again on three ranks, from rank 0's state: the weights are those of a
    # job that took 10 steps on four ranks and 6 on three.
    expected = expected_weights([4] * FAULT_STEP + [3] * (STEPS - FAULT_STEP))
    for record in records.values():
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    fault_at = float((tmp_path / "out" / "fault").read_text())
    took = max(record["recovered_at"] for record in records.values()) - fault_at
    print(
        f"FIGURE shrink, {fault}, DDP over gloo, torch {python_version(records)}, group timeout"
        f" {group_timeout(tuple(freeze))} s: fault to the next step {took:.2f} s"
    )
    said = [line for line in output.splitlines() if "goes on with the" in line]
    assert said == [
        "lightning-mpi-env: generation 1 lost rank 2 of 4; generation 2 goes on with the 3 survivors, renumbered:"
        " each step's global batch is 3/4 of what it was"
    ], output[-4000:]


@pytest.mark.slurm
def test_without_shrink_a_lost_rank_ends_every_process_with_one_named_error(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    code, output, records = run_job(slurm_cluster, tmp_path / "out", "--fault-rank", "2", "--fault-step", "3")
    assert code != 0
    assert records == {}, records  # no rank finished
    ended = [line for line in output.splitlines() if "lost rank 2, and this process cannot go on" in line]
    assert len(ended) == 3, output[-4000:]  # each survivor says it, none waits
    assert "pass `shrink=True`" in output, output[-4000:]


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_under_open_mpi_with_ulfm_the_survivors_go_on(cluster: SimulatedCluster, tmp_path: Path, fault: str):
    # Open MPI 5's `mpirun --with-ft ulfm` keeps the job when a rank dies (without it, mpirun ends every rank), on two
    # simulated nodes, two ranks each. A frozen rank 2 is ended by rank 3, its survivor on the same node (mpirun
    # runs no command beside the job there), or mpirun would wait for it after the others finish.
    out = tmp_path / "out"
    out.mkdir()
    freeze = ("--freeze",) if fault == "frozen" else ()
    command = [sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS), "--shrink", *freeze]
    command += ["--fault-rank", "2", "--fault-step", str(FAULT_STEP)]
    done = cluster.run(
        command,
        timeout=TIMEOUT,
        export={**cluster.job_environment(), "LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(group_timeout(freeze))},
        mpirun_args=["--with-ft", "ulfm"],
    )
    output = done.stdout + done.stderr
    records = read_records(out)
    assert sorted(records) == [0, 1, 3], output[-4000:]
    expected = expected_weights([4] * FAULT_STEP + [3] * (STEPS - FAULT_STEP))
    assert started(out) == {rank: [records[rank]["pid"]] for rank in (0, 1, 3)} | {2: ANY}
    assert len(started(out)[2]) == 1
    for launch_rank, record in records.items():
        assert record["generations"][1] == [2, {0: 0, 1: 1, 3: 2}[launch_rank], 3, FAULT_STEP], record
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    assert output.count("goes on with the 3 survivors") == 1, output[-4000:]
    took = max(record["recovered_at"] for record in records.values()) - float((out / "fault").read_text())
    print(
        f"FIGURE mpirun --with-ft ulfm, {fault}, group timeout {group_timeout(freeze)} s: fault to the next step"
        f" {took:.2f} s"
    )


@pytest.mark.parametrize("ulfm", [False, True], ids=["mpirun", "mpirun --with-ft ulfm"])
def test_under_mpirun_a_frozen_rank_that_the_program_swallowed_ends_the_job(
    cluster: SimulatedCluster, tmp_path: Path, ulfm: bool
):
    # The survivors catch each step's error (the group's timeout) and finish; rank 0 waits that long again for rank 2
    # to return, then raises: its status makes mpirun end the job, the frozen rank with it, where it would wait.
    # mpirun --with-ft ulfm goes on without rank 0: rank 3, which reads rank 0's list on rank 2's node, ends it.
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS), "--swallow", "--freeze"]
    command += ["--fault-rank", "2", "--fault-step", str(FAULT_STEP)]
    done = cluster.run(
        command,
        timeout=TIMEOUT,
        export={**cluster.job_environment(), "LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(FROZEN_GROUP_TIMEOUT)},
        mpirun_args=["--with-ft", "ulfm"] if ulfm else [],
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    swallowed = {line.split()[1] for line in output.splitlines() if line.startswith("SWALLOWED ")}
    # mpirun wakes the frozen rank (SIGCONT) as it ends it: its steps fail then too, and it may finish first.
    assert swallowed >= {"rank=0", "rank=1", "rank=3"}, output[-4000:]
    unreturned = f"rank 2 ({cluster.hosts[1]}) of generation 1 did not return from the function restartable runs"
    assert output.count(f"{unreturned} within {FROZEN_GROUP_TIMEOUT} s") == 1, output[-4000:]  # its host's name
    records = read_records(out)
    assert 0 not in records, output[-4000:]  # rank 0 raised
    assert {1, 3} <= set(records), output[-4000:]  # the others returned


@pytest.mark.parametrize("ulfm", [False, True], ids=["mpirun", "mpirun --with-ft ulfm"])
def test_under_mpirun_a_frozen_rank_0_ends_the_job(cluster: SimulatedCluster, tmp_path: Path, ulfm: bool):
    # Rank 0 served the store: the others give up on it, rank 1 (its survivor on node1) ends it, and each raises.
    # Plain mpirun ends the job at the first status that is not 0; under ulfm every survivor ends by its own error.
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS), "--freeze"]
    command += ["--fault-rank", "0", "--fault-step", str(FAULT_STEP)]
    done = cluster.run(
        command,
        timeout=TIMEOUT,
        export={**cluster.job_environment(), "LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(FROZEN_GROUP_TIMEOUT)},
        mpirun_args=["--with-ft", "ulfm"] if ulfm else [],
    )
    output = done.stdout + done.stderr
    (tmp_path / "output.txt").write_text(output)  # the whole of it, where the tail below is not enough
    assert done.returncode != 0, output[-4000:]
    said = {rank for rank in (1, 2, 3) if f"rank {rank} of generation 1 could not learn which ranks are lost" in output}
    # Rank 1 says why before it ends rank 0; plain mpirun may end the others before they say it.
    assert (said == {1, 2, 3}) if ulfm else (1 in said), (
        f"said: {sorted(said)}; {tmp_path}/output.txt\n{output[-4000:]}"
    )
    assert "Aborted" not in output or not ulfm, output[-4000:]  # plain mpirun may end a survivor as it exits
    assert output.count("; ending rank 0's process") == 1, output[-4000:]
    assert read_records(out) == {}, output[-4000:]  # no rank finished


def run_replaced(cluster: SlurmCluster, out: Path, job: list[str], fault: str) -> tuple[str, dict[int, dict]]:
    """Run ``job`` under ``lightning-mpi-env run`` with 4 ranks on 2 nodes of a 3-node allocation, rank 2 killed or
    frozen at step 10; check that the survivors kept their processes, a new one on node3 took rank 2's place, and
    ``run`` took the step as done (no relaunch). Its output and the ranks' records."""
    freeze = ["--freeze"] if fault == "frozen" else []
    output, events = run_under_run(cluster, out, job, freeze, group_timeout(tuple(freeze)))
    records = read_records(out)
    assert "srun: error: node2: task 2: Killed" in output, output[-4000:]  # srun's status counts it: run does not
    # No failure, no relaunch (a Trainer's first step is an event too).
    assert [event["event"] for event in events if event["event"] != "first_step"] == ["launch", "done"], events
    assert "the step succeeded in its processes: rank 2 lost;" in events[-1]["message"], events
    assert sorted(records) == [0, 1, 2, 3], output[-4000:]
    # The survivors' own processes ran both generations; rank 2 ran in two: the lost one, then the replacement.
    pids = started(out)
    assert {rank: pids[rank] for rank in (0, 1, 3)} == {rank: [records[rank]["pid"]] for rank in (0, 1, 3)}
    assert len(pids[2]) == 2, pids
    assert records[2]["pid"] in pids[2], pids
    assert records[2]["node"] == "node3"
    assert output.count("goes on with a new process on node3 in its place") == 1, output[-4000:]
    return output, records


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_new_process_on_the_spare_node_takes_the_lost_ranks_place(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, fault: str, torch_python: tuple[str, bool]
):
    # The allocation has 3 nodes, the step runs on 2: rank 0 starts the program on node3 (srun --overlap) in rank 2's
    # place. The world keeps its 4 ranks, so the weights are those of a job that never failed.
    out = tmp_path / "out"
    python, reconfigured = torch_python
    output, records = run_replaced(slurm_cluster_with_spare, out, [python, str(JOB)], fault)
    for launch_rank in (0, 1, 3):
        assert records[launch_rank]["reconfigured"] == [reconfigured, reconfigured]
        assert records[launch_rank]["generations"] == [[1, launch_rank, 4, 0], [2, launch_rank, 4, FAULT_STEP]]
        assert records[launch_rank]["worlds"] == [4] * STEPS
        assert list(records[launch_rank]["recovered"]) == ["failed", "left", "agreed", "opened", "restored"]
    # The replacement read no checkpoint (there is none): it took rank 0's kept state at the step that failed.
    assert records[2]["generations"] == [[2, 2, 4, FAULT_STEP]]
    assert records[2]["reconfigured"] == [reconfigured]
    assert records[2]["worlds"] == [4] * (STEPS - FAULT_STEP)
    expected = expected_weights([4] * STEPS)
    for record in records.values():
        assert record["weights"] == pytest.approx(expected, abs=1e-6)
    said = [line for line in output.splitlines() if "in its place" in line]
    assert said == [
        "lightning-mpi-env: generation 1 lost rank 2 of 4; generation 2 goes on with a new process on node3 in its"
        " place"
    ], output[-4000:]
    took = max(record["recovered_at"] for record in records.values()) - float((out / "fault").read_text())
    print(
        f"FIGURE replace, {fault}, DDP over gloo, torch {python_version(records)}: fault to the next step {took:.2f} s"
    )


@pytest.mark.slurm
def test_the_survivors_wait_for_a_replacement_slower_to_start_than_the_group_timeout(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # The replacement's node takes twice the process group's timeout (the stall timeout, with a frozen rank) to start
    # the program: the survivors wait for it to reach the store, bounded by the roll call's timeout, before the group.
    job = [sys.executable, str(JOB), "--replacement-start", str(2 * FROZEN_GROUP_TIMEOUT)]
    output, records = run_replaced(slurm_cluster_with_spare, tmp_path / "out", job, "frozen")
    assert records[2]["generations"] == [[2, 2, 4, FAULT_STEP]]
    expected = expected_weights([4] * STEPS)
    for record in records.values():
        assert record["weights"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slurm
def test_a_replacement_that_fails_to_start_ends_every_rank_at_once_and_run_starts_the_job_again(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # The first replacement exits 3 before it reaches the store. With a killed rank the group's timeout is beyond the
    # test's limit: the job ends in time only if the survivors stop waiting when its step ends.
    job = [sys.executable, str(JOB), "--replacement-fails-once", str(tmp_path / "failed")]
    output, records = run_relaunched_once(slurm_cluster_with_spare, tmp_path, job)
    said = "the replacement for rank 2 on node3 ended (exit status 3) before it reached the job's store"
    assert output.count(said) == 3, output[-4000:]  # each survivor's error
    # The relaunch trained from the start with no fault: the weights of a job that never failed.
    assert sorted(records) == [0, 1, 2, 3], output[-4000:]
    check_relaunched_afresh(records)


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_program_that_swallows_the_lost_ranks_error_ends_in_runs_relaunch(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, fault: str
):
    # The survivors catch their step's error when rank 2 is lost and go on: restartable never sees the loss, so nothing
    # recovers in the processes. A killed rank: their steps fail at once (closed connections; the group's timeout is
    # beyond the test's limit), they finish, and the lost task's status makes run start the job again. A frozen rank:
    # each of their steps waits the group's timeout, they finish, and rank 0 waits that long again for rank 2 to
    # return, then ends it (srun would wait for it to the allocation's end) and raises.
    freeze = ("--freeze",) if fault == "frozen" else ()
    job = [sys.executable, str(JOB), "--swallow"]
    output, records = run_relaunched_once(slurm_cluster_with_spare, tmp_path, job, freeze)
    swallowed = {line.split()[1] for line in output.splitlines() if line.startswith("SWALLOWED ")}
    assert swallowed == {"rank=0", "rank=1", "rank=3"}, output[-4000:]
    assert "goes on with" not in output, output[-4000:]
    unreturned = "rank 2 (node2) of generation 1 did not return from the function restartable runs within"
    unreturned += f" {FROZEN_GROUP_TIMEOUT} s"
    assert output.count(unreturned) == (1 if freeze else 0), output[-4000:]
    check_relaunched_afresh(records)


@pytest.mark.slurm
def test_a_program_that_swallows_errors_with_rank_0_frozen_ends_in_runs_relaunch(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # Rank 1-3 catch each step's error and return; rank 0, which would say which ranks did not return, is frozen and
    # its store answers no request: each gives up on it and raises, and rank 1 ends it (srun would wait for it).
    job = [sys.executable, str(JOB), "--swallow"]
    output, records = run_relaunched_once(slurm_cluster_with_spare, tmp_path, job, ("--freeze",), fault_rank=0)
    swallowed = {line.split()[1] for line in output.splitlines() if line.startswith("SWALLOWED ")}
    assert swallowed >= {"rank=1", "rank=2", "rank=3"}, output[-4000:]
    said = "of generation 1 returned from the function restartable runs, and rank 0's store stopped answering"
    assert {f"rank {rank} {said}" in output for rank in (1, 2, 3)} == {True}, output[-4000:]
    assert output.count("; ending rank 0's process") == 1, output[-4000:]
    assert "Aborted" not in output, output[-4000:]  # no request left inside torch as a survivor's interpreter exits
    check_relaunched_afresh(records)


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_losing_rank_0_ends_every_process_and_run_starts_the_job_again(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path, fault: str
):
    # Rank 0's process served the job's store: the others cannot agree, and each ends with the error that says so.
    # A frozen rank 0 would hold srun to the allocation's end: rank 1, its survivor on node1, ends it first.
    freeze = ("--freeze",) if fault == "frozen" else ()
    job = [sys.executable, str(JOB)]
    output, records = run_relaunched_once(slurm_cluster_with_spare, tmp_path, job, freeze, fault_rank=0)
    said = "of generation 1 could not learn which ranks are lost"
    assert {f"rank {rank} {said}" in output for rank in (1, 2, 3)} == {True}, output[-4000:]
    assert "Aborted" not in output, output[-4000:]  # no request left inside torch as a survivor's interpreter exits
    check_relaunched_afresh(records)


@pytest.mark.slurm
def test_a_rank_0_frozen_while_the_survivors_wait_for_a_replacement_is_ended_and_the_step_ends(
    slurm_cluster_with_spare: SlurmCluster, tmp_path: Path
):
    # A second fault on the way to generation 2: rank 2 was killed, and as its replacement starts on node3, rank 0
    # freezes. The survivors wait for the replacement in rank 0's store, which answers nothing: each gives up after
    # the stall timeout, rank 1 (on rank 0's node) ends it, and every process ends, for `run` to start the job again.
    out = tmp_path / "out"
    out.mkdir()
    command = [*SRUN, "--ntasks=4", sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS)]
    command += ["--fault-rank", "2", "--fault-step", str(FAULT_STEP), "--replacement-freezes-rank-0"]
    done = slurm_cluster_with_spare.run(
        ["salloc", "--no-kill", "-N3", "--ntasks-per-node=2", *command],
        timeout=TIMEOUT,
        env={"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(FROZEN_GROUP_TIMEOUT)},
    )
    output = done.stdout + done.stderr
    assert (out / "froze-rank-0").exists(), output[-4000:]
    assert done.returncode != 0, output[-4000:]
    said = "of generation 1 lost rank 0's store on the way to generation 2: it answered no request for"
    assert {f"rank {rank} {said}" in output for rank in (1, 3)} == {True}, output[-4000:]
    assert output.count("; ending rank 0's process") == 1, output[-4000:]
    assert "Aborted" not in output, output[-4000:]  # no request left inside torch as a survivor's interpreter exits
    assert not list(out.glob("rank-*.json")), output[-4000:]  # no rank finished


def check_relaunched_afresh(records: dict[int, dict]) -> None:
    """Each rank's record is the relaunch's: one generation from the start, and the weights of a job with no fault."""
    expected = expected_weights([4] * STEPS)
    for launch_rank, record in records.items():
        assert record["generations"] == [[1, launch_rank, 4, 0]]
        assert record["weights"] == pytest.approx(expected, abs=1e-6)


def run_relaunched_once(
    cluster: SlurmCluster, tmp_path: Path, job: list[str], freeze: tuple[str, ...] = (), fault_rank: int = 2
) -> tuple[str, dict[int, dict]]:
    """Run ``job`` as :func:`run_replaced` does, ``fault_rank`` killed (or with ``--freeze``, frozen) at step 10 once
    (not after a relaunch); check that the step failed and ``run`` started it again, which succeeded. Its output and
    the ranks' records (their last processes')."""
    once = ["--fault-once", str(tmp_path / "faulted"), *freeze]
    # Without a freeze, no survivor may wait for the lost rank: the group's timeout is beyond the test's limit.
    output, events = run_under_run(cluster, tmp_path / "out", job, once, group_timeout(freeze), fault_rank)
    kinds = [event["event"] for event in events]
    assert [kind for kind in kinds if kind not in ("first_step", "excluded", "probe")] == [
        "launch",
        "failure",
        "relaunch",
        "launch",
        "done",
    ], kinds
    return output, read_records(tmp_path / "out")


def run_under_run(
    cluster: SlurmCluster, out: Path, job: list[str], fault: list[str], stall_timeout: int, fault_rank: int = 2
) -> tuple[str, list[dict]]:
    """Run ``job`` under ``lightning-mpi-env run --restarts 1`` with 4 ranks on 2 nodes of a 3-node allocation,
    ``fault_rank`` lost at step 10 (``fault``: how, beyond a kill), its records in ``out``; check that ``run``
    succeeded. Its output and the events of ``run``'s journal."""
    out.mkdir()
    command = [*SRUN, "--ntasks=4", *job, "--out", str(out), "--steps", str(STEPS)]
    command += ["--fault-rank", str(fault_rank), "--fault-step", str(FAULT_STEP), *fault]
    state = out.parent / "state"
    supervisor = [sys.executable, "-m", "lightning_mpi_env", "run", "--restarts", "1", "--state-dir", str(state)]
    done = cluster.run(
        ["salloc", "--no-kill", "-N3", "--ntasks-per-node=2", *supervisor, "--", *command],
        timeout=TIMEOUT,
        env={"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(stall_timeout)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    [journal] = state.glob("*/timeline.jsonl")
    return output, [json.loads(line) for line in journal.read_text().splitlines()]
