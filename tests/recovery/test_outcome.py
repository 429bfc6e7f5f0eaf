"""How ``restartable`` ends, on a real ``TCPStore`` with threads as ranks: rank 0 waits for every rank's word that it
returned, or its end; the record a step that recovered in its processes leaves for ``run``, written once every rank of
the last generation returned (none without a loss or with a rank missing); the ranks that neither returned nor
ended (frozen), which rank 0 names and every rank reads; a rank 0 frozen after the others returned, on which they give
up and which they end."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder
from lightning_mpi_env.recovery.outcome import HEARD, finished, unreturned
from lightning_mpi_env.recovery.worlds import World
from lightning_mpi_env.supervise.records import read_records


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def client(store: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=10))


class Finishing:
    """``ranks`` of ``world`` other than 0 finishing, each a thread with its own client: they wait for rank 0's list."""

    def __init__(self, store: dist.TCPStore, world: World, ranks: list[int], recorder) -> None:
        self.results: dict[int, object] = {}
        self.threads = [
            threading.Thread(target=self._finish, args=(client(store), world, rank, recorder)) for rank in ranks
        ]
        for thread in self.threads:
            thread.start()

    def _finish(self, store, world, rank, recorder) -> None:
        try:
            self.results[rank] = finished(store, world, rank, {}, recorder, 10.0)
        except Exception as error:  # noqa: BLE001  # the test looks at it
            self.results[rank] = error

    def join(self) -> dict[int, object]:
        """What each rank's ``finished`` returned or raised, once rank 0 wrote its list."""
        for thread in self.threads:
            thread.join(60)
        return self.results


def ranks_finish(store, world, ranks, recorder) -> Finishing:
    """Start ``ranks`` finishing, and wait until each said it returned (rank 0 would see it)."""
    finishing = Finishing(store, world, ranks, recorder)
    keys = [f"lightning_mpi_env/gen/{world.number}/done/{rank}" for rank in ranks]
    client(store).wait(keys, timedelta(seconds=60))
    return finishing


def test_rank_0_writes_the_record_once_every_rank_returned(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    others = ranks_finish(store, world, [1, 2, 3], recorder)  # the replacement (2) among them
    assert finished(store, world, 0, {2: "node2"}, recorder, 10.0) == ()
    assert others.join() == {1: (), 2: (), 3: ()}
    [record] = read_records(str(tmp_path))
    assert record.kind is FailureKind.RECOVERED
    assert (record.ranks, record.hosts, record.written_by) == ((2,), ("node2",), 0)
    assert record.problem == (
        "rank 2 lost; the others went on in their processes through generation 2, and all 4 ranks finished"
    )


def test_a_rank_that_neither_returns_nor_ends_is_named_and_no_record_is_written(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    others = ranks_finish(store, world, [1, 3], recorder)
    # Rank 2 never says so and its process lives (frozen): rank 0 names it once the time is up, to every rank.
    assert finished(store, world, 0, {2: "node2"}, recorder, 0.3) == (2,)
    assert others.join() == {1: (2,), 3: (2,)}
    assert read_records(str(tmp_path)) == []


def test_a_rank_that_ended_without_returning_is_not_waited_for(store, tmp_path):
    # Killed while the others caught their errors: its status ends the step, so rank 0 returns with nothing to end,
    # long before the timeout (the thread's join only ends a hang).
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    others = ranks_finish(store, world, [1, 3], recorder)
    frozen = []
    rank_0 = threading.Thread(target=lambda: frozen.append(finished(store, world, 0, {}, recorder, 3600, gone)))
    rank_0.start()
    rank_0.join(60)
    assert frozen == [()]
    assert others.join() == {1: (), 3: ()}
    assert read_records(str(tmp_path)) == []


def gone(rank: int) -> bool:
    return rank == 2


def test_rank_0_waits_for_a_rank_that_returns_after_it(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    others = ranks_finish(store, world, [1, 3], recorder)
    frozen = []
    rank_0 = threading.Thread(target=lambda: frozen.append(finished(store, world, 0, {2: "node2"}, recorder, 3600)))
    rank_0.start()
    # Rank 0 said it returned, and waits (seen through a client of this thread's own: one is not for two threads).
    client(store).wait(["lightning_mpi_env/gen/2/done/0"], timedelta(seconds=60))
    assert frozen == []
    late = ranks_finish(store, world, [2], recorder)
    rank_0.join(60)
    assert frozen == [()]
    assert {**others.join(), **late.join()} == {1: (), 2: (), 3: ()}
    [record] = read_records(str(tmp_path))
    assert record.ranks == (2,)


def test_no_record_where_no_rank_was_lost_or_outside_run(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    assert finished(store, World(1, (0,)), 0, {}, recorder, 10.0) == ()
    assert finished(store, World(2, (0,), (1,)), 0, {1: "node2"}, None, 10.0) == ()
    assert read_records(str(tmp_path)) == []


def test_a_rank_whose_rank_0_froze_after_it_returned_gives_up_ends_it_and_says_why(store_process):
    # Rank 0's store answers no request once it is frozen: the rank does not wait without end for its list.
    store = dist.TCPStore("127.0.0.1", store_process.port, None, False, timeout=timedelta(seconds=10))
    store_process.freeze()
    called = []
    with pytest.raises(RecoveryError, match="rank 2 of generation 1 returned .* rank 0's store stopped answering"):
        finished(store, World(1, (0, 1, 2)), 2, {}, None, 10.0, store_lost=called.append)
    assert [type(failure) for failure in called] == [RecoveryError]


def test_a_rank_waits_for_rank_0_s_list_while_its_store_answers(store):
    # Rank 0 returns later than the others (work of its own after the last step): they wait, past one wait's time.
    world = World(1, (0, 1))
    others = ranks_finish(store, world, [1], None)
    time.sleep(HEARD + 1)  # longer than one wait of rank 1, which must wait again, not give up
    assert others.results == {}
    assert finished(store, world, 0, {}, None, 10.0) == ()
    assert others.join() == {1: ()}


def test_the_error_names_each_frozen_rank_its_node_and_the_wait():
    error = unreturned(World(1, (0, 1, 2, 3)), {2: "node2", 3: ""}, 10.0)
    assert str(error).startswith(
        "rank 2 (node2), 3 of generation 1 did not return from the function restartable runs within 10 s of the others"
    )
    assert "LIGHTNING_MPI_ENV_STALL_TIMEOUT" in str(error)
