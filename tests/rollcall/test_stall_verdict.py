"""The end of a step after the stall verdict: who asks the scheduler to end it, when, and until when."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_mpi_env.rollcall.stall_verdict import (
    ASK_BOUND,
    FIRST_ASK,
    AskPlan,
    NodeTurn,
    ask_plan,
    ask_to_end,
    end_step_now,
)

SCANCEL = ("scancel", "--signal=KILL", "42.0")
HINT = "`srun --kill-on-bad-exit=1`"


class FakeTime:
    """A wall clock that only ``sleep`` moves; and a scheduler command that ends nothing, recorded."""

    def __init__(self, failure: str = "") -> None:
        self.now = 1_000.0
        self.asked: list[tuple[float, float]] = []  # (seconds after the start, the command's timeout)
        self.failure = failure

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds

    def run(self, command: Sequence[str], timeout: float) -> str:
        assert tuple(command) == SCANCEL
        self.asked.append((self.now - 1_000.0, timeout))
        return self.failure


def _ask(plan: AskPlan, time: FakeTime, turns: Sequence[bool] = ()) -> int:
    answers = iter(turns)
    return ask_to_end(
        SCANCEL,
        plan,
        time.now,
        hint=HINT,
        turn=lambda: next(answers, True),
        sleep=time.sleep,
        clock=time.clock,
        run=time.run,
    )


# --- the plan -------------------------------------------------------------------------------------------------------


def test_the_sender_asks_at_once_then_ever_later_until_the_bound():
    plan = ask_plan(sender=True, rank=1, host="node2", world_size=16_384)
    assert plan.times == (0.0, 1.0, 3.0, 7.0, 15.0)
    assert plan.bound == ASK_BOUND == 31.0


@given(
    rank=st.integers(0, 16_383),
    host=st.text(min_size=1, max_size=64),
    world_size=st.integers(1, 1 << 20),
)
def test_another_rank_asks_only_after_a_healthy_kill_would_have_ended_it_and_twice_before_the_bound(
    rank, host, world_size
):
    times = ask_plan(sender=False, rank=rank, host=host, world_size=world_size).times
    assert FIRST_ASK <= times[0] < FIRST_ASK + 7 + 8  # 1 s per rank % 8, and at most 8 s of the host's spread
    assert len(times) >= 2
    assert list(times) == sorted(set(times))
    assert times[-1] < ASK_BOUND


def test_the_ranks_of_one_node_ask_one_second_apart():
    firsts = [ask_plan(sender=False, rank=rank, host="node7", world_size=64).times[0] for rank in range(8, 16)]
    assert [round(later - first, 6) for first, later in zip(firsts[:-1], firsts[1:], strict=True)] == [1.0] * 7


def test_two_thousand_nodes_whose_kill_was_lost_spread_their_requests():
    # 16,384 ranks on 2,048 nodes of 8, none of which the first KILL reached (the worst case): on each node the rank
    # with the first turn asks, and, alive, keeps it. Then each node asks at most 3 times, and no second holds
    # requests of much more than an eighth of the nodes (the first round spreads over 8 s, the next as much).
    world = 16_384
    requests: Counter[int] = Counter()
    for node in range(world // 8):
        plans = [ask_plan(sender=False, rank=rank, host=f"gpu{node:04d}", world_size=world) for rank in range(8)]
        holder = min(plans, key=lambda plan: plan.times[0])
        requests.update(int(at) for at in holder.times)
    assert sum(requests.values()) <= 3 * world // 8
    assert max(requests.values()) <= 1.25 * world // 8 // 8, sorted(requests.items())


# --- asking ---------------------------------------------------------------------------------------------------------


def test_a_sender_still_alive_asks_on_its_plan_then_says_what_ends_the_step(capsys):
    time = FakeTime()
    assert _ask(ask_plan(sender=True, rank=0, host="node1"), time) == 5
    assert [at for at, _ in time.asked] == [0.0, 1.0, 3.0, 7.0, 15.0]
    assert all(1.0 <= timeout <= 10.0 for _, timeout in time.asked)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("lightning-mpi-env: the job step still runs 31 s after 5 requests `scancel --signal=KILL ")
    assert f"To end the step when a rank fails, add {HINT}; else the step runs until its time limit." in line
    assert line.endswith("This rank exits now.")
    assert time.now == 1_000.0 + ASK_BOUND


def test_only_the_senders_first_failure_is_said_at_once_and_the_last_in_its_final_line(capsys):
    time = FakeTime("scancel: error: Kill job error on job id 42.0: Invalid job id specified")
    _ask(ask_plan(sender=True, rank=0, host="node1"), time)
    first, last = capsys.readouterr().err.splitlines()
    assert first.startswith("lightning-mpi-env: could not end the job step with `scancel --signal=KILL 42.0` (scancel")
    assert " (the last: scancel: error: Kill job error on job id 42.0: Invalid job id specified): " in last
    _ask(ask_plan(sender=False, rank=1, host="node1"), FakeTime("exit status 1"))
    (line,) = capsys.readouterr().err.splitlines()  # a request after the step began to end may fail: no line of it
    assert "after 3 requests `scancel --signal=KILL 42.0` (the last: exit status 1): " in line


def test_a_rank_whose_node_turn_another_live_rank_holds_never_asks(capsys):
    time = FakeTime()
    assert _ask(ask_plan(sender=False, rank=3, host="node2"), time, turns=[False] * 9) == 0
    assert time.asked == []
    (line,) = capsys.readouterr().err.splitlines()
    assert "after the requests of this node's other ranks `scancel --signal=KILL 42.0`: " in line


def test_a_rank_takes_the_turn_over_once_the_rank_that_held_it_died():
    time = FakeTime()
    plan = ask_plan(sender=False, rank=3, host="node2")
    assert _ask(plan, time, turns=[False, True]) == len(plan.times) - 1
    assert [at for at, _ in time.asked] == [pytest.approx(at) for at in plan.times[1:]]


def test_the_sender_asks_whoever_holds_its_nodes_turn():
    time = FakeTime()
    assert _ask(ask_plan(sender=True, rank=0, host="node1"), time, turns=[False] * 9) == 5


def test_no_request_runs_past_the_bound():
    # A command that hangs is given up before the bound: the rank says so at the bound, not 10 s later.
    time = FakeTime()
    plan = AskPlan((0.0, 25.0), bound=31.0, sender=False)
    _ask(plan, time)
    assert time.asked == [(0.0, 10.0), (25.0, 6.0)]


# --- one rank per node at a time ------------------------------------------------------------------------------------


def test_one_process_per_node_and_step_holds_the_turn():
    first, second = NodeTurn("node1", SCANCEL), NodeTurn("node1", SCANCEL)
    elsewhere, other_step = NodeTurn("node2", SCANCEL), NodeTurn("node1", ("scancel", "--signal=KILL", "42.1"))
    try:
        assert first()
        assert first()  # held
        assert not second()
        assert elsewhere()
        assert other_step()
        first.close()
        assert second()
    finally:
        for turn in (first, second, elsewhere, other_step):
            turn.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix socket names are Linux's")
def test_the_turn_is_free_once_the_process_that_held_it_is_killed():
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from lightning_mpi_env.rollcall.stall_verdict import NodeTurn\n"
            f"turn = NodeTurn('node1', {SCANCEL!r})\n"
            "print(turn(), flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    turn = NodeTurn("node1", SCANCEL)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "True\n"
        assert not turn()
        holder.kill()  # the step's KILL
        holder.wait()
        assert turn()
    finally:
        turn.close()
        holder.kill()
        holder.wait()


# --- the roll call's one request, and its retries -------------------------------------------------------------------


def test_a_failed_end_of_the_step_is_said(capsys):
    end_step_now(("lightning-mpi-env-no-such-command", "1.0"), -1)
    err = capsys.readouterr().err
    assert "lightning-mpi-env: could not end the job step with `lightning-mpi-env-no-such-command 1.0`" in err
    assert "FileNotFoundError" in err


def test_a_command_killed_by_the_step_it_ends_is_not_a_failure(capsys):
    # scancel --signal=KILL runs inside the step it ends: the step's SIGKILL may reach it before it exits. Any other
    # exit is said.
    end_step_now(("sh", "-c", "kill -KILL $$"), -1)
    assert "could not end the job step" not in capsys.readouterr().err
    end_step_now(("sh", "-c", "kill -TERM $$"), -1)
    assert "could not end the job step with `sh -c kill -TERM $$` (exit status -15)" in capsys.readouterr().err
    end_step_now(("sh", "-c", "echo 'scancel: error: Invalid job id specified' >&2; exit 1"), -1)
    assert "(scancel: error: Invalid job id specified)" in capsys.readouterr().err


def test_a_rank_alive_after_ending_the_step_asks_again_then_says_what_ends_it(tmp_path, capsys):
    ran = tmp_path / "ran"
    command = (sys.executable, "-c", f"open({str(ran)!r}, 'a').write('x')")
    time = FakeTime()
    end_step_now(command, -1, retries=3, hint=HINT, sleep=time.sleep, clock=time.clock)
    assert ran.read_text() == "xxxx"  # the first request and 3 more
    assert time.now == 1_000.0 + 15.0  # each wait twice the last (1, 2, 4), then 8 s for the last one to act
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("lightning-mpi-env: the job step still runs 15 s after 4 requests `")
    assert f"To end the step when a rank fails, add {HINT}; else the step runs until its time " in line
