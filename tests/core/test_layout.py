from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import ApproximateNodeRankWarning, LayoutError
from lightning_mpi_env.core.launchers import FLUX, HYDRA, LAUNCHERS, OPEN_MPI, PMIX, SRUN, TORCHRUN, Launcher
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.placement import Placement
from lightning_mpi_env.core.ports import DEFAULT_MAIN_PORT, DERIVED_PORT_RANGE, derive_port
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, MAX_WORLD_SIZE
from tests.layouts import launcher_env, placed

ADDRESS = {"MASTER_ADDR": "nodea", "MASTER_PORT": "29611"}


def resolve_all(launcher: Launcher, nodes: int, per_node: int, placement: str, **extra: str) -> list:
    layouts = []
    for rank, local_rank, node in placed(nodes, per_node, placement):
        env = launcher_env(
            launcher,
            rank=rank,
            world_size=nodes * per_node,
            local_rank=local_rank,
            local_size=per_node,
            node=node,
            num_nodes=nodes,
        )
        layouts.append((node, from_env({**env, **ADDRESS, **extra})))
    return layouts


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda launcher: launcher.key)
@pytest.mark.parametrize("placement", ["block", "round-robin"])
@pytest.mark.parametrize(("nodes", "per_node"), [(2, 2), (2, 4), (1, 8), (8, 1)])
def test_every_launcher_resolves_two_node_layouts_exactly(launcher, placement, nodes, per_node):
    layouts = resolve_all(launcher, nodes, per_node, placement)
    assert sorted(layout.rank for _, layout in layouts) == list(range(nodes * per_node))
    for expected_node, layout in layouts:
        assert layout.node_rank == expected_node, layout
        # Exact only where the launcher exports the node index or every rank is on one node; else assumed, and right.
        assert layout.node_rank_is_exact == (launcher.node_rank is not None or nodes == 1)
        assert layout.num_nodes == nodes
        assert layout.world_size == nodes * per_node
        assert layout.local_size == per_node
        assert layout.launcher is launcher
        assert not layout.warnings
    assert len({(layout.node_rank, layout.local_rank) for _, layout in layouts}) == nodes * per_node


def test_round_robin_on_two_nodes_is_recognised_not_guessed():
    layouts = resolve_all(OPEN_MPI, 2, 4, "round-robin")
    # rank 1 runs on node 1 under --map-by node; the usual hand fix rank // local_size would say node 0
    rank1 = next(layout for _, layout in layouts if layout.rank == 1)
    assert (rank1.node_rank, rank1.local_rank, rank1.placement) == (1, 0, Placement.ROUND_ROBIN)
    assert rank1.sources["node_rank"] == "OMPI_COMM_WORLD_RANK % num_nodes (assumed round-robin placement)"
    assert not rank1.node_rank_is_exact


def test_ambiguous_placement_is_approximate_and_says_so():
    # 3 nodes x 2: rank 2 with local rank 0 is node 1 under block placement and node 2 under round-robin.
    env = launcher_env(OPEN_MPI, rank=2, world_size=6, local_rank=0, local_size=2, node=2, num_nodes=3)
    layout = from_env({**env, **ADDRESS})
    assert layout.placement is Placement.UNKNOWN
    assert not layout.node_rank_is_exact
    assert "node=1~/3~" in repr(layout)
    (warning,) = layout.warnings
    assert isinstance(warning, ApproximateNodeRankWarning)
    assert "approximate" in str(warning)
    assert "OMPI_COMM_WORLD_RANK=2" in str(warning)
    assert "ddp_mpi" in str(warning)


def test_rankfile_placement_fitting_neither_rule_is_approximate():
    # 3 nodes x 2: block placement gives rank 2 local rank 0, round-robin gives 0 too; a rankfile gave it 1.
    env = launcher_env(OPEN_MPI, rank=2, world_size=6, local_rank=1, local_size=2, node=2, num_nodes=3)
    layout = from_env({**env, **ADDRESS})
    assert layout.placement is Placement.UNKNOWN
    assert "fits neither" in str(layout.warnings[0])


def test_repr_is_informative():
    env = launcher_env(OPEN_MPI, rank=5, world_size=8, local_rank=1, local_size=4, node=1, num_nodes=2)
    assert repr(from_env({**env, **ADDRESS})) == (
        "RankLayout(rank=5/8, local=1/4, node=1~/2~, main=nodea:29611, from=Open MPI)"
    )


