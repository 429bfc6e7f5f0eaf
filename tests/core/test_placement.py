"""Where each rank's node is and how many ranks every node runs: what `from_env` proves, assumes and refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import compress_tasks_per_node, expand_nodelist, nodelist_position
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.placement import Placement, every_rank_here
from lightning_mpi_env.core.rank_layout import UNEVEN_FIX, uneven_fix

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


# --- every node's count: what from_env proves, assumes and refuses under each launcher's own variables ---

# --- Slurm: SLURM_STEP_TASKS_PER_NODE ----------------------------------------------------------------------------
# sbatch(1), SLURM_TASKS_PER_NODE: "Values are comma separated and in the same order as SLURM_JOB_NODELIST. If two or
# more consecutive nodes are to have the same task count, that count is followed by "(x#)" where "#" is the
# repetition count. For example, "SLURM_TASKS_PER_NODE=2(x3),1" indicates that the first three nodes will each
# execute two tasks and the fourth node will execute one task." srun(1), SLURM_STEP_TASKS_PER_NODE: "Number of
# processes per node within the step"; SLURM_NODEID: "The relative node ID of the current node"; both in the same
# form and order (env_array_for_step, src/common/env.c, writes one string to both).


def srun_task(rank: int, node: int, local_rank: int, counts: str = "2(x3),1", **more: str) -> dict[str, str]:
    """One task of `srun -n7` whose step runs 2, 2, 2 and 1 tasks on gpu[01-04], as srun exports it."""
    return {
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "7",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_TASKS_PER_NODE": counts,  # srun overwrites it in a step ("OBSOLETE, but needed by some MPI")
        "SLURM_STEP_NODELIST": "gpu[01-04]",
        "SLURMD_NODENAME": f"gpu0{node + 1}",
        **more,
    }


@pytest.mark.parametrize(("rank", "node", "local_rank", "local_size"), [(0, 0, 0, 2), (5, 2, 1, 2), (6, 3, 0, 1)])
def test_slurm_compressed_counts_give_every_node_exactly(rank, node, local_rank, local_size):
    layout = from_env(srun_task(rank, node, local_rank))
    assert (layout.world_size, layout.rank, layout.local_rank, layout.local_size) == (7, rank, local_rank, local_size)
    assert (layout.node_rank, layout.num_nodes, layout.ranks_per_node) == (node, 4, (2, 2, 2, 1))
    assert layout.node_rank_is_exact
    assert layout.num_nodes_is_exact
    assert not layout.is_even
    assert layout.placement is Placement.LAUNCHER
    assert layout.main_address == "gpu01"
    trainer = layout.trainer_kwargs()
    assert (trainer.devices, trainer.num_nodes) == (None, None)
    assert trainer.note.endswith(f"(2(x3),1 per node), not the same number on every node. {uneven_fix('slurm')}.")


@pytest.mark.parametrize(
    ("counts", "expanded"),
    [("2(x3),1", (2, 2, 2, 1)), ("1,2(x2)", (1, 2, 2)), ("4(x1),3", (4, 3)), ("3,1,2", (3, 1, 2))],
)
def test_slurm_counts_in_every_form_are_read_in_node_order(counts, expanded):
    env = srun_task(0, 0, 0, counts, SLURM_NTASKS=str(sum(expanded)), SLURM_STEP_NUM_TASKS=str(sum(expanded)))
    env["SLURM_STEP_NODELIST"] = f"gpu[01-0{len(expanded)}]"
    layout = from_env(env)
    assert (layout.ranks_per_node, layout.local_size, layout.num_nodes) == (expanded, expanded[0], len(expanded))


def test_slurm_counts_that_add_up_to_another_world_size_are_one_named_error():
    env = srun_task(0, 0, 0, "2(x3),1", SLURM_NTASKS="8", SLURM_STEP_NUM_TASKS="8")
    with pytest.raises(
        LayoutError, match=r"SLURM_STEP_TASKS_PER_NODE='2\(x3\),1' adds up to 7 tasks but SLURM_NTASKS=8"
    ):
        from_env(env)


def test_slurm_preserve_env_keeps_the_job_s_ntasks_and_is_named():
    # srun(1), -E/--preserve-env: "Pass the current values of environment variables SLURM_JOB_NUM_NODES and
    # SLURM_NTASKS through to the executable, rather than computing them from command line parameters." The step's
    # own count stays in SLURM_STEP_NUM_TASKS: `srun -E -n7` inside `sbatch -n16`.
    with pytest.raises(LayoutError, match=r"SLURM_NTASKS=16 is the job's, not this step's") as raised:
        from_env(srun_task(0, 0, 0, SLURM_NTASKS="16", SLURM_TASKS_PER_NODE="8(x2)"))
    error = raised.value
    assert (error.variable, error.value, error.launcher) == ("SLURM_NTASKS", "16", "Slurm srun")
    assert "Drop `--preserve-env`/`-E`" in error.hint


def test_slurm_a_rank_past_its_node_s_count_is_refused():
    # SLURM_LOCALID=1 on the node that runs 1 task: the variables were not set by one launch.
    with pytest.raises(LayoutError, match=r"SLURM_LOCALID=1 is out of range: .* only 1 \(SLURM_STEP_TASKS_PER_NODE"):
        from_env(srun_task(6, 3, 1))


# --- Slurm heterogeneous steps: srun --het-group=0,1 ---------------------------------------------------------------
# heterogeneous_jobs.html: "the applications launched by a single execution of the srun command (even for different
# components of the heterogeneous job) are combined into one MPI_COMM_WORLD with non-overlapping task IDs"; "The
# SLURM_PROCID and SLURM_TASKID environment variables will be set to reflect a global task rank"; "SLURM_NTASKS will
# be set to the total count of tasks in all components"; "SLURM_HET_SIZE will contain the number of components in the
# job", and per component SLURM_*_HET_GROUP_<n>. Whole-step, not per component, also (Slurm source): SLURM_NODEID =
# het_job_node_offset + the node's index in its component (slurmstepd/task.c, exec_task), and
# SLURM_STEP_TASKS_PER_NODE / SLURM_STEP_NODELIST over every node of the step, *sorted by host name*
# (srun.c, _reorder_het_job_recs; env.c, env_array_for_step). So when the first component's nodes do not sort first,
# SLURM_NODEID does not index SLURM_STEP_TASKS_PER_NODE: this node's count is found by SLURMD_NODENAME (srun(1):
# "Name of the node running the task").

HET_JOB = {
    "SLURM_HET_SIZE": "2",
    "SLURM_JOB_ID": "500",
    "SLURM_JOB_ID_HET_GROUP_0": "500",
    "SLURM_JOB_ID_HET_GROUP_1": "501",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu01",
    "SLURM_JOB_NODELIST_HET_GROUP_1": "cpu[01-02]",
    "SLURM_NTASKS_HET_GROUP_0": "2",
    "SLURM_NTASKS_HET_GROUP_1": "2",
    "MASTER_ADDR": "gpu01",  # required in a heterogeneous job: see below
}
HET_TASKS = [
    # (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID, SLURMD_NODENAME, that node's count): component 0 runs 2 tasks on
    # gpu01 (node 0), component 1 one each on cpu01 and cpu02 (nodes 1 and 2); the sorted step lists cpu01, cpu02,
    # gpu01 with 1, 1, 2 tasks.
    (0, 0, 0, "gpu01", 2),
    (1, 0, 1, "gpu01", 2),
    (2, 1, 0, "cpu01", 1),
    (3, 2, 0, "cpu02", 1),
]


def het_task(rank: int, node: int, local_rank: int, name: str, **more: str) -> dict[str, str]:
    return {
        **HET_JOB,
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": "1(x2),2",
        "SLURM_STEP_NODELIST": "cpu[01-02],gpu01",
        "SLURM_JOB_NODELIST": "cpu[01-02],gpu01",
        "SLURMD_NODENAME": name,
        **more,
    }


@pytest.mark.parametrize(("rank", "node", "local_rank", "name", "local_size"), HET_TASKS)
def test_heterogeneous_step_gives_whole_step_ranks_and_each_node_s_own_count(rank, node, local_rank, name, local_size):
    layout = from_env(het_task(rank, node, local_rank, name))
    assert (layout.world_size, layout.rank, layout.local_rank, layout.local_size) == (4, rank, local_rank, local_size)
    assert (layout.node_rank, layout.num_nodes) == (node, 3)  # SLURM_NODEID, the launcher's own, exact
    assert layout.ranks_per_node == (1, 1, 2)  # in SLURM_STEP_NODELIST's order, which is not SLURM_NODEID's here
    assert layout.sources["local_size"] == "SLURM_STEP_TASKS_PER_NODE[SLURMD_NODENAME]"
    assert not layout.is_even
    assert layout.main_address == "gpu01"


# Captured on this project's simulated Slurm cluster (Debian's Slurm 22.05, tests/clusters/slurm.py):
# `salloc -N1 -n2 -w node2 : -N1 -n1 -w node1 srun --het-group=0,1 env`. Component 0 runs 2 tasks on node2, component
# 1 one task on node1; srun listed the step sorted (node1 first) while SLURM_NODEID counts component 0's node2 as 0.
CAPTURED_HET_STEP = {
    "SLURM_HET_SIZE": "2",
    "SLURM_JOB_ID": "1683700",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "node2",
    "SLURM_JOB_NODELIST_HET_GROUP_1": "node1",
    "SLURM_NTASKS": "3",
    "SLURM_NTASKS_HET_GROUP_0": "2",
    "SLURM_NTASKS_HET_GROUP_1": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_STEP_TASKS_PER_NODE": "1,2",
    "SLURM_TASKS_PER_NODE": "1,2",
    "SLURM_TASKS_PER_NODE_HET_GROUP_0": "2",
    "SLURM_TASKS_PER_NODE_HET_GROUP_1": "1",
}
CAPTURED_HET_TASKS = [
    # SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME as each task saw them; and that node's count.
    ("0", "0", "0", "node2", 2),
    ("1", "1", "0", "node2", 2),
    ("2", "0", "1", "node1", 1),
]


@pytest.mark.parametrize(("rank", "local_rank", "node", "name", "local_size"), CAPTURED_HET_TASKS)
def test_captured_heterogeneous_step_resolves_every_task(rank, local_rank, node, name, local_size):
    env = {**CAPTURED_HET_STEP, "SLURM_PROCID": rank, "SLURM_LOCALID": local_rank, "SLURM_NODEID": node,
           "SLURMD_NODENAME": name}  # fmt: skip
    layout = from_env({**env, "MASTER_ADDR": "node2"})
    assert (layout.rank, layout.local_rank, layout.local_size) == (int(rank), int(local_rank), local_size)
    assert (layout.world_size, layout.node_rank, layout.num_nodes, layout.ranks_per_node) == (3, int(node), 2, (1, 2))
    # Without MASTER_ADDR the step's first host would be node1, which runs rank 2: refused, never guessed.
    with pytest.raises(LayoutError, match=r"srun sorts the nodes of a step over several components by name"):
        from_env(env)


def test_heterogeneous_step_read_by_node_id_alone_would_be_wrong():
    # The reason for SLURMD_NODENAME: rank 1 is local rank 1 of 2 on gpu01, but SLURM_NODEID=0 points at cpu01's 1.
    env = het_task(1, 0, 1, "gpu01")
    env.pop("SLURM_HET_SIZE")  # not a heterogeneous job, as far as the variables say: read by SLURM_NODEID
    with pytest.raises(LayoutError, match=r"SLURM_LOCALID=1 is out of range"):
        from_env(env)


def test_heterogeneous_step_without_the_node_s_name_is_one_named_error():
    env = het_task(0, 0, 0, "gpu01")
    env.pop("SLURMD_NODENAME")
    with pytest.raises(LayoutError, match=r"SLURM_HET_SIZE='2': a heterogeneous Slurm job") as raised:
        from_env(env)
    assert (raised.value.variable, raised.value.launcher) == ("SLURMD_NODENAME", "Slurm srun")


def test_heterogeneous_step_whose_list_does_not_name_this_node_is_refused():
    with pytest.raises(LayoutError, match=r"SLURM_STEP_NODELIST='cpu\[01-02\],gpu01' does not list SLURMD_NODENAME"):
        from_env(het_task(0, 0, 0, "gpu09"))


def test_heterogeneous_step_with_even_counts_needs_no_name():
    # Every node runs as many: which count is this node's does not matter.
    env = het_task(2, 1, 0, "cpu01", SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURM_NTASKS="3", SLURM_STEP_NUM_TASKS="3")
    env.pop("SLURMD_NODENAME")
    layout = from_env({**env, "SLURM_PROCID": "1"})
    assert (layout.local_size, layout.ranks_per_node, layout.is_even) == (1, (1, 1, 1), True)


def test_heterogeneous_job_needs_master_addr():
    # The sorted step list's first host (cpu01) runs rank 2, not rank 0: the main address is never guessed from it.
    env = het_task(0, 0, 0, "gpu01")
    env.pop("MASTER_ADDR")
    with pytest.raises(LayoutError, match=r"srun sorts the nodes of a step over several components by name") as raised:
        from_env(env)
    assert raised.value.variable == "MASTER_ADDR"
    assert "SLURM_JOB_NODELIST_HET_GROUP_0" in raised.value.hint


@st.composite
def het_steps(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Components of one heterogeneous step, in order: each a list of (host, tasks on it), hosts distinct."""
    hosts = draw(st.lists(st.sampled_from(["gpu01", "gpu02", "cpu01", "cpu02", "big1", "a7", "z3"]), min_size=2,
                          max_size=6, unique=True))  # fmt: skip
    cuts = sorted(draw(st.sets(st.integers(1, len(hosts) - 1), max_size=2)))
    counts = draw(st.lists(st.integers(1, 4), min_size=len(hosts), max_size=len(hosts)))
    bounds = [0, *cuts, len(hosts)]
    return [list(zip(hosts[a:b], counts[a:b], strict=True)) for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=60, deadline=None)
