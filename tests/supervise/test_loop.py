"""The supervisor on the two-node simulated Slurm cluster: a frozen rank's step relaunched on the other node.

Inside ``salloc -N2`` (one node used, one spare), ``lightning-mpi-env run -- srun -N1 -n2 ...`` runs a Fabric loop
under ``ddp_mpi`` whose rank 1 freezes (``SIGSTOP``) at step 10 the first time only (``--freeze-once``). The
watchdog names it, rank 0 writes the record and ends the step; the supervisor relaunches the step with the frozen
rank's node excluded, and it finishes on the other node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.records import (
    FailureKind,
    FailureRecorder,
    Fault,
    StragglerFinding,
    first_step,
    write_first_step,
    write_stragglers,
)
from lightning_mpi_env.core.state_files import LEAVE_OUT, spares_given
from lightning_mpi_env.supervise.loop import supervise
from lightning_mpi_env.supervise.policy import RestartPolicy
from lightning_mpi_env.supervise.srun_line import SrunLineError
from lightning_mpi_env.supervise.step import StepEnd
from tests.clusters.slurm import SlurmCluster
from tests.test_slurm import FABRIC_FREEZE, LIGHTNING_TIMEOUT, STALL_TIMEOUT


def test_a_line_of_another_launcher_runs_nothing(tmp_path):
    ran: list[object] = []
    with pytest.raises(SrunLineError, match=r"is 'torchrun', not srun, mpirun or mpiexec"):
        supervise(["torchrun", "--nnodes=2", "a"], RestartPolicy(1), env={}, state=str(tmp_path), run=ran.append)
    assert ran == []
    assert list(tmp_path.iterdir()) == []


LINE = ["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "python", "train.py"]
ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-3]"}
RELAUNCHED_ONCE = ["launch", "failure", "excluded", "relaunch", "launch", "first_step", "done"]


class Steps:
    """Stand-in steps for the loop's logic (the real ones run in test_relaunch_slurm.py): each call plays the next
    scripted step, writing into its state folder what its ranks would, and returns how it ended."""

    def __init__(self, *plays):
        self.plays = list(plays)
        self.argvs: list[list[str]] = []
        self.envs: list[dict[str, str]] = []

    def __call__(self, argv, env, folder, *, tick, grace):
        self.argvs.append(list(argv))
        self.envs.append(dict(env))
        assert env["LIGHTNING_MPI_ENV_STATE_DIR"] == folder
        end = self.plays.pop(0)(folder)
        tick()
        return end


def frozen_on(host: str, step: int = 10):
    def play(folder: str) -> StepEnd:
        recorder = FailureRecorder.plan(folder, "Slurm srun", "77")
        assert recorder is not None
        recorder.write(Fault(FailureKind.FROZEN, (2,), (host,), step), problem="rank 2 froze", written_by=0)
        return StepEnd(137)

    return play


def resumed(step: int, at: int | None):
    def play(folder: str) -> StepEnd:
        name = None if at is None else f"/runs/hpc_ckpt_{at // 5}.ckpt"
        write_first_step(folder, first_step(step, name, at, 1.0, "77"))
        return StepEnd(0)

    return play


def recovered_in_its_processes(folder: str) -> StepEnd:
    recorder = FailureRecorder.plan(folder, "Slurm srun", "77")
    assert recorder is not None
    recorder.write(Fault(FailureKind.RECOVERED, (2,), ("node2",)), problem="rank 2 lost; ...", written_by=0)
    return StepEnd(137, "srun: error: node2: task 2: Killed\n")


def killed_by_srun(folder: str) -> StepEnd:
    return StepEnd(137, "srun: error: node2: task 3: Killed\nsrun: error: node1: tasks 0-1: Exited with exit code 1\n")


def _supervise(tmp_path, steps, *, probe_fails=None, line=LINE, env=ALLOCATION, backoff=0, trace=None, **given):
    """Run the loop on fakes; ``trace`` (a list) gets every line said, wait and probe, in order."""
    shown: list[str] = []
    probed: list[list[str]] = []
    trace = [] if trace is None else trace

    def say(text: str) -> None:
        shown.append(text)
        trace.append(text)

    def check(hosts, *, env, timeout, line_for):
        probed.append(list(hosts))
        trace.append(("probe", list(hosts)))
        assert line_for(hosts[0])[:2] == ["srun", "--nodes=1"]  # the srun line's probe is a Slurm step
        return {host: "no answer in 20 s" for host in hosts if host in (probe_fails or {})}

    status = supervise(
        line,
        RestartPolicy(3, backoff=backoff),
        env=env,
        state=str(tmp_path),
        say=say,
        run=steps,
        check=check,
        sleep=lambda seconds: trace.append(("sleep", seconds)),
        **given,
    )
    (journal,) = tmp_path.glob("*/timeline.jsonl")
    return status, [json.loads(line) for line in journal.read_text().splitlines()], probed, shown


def _events_said(shown: list[str]) -> list[str]:
    """The lines that are events of the timeline (the others say what the loop waits for)."""
    return [line for line in shown if line.startswith("lightning-mpi-env run: step ")]


def test_a_step_that_recovered_in_its_processes_is_done_and_the_supervisor_exits_0(tmp_path):
    status, events, probed, shown = _supervise(tmp_path, Steps(recovered_in_its_processes))
    assert status == 0
    assert [event["event"] for event in events] == ["launch", "done"]
    assert events[-1]["message"] == "the step succeeded in its processes: rank 2 lost; ..."
    assert probed == []


def test_a_frozen_node_is_left_out_and_the_relaunch_resumes_with_the_steps_lost_said(tmp_path):
    steps = Steps(frozen_on("node2", step=12), resumed(10, at=10))
    status, events, probed, shown = _supervise(tmp_path, steps)
    assert status == 0
    assert [event["event"] for event in events] == RELAUNCHED_ONCE
    assert probed == [["node1", "node3"]]  # the blamed host is not probed; the others are
    assert steps.argvs[1] == ["srun", "--exclude=node2", *LINE[1:]]
    first = events[5]
    assert first["resumed_step"] == 10
    assert first["steps_lost"] == 2
    assert "2 step(s) since that checkpoint were lost" in first["message"]
    assert len(_events_said(shown)) == len(events)


def test_the_backoff_and_the_probe_are_said_before_each_waits(tmp_path):
    trace: list[object] = []
    status, events, _, shown = _supervise(
        tmp_path, Steps(frozen_on("node2"), resumed(10, at=10)), backoff=10, trace=trace
    )
    assert status == 0
    start = trace.index("lightning-mpi-env run: step 1: excluded: node2")
    assert trace[start + 1 : start + 6] == [
        "lightning-mpi-env run: waiting 10 s (the backoff) before relaunch 1 of at most 3",
        ("sleep", 10.0),
        "lightning-mpi-env run: probing 2 host(s), up to 20 s, before relaunch 1 of at most 3: node1, node3",
        ("probe", ["node1", "node3"]),
        "lightning-mpi-env run: step 2: relaunch: relaunch 1 of at most 3 after frozen: rank(s) 2 on node2 at step 10",
    ]
    # They are no events: the timeline's file and its lines are what they were.
    assert [event["event"] for event in events] == RELAUNCHED_ONCE
    assert len(_events_said(shown)) == len(events)
    assert len(shown) == len(events) + 2


def test_without_a_backoff_only_the_probe_is_said(tmp_path):
    _, _, _, shown = _supervise(tmp_path, Steps(frozen_on("node2"), resumed(10, at=10)), backoff=0)
    assert not [line for line in shown if "backoff" in line]
    assert [line for line in shown if "probing" in line] == [
        "lightning-mpi-env run: probing 2 host(s), up to 20 s, before relaunch 1 of at most 3: node1, node3"
    ]


def test_the_probe_s_line_names_the_first_hosts_and_counts_the_rest(tmp_path):
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-12]"}
    _, _, probed, shown = _supervise(tmp_path, Steps(frozen_on("node2"), resumed(10, at=10)), env=env)
    assert len(probed[0]) == 11
    assert [line for line in shown if "probing" in line] == [
        "lightning-mpi-env run: probing 11 host(s), up to 20 s, before relaunch 1 of at most 3: node1, node3, node4, "
        "node5, node6, node7, node8, node9 and 3 more"
    ]


def test_a_host_that_fails_the_probe_is_left_out_and_without_a_spare_the_loop_stops(tmp_path):
    status, events, _, _ = _supervise(tmp_path, Steps(frozen_on("node2")), probe_fails={"node3"})
    assert status == 137
    assert [event["event"] for event in events] == ["launch", "failure", "excluded", "probe", "stop"]
    assert events[3]["hosts"] == ["node3"]
    assert events[3]["message"] == "node3 (no answer in 20 s)"
    assert events[4]["reason"] == "hosts"
    assert "add a spare node" in events[4]["message"].lower()


def test_a_rank_srun_saw_killed_blames_its_host_when_no_rank_wrote_a_record(tmp_path):
    steps = Steps(killed_by_srun, resumed(10, at=None))
    status, events, _, _ = _supervise(tmp_path, steps)
    assert status == 0
    failure = events[1]
    assert failure["hosts"] == ["node2"]
    assert failure["message"] == "died: rank(s) 3 on node2"
    assert steps.argvs[1][1] == "--exclude=node2"
    assert "started afresh" in events[5]["message"]


def test_an_abandoned_step_is_relaunched_overlapping_its_cpus(tmp_path):
    def hung(folder: str) -> StepEnd:
        end = frozen_on("node2")(folder)
        return StepEnd(end.status, abandoned=True)

    steps = Steps(hung, resumed(10, at=10))
    status, events, _, _ = _supervise(tmp_path, steps)
    assert status == 0
    assert events[1]["abandoned"] is True
    assert "its launcher was killed" in events[1]["message"]
    assert "--overlap" in steps.argvs[1]


def test_the_allocation_s_spelling_is_excluded_and_a_blamed_name_of_no_host_is_said(tmp_path):
    # The ranks report their hostname; this scheduler spells its nodes in full, and node9 is nobody's name here.
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-3].cluster"}

    def blames_two(folder: str) -> StepEnd:
        recorder = FailureRecorder.plan(folder, "Slurm srun", "77")
        assert recorder is not None
        recorder.write(Fault(FailureKind.FROZEN, (2, 3), ("node2", "node9"), 10), problem="froze", written_by=0)
        return StepEnd(137)

    steps = Steps(blames_two, resumed(10, at=10))
    status, events, _, _ = _supervise(tmp_path, steps, env=env)
    assert status == 0
    assert steps.argvs[1][1] == "--exclude=node2.cluster"  # srun is given its own name of the node, and only that
    relaunch = next(event for event in events if event["event"] == "relaunch")
    assert relaunch["unmatched"] == ["node9"]
    assert "no host of the allocation is named node9" in relaunch["message"]


def test_a_main_address_the_job_exported_for_a_host_left_out_is_not_passed_on(tmp_path):
    # A batch script's `export MASTER_ADDR=$(scontrol show hostnames | head -n1)`: node1, which failed. Kept, every
    # rank would look for rank 0 there; without it, srun's step node list names rank 0's node.
    steps = Steps(frozen_on("node1"), resumed(10, at=10))
    status, events, _, _ = _supervise(tmp_path, steps, env={**ALLOCATION, "MASTER_ADDR": "node1"})
    assert status == 0
    assert steps.envs[0]["MASTER_ADDR"] == "node1"  # the first step runs as the user launched it
    assert "MASTER_ADDR" not in steps.envs[1]
    relaunch = next(event for event in events if event["event"] == "relaunch")
    assert relaunch["dropped_main_address"] == "node1"
    assert "MASTER_ADDR=node1, exported for the job, names a host left out" in relaunch["message"]


def test_a_main_address_on_a_host_still_in_the_step_is_kept(tmp_path):
    steps = Steps(frozen_on("node2"), resumed(10, at=10))
    _, events, _, _ = _supervise(tmp_path, steps, env={**ALLOCATION, "MASTER_ADDR": "node1.cluster"})
    assert steps.envs[1]["MASTER_ADDR"] == "node1.cluster"
    assert next(event for event in events if event["event"] == "relaunch")["dropped_main_address"] is None


def test_rank_zero_s_host_blamed_on_its_fabric_name_is_left_out_by_its_node_name(tmp_path):
    # With LIGHTNING_MPI_ENV_MAIN_HOST='{host}-ib' the ranks reach rank 0 at node1-ib, and a silent store is recorded
    # under that name; Slurm knows node1.
    def silent_store(folder: str) -> StepEnd:
        recorder = FailureRecorder.plan(folder, "Slurm srun", "77")
        assert recorder is not None
        fault = Fault(FailureKind.STORE_UNREACHABLE, (0,), ("node1-ib",), 10)
        recorder.write(fault, problem="rank 0's store fell silent", written_by=2)
        return StepEnd(1)

    steps = Steps(silent_store, resumed(10, at=10))
    env = {**ALLOCATION, "LIGHTNING_MPI_ENV_MAIN_HOST": "{host}-ib"}
    status, events, _, _ = _supervise(tmp_path, steps, env=env)
    assert status == 0
    assert next(event for event in events if event["event"] == "excluded")["hosts"] == ["node1"]
    assert steps.argvs[1][1] == "--exclude=node1"


def test_a_host_whose_own_name_fits_the_fabric_template_is_left_out_by_that_name(tmp_path):
    # '{host}i' (JSC's fabric names) read backwards would make nodei node "node"; nodei is a host itself here.
    steps = Steps(frozen_on("nodei"), resumed(10, at=10))
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "nodeai,nodei,nodeci", "LIGHTNING_MPI_ENV_MAIN_HOST": "{host}i"}
    status, events, _, _ = _supervise(tmp_path, steps, env=env)
    assert status == 0
    assert next(event for event in events if event["event"] == "excluded")["hosts"] == ["nodei"]
    assert steps.argvs[1][1] == "--exclude=nodei"


@pytest.mark.mpi
@pytest.mark.slurm
def test_a_frozen_rank_s_step_is_relaunched_without_its_node(slurm_cluster: SlurmCluster, tmp_path: Path):
    state, marker = tmp_path / "state", tmp_path / "frozen-once"
    step = ["srun", "-N1", "-n2", sys.executable, str(FABRIC_FREEZE), "--strategy", "ddp_mpi", "--num-nodes", "1"]
    step += ["--steps", "60", "--freeze", "1:10", "--freeze-once", str(marker), "--tag", f"loop-{tmp_path.name}"]
    supervisor = [sys.executable, "-m", "lightning_mpi_env", "run", "--restarts", "2", "--backoff", "1"]
    supervisor += ["--state-dir", str(state), "--", *step]
    done = slurm_cluster.run(
        ["salloc", "-N2", "--ntasks-per-node=2", *supervisor],
        timeout=2 * LIGHTNING_TIMEOUT,
        env={"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "FREEZE rank=1 step=10" in done.stdout, output[-6000:]
    (journal,) = state.glob("*/timeline.jsonl")
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [event["event"] for event in events] == ["launch", "failure", "excluded", "relaunch", "launch", "done"]
    (frozen_host,) = events[2]["hosts"]
    assert frozen_host in slurm_cluster.hosts
    assert events[1]["hosts"] == [frozen_host]
    assert events[1]["message"].startswith(f"frozen: rank(s) 1 on {frozen_host}"), events[1]
    assert events[4]["argv"][:2] == ["srun", f"--exclude={frozen_host}"]
    # The relaunched step ran on the other node, and finished there.
    (other,) = [host for host in slurm_cluster.hosts if host != frozen_host]
    finished = [line for line in done.stdout.splitlines() if line.startswith("DONE rank=")]
    assert sorted(finished) == [f"DONE rank=0 host={other} first=0", f"DONE rank=1 host={other} first=0"], output[
        -6000:
    ]
    # One human line per event on stderr.
    shown = [line for line in done.stderr.splitlines() if line.startswith("lightning-mpi-env run: step ")]
    assert len(shown) == len(events), output[-6000:]
    (frozen_at,) = [float(line.rsplit("time=", 1)[1]) for line in done.stdout.splitlines() if "FREEZE rank=1" in line]
    failed, relaunched, finished_at = events[1]["when"], events[4]["when"], events[5]["when"]
    print(
        f"FIGURE run, srun, ddp_mpi, stall timeout {STALL_TIMEOUT} s: step 1 ended {failed - frozen_at:.1f} s after "
        f"the freeze, step 2 started {relaunched - frozen_at:.1f} s after it, and finished "
        f"{finished_at - frozen_at:.1f} s after it (Lightning's start included)"
    )


def straggling(*named: tuple[int, str, float]):
    """A step that succeeds after rank 0 named ``(rank, host, factor)`` stragglers, each written as it would be."""

    def play(folder: str) -> StepEnd:
        findings: dict[int, StragglerFinding] = {}
        for rank, host, factor in named:
            findings[rank] = StragglerFinding(rank, host, factor, 20, 21, 5.0)
            write_stragglers(folder, findings.values(), "77")
        return StepEnd(0)

    return play


def test_the_stragglers_rank_zero_named_are_events_of_the_timeline(tmp_path):
    steps = Steps(straggling((3, "node2", 2.0), (3, "node2", 2.6), (1, "node1", 1.7)))
    status, events, _, shown = _supervise(tmp_path, steps)
    assert status == 0
    said = [event for event in events if event["event"] == "straggler"]
    # The step's tick reads the record once, after all three namings: each rank once, as last named, slowest first.
    assert [(event["rank"], event["host"], event["factor"]) for event in said] == [(3, "node2", 2.6), (1, "node1", 1.7)]
    assert said[0]["training_step"] == 21
    assert "rank 3 on node2 works x2.6 the median of all ranks a step" in said[0]["message"]
    assert [event["event"] for event in events] == ["launch", "straggler", "straggler", "done"]
    assert len(_events_said(shown)) == len(events)


def test_a_malformed_straggler_record_is_said_once_and_the_step_goes_on(tmp_path):
    def forged(folder: str) -> StepEnd:
        Path(folder, "stragglers.json").write_text('{"format": 1, "stragglers": [{"rank": -1}], "job_id": null}')
        return StepEnd(0)

    status, events, _, shown = _supervise(tmp_path, Steps(forged))
    assert status == 0
    assert [event["event"] for event in events] == ["launch", "done"]
    assert sum("stragglers.json is malformed" in line for line in shown) == 1


LEAVING_OUT = {**ALLOCATION, "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": "5"}


class SlowNode:
    """Step 1: rank 0 names rank 3 on node2; then, asked by the supervisor (read back here, as rank 0 reads it at its
    checkpoint), it records node2 as a straggler's host and every rank exits 1. Step 2 resumes from that checkpoint."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []
        self.asked: list[int] = []

    def __call__(self, argv, env, folder, *, tick, grace):
        self.argvs.append(list(argv))
        if len(self.argvs) > 1:
            end = resumed(11, 10)(folder)
            tick()
            return end
        straggling((3, "node2", 2.0))(folder)
        tick()
        self.asked.append(spares_given(folder))
        if self.asked[-1]:
            recorder = FailureRecorder.plan(folder, "Slurm srun", "77")
            assert recorder is not None
            fault = Fault(FailureKind.STRAGGLER, (3,), ("node2",), 10)
            recorder.write(fault, problem="leaving out node2 x2.0 (rank 3)", written_by=0)
            return StepEnd(1)
        return StepEnd(0)