def test_sources_name_the_variables():
    env = launcher_env(HYDRA, rank=3, world_size=4, local_rank=1, local_size=2, node=1, num_nodes=2)
    layout = from_env({**env, **ADDRESS})
    assert layout.sources["rank"] == "PMI_RANK"
    assert layout.sources["world_size"] == "PMI_SIZE"
    assert layout.sources["local_rank"] == "MPI_LOCALRANKID"
    assert layout.sources["local_size"] == "MPI_LOCALNRANKS"
    assert layout.sources["main_address"] == "MASTER_ADDR"
    assert layout.sources["main_port"] == "MASTER_PORT"


# --- precedence ------------------------------------------------------------------------------------------------

SBATCH_INHERITED = {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "8",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def test_mpirun_inside_sbatch_uses_open_mpi_not_the_inherited_slurm_rank():
    env = launcher_env(OPEN_MPI, rank=5, world_size=8, local_rank=1, local_size=4, node=1, num_nodes=2)
    layout = from_env({**SBATCH_INHERITED, **env})
    assert (layout.rank, layout.node_rank, layout.launcher) == (5, 1, OPEN_MPI)
    assert layout.main_address == "gpu07"
    assert layout.sources["main_address"] == "SLURM_JOB_NODELIST (first host)"


def test_mpirun_inside_an_srun_step_still_uses_open_mpi():
    step = {**SBATCH_INHERITED, "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS": "2"}
    env = launcher_env(OPEN_MPI, rank=6, world_size=8, local_rank=2, local_size=4, node=1, num_nodes=2)
    assert from_env({**step, **env}).rank == 6


def test_a_batch_script_alone_is_not_a_launch():
    layout = from_env(SBATCH_INHERITED)
    assert layout.launcher is None
    assert (layout.world_size, layout.rank, layout.placement) == (1, 0, Placement.SINGLE)


def test_srun_with_pmi2_uses_slurm_because_hydra_s_own_variable_is_absent():
    env = launcher_env(SRUN, rank=3, world_size=4, local_rank=1, local_size=2, node=1, num_nodes=2)
    layout = from_env({**env, "PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_STEP_NODELIST": "n[1-2]"})
    assert layout.launcher is SRUN
    assert (layout.rank, layout.node_rank, layout.main_address) == (3, 1, "n1")


def test_open_mpi_wins_over_its_own_pmix_variables():
    env = launcher_env(OPEN_MPI, rank=1, world_size=2, local_rank=1, local_size=2, node=0, num_nodes=1)
    assert from_env({**env, "PMIX_RANK": "1"}).launcher is OPEN_MPI


def test_an_open_mpi_rank_overridden_after_the_launch_is_named_against_pmix_rank():
    # Open MPI 5's mpirun sets both to the world rank (seen with `mpirun -np 3 sh -c 'echo $OMPI_COMM_WORLD_RANK
    # $PMIX_RANK'`); a wrapper that exports one rank to every process changes the first only.
    env = launcher_env(OPEN_MPI, rank=1, world_size=4, local_rank=0, local_size=2, node=0, num_nodes=2)
    with pytest.raises(
        LayoutError, match=r"OMPI_COMM_WORLD_RANK=1 but PMIX_RANK='0', which Open MPI sets to the same"
    ) as raised:
        from_env({**env, "PMIX_RANK": "0", **ADDRESS})
    assert (raised.value.variable, raised.value.value, raised.value.launcher) == (
        "OMPI_COMM_WORLD_RANK",
        "1",
        "Open MPI",
    )
    assert (
        "nothing serves the roll call. Do not set OMPI_COMM_WORLD_RANK (or PMIX_RANK) in a wrapper" in raised.value.hint
    )
    assert from_env({**env, "PMIX_RANK": "1", **ADDRESS}).rank == 1


def test_slurm_uneven_task_counts_give_exact_node_and_local_size():
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "8",
        "SLURM_NTASKS": "11",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2),3",
        "SLURM_STEP_NODELIST": "gpu[07-08,10]",
    }
    layout = from_env(env)
    assert (layout.node_rank, layout.local_size, layout.num_nodes) == (2, 3, 3)
    assert not layout.is_even
    assert layout.describe_world() == "11 ranks, 3 on this node"