@given(het_steps())
def test_property_every_task_of_a_heterogeneous_step_resolves_to_where_srun_put_it(components):
    # As slurmstepd and srun set them: SLURM_PROCID and SLURM_NODEID offset component by component, the step's node
    # list and counts sorted by host name (here Python's order, which stands for hostlist_sort's).
    nodes = [node for component in components for node in component]
    listed = sorted(nodes)
    world = sum(count for _, count in nodes)
    base = {**HET_JOB, "SLURM_HET_SIZE": str(len(components)), "SLURM_STEP_ID": "0", "SLURM_NTASKS": str(world),
            "SLURM_STEP_NUM_TASKS": str(world), "SLURM_STEP_NODELIST": ",".join(host for host, _ in listed),
            "SLURM_STEP_TASKS_PER_NODE": compress_tasks_per_node([count for _, count in listed])}  # fmt: skip
    rank = 0
    for node_id, (host, count) in enumerate(nodes):
        for local_rank in range(count):
            env = {**base, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node_id), "SLURM_LOCALID": str(local_rank),
                   "SLURMD_NODENAME": host}  # fmt: skip
            layout = from_env(env)
            assert (layout.rank, layout.local_rank, layout.local_size) == (rank, local_rank, count)
            assert (layout.node_rank, layout.num_nodes, layout.world_size) == (node_id, len(nodes), world)
            assert layout.ranks_per_node == tuple(count for _, count in listed)
            rank += 1


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["n", "gpu", "r1n", ""]), st.integers(0, 30), st.integers(0, 5), st.integers(1, 3)),
        min_size=1,
        max_size=4,
    ),
    st.data(),
)
def test_property_nodelist_position_is_the_first_index_in_the_expanded_list(items, data):
    nodelist = ",".join(f"{prefix or 'x'}[{str(low).zfill(width)}-{low + span}]" for prefix, low, span, width in items)
    names = expand_nodelist(nodelist)
    host = data.draw(st.one_of(st.sampled_from(names), st.sampled_from(["x1", "n031", "gpu", "y0"])))
    assert nodelist_position(nodelist, host) == (names.index(host) if host in names else None, len(names))


