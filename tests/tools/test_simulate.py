from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.placement import Placement
from lightning_mpi_env.core.ports import derive_port
from lightning_mpi_env.tools.simulate import check_table, require_ok, simulate
from lightning_mpi_env.tools.simulated_launch import HOST_FILE, LAUNCHER_KEYS, SCHEDULERS, MapBy

# What each launcher exports to rank 3 of 2 nodes x 2 slots, written out by hand from the launchers' documentation
# (block placement: rank 3 is the second rank on the second node), without the scheduler's variables.
HAND_BUILT_RANK_3 = {
    "openmpi": {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_RANK": "3",
        "PMIX_NAMESPACE": "prterun-node001-12345@1",
    },
    "mpich": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "9"},
    "intelmpi": {
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "PMI_FD": "9",
        "I_MPI_HYDRA_UUID": "00003039-0000-0000-0000-000000000001",  # one per mpiexec, the same on every rank
    },
    "mvapich2": {
        "MV2_COMM_WORLD_RANK": "3",
        "MV2_COMM_WORLD_SIZE": "4",
        "MV2_COMM_WORLD_LOCAL_RANK": "1",
        "MV2_COMM_WORLD_LOCAL_SIZE": "2",
    },
    "slurm": {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "node[001-002]",
        "SLURM_JOB_ID": "12345",
        "SLURMD_NODENAME": "node002",  # srun(1): "Name of the node running the task"
    },
    "pals": {
        "PALS_RANKID": "3",
        "PMI_SIZE": "4",
        "PALS_LOCAL_RANKID": "1",
        "PMI_LOCAL_SIZE": "2",
        "PALS_NODEID": "1",
        "PALS_APID": "12345-0",
    },
    # flux-core doc/man7/flux-environment.rst: no local size, no node index; PMI-1 variables besides.
    "flux": {
        "FLUX_TASK_RANK": "3",
        "FLUX_JOB_SIZE": "4",
        "FLUX_TASK_LOCAL_ID": "1",
        "FLUX_JOB_NNODES": "2",
        "FLUX_JOB_ID": "ƒ12345",
        "PMI_RANK": "3",
        "PMI_SIZE": "4",
        "PMI_FD": "5",
    },
    # Lightning's LSFEnvironment docstring; the rank file's first line is the launch node.
    "jsrun": {
        "JSM_NAMESPACE_RANK": "3",
        "JSM_NAMESPACE_SIZE": "4",
        "JSM_NAMESPACE_LOCAL_RANK": "1",
        "JSM_NAMESPACE_LOCAL_SIZE": "2",
        "LSB_DJOB_RANKFILE": f"{HOST_FILE}/LSB_DJOB_RANKFILE",
    },
}

SCHEDULER_VARIABLES = {
    "none": {"MASTER_ADDR": "node001"},
    "slurm": {"SLURM_JOB_ID": "12345", "SLURM_JOB_NODELIST": "node[001-002]"},
    "sge": {"SGE_JOB_HOSTLIST": HOST_FILE, "JOB_ID": "12345"},
    "pbs": {"PBS_NODEFILE": HOST_FILE, "PBS_JOBID": "12345.pbs"},
    "lsf": {"LSB_MCPU_HOSTS": "node001 2 node002 2", "LSB_JOBID": "12345"},
    # Flux lists no hosts: the batch script passes the first one.
    "flux": {"FLUX_ENCLOSING_ID": "ƒ12345", "MASTER_ADDR": "node001"},
}

HAND_BUILT_FILES = {
    HOST_FILE: "node001\nnode002\n",
    f"{HOST_FILE}/LSB_DJOB_RANKFILE": "batch1\nnode001\nnode001\nnode002\n",
}


def _read_hosts(path: str) -> str:
    return HAND_BUILT_FILES[path]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("launcher", LAUNCHER_KEYS)
def test_simulate_matches_hand_built_environment(launcher, scheduler):
    hand = {**SCHEDULER_VARIABLES[scheduler], **HAND_BUILT_RANK_3[launcher]}
    expected = from_env(hand, read_text=_read_hosts)
    result = simulate(launcher, nodes=2, ppn=2, scheduler=scheduler)
    row = result.ranks[3]
    assert row.layout == expected  # every field but the sources
    assert (expected.rank, expected.local_rank, expected.node_rank, expected.world_size) == (3, 1, 1, 4)
    assert expected.main_address == "node001"
    assert result.ok, result.problems
    # The simulated environment holds every hand-built variable with the same value.
    assert {name: row.env[name] for name in HAND_BUILT_RANK_3[launcher]} == HAND_BUILT_RANK_3[launcher]