def test_leave_out_asks_the_step_for_its_spares_and_relaunches_without_the_straggler_s_host(tmp_path):
    steps = SlowNode()
    status, events, _, shown = _supervise(tmp_path, steps, env=LEAVING_OUT, leave_out_stragglers=True)
    assert status == 0
    assert steps.asked == [1]  # node[1-3], a step of 2 nodes: one spare
    assert [event["event"] for event in events] == [
        "launch",
        "straggler",
        "failure",
        "excluded",
        "relaunch",
        "launch",
        "first_step",
        "done",
    ]
    assert events[2]["message"] == "straggler: rank(s) 3 on node2 at step 10", events[2]
    assert events[3]["hosts"] == ["node2"]
    assert steps.argvs[1][:2] == ["srun", "--exclude=node2"]
    assert events[6]["steps_lost"] == 0
    assert sum("asked the step to end at its next periodic checkpoint" in line for line in shown) == 1
    assert "at most 1 (the allocation's spare hosts)" in "\n".join(shown)


def test_leave_out_without_a_spare_says_the_hosts_stay_and_asks_nothing(tmp_path):
    steps = SlowNode()
    line = ["srun", "--nodes=3", "--ntasks-per-node=2", "python", "train.py"]
    status, events, _, shown = _supervise(tmp_path, steps, line=line, env=LEAVING_OUT, leave_out_stragglers=True)
    assert status == 0
    assert steps.asked == [0]
    assert not list(tmp_path.glob(f"*/step-1/{LEAVE_OUT}"))
    assert [event["event"] for event in events] == ["launch", "straggler", "done"]
    assert sum("the stragglers' hosts stay in the step: the allocation has no host" in line for line in shown) == 1