def test_nodelist_position_counts_without_expanding():
    assert nodelist_position("cpu[01-02],gpu01", "gpu01") == (2, 3)
    assert nodelist_position("n[000001-999999]", "n999999") == (999998, 999999)
    assert nodelist_position("n[1-3]", "m1") == (None, 3)
    # Number groups next to digits split more than one way: those items are counted name by name.
    assert nodelist_position("n[1-2][3-4]", "n24") == (3, 4)
    assert nodelist_position("n1[0-2]2", "n112") == (1, 3)
    assert nodelist_position("n[1-3,2-4]", "n2") == (1, 6)  # the first of two


# --- Open MPI, MPICH and Intel MPI (Hydra): uneven host files --------------------------------------------------------
# Open MPI (docs.open-mpi.org, "Environment variables set for MPI applications"): OMPI_COMM_WORLD_LOCAL_SIZE "the
# number of ranks from this job that are running on this node"; no node index (OMPI_COMM_WORLD_NODE_RANK is "the
# relative rank of this process on this node looking across all jobs") and no node count. Hydra exports PMI_RANK,
# PMI_SIZE, MPI_LOCALRANKID and MPI_LOCALNRANKS (this node's count; tests/data/*/mpiexec_uneven_n3_ppn2.json, captured
# from real MPICH and Intel MPI). So one rank knows its node's count exactly and nothing of the others: an uneven
# launch is proved only where the world size does not divide by this node's count.

