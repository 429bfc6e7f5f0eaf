"""The restart loop's rules: the cap, the backoff, a fault that follows the job, a wrong launch."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.records import FailureKind, FailureRecord
from lightning_mpi_env.supervise.policy import Action, RestartPolicy, StepOutcome, StopReason, signature


def _record(kind: FailureKind, host: str, ranks=(3,), step: int | None = 10) -> FailureRecord:
    return FailureRecord(kind, ranks, (host,), 1.0, step, "srun", "42", 0, "...")


def _failed(kind: FailureKind = FailureKind.FROZEN, host: str = "node2", **fields) -> StepOutcome:
    return StepOutcome(1, (_record(kind, host, **fields),))


def test_a_step_that_succeeds_is_done():
    assert RestartPolicy(3).decide(StepOutcome(0)).action is Action.DONE


def test_a_step_that_recovered_in_its_processes_is_done_whatever_its_status():
    # srun's status counts the rank it lost; the ranks' own record says that the others finished.
    decision = RestartPolicy(3).decide(_failed(FailureKind.RECOVERED))
    assert decision.action is Action.DONE
    assert decision.message == "the step succeeded in its processes: ..."


def test_a_recovered_record_beside_a_failure_is_a_failure():
    outcome = StepOutcome(1, (_record(FailureKind.RECOVERED, "node2"), _record(FailureKind.FROZEN, "node1")))
    assert not outcome.recovered
    assert RestartPolicy(3).decide(outcome).action is Action.RELAUNCH


def test_a_failed_step_is_relaunched_without_the_hosts_its_records_blame():
    decision = RestartPolicy(3, backoff=5).decide(_failed(host="node2"))
    assert decision.action is Action.RELAUNCH
    assert decision.exclude == ("node2",)
    assert decision.wait == 5.0
    assert "relaunch 1 of at most 3 after frozen: rank(s) 3 on node2 at step 10" in decision.message


def test_the_cap_holds_and_the_backoff_doubles_to_its_limit():
    policy = RestartPolicy(3, backoff=10, max_backoff=25)
    kinds = [FailureKind.FROZEN, FailureKind.MISSING, FailureKind.STALLED, FailureKind.FROZEN]
    decisions = [policy.decide(_failed(kind, f"node{n}", ranks=(n,))) for n, kind in enumerate(kinds)]
    assert [d.action for d in decisions] == [Action.RELAUNCH] * 3 + [Action.STOP]
    assert [d.wait for d in decisions[:3]] == [10.0, 20.0, 25.0]
    assert decisions[3].reason is StopReason.CAP
    assert decisions[3].message == "the cap of 3 restart(s) is reached"


def test_no_restarts_stops_at_the_first_failure():
    decision = RestartPolicy(0).decide(_failed())
    assert (decision.action, decision.reason) == (Action.STOP, StopReason.CAP)


def test_the_same_rank_at_the_same_step_on_another_host_is_the_program_s_fault():
    # Rank 3 froze at step 10 on node2; relaunched without node2, it froze at step 10 again, on node3.
    policy = RestartPolicy(5)
    assert policy.decide(_failed(host="node2")).action is Action.RELAUNCH
    decision = policy.decide(_failed(host="node3"))
    assert (decision.action, decision.reason) == (Action.STOP, StopReason.SAME_FAULT)
    assert "the same fault (frozen: rank(s) 3 on node3 at step 10) ended 2 steps in a row, the hosts it blamed" in (
        decision.message
    )
    assert "it is the program's fault" in decision.message


def test_a_program_that_dies_alike_everywhere_stops_after_two_tries():
    policy = RestartPolicy(5)
    assert policy.decide(StepOutcome(1)).action is Action.RELAUNCH  # no record: a traceback on every rank, say
    decision = policy.decide(StepOutcome(1))
    assert decision.reason is StopReason.SAME_FAULT
    assert "the same fault (the step died with status 1, no record) ended 2 steps in a row: it follows" in (
        decision.message
    )


def test_different_faults_in_a_row_are_node_faults():
    policy = RestartPolicy(5)
    assert policy.decide(_failed(host="node2", step=10)).action is Action.RELAUNCH
    assert policy.decide(_failed(host="node3", step=25)).action is Action.RELAUNCH  # another step: another fault
    assert policy.decide(_failed(host="node4", ranks=(1,), step=25)).action is Action.RELAUNCH  # another rank
    assert policy.decide(StepOutcome(137)).action is Action.RELAUNCH


@pytest.mark.parametrize("kind", [FailureKind.DUPLICATE, FailureKind.MISMATCH])
def test_a_wrong_launch_is_never_relaunched(kind):
    decision = RestartPolicy(5).decide(_failed(kind))
    assert (decision.action, decision.reason) == (Action.STOP, StopReason.LAUNCH)
    assert f"the launch itself is wrong ({kind.value})" in decision.message


def test_the_signature_leaves_the_hosts_out():
    assert signature(_failed(host="node2")) == signature(_failed(host="node9"))
    assert signature(_failed(step=10)) != signature(_failed(step=11))


@pytest.mark.parametrize("restarts", [-1, 1001])
def test_the_cap_is_bounded(restarts):
    with pytest.raises(ValueError, match=r"restarts=.* is not from 0 to 1000"):
        RestartPolicy(restarts)
