"""The node check's protocol over a real ``TCPStore`` and real gloo process groups, one thread a rank."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from lightning_mpi_env.checks.device import TorchDevices
from lightning_mpi_env.checks.findings import Finding, Kind, Writers
from lightning_mpi_env.checks.node_check import Outcome, Place, local_findings, run_node_check
from lightning_mpi_env.core.errors import NodeCheckError
from lightning_mpi_env.gpu.devices import DeviceBasis, DeviceChoice, PhysicalDevices

WORLD = 4
HOSTS = ("nodea", "nodea", "nodeb", "nodeb")


def place(rank: int, world: int = WORLD) -> Place:
    return Place(rank, world, HOSTS[rank % len(HOSTS)], rank // 2, rank % 2 == 0)


def ranks_check(found: dict, writers=Writers.RANK_ZERO, *, reduce_of=None, timeout=30.0, world=WORLD) -> dict:
    """Every rank's outcome (or error) of :func:`run_node_check`, with a gloo group of ``world`` threads."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    results: dict = {}
    done = threading.Event()

    def rank_thread(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
        group = dist.ProcessGroupGloo(dist.PrefixStore("pg", client), rank, world, timedelta(seconds=30))
        reduce = (reduce_of or (lambda group, rank: lambda tensor: group.allreduce([tensor])))(group, rank)
        try:
            if reduce is not None:
                results[rank] = run_node_check(
                    client, place(rank, world), found.get(rank, []), writers=writers, reduce=reduce, timeout=timeout
                )
        except NodeCheckError as error:
            results[rank] = error
        finally:
            if rank == 0:
                done.set()
            done.wait(60)  # a rank that does not take part keeps its group open until rank 0 is through

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_nothing_found_every_rank_goes_on_and_nothing_is_read():
    assert ranks_check({}) == {rank: Outcome(False) for rank in range(WORLD)}


def test_a_node_without_a_writer_under_ddp_is_named_by_rank_0_alone():
    finding = Finding(2, "nodeb", 1, Kind.FOLDER, "'/ckpt' cannot be written (Read-only file system)", "/ckpt")
    results = ranks_check({2: [finding]})
    assert results[0] == Outcome(False, (finding,))
    assert all(results[rank] == Outcome(False) for rank in (1, 2, 3))


def test_rank_0_s_node_stops_every_rank_with_the_finding():
    finding = Finding(0, "nodea", 0, Kind.FOLDER, "'/ckpt' cannot be written (Read-only file system)", "/ckpt")
    results = ranks_check({0: [finding]})
    assert results == {rank: Outcome(True, (finding,)) for rank in range(WORLD)}


def test_under_sharded_checkpoints_any_node_stops_every_rank():
    finding = Finding(2, "nodeb", 1, Kind.SPACE, "'/ckpt' has little free space", "/ckpt")
    results = ranks_check({2: [finding]}, Writers.EVERY_RANK)
    assert results == {rank: Outcome(True, (finding,)) for rank in range(WORLD)}


def test_a_wrong_sum_is_named_by_every_rank():
    def corrupting(group, rank):
        def reduce(tensor):
            if rank == 3:
                tensor[3] += 7  # rank 3's contribution damaged on its way
            return group.allreduce([tensor])

        return reduce

    results = ranks_check({}, reduce_of=corrupting)
    for rank, outcome in results.items():
        assert outcome.stop
        (finding,) = outcome.findings
        assert finding.kind is Kind.ALL_REDUCE
        assert finding.rank == rank
        assert "wrong sum for the place of rank(s) 3 of 4" in finding.clause


def test_an_all_reduce_that_never_finishes_is_named_within_the_bound():
    def rank_1_never_comes(group, rank):
        return None if rank == 1 else lambda tensor: group.allreduce([tensor])

    results = ranks_check({}, reduce_of=rank_1_never_comes, timeout=1.0, world=2)
    error = results[0]
    assert isinstance(error, NodeCheckError)
    assert "did not finish within 1 s on rank 0 (host nodea, node 0)" in error.problem
    assert "LIGHTNING_MPI_ENV_IFNAME" in error.hint


def test_only_the_node_s_lowest_rank_probes_its_folders(tmp_path):
    (tmp_path / "runs").write_text("a file where the folder goes")
    folders = [str(tmp_path / "runs"), "s3://bucket/runs"]
    leader = local_findings(place(2), folders, None)
    assert [(finding.kind, finding.rank, finding.node) for finding in leader] == [(Kind.FOLDER, 2, 1)]
    assert "is not a folder" in leader[0].clause
    assert local_findings(place(3), folders, None) == []
    assert local_findings(place(2), [str(tmp_path)], None, min_free=1 << 62)[0].kind is Kind.SPACE


def test_every_rank_compares_its_own_gpu():
    choice = DeviceChoice(1, DeviceBasis.WHOLE_NODE, PhysicalDevices(2))
    (finding,) = local_findings(place(3), [], choice, seen=lambda index: TorchDevices(2, current=0))
    assert finding.kind is Kind.DEVICE
    assert finding.rank == 3
    assert local_findings(place(3), [], choice, seen=lambda index: TorchDevices(2, current=1)) == []


@pytest.mark.parametrize("world", [1, 3])
def test_any_world_size(world):
    assert ranks_check({}, world=world) == {rank: Outcome(False) for rank in range(world)}


def test_the_tensor_is_two_integers_a_rank():
    seen = []

    def recording(group, rank):
        def reduce(tensor):
            seen.append((tensor.dtype, tuple(tensor.shape)))
            return group.allreduce([tensor])

        return reduce

    ranks_check({}, reduce_of=recording, world=2)
    assert seen == [(torch.int64, (4,))] * 2
