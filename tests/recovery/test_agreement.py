"""The ranks agree which are lost, on a real ``TCPStore``: each simulated rank a thread with its own client.

A rank whose main thread is still busy is not lost (its lookout answers); a rank that is gone or frozen (no
lookout) is; a rank that comes after the list was written ends with a named error; a forged list is one named error;
an older generation's writes replayed later change nothing of a newer one's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.agreement import Lookout, agree_on_lost, keys_of, sound_alarm
from lightning_mpi_env.recovery.worlds import World, first, successor
from lightning_mpi_env.rollcall.deadline import Deadline

SETTLE = 5.0  # longer than a thread's wake-up on busy cores: only a rank with no lookout at all goes unheard
TIMEOUT = 60.0


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=TIMEOUT), wait_for_workers=False)


def client(server) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=TIMEOUT))


def run_ranks(ranks: dict[int, Callable[[], object]]) -> dict[int, object]:
    """Run each rank's part in a thread of its own; what each returned or raised."""
    results: dict[int, object] = {}

    def run(rank: int, part: Callable[[], object]) -> None:
        try:
            results[rank] = part()
        except Exception as error:  # noqa: BLE001  # the test looks at it
            results[rank] = error

    threads = [threading.Thread(target=run, args=item) for item in ranks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 2)
    return results


def lookouts(server, world: World, ranks) -> list[Lookout]:
    return [
        Lookout(client(server), client(server), world, rank, settle=SETTLE, timeout=TIMEOUT).start() for rank in ranks
    ]


def test_a_rank_without_a_lookout_is_lost_and_the_others_agree(server):
    world = first(4)
    watching = lookouts(server, world, [0, 1, 3])  # rank 2 is gone: nothing of it answers
    results = run_ranks(
        {
            rank: (lambda rank=rank: agree_on_lost(client(server), world, rank, settle=SETTLE, timeout=TIMEOUT))
            for rank in (0, 1, 3)
        }
    )
    assert results == {0: (2,), 1: (2,), 3: (2,)}
    for lookout in watching:
        lookout.close()


def test_a_rank_whose_main_thread_is_busy_is_not_lost(server):
    # Rank 1's main thread comes to the agreement only once the list is written (a long step, or a collective it is
    # still held in): its lookout answered for it, so it goes on with the others.
    world = first(3)
    watching = lookouts(server, world, [0, 1, 2])
    written = threading.Event()

    def busy_rank() -> object:
        store = client(server)
        store.wait([keys_of(world).lost])
        written.set()
        return agree_on_lost(store, world, 1, settle=SETTLE, timeout=TIMEOUT)

    results = run_ranks(
        {
            0: lambda: agree_on_lost(client(server), world, 0, settle=SETTLE, timeout=TIMEOUT),
            1: busy_rank,
            2: lambda: agree_on_lost(client(server), world, 2, settle=SETTLE, timeout=TIMEOUT),
        }
    )
    assert written.is_set()
    assert results == {0: (), 1: (), 2: ()}  # nobody is lost: the failure was the program's own
    for lookout in watching:
        lookout.close()


def test_a_rank_that_answers_after_the_list_is_written_ends_with_a_named_error(server):
    world = first(3)
    watching = lookouts(server, world, [0, 1])  # rank 2 was frozen: no answer while the others agree
    results = run_ranks(
        {
            rank: (lambda rank=rank: agree_on_lost(client(server), world, rank, settle=SETTLE, timeout=TIMEOUT))
            for rank in (0, 1)
        }
    )
    assert results == {0: (2,), 1: (2,)}
    with pytest.raises(RecoveryError, match="rank 2 of generation 1 was counted lost"):
        agree_on_lost(client(server), world, 2, settle=SETTLE, timeout=TIMEOUT)
    for lookout in watching:
        lookout.close()


def test_a_forged_list_is_one_named_error_on_every_rank(server):
    world = first(3)
    client(server).set(keys_of(world).lost, "0,\x1b[2K")  # written before rank 0 names anyone: compare_set keeps it
    watching = lookouts(server, world, [0, 1, 2])
    results = run_ranks(
        {
            rank: (lambda rank=rank: agree_on_lost(client(server), world, rank, settle=SETTLE, timeout=TIMEOUT))
            for rank in range(3)
        }
    )
    assert all(isinstance(result, RecoveryError) for result in results.values()), results
    assert all("lost ranks under lightning_mpi_env/gen/1/end/lost" in str(result) for result in results.values())
    for lookout in watching:
        lookout.close()


