"""The requeue's stop agreement: real ``TCPStore`` clients on 127.0.0.1, a watchdog thread and a loop per rank.

Each rank's loop runs steps in lockstep with the others (a ``threading.Barrier`` per step stands for the gradient
all-reduce that holds DDP's ranks together), and asks :meth:`StopAgreement.due` after each step, as the callback does.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.rollcall.agreement import AT, REQUESTED, AgreementState, StopAgreement
from lightning_mpi_env.rollcall.watchdog import Watchdog

HANG = 120.0
"""Seconds a test waits for the threads at most: a bound on a hang (the agreement takes a few intervals of 1 s)."""


def _wait_for(condition, seconds: float = HANG) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def store_port():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield server.port
    del server


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))


def _run_job(port: int, world: int, signal_to: dict[int, int]) -> tuple[dict[int, int], list[StopAgreement]]:
    """Run ``world`` ranks until they stop; ``signal_to[rank] = step``: that rank's signal comes after that step.

    Returns the step each rank stopped at (a rank that never did is left out) and the agreements. The ranks step on
    until they stop, however slowly the threads run; after ``HANG`` seconds the test gives up on them.
    """
    signalled = {rank: threading.Event() for rank in range(world)}
    agreements = [StopAgreement(rank=rank, world_size=world, signalled=signalled[rank].is_set) for rank in range(world)]
    dogs = [
        Watchdog(lambda seconds: _client(port), rank=rank, world_size=world, host="h", timeout=0, agreement=agreement)
        for rank, agreement in enumerate(agreements)
    ]
    lockstep = threading.Barrier(world, timeout=120)
    stopped: dict[int, int] = {}

    def loop(rank: int) -> None:
        generator = random.Random(rank)
        finished = 0
        try:
            while True:
                finished += 1
                time.sleep(generator.uniform(0.001, 0.008))  # ranks reach the end of a step at different moments
                if signal_to.get(rank) == finished:
                    signalled[rank].set()
                if agreements[rank].due(finished, wait=60):
                    stopped[rank] = finished
                    return
                lockstep.wait()  # the next step's all-reduce: no rank runs ahead by more than one step
        except threading.BrokenBarrierError:
            return  # the test gave up on the ranks, or another rank stopped at another step

    for dog in dogs:
        dog.start()
    loops = [threading.Thread(target=loop, args=(rank,)) for rank in range(world)]
    for thread in loops:
        thread.start()
    _wait_for(lambda: not any(thread.is_alive() for thread in loops))
    lockstep.abort()  # ranks still stepping (a hang) stop at their next step
    for thread in loops:
        thread.join(HANG)
    for dog in dogs:
        dog.stop()
    return stopped, agreements


def test_every_rank_stops_at_one_step_when_one_rank_got_the_signal(store_port):
    # Under mpirun in a batch job, `scancel --signal` may reach some ranks only: here rank 2 alone.
    stopped, agreements = _run_job(store_port, 4, {2: 30})
    assert sorted(stopped) == [0, 1, 2, 3], stopped
    assert len(set(stopped.values())) == 1, stopped
    (step,) = set(stopped.values())
    assert step >= 30
    assert {agreement.stop_at for agreement in agreements} == {step}
    assert all(agreement.state is AgreementState.KNOWN for agreement in agreements)


def test_ranks_signalled_at_different_steps_still_agree_on_one(store_port):
    stopped, _ = _run_job(store_port, 4, {0: 12, 3: 15, 1: 40})
    assert sorted(stopped) == [0, 1, 2, 3], stopped
    assert len(set(stopped.values())) == 1, stopped
    assert min(stopped.values()) >= 12


def test_without_a_signal_nothing_is_asked_or_written(store_port):
    # The healthy path: the loop reads two local variables per step, and no stop key appears in the store.
    asked: list[int] = []  # one entry each time the thread asks whether a signal came, once per interval
    agreement = StopAgreement(rank=0, world_size=1, signalled=lambda: bool(asked.append(1)))
    dog = Watchdog(lambda seconds: _client(store_port), rank=0, world_size=1, host="h", timeout=0, agreement=agreement)
    dog.start()
    assert not any(agreement.due(finished, wait=1) for finished in range(1, 200))
    before = len(asked)
    assert _wait_for(lambda: len(asked) >= before + 2)  # a whole interval of the thread's after the loop's steps
    dog.stop()
    assert not _client(store_port).check([REQUESTED])
    assert agreement.state is AgreementState.IDLE


def test_a_rank_that_never_answers_is_an_error_not_a_hang(store_port):
    # Rank 1 of 2 has no thread (frozen, say): rank 0 posts, then its loop waits `wait` seconds and says why.
    agreement = StopAgreement(rank=0, world_size=2, signalled=lambda: True)
    dog = Watchdog(lambda seconds: _client(store_port), rank=0, world_size=2, host="h", timeout=0, agreement=agreement)
    dog.start()
    try:
        # The thread announces the signal and posts this rank's step at its first interval.
        assert _wait_for(lambda: agreement.state is not AgreementState.IDLE)
        assert agreement.state is AgreementState.POSTED
        with pytest.raises(StallError, match=r"did not agree on a step to checkpoint at within 1 s"):
            agreement.due(2, wait=1)
    finally:
        dog.stop()


def test_the_stored_step_only_rises(store_port):
    # compare_set keeps the highest post, whatever order the ranks post in.
    client = _client(store_port)
    for step in (7, 3, 9, 9, 8):
        StopAgreement._raise_to(step, client)
    assert int(client.get(AT)) == 9


def test_a_malformed_stop_step_is_raised_by_the_loop_naming_the_key(store_port):
    # Someone on the network wrote a stop request and a step that is no step: the loop raises the named error at
    # once, instead of waiting for an agreement that cannot come.
    from lightning_mpi_env.core.errors import RendezvousError

    forger = _client(store_port)
    forger.set(AT, "soon")
    forger.set(REQUESTED, "9")
    agreement = StopAgreement(rank=0, world_size=2, signalled=lambda: False)
    assert agreement.poll(_client(store_port), events=1) == 0
    with pytest.raises(RendezvousError, match="malformed value under 'lightning_mpi_env/stop/at': it is not JSON"):
        agreement.due(3, wait=60)
    assert agreement.poll(_client(store_port), events=1) == 0  # and stays so, without another request


@pytest.mark.parametrize(("waiting", "expected"), [(True, 7), (False, 8)], ids=["waiting", "in-its-step"])
def test_under_a_prompt_kind_a_loop_waiting_at_the_end_of_its_step_stops_right_there(store_port, waiting, expected):
    # A SIGTERM from the scheduler reaches every process of the step, the data loader workers too: a rank that ran
    # one more step would fetch a batch from workers that are gone. The loop already waits at the end of step 7
    # when its thread posts: the step to stop at is 7. A thread that posts while its loop is still in step 8 posts 8.
    from lightning_mpi_env.rollcall.agreement import SIGTERM_STOP

    client = _client(store_port)
    agreement = StopAgreement(rank=0, world_size=1, signalled=lambda: True, kind=SIGTERM_STOP)
    answers: list[bool] = []
    if waiting:
        loop = threading.Thread(target=lambda: answers.append(agreement.due(7, wait=HANG)))
        loop.start()
        assert _wait_for(lambda: agreement._waiting)  # the loop waits in due() at the end of step 7
        agreement.poll(client, events=0)  # the thread's interval: announce, post, and the step is known
        loop.join(HANG)
    else:
        agreement._finished = 7  # the loop finished step 7 and is in step 8 when the thread posts
        agreement.poll(client, events=0)
        answers += [agreement.due(7, wait=HANG), agreement.due(8, wait=HANG)]
    assert agreement.stop_at == expected
    assert answers == ([True] if waiting else [False, True])


def _sigterm_agreement(rank: int, coming, between=None) -> StopAgreement:
    from lightning_mpi_env.rollcall.agreement import SIGTERM_STOP

    return StopAgreement(
        rank=rank, world_size=2, signalled=lambda: rank == 0, kind=SIGTERM_STOP, coming=coming, between=between
    )


@pytest.mark.parametrize("late", [False, True], ids=["signal-in-hand", "signal-a-moment-later"])
def test_a_thread_holds_its_post_while_its_loop_is_between_steps_where_the_signal_came_or_may_come(store_port, late):
    # The scheduler's SIGTERM ended both ranks' loader workers while both waited for batch 5, which never comes. Rank
    # 1's thread sees rank 0's request before rank 1's main thread ran its handler, or (late) before the signal reached
    # rank 1 at all: the scheduler signals one node a moment after another. Posting 5 would send both ranks to fetch
    # batch 5 (torch then raises "DataLoader worker ... exited unexpectedly"); it holds its post, and both stop after
    # step 4.
    came = threading.Event()
    ranks = [_sigterm_agreement(0, coming=lambda: True), _sigterm_agreement(1, came.is_set, between=lambda: True)]
    clients = [_client(store_port), _client(store_port)]
    answers: dict[int, bool] = {}

    def wait_at(rank: int) -> threading.Thread:  # the handler's stop: the loop waits at the end of step 4
        loop = threading.Thread(target=lambda: answers.__setitem__(rank, ranks[rank].due(4, wait=HANG)))
        loop.start()
        assert _wait_for(lambda: ranks[rank]._waiting)
        return loop

    loops = [wait_at(0)]
    ranks[0].poll(clients[0], events=0)  # announces and posts 4
    ranks[0]._finished = 4  # rank 1's loop finished step 4 and has not come to wait yet
    ranks[1]._finished = 4
    if not late:
        came.set()
    ranks[1].poll(clients[1], events=1)
    assert ranks[1].state is AgreementState.IDLE  # held: nothing posted
    assert not clients[1].check(["lightning_mpi_env/sigterm/known"])
    if late:
        came.set()  # rank 1's own signal: its handler is on the way
        ranks[1].poll(clients[1], events=1)
        assert ranks[1].state is AgreementState.IDLE  # held for the loop to wait
    loops.append(wait_at(1))
    ranks[1].poll(clients[1], events=1)  # posts 4, the last post: the step is known
    ranks[0].poll(clients[0], events=1)
    for loop in loops:
        loop.join(HANG)
    assert [agreement.stop_at for agreement in ranks] == [4, 4]
    assert answers == {0: True, 1: True}


def test_a_loop_still_on_its_way_after_hold_seconds_gets_the_step_it_finished(store_port, monkeypatch, capsys):
    # The loop has not come (its main thread held in a collective, as Lightning's broadcast before each batch, with
    # its peer waiting in its own handler): after HOLD the thread posts the step the loop finished, and says so. The
    # loop, the signal in hand, stops there as it gets back; the next step would fetch from ended workers.
    from lightning_mpi_env.rollcall import agreement as module

    agreement = _sigterm_agreement(1, coming=lambda: True)
    agreement._finished = 4
    _client(store_port).set("lightning_mpi_env/sigterm/requested", "0")
    agreement.poll(_client(store_port), events=1)
    assert agreement.state is AgreementState.IDLE
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(module, "HOLD", 0.0)
    agreement.poll(_client(store_port), events=1)
    assert agreement.state is AgreementState.POSTED
    assert int(_client(store_port).get("lightning_mpi_env/sigterm/at")) == 4
    assert "rank 1's loop did not come to stop within 0 s" in capsys.readouterr().err


@pytest.mark.parametrize("between", [True, False], ids=["between-steps", "in-a-step"])
def test_a_signal_to_one_rank_alone_holds_another_between_steps_for_the_grace_only(
    store_port, monkeypatch, capsys, between
):
    # ``kill -TERM`` of rank 0 only: rank 1 posts the next step once the grace is over, or at once where its loop is
    # inside a step (the step's end asks again).
    from lightning_mpi_env.rollcall import agreement as module

    agreement = _sigterm_agreement(1, coming=lambda: False, between=lambda: between)
    agreement._finished = 4
    _client(store_port).set("lightning_mpi_env/sigterm/requested", "0")
    agreement.poll(_client(store_port), events=1)
    assert agreement.state is (AgreementState.IDLE if between else AgreementState.POSTED)
    monkeypatch.setattr(module, "GRACE", 0.0)
    agreement.poll(_client(store_port), events=1)
    assert agreement.state is AgreementState.POSTED
    assert int(_client(store_port).get("lightning_mpi_env/sigterm/at")) == 5
    assert "did not come" not in capsys.readouterr().err  # a signal to one rank alone is no trouble: nothing said


@pytest.mark.parametrize("kind", ["requeue", "sigterm-not-coming"])
def test_only_a_prompt_kind_s_loop_on_its_way_holds_the_post(store_port, kind):
    from lightning_mpi_env.rollcall.agreement import REQUEUE_STOP, SIGTERM_STOP

    stop = REQUEUE_STOP if kind == "requeue" else SIGTERM_STOP
    coming = kind == "requeue"  # the requeue's kind is never prompt: a loop on its way changes nothing
    agreement = StopAgreement(rank=1, world_size=2, signalled=lambda: False, kind=stop, coming=lambda: coming)
    agreement._finished = 4
    _client(store_port).set(stop.key + "requested", "0")
    agreement.poll(_client(store_port), events=1)
    assert agreement.state is AgreementState.POSTED
    assert int(_client(store_port).get(stop.key + "at")) == 5