def test_uneven_slurm_task_counts_are_uneven_even_where_the_product_happens_to_match():
    # 3 nodes x 2 on this node == 6 ranks, but the nodes run 3, 1 and 2: no Trainer(devices=2, num_nodes=3) fits.
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "4",
        "SLURM_NTASKS": "6",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "3,1,2",
        **ADDRESS,
    }
    layout = from_env(env)
    assert (layout.local_size, layout.num_nodes, layout.ranks_per_node) == (2, 3, (3, 1, 2))
    assert not layout.is_even
    assert pickle.loads(pickle.dumps(layout)) == layout


@pytest.mark.parametrize(
    ("job", "step", "end_step"),
    [
        ("42", "3", ("scancel", "--signal=KILL", "42.3")),  # scancel(1): job_id[.step_id]
        ("--partition=evil", "0", ()),  # never an option on a command line
        ("٤٢", "0", ()),  # ASCII digits only
    ],
)
def test_the_step_that_ends_the_launch_is_read_with_the_layout(job, step, end_step):
    # Read once with the launch and carried by the layout (the watchdog reads no environment); pickled with it.
    env = {
        "SLURM_STEP_ID": step,
        "SLURM_JOB_ID": job,
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "MASTER_PORT": "29500",
        **ADDRESS,
    }
    layout = from_env(env)
    assert layout.end_step == end_step
    assert pickle.loads(pickle.dumps(layout)).end_step == end_step
    assert (
        from_env(
            {**env, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
            | {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
        ).end_step
        == ()
    )  # mpirun ends its job


def test_pmix_alone_reads_sizes_from_torch_names():
    env = {"PMIX_RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", **ADDRESS}
    layout = from_env(env)
    assert (layout.launcher, layout.rank, layout.node_rank) == (PMIX, 3, 1)


# --- bad input -------------------------------------------------------------------------------------------------


def open_mpi(**overrides: str | None) -> dict[str, str]:
    env = {**launcher_env(OPEN_MPI, rank=5, world_size=8, local_rank=1, local_size=4, node=1, num_nodes=2), **ADDRESS}
    for name, value in overrides.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    return env


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (open_mpi(OMPI_COMM_WORLD_RANK="five"), r"OMPI_COMM_WORLD_RANK='five' \(Open MPI\) is not a non-negative"),
        (open_mpi(OMPI_COMM_WORLD_RANK="٥"), r"OMPI_COMM_WORLD_RANK='٥' \(Open MPI\) is not"),
        (open_mpi(OMPI_COMM_WORLD_RANK="5_0"), r"OMPI_COMM_WORLD_RANK='5_0'"),
        (open_mpi(OMPI_COMM_WORLD_RANK=""), r"OMPI_COMM_WORLD_RANK='' \(Open MPI\)"),
        (open_mpi(OMPI_COMM_WORLD_LOCAL_RANK="-1"), r"OMPI_COMM_WORLD_LOCAL_RANK='-1' \(Open MPI\) is negative"),
        (open_mpi(OMPI_COMM_WORLD_SIZE="0"), r"OMPI_COMM_WORLD_SIZE='0' \(Open MPI\) must be at least 1"),
        (open_mpi(OMPI_COMM_WORLD_RANK="8"), r"OMPI_COMM_WORLD_RANK=8 is out of range.*OMPI_COMM_WORLD_SIZE=8"),
        (open_mpi(OMPI_COMM_WORLD_LOCAL_RANK="4"), r"OMPI_COMM_WORLD_LOCAL_RANK=4 is out of range"),
        (open_mpi(OMPI_COMM_WORLD_LOCAL_SIZE="16"), r"OMPI_COMM_WORLD_LOCAL_SIZE=16 ranks on this node is more"),
        (open_mpi(OMPI_COMM_WORLD_SIZE=None), r"Open MPI variables are only partly set.*OMPI_COMM_WORLD_SIZE"),
        (open_mpi(RANK="0"), r"RANK='0' disagrees with Open MPI, which says OMPI_COMM_WORLD_RANK=5"),
        (open_mpi(WORLD_SIZE="4"), r"WORLD_SIZE='4' disagrees with Open MPI"),
        (open_mpi(LOCAL_RANK="x"), r"LOCAL_RANK='x' disagrees with Open MPI"),
        (open_mpi(MASTER_PORT="70000"), r"MASTER_PORT='70000' is not a port number.*Open MPI"),
        (open_mpi(MASTER_PORT="http"), r"MASTER_PORT='http'"),
        (open_mpi(MASTER_ADDR=None), r"Open MPI started 8 ranks on 2 nodes.*MASTER_ADDR is not set"),
        (open_mpi(MASTER_ADDR=None, SLURM_JOB_NODELIST="gpu[07-"), r"SLURM_JOB_NODELIST='gpu\[07-' is not a valid"),
        (open_mpi(MASTER_ADDR=None, SLURM_JOB_NODELIST="gpu[08-07]"), r"the range '08-07' runs backwards"),
        (open_mpi(MASTER_ADDR=None, LSB_MCPU_HOSTS="hostA four"), r"LSB_MCPU_HOSTS='hostA four' \(LSF\)"),
        (
            {
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "5",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                **ADDRESS,
            },
            r"SLURM_STEP_TASKS_PER_NODE='2\(x2\)' adds up to 4 tasks but SLURM_NTASKS=5",
        ),
        (
            {
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "2",
                "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                **ADDRESS,
            },
            r"SLURM_NODEID=2 but SLURM_STEP_TASKS_PER_NODE='2\(x2\)' lists only 2 node",
        ),
        (
            {
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "two",
                **ADDRESS,
            },
            r"SLURM_STEP_TASKS_PER_NODE='two' \(Slurm srun\) is not a list of task counts",
        ),
        (
            {
                "PALS_RANKID": "1",
                "PMI_SIZE": "4",
                "PALS_LOCAL_RANKID": "1",
                "PMI_LOCAL_SIZE": "2",
                "PALS_NODEID": "5",
                **ADDRESS,
            },
            r"Cray PALS: PALS_NODEID=5 with PMI_LOCAL_SIZE=2 ranks on this node needs at least 7 ranks, but PMI_SIZE=4",
        ),
        ({"PMIX_RANK": "2", **ADDRESS}, r"PMIx variables are only partly set: PMIX_RANK='2' is set, but WORLD_SIZE"),
    ],
)
def test_bad_input_is_one_clear_error(env, match):
    with pytest.raises(LayoutError, match=match) as raised:
        from_env(env)
    assert "\nHINT: " in str(raised.value)