HOST_FILE_3_1 = [(0, 0, 3), (1, 1, 3), (2, 2, 3), (3, 0, 1)]
"""(rank, local rank, local size) of `mpirun -np 4 --hostfile` with `a slots=3` and `b slots=1`, --map-by slot."""

HYDRA_2_1 = [(0, 0, 2), (1, 1, 2), (2, 0, 1)]
"""(rank, local rank, local size) of `mpiexec -n 3 -hosts a:2,b:1` (block)."""


def open_mpi(rank: int, local_rank: int, local_size: int, world_size: int) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "MASTER_ADDR": "a",
    }


def hydra(rank: int, local_rank: int, local_size: int, world_size: int, **more: str) -> dict[str, str]:
    return {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(world_size),
        "MPI_LOCALRANKID": str(local_rank),
        "MPI_LOCALNRANKS": str(local_size),
        "PMI_FD": "9",
        "MASTER_ADDR": "a",
        **more,
    }


@pytest.mark.parametrize(
    ("make", "tasks", "flavour"),
    [
        (open_mpi, HOST_FILE_3_1, {}),
        (hydra, HYDRA_2_1, {}),  # MPICH
        (hydra, HYDRA_2_1, {"I_MPI_HYDRA_UUID": "00003039-0000-0000-0000-000000000001"}),  # Intel MPI
    ],
    ids=["openmpi", "mpich", "intelmpi"],
)
def test_mpi_launchers_know_this_node_s_count_and_prove_uneven_only_where_it_does_not_divide(make, tasks, flavour):
    world = len(tasks)
    for rank, local_rank, local_size in tasks:
        layout = from_env(make(rank, local_rank, local_size, world, **flavour))
        assert (layout.rank, layout.world_size, layout.local_rank, layout.local_size) == (
            rank, world, local_rank, local_size,
        )  # fmt: skip
        assert layout.ranks_per_node == ()  # the other nodes' counts are nowhere in the variables
        assert not layout.num_nodes_is_exact
        assert not layout.node_rank_is_exact
        if world % local_size:
            # 3 ranks here of 4 (or 2 of 3): no even launch has that, so surely uneven.
            assert (layout.num_nodes, layout.is_even) == (None, False)
            assert layout.trainer_kwargs().note.endswith(f"{UNEVEN_FIX}.")
        else:
            # 1 rank of 4 here looks like one node of 4 x 1: consistent with even, and said to be an assumption.
            assert layout.num_nodes == world // local_size
            assert "assumed even" in layout.sources["num_nodes"]
            assert layout.trainer_kwargs().exact is False