def test_an_older_generation_replayed_after_a_newer_began_changes_nothing(server):
    # Generation 1 of 4 lost rank 2; generation 2 (launch ranks 0, 1, 3) then loses its rank 1 (launch rank 1). A
    # stale process of generation 1 replays every write of generation 1's end in between: generation 2's
    # agreement reads none of it.
    one = first(4)
    watching = lookouts(server, one, [0, 1, 3])
    assert run_ranks(
        {
            rank: (lambda rank=rank: agree_on_lost(client(server), one, rank, settle=SETTLE, timeout=TIMEOUT))
            for rank in (0, 1, 3)
        }
    ) == {0: (2,), 1: (2,), 3: (2,)}
    two = successor(one, (2,), shrink=True)
    assert isinstance(two, World)
    ghost = client(server)
    keys = keys_of(one)
    sound_alarm(ghost, one)
    for rank in range(4):
        ghost.set(keys.alive + str(rank), b"1")
        ghost.add(keys.answered, 1)
    ghost.set(keys.lost, "1,2,3")
    watching += lookouts(server, two, [0, 2])  # generation 2's rank 1 is gone
    results = run_ranks(
        {
            rank: (lambda rank=rank: agree_on_lost(client(server), two, rank, settle=SETTLE, timeout=TIMEOUT))
            for rank in (0, 2)
        }
    )
    assert results == {0: (1,), 2: (1,)}
    for lookout in watching:
        lookout.close()


def test_without_rank_0_s_store_a_rank_cannot_agree_and_says_why():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=TIMEOUT), wait_for_workers=False)
    store = client(server)
    del server  # rank 0 is gone, and its store with it
    with pytest.raises(RecoveryError, match="rank 1 of generation 1 could not learn which ranks are lost"):
        agree_on_lost(store, first(2), 1, settle=SETTLE, timeout=TIMEOUT)


def test_a_rank_whose_process_ended_is_named_at_once_not_after_settle(server):
    # settle is longer than the test's own limit: the list comes only because rank 2's process is known to have
    # ended (rank 0's liveness watcher) and every other rank answered.
    world = first(4)
    ended = {2}
    long = {"settle": 10 * TIMEOUT, "timeout": 10 * TIMEOUT}
    watching = [
        Lookout(client(server), client(server), world, rank, **long, gone=ended.__contains__).start()
        for rank in (0, 1, 3)
    ]
    agree = {
        rank: (lambda rank=rank: agree_on_lost(client(server), world, rank, settle=10 * TIMEOUT, timeout=TIMEOUT))
        for rank in (0, 1, 3)
    }
    assert run_ranks(agree) == {0: (2,), 1: (2,), 3: (2,)}
    for lookout in watching:
        lookout.close()


def test_with_rank_0_frozen_a_rank_gives_up_ends_it_and_says_why(store_process):
    # A request to a stopped server does not return, whatever the client's timeout (its kernel still keeps the
    # connection): the agreement and the lookout's close give up after their deadlines, and the store is called lost.
    store = dist.TCPStore("127.0.0.1", store_process.port, None, False, timeout=timedelta(seconds=TIMEOUT))
    world = first(2)
    lookout_client = dist.TCPStore("127.0.0.1", store_process.port, None, False)
    lookout = Lookout(store, lookout_client, world, 1, settle=0.1, timeout=1).start()
    store_process.freeze()
    called = []
    with pytest.raises(RecoveryError, match="rank 1 of generation 1 could not learn which ranks are lost"):
        agree_on_lost(store, world, 1, settle=0.1, timeout=1, requests=Deadline(), store_lost=called.append)
    assert [type(failure) for failure in called] == [RecoveryError]
    closing = threading.Thread(target=lookout.close)
    closing.start()
    closing.join(TIMEOUT)
    assert not closing.is_alive()