@pytest.mark.parametrize("launcher", LAUNCHER_KEYS)
@pytest.mark.parametrize("map_by", ["slot", "node"])
def test_two_nodes_resolve_exactly_for_every_launcher(launcher, map_by):
    result = simulate(launcher, nodes=2, ppn=4, map_by=map_by)
    assert result.ok, result.problems
    assert result.warnings == ()
    assert [row.layout.rank for row in result.ranks] == list(range(8))
    assert sorted((row.layout.node_rank, row.layout.local_rank) for row in result.ranks) == [
        (node, local) for node in range(2) for local in range(4)
    ]
    if map_by == "node":
        assert [row.layout.node_rank for row in result.ranks] == [0, 1] * 4


def test_round_robin_slurm_sets_cyclic_distribution():
    row = simulate("slurm", nodes=3, ppn=2, map_by="node").ranks[4]
    assert row.env["SLURM_DISTRIBUTION"] == "cyclic"
    assert (row.env["SLURM_NODEID"], row.env["SLURM_LOCALID"], row.env["SLURM_STEP_TASKS_PER_NODE"]) == (
        "1",
        "1",
        "2(x3)",
    )
    assert row.layout.placement is Placement.LAUNCHER


def test_intelmpi_is_the_hydra_row():
    assert simulate("intelmpi", 2, 2).ranks[2].layout.launcher.key == "mpich"


@settings(deadline=None)  # no timing assertion: a loaded login node runs one example in seconds
@given(
    launcher=st.sampled_from(LAUNCHER_KEYS),
    nodes=st.integers(1, 6),
    ppn=st.integers(1, 6),
    scheduler=st.sampled_from(SCHEDULERS),
)
def test_full_block_placement_is_always_sound(launcher, nodes, ppn, scheduler):
    result = simulate(launcher, nodes, ppn, map_by="slot", scheduler=scheduler)
    assert result.ok, result.problems
    assert len({row.layout.rank for row in result.ranks}) == nodes * ppn
    assert {row.layout.main_port for row in result.ranks} == {result.ranks[0].layout.main_port}


@settings(deadline=None)
@given(launcher=st.sampled_from(["slurm", "pals"]), nodes=st.integers(1, 5), ppn=st.integers(1, 5), data=st.data())
def test_launchers_exporting_the_node_id_resolve_any_placement(launcher, nodes, ppn, data):
    np = data.draw(st.integers(1, nodes * ppn))
    map_by = data.draw(st.sampled_from(list(MapBy)))
    result = simulate(launcher, nodes, ppn, np=np, map_by=map_by)
    # The resolved ranks always match where the launcher put them; only uneven nodes can be a problem.
    assert all("resolved to" not in problem and "more than one" not in problem for problem in result.problems)
    assert all("different numbers of ranks" in problem for problem in result.problems)


def test_uneven_nodes_are_fine_for_ddp_mpi():
    result = simulate("slurm", nodes=2, ppn=4, np=6)
    assert result.ok, result.problems
    assert (result.strategy, result.is_even, result.ranks_per_node) == ("ddp_mpi", False, {"node001": 4, "node002": 2})
    require_ok(result)  # nothing to raise


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
def test_uneven_nodes_are_a_problem_for_lightning_s_own_strategies(strategy):
    result = simulate("slurm", nodes=2, ppn=4, np=6, strategy=strategy)
    # Under srun, the strategy object, in the problem as in the hint below.
    assert result.problems == (
        "nodes run different numbers of ranks (node001: 4, node002: 2); Lightning's own strategy "
        f'"{strategy}" needs the same on every node: use Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) '
        "(the object, not the name: by name Lightning makes its own SLURMEnvironment first, and that refuses a step "
        "of srun --ntasks without --ntasks-per-node), which trains it.",
    )
    # Under mpirun, the name: Lightning makes no SLURMEnvironment there.
    assert simulate("openmpi", nodes=2, ppn=4, np=6, strategy=strategy).problems == (
        "nodes run different numbers of ranks (node001: 4, node002: 2); Lightning's own strategy "
        f'"{strategy}" needs the same on every node: use Trainer(strategy="ddp_mpi"), which trains it.',
    )
    # The hint fits the launch: 6 ranks on the 2 nodes it used, never `-np 1`.
    with pytest.raises(LayoutError, match=r"has problems: nodes run different numbers of ranks") as raised:
        require_ok(result)
    # Under srun, the strategy object: by name, Lightning's SLURMEnvironment refuses the uneven step before it.
    assert raised.value.hint.startswith(
        "Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) (the object, not the name"
    )
    assert raised.value.hint.endswith(
        "Or launch the same number on each of the 2 node(s): `mpirun -np 6 --map-by ppr:3:node` (Open MPI) or "
        "`srun -N 2 --ntasks-per-node=3`."
    )