# --- PBS with a mixed select: Cray PALS -------------------------------------------------------------------------------
# `qsub -l select=1:ncpus=4:mpiprocs=4+1:ncpus=2:mpiprocs=2`: PBS_NODEFILE lists each host once per MPI process
# (PBS Professional User's Guide, "The job's node file"), 4 lines of x1000c0s0b0n0, then 2 of x1000c0s0b0n1. Cray's
# mpiexec (PALS) exports PALS_NODEID, the node's index, PMI_LOCAL_SIZE, this node's count, and PMI_SIZE; no node count.

PBS_NODEFILE = "x1000c0s0b0n0\n" * 4 + "x1000c0s0b0n1\n" * 2


@pytest.mark.parametrize(("rank", "node", "local_rank", "local_size"), [(0, 0, 0, 4), (3, 0, 3, 4), (4, 1, 0, 2)])
def test_pals_under_a_mixed_select_gives_the_exported_node_index(rank, node, local_rank, local_size):
    env = {
        "PALS_RANKID": str(rank),
        "PALS_NODEID": str(node),
        "PALS_LOCAL_RANKID": str(local_rank),
        "PMI_LOCAL_SIZE": str(local_size),
        "PMI_SIZE": "6",
        "PBS_NODEFILE": "/var/spool/pbs/aux/1234.pbs01",
        "PBS_JOBID": "1234.pbs01",
    }
    layout = from_env(env, read_text=lambda path: PBS_NODEFILE)
    assert (layout.node_rank, layout.local_size, layout.placement) == (node, local_size, Placement.LAUNCHER)
    assert layout.node_rank_is_exact
    assert layout.ranks_per_node == ()  # the node file is the allocation, not the launch: never read as counts
    assert layout.main_address == "x1000c0s0b0n0"  # the node file's first host, where rank 0 runs
    if local_size == 4:
        assert (layout.num_nodes, layout.is_even) == (None, False)  # 6 does not divide by 4
    else:
        # 6 / 2 would be 3 nodes: assumed, never called exact, and node 1 of them is still a valid index.
        assert (layout.num_nodes, layout.num_nodes_is_exact) == (3, False)