def test_missing_address_hint_says_how_to_pass_it():
    with pytest.raises(LayoutError, match=r"HINT: export MASTER_ADDR=.*mpirun -x MASTER_ADDR"):
        from_env(open_mpi(MASTER_ADDR=None))


def test_unreadable_host_file_names_variable_path_and_scheduler(tmp_path: Path):
    missing = tmp_path / "nope"
    with pytest.raises(LayoutError, match=rf"SGE_JOB_HOSTLIST='{missing}' \(SGE\) names a host file that cannot be"):
        from_env(open_mpi(MASTER_ADDR=None, SGE_JOB_HOSTLIST=str(missing)))


def test_empty_host_file_is_an_error(tmp_path: Path):
    empty = tmp_path / "nodes"
    empty.write_text("\n# nothing\n")
    with pytest.raises(LayoutError, match=r"PBS_NODEFILE=.*\(PBS\) names an empty host file"):
        from_env(open_mpi(MASTER_ADDR=None, PBS_NODEFILE=str(empty)))


def test_agreeing_torch_variables_are_accepted():
    env = open_mpi(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    assert from_env(env).rank == 5


# --- main address and port -------------------------------------------------------------------------------------


def test_main_address_prefers_master_addr_over_host_lists(tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text("g0001\ng0002\n")
    assert from_env(open_mpi(SGE_JOB_HOSTLIST=str(hosts))).main_address == "nodea"
    layout = from_env(open_mpi(MASTER_ADDR=None, SGE_JOB_HOSTLIST=str(hosts)))
    assert (layout.main_address, layout.sources["main_address"]) == ("g0001", "SGE_JOB_HOSTLIST (first host)")


@pytest.mark.parametrize(
    ("variable", "content", "expected"),
    [
        ("PBS_NODEFILE", "cn01\ncn01\ncn02\ncn02\n", "cn01"),
        ("LSB_DJOB_HOSTFILE", "batch3\nbatch3\nbatch4\n", "batch3"),
    ],
)
def test_main_address_from_scheduler_host_files(tmp_path: Path, variable, content, expected):
    path = tmp_path / "hostfile"
    path.write_text(content)
    assert from_env(open_mpi(MASTER_ADDR=None, **{variable: str(path)})).main_address == expected


def test_main_address_from_lsf_pairs_and_slurm_lists():
    assert from_env(open_mpi(MASTER_ADDR=None, LSB_MCPU_HOSTS="hostA 4 hostB 4")).main_address == "hostA"
    assert from_env(open_mpi(MASTER_ADDR=None, SLURM_JOB_NODELIST="gpu[007-008]")).main_address == "gpu007"


def test_single_node_uses_loopback_without_any_host_list():
    env = launcher_env(OPEN_MPI, rank=1, world_size=4, local_rank=1, local_size=4, node=0, num_nodes=1)
    layout = from_env(env)
    assert (layout.main_address, layout.sources["main_address"]) == ("127.0.0.1", "single node: loopback")


def test_main_port_derived_from_job_identity_is_the_same_on_every_rank():
    ports = {
        from_env(open_mpi(MASTER_PORT=None, OMPI_COMM_WORLD_RANK=str(rank), PMIX_NAMESPACE="prterun-a-1@1")).main_port
        for rank in range(8)
        if rank % 4 == 1
    }
    assert len(ports) == 1
    assert ports.pop() in DERIVED_PORT_RANGE


def test_main_port_prefers_the_most_specific_job_identity():
    layout = from_env(open_mpi(MASTER_PORT=None, PMIX_NAMESPACE="ns@1", JOB_ID="77"))
    assert (layout.main_port, layout.sources["main_port"]) == (derive_port("ns@1"), "derived from PMIX_NAMESPACE")
    # Under mpirun inside a Slurm job, ranks on different nodes inherit different steps (the batch script's has no
    # SLURM_STEP_ID, the second node's is its daemon's): the job id alone is the same on all of them.
    slurm = from_env(open_mpi(MASTER_PORT=None, SLURM_JOB_ID="77", SLURM_STEP_ID="3"))
    assert slurm.main_port == derive_port("77")
    assert slurm.sources["main_port"] == "derived from SLURM_JOB_ID"


def test_main_port_default_without_identity():
    layout = from_env(open_mpi(MASTER_PORT=None))
    assert (layout.main_port, layout.sources["main_port"]) == (DEFAULT_MAIN_PORT, "default")


def test_neighbouring_job_ids_get_different_ports():
    assert len({derive_port(str(job)) for job in range(1000, 1010)}) == 10


def test_from_env_does_not_touch_the_mapping_it_reads():
    env = open_mpi()
    before = dict(env)
    from_env(env)
    assert env == before


# --- properties ------------------------------------------------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A placement and the number of ranks on each node."""
    nodes = draw(st.integers(1, 1024))
    kind = draw(st.sampled_from(["block", "round-robin", "uneven"]))
    if kind == "uneven":
        counts = draw(st.lists(st.integers(1, 16), min_size=nodes, max_size=nodes))
    else:
        counts = [draw(st.integers(1, 16))] * nodes
    return kind, counts


def processes(kind: str, counts: list[int]) -> list[tuple[int, int, int]]:
    """``(rank, local_rank, node)`` for every process."""
    if kind == "round-robin":
        return placed(len(counts), counts[0], "round-robin")
    result, rank = [], 0
    for node, count in enumerate(counts):
        result += [(rank + local, local, node) for local in range(count)]
        rank += count
    return result


@settings(max_examples=25, deadline=None)
@given(
    layouts(),
    st.sampled_from([launcher for launcher in LAUNCHERS if launcher.node_rank is None and launcher.local_size]),
)
def test_property_ranks_unique_and_exact_node_pairs_unique(layout, launcher):
    kind, counts = layout
    world = sum(counts)
    seen_ranks, exact_pairs, worlds_seen = set(), set(), set()
    for rank, local_rank, node in processes(kind, counts):
        env = launcher_env(
            launcher,
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_size=counts[node],
            node=node,
            num_nodes=len(counts),
        )
        resolved = from_env({**env, **ADDRESS})
        assert resolved.rank not in seen_ranks
        seen_ranks.add(resolved.rank)
        assert resolved.local_rank == local_rank
        worlds_seen.add((resolved.is_even, resolved.local_size, resolved.num_nodes))
        if kind == "uneven":
            continue
        if resolved.node_rank_is_exact:
            assert resolved.node_rank == node
            exact_pairs.add((resolved.node_rank, resolved.local_rank))
        elif resolved.placement is Placement.UNKNOWN:
            assert resolved.warnings
    assert seen_ranks == set(range(world))
    if kind == "uneven" and len(set(counts)) > 1:
        # One process cannot see that other nodes run a different number of ranks (with 1, 1, 2 ranks the last
        # node looks like half of an even 2 x 2 job). What holds is job-wide: processes disagree on the world, so
        # no Trainer(devices, num_nodes) passes validate_settings on every rank and the job is refused.
        assert len(worlds_seen) > 1 or not all(is_even for is_even, _, _ in worlds_seen)
    else:
        assert len(worlds_seen) == 1


@settings(max_examples=25, deadline=None)
@given(layouts(), st.data())
def test_property_slurm_node_ranks_are_always_exact(layout, data):
    kind, counts = layout
    world = sum(counts)
    env_counts = ",".join(str(count) for count in counts)
    rank, local_rank, node = data.draw(st.sampled_from(processes("block", counts)))
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(world),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": env_counts,
        **ADDRESS,
    }
    resolved = from_env(env)
    assert (resolved.rank, resolved.node_rank, resolved.local_size) == (rank, node, counts[node])


BREAKAGES = st.sampled_from(["text", "negative", "rank_too_big", "local_too_big", "missing", "size_zero"])


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([launcher for launcher in LAUNCHERS if launcher is not SRUN]),
    st.integers(1, 64),
    st.integers(1, 16),
    st.data(),
    BREAKAGES,
)
def test_property_every_invalid_layout_raises_layout_error(launcher, nodes, per_node, data, breakage):
    rank = data.draw(st.integers(0, nodes * per_node - 1))
    env = launcher_env(
        launcher,
        rank=rank,
        world_size=nodes * per_node,
        local_rank=rank % per_node,
        local_size=per_node,
        node=rank // per_node,
        num_nodes=nodes,
    )
    env.update(ADDRESS)
    target = data.draw(st.sampled_from([launcher.rank, launcher.world_size, launcher.local_rank]))
    if breakage == "text":
        env[target] = data.draw(st.text().filter(lambda text: not (text.strip().isascii() and text.strip().isdigit())))
    elif breakage == "negative":
        env[target] = str(-data.draw(st.integers(1, 10**6)))
    elif breakage == "rank_too_big":
        env[launcher.rank] = str(nodes * per_node + data.draw(st.integers(0, 100)))
    elif breakage == "local_too_big":
        env[launcher.local_rank] = str(per_node + data.draw(st.integers(0, 100)))
    elif breakage == "missing":
        env.pop(data.draw(st.sampled_from([name for name in launcher.variables if name != launcher.marker])))
    else:
        env[launcher.world_size] = "0"
    with pytest.raises(LayoutError, match="HINT: "):
        from_env(env)


