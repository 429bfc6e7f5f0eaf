import pytest

from lightning_mpi_env.tools.simulated_launch import (
    MapBy,
    compress_nodelist,
    host_names,
    launch_environments,
    map_slots,
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"launcher": "lam", "nodes": 1, "ppn": 1}, "launcher='lam' is not one of"),
        ({"launcher": "slurm", "nodes": 1, "ppn": 1, "scheduler": "moab"}, "scheduler='moab' is not one of"),
        ({"launcher": "slurm", "nodes": 0, "ppn": 1}, "--nodes 0 must be at least 1"),
        ({"launcher": "slurm", "nodes": 10**18, "ppn": 10**18, "np": 1}, "more than the 65536 slots"),
        ({"launcher": "slurm", "nodes": 1, "ppn": 2, "np": 3}, "--np 3 is more than the 2 slots"),
    ],
)
def test_launch_environments_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch_environments(**kwargs)


def test_place_fills_round_robin_unevenly():
    slots = map_slots(2, 3, 5, MapBy.NODE)
    assert [(slot.node, slot.local_rank, slot.local_size) for slot in slots] == [
        (0, 0, 3),
        (1, 0, 2),
        (0, 1, 3),
        (1, 1, 2),
        (0, 2, 3),
    ]


def test_host_names_and_nodelist():
    assert host_names(1000)[-1] == "node1000"
    assert compress_nodelist(host_names(1)) == "node001"
    assert compress_nodelist(host_names(12)) == "node[001-012]"