def test_pals_node_index_past_what_the_counts_allow_is_refused():
    env = {"PALS_RANKID": "5", "PALS_NODEID": "5", "PALS_LOCAL_RANKID": "1", "PMI_LOCAL_SIZE": "2", "PMI_SIZE": "6"}
    with pytest.raises(LayoutError, match=r"PALS_NODEID=5 with PMI_LOCAL_SIZE=2 ranks on this node needs at least 7"):
        from_env({**env, "MASTER_ADDR": "a"})


# --- LSF: LSB_MCPU_HOSTS ---------------------------------------------------------------------------------------------
# LSF's LSB_MCPU_HOSTS ("hostA 4 hostB 2": each host of the allocation with its slot count; IBM Spectrum LSF,
# "Environment variables set for job execution") is the job's allocation, not a launch: ranks started in it by
# Spectrum MPI's / Open MPI's mpirun read OMPI_COMM_WORLD_*, by jsrun JSM_NAMESPACE_*. It gives rank 0's host only.


@pytest.mark.parametrize(("rank", "local_rank", "local_size"), [(0, 0, 4), (5, 1, 2)])
def test_lsf_uneven_allocation_gives_the_first_host_and_the_launcher_the_rest(rank, local_rank, local_size):
    env = open_mpi(rank, local_rank, local_size, world_size=6)
    env.pop("MASTER_ADDR")
    layout = from_env({**env, "LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "hostA 4 hostB 2"})
    assert layout.main_address == "hostA"
    assert layout.sources["main_address"] == "LSB_MCPU_HOSTS (first host)"
    assert (layout.local_size, layout.ranks_per_node) == (local_size, ())
    assert layout.num_nodes is (None if local_size == 4 else 3)


def test_jsrun_uneven_resource_sets_give_this_node_s_count():
    # jsrun exports JSM_NAMESPACE_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE (read by Lightning's LSFEnvironment and by
    # Spectrum MPI): 3 ranks on the first compute node of 4.
    env = {
        "JSM_NAMESPACE_RANK": "2",
        "JSM_NAMESPACE_SIZE": "4",
        "JSM_NAMESPACE_LOCAL_RANK": "2",
        "JSM_NAMESPACE_LOCAL_SIZE": "3",
        "LSB_DJOB_RANKFILE": "/home/u/.lsbatch/rankfile",
    }
    layout = from_env(env, read_text=lambda path: "batch1\ncn1\ncn1\ncn1\ncn2\n")
    assert (layout.local_size, layout.num_nodes, layout.is_even, layout.main_address) == (3, None, False, "cn1")


# --- Flux -----------------------------------------------------------------------------------------------------------
# flux-environment(7): FLUX_JOB_SIZE "The number of tasks in the current job"; FLUX_JOB_NNODES "The total number of
# nodes hosting tasks on behalf of the current job"; FLUX_TASK_RANK "The zero-origin, global rank for this task";
# FLUX_TASK_LOCAL_ID "The zero-origin, local (to the node) rank for this task". No per-node count and no node index
# (the shell sets no other; src/shell/shell.c, task.c). flux-run(1): with -N, "Tasks will be distributed evenly
# across the allocated nodes" - as evenly as possible, so -N2 -n5 is 3 + 2.


def flux_task(rank: int, local_rank: int, size: int, nodes: int) -> dict[str, str]:
    return {
        "FLUX_TASK_RANK": str(rank),
        "FLUX_JOB_SIZE": str(size),
        "FLUX_TASK_LOCAL_ID": str(local_rank),
        "FLUX_JOB_NNODES": str(nodes),
        "FLUX_JOB_ID": "ƒ2n7Sd1Ky",
        "MASTER_ADDR": "a",
    }


def test_flux_even_job_has_an_exact_node_count_and_an_assumed_local_size():
    layout = from_env(flux_task(3, 1, 4, 2))
    assert (layout.local_size, layout.num_nodes, layout.num_nodes_is_exact) == (2, 2, True)
    assert layout.sources["local_size"] == "FLUX_JOB_SIZE / FLUX_JOB_NNODES (assumed even)"
    assert layout.trainer_kwargs().exact is False  # the ranks per node are divided out, not exported


@pytest.mark.parametrize(("rank", "local_rank"), [(0, 0), (3, 0), (4, 1)])
def test_flux_job_whose_size_does_not_divide_is_refused_by_every_task(rank, local_rank):
    # flux run -N2 -n5: 3 + 2 tasks; no task can know its node's count.
    with pytest.raises(
        LayoutError, match=r"FLUX_JOB_SIZE=5 tasks do not divide over FLUX_JOB_NNODES=2 nodes"
    ) as raised:
        from_env(flux_task(rank, local_rank, 5, 2))
    error = raised.value
    assert (error.variable, error.value, error.launcher) == ("FLUX_JOB_SIZE", "5", "Flux")
    # The fix fits the launch: the even launches of 2 nodes nearest to 5 tasks, never one task.
    assert error.hint == (
        "Give every node the same number of tasks: `flux run -N 2 --tasks-per-node=2` (4 tasks) or "
        "`--tasks-per-node=3` (6 tasks)."
    )


def test_flux_task_past_an_even_share_proves_the_job_uneven():
    # 6 tasks on 2 nodes, packed 4 + 2 by the scheduler (no -N): local id 3 is past 6 / 2.
    with pytest.raises(LayoutError, match=r"FLUX_TASK_LOCAL_ID=3 is past an even share of 3 per node") as raised:
        from_env(flux_task(3, 3, 6, 2))
    assert "not all set by one launch" not in str(raised.value)  # an uneven job, not a broken one