@settings(max_examples=25, deadline=None)
@given(layouts())
def test_property_flux_resolves_even_jobs_exactly_and_refuses_uneven_ones(layout):
    # Flux exports the node count but not the ranks per node: an even job is exact, an uneven one is refused (by
    # every rank when the count does not divide, by the ranks that fall outside the derived size otherwise).
    kind, counts = layout
    world, even = sum(counts), len(set(counts)) == 1
    refusals: list[LayoutError] = []
    for rank, local_rank, node in processes(kind, counts):
        env = {**launcher_env(FLUX, rank=rank, world_size=world, local_rank=local_rank, local_size=counts[node],
                              node=node, num_nodes=len(counts)), **ADDRESS}  # fmt: skip
        if not even:
            try:
                from_env(env)
            except LayoutError as error:
                refusals.append(error)
            continue
        resolved = from_env(env)
        assert (resolved.rank, resolved.local_rank, resolved.local_size) == (rank, local_rank, counts[0])
        if resolved.node_rank_is_exact:
            assert resolved.node_rank == node
    assert even or refusals
    assert all(error.launcher == "Flux" for error in refusals)


# --- torchrun ----------------------------------------------------------------------------------------------------
# https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables: what torchrun exports to each worker.

TORCHRUN_WORKER = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "ROLE_RANK": "3",
    "ROLE_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "MASTER_ADDR": "g0001",
    "MASTER_PORT": "29400",
}


