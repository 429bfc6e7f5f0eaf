"""The record a step that recovered in its processes leaves for ``run``: written by rank 0 once every rank of the last
generation returned, on a real ``TCPStore`` with threads as ranks; none without a loss or with a rank missing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.records import FailureKind, FailureRecorder
from lightning_mpi_env.recovery.outcome import finished
from lightning_mpi_env.recovery.worlds import World
from lightning_mpi_env.supervise.records import read_records


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def client(store: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", store.port, None, False, timeout=timedelta(seconds=10))


def ranks_finish(store, world, ranks, recorder) -> None:
    others = [
        threading.Thread(target=finished, args=(client(store), world, rank, {}, recorder, 10.0)) for rank in ranks
    ]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(30)


def test_rank_0_writes_the_record_once_every_rank_returned(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    ranks_finish(store, world, [1, 2, 3], recorder)  # the replacement (2) among them
    finished(store, world, 0, {2: "node2"}, recorder, 10.0)
    [record] = read_records(str(tmp_path))
    assert record.kind is FailureKind.RECOVERED
    assert (record.ranks, record.hosts, record.written_by) == ((2,), ("node2",), 0)
    assert record.problem == (
        "rank 2 lost; the others went on in their processes through generation 2, and all 4 ranks finished"
    )


def test_no_record_while_a_rank_has_not_returned(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    world = World(2, (0, 1, 2, 3), (2,))
    ranks_finish(store, world, [1, 3], recorder)
    finished(store, world, 0, {2: "node2"}, recorder, 0.3)  # rank 2 never says so: run sees what srun's status says
    assert read_records(str(tmp_path)) == []


def test_no_record_where_no_rank_was_lost_or_outside_run(store, tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path), "Slurm srun", "77")
    finished(store, World(1, (0,)), 0, {}, recorder, 10.0)
    finished(store, World(2, (0,), (1,)), 0, {1: "node2"}, None, 10.0)
    assert read_records(str(tmp_path)) == []
    assert not store.check(["lightning_mpi_env/gen/2/done"])