def test_simulate_rejects_an_unknown_strategy():
    with pytest.raises(ValueError, match=r"strategy='ddp_spawn' is not one of ddp_mpi, ddp, fsdp, deepspeed"):
        simulate("slurm", 2, 2, strategy="ddp_spawn")


@pytest.mark.parametrize(
    ("nodes", "ppn", "np", "map_by", "wrong"),
    [
        # The issue's launches: host files of 3+1 slots (--map-by slot) and 2+1+1 (--map-by node).
        (2, 3, 4, "slot", {3: (3, 1)}),
        (3, 2, 4, "node", {3: (1, 0)}),
        (2, 4, 6, "slot", {4: (2, 1), 5: (2, 1)}),
    ],
)
def test_uneven_open_mpi_node_ranks_are_assumed_and_only_warned_about(nodes, ppn, np, map_by, wrong):
    # Open MPI exports no node index (OMPI_COMM_WORLD_LOCAL_SIZE is this node's count only): from one rank an uneven
    # launch looks like an even one, and the node rank divided out is a guess that the roll call replaces.
    result = simulate("openmpi", nodes=nodes, ppn=ppn, np=np, map_by=map_by)
    assert result.ok, result.problems
    for rank, (assumed, launched) in wrong.items():
        host = result.ranks[rank].host
        assert any(
            warning.startswith(f"rank {rank} on {host}: node rank {assumed} (launched on node {launched}) is assumed")
            for warning in result.warnings
        ), result.warnings
    assert not result.is_even
    assert all(not row.layout.node_rank_is_exact for row in result.ranks if row.layout.local_size < np)


def test_check_table_finds_duplicates():
    rows = list(simulate("slurm", 2, 2).ranks)
    rows[1] = replace(rows[1], layout=rows[0].layout)
    problems = check_table(rows)
    assert "global rank(s) [0] resolved on more than one process." in problems
    assert "2 processes resolved to node 0, local rank 0." in problems


def test_check_table_finds_a_wrong_node_rank_the_launcher_exports():
    # SLURM_NODEID is the launcher's own: wrong, it is a problem, not a guess for the roll call to fix.
    rows = list(simulate("slurm", 2, 2).ranks)
    rows[2] = replace(rows[2], layout=rows[2].layout._replace(node_rank=0))
    assert "rank 2 on node002 resolved to node rank 0 (launched on node 1)." in check_table(rows)


def test_check_table_leaves_duplicates_of_assumed_node_ranks_to_the_roll_call():
    # Open MPI's node ranks are assumed: a repeated (node, local rank) pair is a guess gone wrong, not a problem.
    rows = list(simulate("openmpi", 2, 2).ranks)
    rows[1] = replace(rows[1], layout=rows[0].layout)
    problems = check_table(rows)
    assert "global rank(s) [0] resolved on more than one process." in problems
    assert not any("processes resolved to node" in problem for problem in problems)


def test_refused_environment_is_a_problem(monkeypatch):
    # A job script that exports MASTER_PORT=0 breaks every rank.
    import lightning_mpi_env.tools.simulated_launch as module

    original = module._scheduler_environment
    monkeypatch.setattr(
        module, "_scheduler_environment", lambda *args: ({**original(*args)[0], "MASTER_PORT": "0"}, original(*args)[1])
    )
    result = simulate("mpich", 1, 2)
    assert not result.ok
    assert result.ranks[0].layout is None
    assert "MASTER_PORT='0' is not a port number" in result.problems[0]
    assert result.ranks[0].as_dict()["error"].startswith("MASTER_PORT='0'")


def test_main_port_is_derived_from_the_job():
    assert simulate("slurm", 2, 2).ranks[0].layout.main_port == derive_port("12345/0")
    assert simulate("mpich", 2, 2, scheduler="pbs").ranks[0].layout.main_port == derive_port("12345.pbs")


def test_as_dict_has_the_documented_keys():
    row = simulate("openmpi", 2, 2).ranks[2].as_dict()
    assert {"global_rank", "node_rank", "local_rank", "world_size"} <= row.keys()
    assert (row["global_rank"], row["node_rank"], row["local_rank"], row["world_size"]) == (2, 1, 0, 4)


def test_map_by_rejects_unknown_value():
    with pytest.raises(ValueError, match="'board' is not a valid MapBy"):
        simulate("openmpi", 1, 1, map_by="board")