def test_torchrun_is_a_launcher_with_an_exact_node_rank():
    layout = from_env(TORCHRUN_WORKER)
    assert layout.launcher is TORCHRUN
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_size) == (3, 4, 1, 2)
    assert (layout.node_rank, layout.node_rank_is_exact, layout.placement) == (1, True, Placement.LAUNCHER)
    assert (layout.main_address, layout.main_port) == ("g0001", 29400)
    assert layout.sources["node_rank"] == "GROUP_RANK"


def test_torchrun_inside_mpirun_wins_over_the_agent_s_mpi_variables():
    # mpirun -npernode 1 torchrun --nproc-per-node 2 ...: the worker inherits its agent's OMPI rank (the node).
    agent = launcher_env(OPEN_MPI, rank=1, world_size=2, local_rank=0, local_size=1, node=1, num_nodes=2)
    assert from_env({**agent, **TORCHRUN_WORKER}).launcher is TORCHRUN
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    assert from_env({**step, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", **TORCHRUN_WORKER}).rank == 3


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "3", "WORLD_SIZE": "4"},
        {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"},
        {"RANK": "x"},
    ],
)
def test_torch_variables_without_torchrun_are_refused_not_rank_0_of_1(env):
    with pytest.raises(LayoutError, match=r"as torchrun sets them, but TORCHELASTIC_RUN_ID is not") as raised:
        from_env(env)
    assert "HINT: Start the workers with `torchrun`" in str(raised.value)
    assert raised.value.launcher == TORCHRUN.name


