"""Uneven launches: nothing a layout marks exact may be wrong (issue 15, items 1 and 2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import Placement, from_env
from lightning_mpi_env.core.placement import every_rank_here

ADDRESS = {"MASTER_ADDR": "a", "MASTER_PORT": "29611"}


def place(slots: list[int], np: int, map_by: str) -> list[tuple[int, int, int]]:
    """``(rank, local_rank, node)`` of every rank, as ``mpirun -n NP --host a:S0,b:S1,... --map-by MAP_BY`` places
    them: ``slot`` fills each host's slots before the next, ``node`` deals one rank to each host with a free slot in
    turn. ``node`` counts only the hosts that run a rank, in host-list order."""
    hosts: list[list[int]] = [[] for _ in slots]
    if map_by == "slot":
        rank = 0
        for host, count in enumerate(slots):
            take = min(count, np - rank)
            hosts[host] = list(range(rank, rank + take))
            rank += take
    else:
        rank = 0
        while rank < np:
            for host, count in enumerate(slots):
                if rank < np and len(hosts[host]) < count:
                    hosts[host].append(rank)
                    rank += 1
    used = [ranks for ranks in hosts if ranks]
    return sorted((rank, local, node) for node, ranks in enumerate(used) for local, rank in enumerate(ranks))


@st.composite
def launches(draw: st.DrawFn) -> tuple[list[int], int, str]:
    """Uneven slots per host, a process count that fits them, and a mapping."""
    slots = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    np = draw(st.integers(1, sum(slots)))
    return slots, np, draw(st.sampled_from(["slot", "node"]))


def open_mpi_env(rank: int, local: int, local_size: int, world: int, universe: int) -> dict[str, str]:
    # https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html: every variable Open MPI sets for a rank.
    # OMPI_COMM_WORLD_NODE_RANK is the rank on the node across *all* jobs (one job here: the local rank), not a
    # node index; OMPI_UNIVERSE_SIZE is the number of slots, not of processes.
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_NODE_RANK": str(local),
        "OMPI_UNIVERSE_SIZE": str(universe),
        "PMIX_RANK": str(rank),
        "PMIX_NAMESPACE": "prterun-a-1@1",
        **ADDRESS,
    }


def pals_env(rank: int, local: int, local_size: int, world: int, node: int) -> dict[str, str]:
    # Cray PALS (HPE Cray PE `mpiexec`): PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, PMI_SIZE, PMI_LOCAL_SIZE;
    # PALS_NODEID is this node's index in the application, so the node rank is exact (the row's own reading).
    return {
        "PALS_RANKID": str(rank),
        "PALS_LOCAL_RANKID": str(local),
        "PALS_NODEID": str(node),
        "PALS_APID": "4242-0",
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(world),
        "PMI_LOCAL_SIZE": str(local_size),
        **ADDRESS,
    }


def check_exact_values(placed: list[tuple[int, int, int]], make_env) -> None:  # type: ignore[no-untyped-def]
    world = len(placed)
    per_node: dict[int, int] = {}
    for _, _, node in placed:
        per_node[node] = per_node.get(node, 0) + 1
    for rank, local, node in placed:
        layout = from_env(make_env(rank, local, per_node[node], world, node))
        assert (layout.rank, layout.local_rank, layout.local_size) == (rank, local, per_node[node])
        if layout.node_rank_is_exact:
            assert layout.node_rank == node, layout
        if layout.num_nodes_is_exact:
            assert layout.num_nodes == len(per_node), layout
        if layout.num_nodes is not None and len(set(per_node.values())) > 1 and layout.num_nodes_is_exact:
            pytest.fail(f"an uneven launch claimed even: {layout!r}")


@settings(max_examples=300, deadline=None)
@given(launches())
def test_property_open_mpi_uneven_placements_mark_nothing_wrong_as_exact(launch):
    slots, np, map_by = launch
    placed = place(slots, np, map_by)
    universe = sum(slots)
    check_exact_values(placed, lambda rank, local, size, world, _node: open_mpi_env(rank, local, size, world, universe))


@settings(max_examples=300, deadline=None)
@given(launches())
def test_property_pals_uneven_placements_are_accepted_and_mark_nothing_wrong_as_exact(launch):
    slots, np, map_by = launch
    placed = place(slots, np, map_by)
    check_exact_values(placed, pals_env)
    for rank, local, node in placed:  # PALS exports the node index: always exact
        size = sum(1 for _, _, other in placed if other == node)
        assert from_env(pals_env(rank, local, size, np, node)).node_rank_is_exact


def test_open_mpi_uneven_hosts_block():
    # mpirun -n 6 --host a:4,b:4: rank 4 is local rank 0 of 2 on b (node 1 of 2), and looks like node 2 of 3 x 2.
    layout = from_env(open_mpi_env(4, 0, 2, 6, 8))
    assert (layout.node_rank, layout.num_nodes) == (2, 3)
    assert not layout.node_rank_is_exact
    assert not layout.num_nodes_is_exact
    assert "node=2~/3~" in repr(layout)
    assert layout.sources["node_rank"].endswith("(assumed block placement)")
    assert layout.sources["num_nodes"].endswith("(assumed even)")


def test_open_mpi_uneven_hosts_round_robin():
    # mpirun --map-by node --host a:2,b:2,c:1,d:1 -n 6: rank 5 runs on b (node 1), local rank 1 of 2.
    assert place([2, 2, 1, 1], 6, "node")[5] == (5, 1, 1)
    layout = from_env(open_mpi_env(5, 1, 2, 6, 6))
    assert not layout.node_rank_is_exact
    assert not layout.num_nodes_is_exact


def test_every_rank_on_this_node_is_exact():
    layout = from_env(open_mpi_env(3, 3, 4, 4, 4))
    assert (layout.node_rank, layout.num_nodes, layout.placement) == (0, 1, Placement.BLOCK)
    assert layout.node_rank_is_exact
    assert layout.num_nodes_is_exact
    assert "node=0/1" in repr(layout)
    assert every_rank_here(4, 4)


def test_pals_second_node_of_an_uneven_ppn_launch():
    # mpiexec -n 6 --ppn 4 on 2 nodes: the second node runs ranks 4 and 5.
    layout = from_env(pals_env(4, 0, 2, 6, 1))
    assert layout.node_rank == 1
    assert layout.node_rank_is_exact
    assert layout.num_nodes == 3
    assert not layout.num_nodes_is_exact
    assert "node=1/3~" in repr(layout)
    assert layout.trainer_kwargs().exact is False


def test_pals_node_index_past_the_even_count_proves_unevenness():
    # Nodes running 1, 1, 1 and 3 ranks: the fourth looks like the second node of 2 x 3, but PALS_NODEID=3.
    layout = from_env(pals_env(3, 0, 3, 6, 3))
    assert (layout.node_rank, layout.num_nodes, layout.is_even) == (3, None, False)


def test_pals_node_index_no_launch_can_fill_is_refused():
    with pytest.raises(LayoutError, match=r"PALS_NODEID=5 with PMI_LOCAL_SIZE=2 ranks on this node needs at least 7"):
        from_env(pals_env(1, 1, 2, 4, 5))