def test_without_leave_out_a_straggler_is_only_named(tmp_path):
    steps = SlowNode()
    status, events, _, _ = _supervise(tmp_path, steps, env=LEAVING_OUT)
    assert (status, steps.asked) == (0, [0])
    assert [event["event"] for event in events] == ["launch", "straggler", "done"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (ALLOCATION, r"LIGHTNING_MPI_ENV_CHECKPOINT_EVERY is unset or 0: there is none"),
        ({**ALLOCATION, "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": "0"}, r"CHECKPOINT_EVERY is unset or 0"),
        ({**LEAVING_OUT, "LIGHTNING_MPI_ENV_STRAGGLERS": "0"}, r"LIGHTNING_MPI_ENV_STRAGGLERS=0 turns the straggler"),
        ({**LEAVING_OUT, "LIGHTNING_MPI_ENV_STRAGGLER_WINDOW": "0"}, r"STRAGGLER_WINDOW=0 turns the straggler watch"),
        ({**LEAVING_OUT, "LIGHTNING_MPI_ENV_STRAGGLER_WINDOW": "x"}, r"LIGHTNING_MPI_ENV_STRAGGLER_WINDOW='x'"),
    ],
)
def test_leave_out_where_no_host_would_be_left_out_is_refused_before_anything_runs(tmp_path, env, message):
    ran: list[list[str]] = []
    with pytest.raises(SettingError, match=message):
        supervise(LINE, RestartPolicy(1), env=env, state=str(tmp_path), run=ran.append, leave_out_stragglers=True)
    assert ran == []
    assert list(tmp_path.iterdir()) == []