def test_torch_variables_of_a_single_process_are_accepted():
    assert from_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}).world_size == 1
    # Lightning's own workers set LOCAL_RANK and WORLD_SIZE, never RANK: not refused here.
    assert from_env({"LOCAL_RANK": "1", "WORLD_SIZE": "2", "NODE_RANK": "0"}).launcher is None


# --- hostile values ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_thousands_of_digits_are_one_clear_error_with_the_value_cut(variable):
    with pytest.raises(LayoutError, match=rf"^{variable}='9{{40}}'\.\.\. \(5000 characters\) \(Open MPI\) has 5000 "):
        from_env(open_mpi(**{variable: "9" * 5000}))


def test_a_stale_torch_variable_with_thousands_of_digits_is_one_clear_error():
    with pytest.raises(LayoutError, match=r"^RANK='1{40}'\.\.\. \(5000 characters\) disagrees with Open MPI") as raised:
        from_env(open_mpi(RANK="1" * 5000))
    assert raised.value.value == "1" * 40


# --- Slurm and Flux with their Cray PALS plugins ----------------------------------------------------------------------

CRAY_SHASTA_STEP = {
    # srun --mpi=cray_shasta -N2 -n4, job on x[1000-1003], step on x[1002-1003]. The plugin's own variables:
    # https://github.com/SchedMD/slurm/blob/master/src/plugins/mpi/cray_shasta/mpi_cray_shasta.c
    # (PALS_APID, PALS_APINFO, PALS_RANKID, PALS_NODEID, PALS_SPOOL_DIR, PMI_CONTROL_PORT; newer Slurm also
    # PALS_LOCAL_RANKID, PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK, PMI_LOCAL_SIZE, PMI_JOBID).
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "2",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "x[1000-1003]",
    "SLURM_STEP_NODELIST": "x[1002-1003]",
    "PALS_APID": "77.2",
    "PALS_APINFO": "/var/spool/slurmd/mpi_cray_shasta/77.2/apinfo",
    "PALS_RANKID": "3",
    "PALS_NODEID": "1",
    "PALS_SPOOL_DIR": "/var/spool/slurmd/mpi_cray_shasta/77.2",
    "PMI_CONTROL_PORT": "11000",
}


@pytest.mark.parametrize(
    "newer_slurm",
    [{}, {"PALS_LOCAL_RANKID": "1", "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_SIZE": "2", "PMI_JOBID": "77.2"}],
    ids=["slurm-22", "slurm-24"],
)
def test_srun_cray_shasta_is_slurm_with_the_step_s_first_host(newer_slurm):
    layout = from_env({**CRAY_SHASTA_STEP, **newer_slurm})
    assert layout.launcher is SRUN
    assert (layout.rank, layout.node_rank, layout.local_size, layout.num_nodes) == (3, 1, 2, 2)
    assert (layout.main_address, layout.sources["main_address"]) == ("x1002", "SLURM_STEP_NODELIST (first host)")
    assert layout.sources["main_port"] == "derived from SLURM_JOB_ID+SLURM_STEP_ID"


def test_flux_with_the_cray_pals_shell_plugin_is_flux():
    # flux run -N2 -n4 -o pmi=cray-pals,simple: flux-coral2's cray_pals plugin sets PALS_APID, PALS_APINFO,
    # PALS_RANKID, PALS_NODEID, PALS_SPOOL_DIR only
    # (https://github.com/flux-framework/flux-coral2/blob/main/src/shell/plugins/cray_pals.c); Flux's own are whole.
    env = {
        **launcher_env(FLUX, rank=3, world_size=4, local_rank=1, local_size=2, node=1, num_nodes=2),
        "FLUX_JOB_ID": "ƒ2n7Sd1Ky",
        "PALS_APID": "123456789",
        "PALS_APINFO": "/tmp/flux-x/jobtmp-0-ƒ2n7Sd1Ky/libpals_apinfo",
        "PALS_RANKID": "3",
        "PALS_NODEID": "1",
        "PALS_SPOOL_DIR": "/tmp/flux-x/jobtmp-0-ƒ2n7Sd1Ky",
        **ADDRESS,
    }
    layout = from_env(env)
    assert layout.launcher is FLUX
    assert (layout.rank, layout.local_rank, layout.local_size) == (3, 1, 2)


def test_cray_mpiexec_under_pbs_is_still_pals():
    env = {"PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PMI_SIZE": "8", "PMI_LOCAL_SIZE": "4"}
    layout = from_env({**env, "PBS_JOBID": "12.pbs", **ADDRESS})
    assert (layout.launcher.key, layout.node_rank) == ("pals", 1)


def test_an_ensemble_member_on_one_node_meets_on_its_own_node(tmp_path: Path):
    # One PBS job, several one-node `mpiexec -n 4 --ppn 4` runs (an ensemble): every rank of this launch is on this
    # node, so the first line of $PBS_NODEFILE (another member's node) is not where they meet.
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1001\nx1002\nx1003\n")
    env = launcher_env(OPEN_MPI, rank=2, world_size=4, local_rank=2, local_size=4, node=0, num_nodes=1)
    layout = from_env({**env, "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "12.pbs"})
    assert (layout.main_address, layout.sources["main_address"]) == ("127.0.0.1", "single node: loopback")
    two_nodes = launcher_env(OPEN_MPI, rank=6, world_size=8, local_rank=2, local_size=4, node=1, num_nodes=2)
    assert from_env({**two_nodes, "PBS_NODEFILE": str(nodefile)}).main_address == "x1001"


def test_a_port_with_thousands_of_digits_is_one_clear_error():
    with pytest.raises(LayoutError, match=r"^MASTER_PORT='9{40}'\.\.\. \(5000 characters\) is not a port number"):
        from_env(open_mpi(MASTER_PORT="9" * 5000))


# --- sizes have sane maxima -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        ("OMPI_COMM_WORLD_SIZE", str(10**17), r"more than the 16777216 ranks of one job"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", str(10**17), r"more than the 16384 ranks on one node"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", str(MAX_LOCAL_SIZE + 1), r"more than the 16384 ranks on one node"),
    ],
)
def test_sizes_past_the_maxima_are_one_layout_error(variable, value, match):
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(MAX_WORLD_SIZE), "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_LOCAL_SIZE": str(MAX_LOCAL_SIZE), "MASTER_ADDR": "nodea", variable: value}
    with pytest.raises(LayoutError, match=rf"{variable}='{value}' \(Open MPI\) is {match}"):
        from_env(env)


def test_the_maxima_themselves_resolve():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(MAX_WORLD_SIZE), "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_LOCAL_SIZE": str(MAX_LOCAL_SIZE), "MASTER_ADDR": "nodea"}
    assert (from_env(env).world_size, from_env(env).local_size) == (MAX_WORLD_SIZE, MAX_LOCAL_SIZE)


def test_slurm_task_counts_past_the_node_maximum():
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "20000", "SLURM_LOCALID": "0"}
    env |= {"SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "20000", "SLURM_STEP_NODELIST": "a"}
    with pytest.raises(LayoutError, match=r"gives node 0 20000 tasks, more than the 16384 ranks on one node"):
        from_env(env)
