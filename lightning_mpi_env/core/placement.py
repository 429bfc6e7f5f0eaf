"""Which node a process runs on, and how many ranks each node runs: what one process can and cannot know.

Open MPI and the like export only *this* node's local size: under ``mpirun -n 6 --host a:4,b:4`` rank 4 looks like
the third node of an even 3 x 2 job, so a node index derived from it is assumed (the roll call makes it exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import NamedTuple

from lightning_mpi_env.core.errors import ApproximateNodeRankWarning, LayoutError
from lightning_mpi_env.core.hostlist import expand_tasks_per_node, nodelist_position
from lightning_mpi_env.core.launchers import Launcher
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, SHOWN_CHARACTERS, shown


class Placement(str, Enum):
    """How the node rank was found."""

    SINGLE = "single process"
    """No launcher: one process on one node."""
    LAUNCHER = "exported by the launcher"
    """The launcher exports the node index (``SLURM_NODEID``, ``PALS_NODEID``, ``GROUP_RANK``): exact."""
    BLOCK = "block placement"
    """Consecutive ranks fill a node before the next (``--map-by slot``): ``rank // local_size``, assumed."""
    ROUND_ROBIN = "round-robin placement"
    """Ranks dealt to nodes in turn (``--map-by node``): ``rank % num_nodes``, assumed like :attr:`BLOCK`."""
    UNKNOWN = "unknown placement"
    """Neither placement explains this process's local rank, or both do with different answers: approximate."""


DEALING: Mapping[Placement, tuple[str, str]] = {
    Placement.BLOCK: ("slot", "block"),
    Placement.ROUND_ROBIN: ("node", "cyclic"),
}
"""How a launch deals ranks to nodes, by placement: Open MPI's ``--map-by`` and Slurm's ``--distribution`` names."""

ASSUMED_EVEN = "assumed even"
"""Ends the source of a count divided out of the world size: it assumes every node runs as many ranks."""


class NodeGuess(NamedTuple):
    """The node index and node count one process derives without a node index from the launcher."""

    node_rank: int
    num_nodes: int | None
    """``world_size // local_size`` (assumed), or ``None`` where it does not divide (then surely uneven)."""
    placement: Placement
    sources: dict[str, str]
    """``node_rank`` and ``num_nodes``: the rule each came from."""
    warning: ApproximateNodeRankWarning | None
    """Set where no placement rule explains the local rank (a rankfile), or two do with different answers."""


def every_rank_here(world_size: int, local_size: int) -> bool:
    """Whether every rank of the launch runs on this node: the one case the node values are known from one process."""
    return local_size == world_size


def num_nodes_source(row: Launcher, local_size_source: str, world_size: int, local_size: int) -> str:
    """Where a node count divided out of the world size comes from, marked assumed unless every rank is here."""
    source = f"{row.world_size} / {local_size_source}"
    return source if every_rank_here(world_size, local_size) else f"{source} ({ASSUMED_EVEN})"


def guess_node(
    row: Launcher, rank: int, world_size: int, local_rank: int, local_size: int, local_size_source: str
) -> NodeGuess:
    """This process's node under block or round-robin placement, for a launcher that exports no node index."""
    num_nodes = world_size // local_size if world_size % local_size == 0 else None
    sources = {"num_nodes": num_nodes_source(row, local_size_source, world_size, local_size)}
    assumed = "" if every_rank_here(world_size, local_size) else "assumed "
    block = (rank % local_size == local_rank, rank // local_size)
    round_robin = (num_nodes is not None and rank // num_nodes == local_rank, rank % (num_nodes or 1))
    if block[0] and (not round_robin[0] or block[1] == round_robin[1]):
        sources["node_rank"] = f"{row.rank} // {local_size_source} ({assumed}block placement)"
        return NodeGuess(block[1], num_nodes, Placement.BLOCK, sources, None)
    if round_robin[0] and not block[0]:
        sources["node_rank"] = f"{row.rank} % num_nodes ({assumed}round-robin placement)"
        return NodeGuess(round_robin[1], num_nodes, Placement.ROUND_ROBIN, sources, None)
    sources["node_rank"] = f"{row.rank} // {local_size_source} (approximate)"
    why = (
        "fits both block and round-robin placement with different answers"
        if block[0]
        else "fits neither block nor round-robin placement (a rankfile or an uneven mapping?)"
    )
    warning = ApproximateNodeRankWarning(
        f"Node rank {block[1]} is approximate: {row.rank}={rank} with {row.local_rank}={local_rank} and "
        f"{local_size_source}={local_size} {why}. Global and local ranks are exact; only the node "
        f"index is a guess.",
        "use Trainer(strategy='ddp_mpi') or the roll call of MPIClusterEnvironment, which resolve node "
        "ranks exactly by exchanging host names.",
        variable=row.rank,
        value=str(rank),
        launcher=row.name,
    )
    return NodeGuess(block[1], num_nodes, Placement.UNKNOWN, sources, warning)


HET_SIZE = "SLURM_HET_SIZE"
"""Set in every heterogeneous Slurm job (the number of its components); sbatch(1), salloc(1), srun(1)."""

NODE_NAME = "SLURMD_NODENAME"
"""srun(1): "Name of the node running the task"; set by ``slurmstepd`` for every task."""

STEP_NODELIST = "SLURM_STEP_NODELIST"
"""srun(1): the step's nodes, in the order of ``SLURM_STEP_TASKS_PER_NODE``."""

STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
"""srun(1): the step's number of tasks, set even where ``srun --preserve-env`` keeps the job's ``SLURM_NTASKS``."""


class NodeCounts(NamedTuple):
    """Every node's number of ranks, as the launcher lists them, and where this node is in the list."""

    counts: tuple[int, ...]
    """Every node's count, in the order of the launcher's list (``SLURM_STEP_NODELIST``'s)."""
    position: int
    source: str
    """How :attr:`position` was found, for ``RankLayout.sources``."""

    @property
    def local_size(self) -> int:
        """This node's count."""
        return self.counts[self.position]


def launch_conflict(row: Launcher, problem: str, variable: str, value: str) -> LayoutError:
    """Variables of one launcher that contradict each other: they were not all set by one launch."""
    return LayoutError(
        f"{row.name}: {problem}",
        f"The variables disagree, so they were not all set by one launch. {row.launch_hint}",
        variable=variable,
        value=value[:SHOWN_CHARACTERS],
        launcher=row.name,
    )


def slurm_node_counts(env: Mapping[str, str], row: Launcher, world_size: int, node: int) -> NodeCounts:
    """Every node's count from ``SLURM_STEP_TASKS_PER_NODE``; a :class:`LayoutError` unless it fits world and node."""
    assert row.tasks_per_node is not None
    assert row.node_rank is not None
    raw = env[row.tasks_per_node]
    counts = tuple(expand_tasks_per_node(raw, variable=row.tasks_per_node))
    if sum(counts) != world_size:
        raise _sum_mismatch(env, row, row.tasks_per_node, counts, world_size)
    if node >= len(counts):
        raise launch_conflict(
            row,
            f"{row.node_rank}={node} but {row.tasks_per_node}={shown(raw)} lists only {len(counts)} node(s).",
            row.node_rank,
            str(node),
        )
    position, source = node, f"{row.tasks_per_node}[{row.node_rank}]"
    if HET_SIZE in env and len(set(counts)) > 1:
        position, source = _het_position(env, row, len(counts)), f"{row.tasks_per_node}[{NODE_NAME}]"
    if counts[position] > MAX_LOCAL_SIZE:
        raise launch_conflict(
            row,
            f"{row.tasks_per_node}={shown(raw)} gives node {position} {counts[position]} tasks, more than the "
            f"{MAX_LOCAL_SIZE} ranks on one node this package accepts.",
            row.tasks_per_node,
            raw,
        )
    return NodeCounts(counts, position, source)


def _sum_mismatch(
    env: Mapping[str, str], row: Launcher, variable: str, counts: tuple[int, ...], world_size: int
) -> LayoutError:
    raw = env[variable]
    if env.get(STEP_NUM_TASKS) == str(sum(counts)):
        # Slurm's env_array_for_step (src/common/env.c): with preserve_env, SLURM_NTASKS and the like stay the job's.
        return LayoutError(
            f"{row.world_size}={world_size} is the job's, not this step's: {STEP_NUM_TASKS}={sum(counts)} and "
            f"{variable}={shown(raw)} count {sum(counts)} tasks ({row.name}). `srun --preserve-env` (-E) "
            f"keeps the job's {row.world_size}, which would give every rank the wrong world size.",
            f"Drop `--preserve-env`/`-E` from the srun line (or give it `-n {world_size}`).",
            variable=row.world_size,
            value=str(world_size),
            launcher=row.name,
        )
    return launch_conflict(
        row,
        f"{variable}={shown(raw)} adds up to {sum(counts)} tasks but {row.world_size}={world_size}.",
        variable,
        raw,
    )


def _het_position(env: Mapping[str, str], row: Launcher, nodes: int) -> int:
    # srun.c, _reorder_het_job_recs: the lists are sorted by host name, while SLURM_NODEID counts per component.
    name, nodelist = env.get(NODE_NAME), env.get(STEP_NODELIST)
    if name is None or nodelist is None:
        missing = NODE_NAME if name is None else STEP_NODELIST
        raise LayoutError(
            f"{HET_SIZE}={shown(env[HET_SIZE])}: a heterogeneous Slurm job, whose step lists its nodes' task counts "
            f"({row.tasks_per_node}={shown(env[row.tasks_per_node or ''])}) by host name, not in {row.node_rank}'s "
            f"order; {missing} is not set, so which count is this node's is unknown.",
            f"Start the ranks with `srun` (slurmstepd sets {NODE_NAME} and {STEP_NODELIST}); do not unset them.",
            variable=missing,
            launcher=row.name,
        )
    position, listed = nodelist_position(nodelist, name, variable=STEP_NODELIST)
    if position is None or listed != nodes:
        why = f"does not list {NODE_NAME}={shown(name)}" if position is None else f"lists {listed} node(s)"
        raise launch_conflict(
            row,
            f"{STEP_NODELIST}={shown(nodelist)} {why}, and {row.tasks_per_node} counts tasks on {nodes}.",
            STEP_NODELIST,
            nodelist,
        )
    return position


def het_step_needs_main_address(env: Mapping[str, str], row: Launcher) -> LayoutError | None:
    """The error for a heterogeneous Slurm job without ``MASTER_ADDR``; ``None`` for any other launch.

    srun sorts such a step's nodes by name (``_reorder_het_job_recs``), and no variable says which runs rank 0.
    """
    if HET_SIZE not in env or row.tasks_per_node is None:
        return None
    main = TORCH.master_addr
    return LayoutError(
        f"{HET_SIZE}={shown(env[HET_SIZE])}: this step belongs to a heterogeneous Slurm job, and {main} is not set. "
        f"srun sorts the nodes of a step over several components by name ({STEP_NODELIST}="
        f"{shown(env.get(STEP_NODELIST, ''))}), so its first host need not run rank 0, and no variable of one task "
        "says which node does.",
        f"export {main} to the first node of the step's first component before srun, e.g. for "
        f'`srun --het-group=0,1`: export {main}=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | '
        "head -n 1) (srun passes the job script's environment to every task).",
        variable=TORCH.master_addr,
        launcher=row.name,
    )


def flux_local_size(row: Launcher, world_size: int, nodes: int, local_rank: int) -> int:
    """This node's count under Flux: ``FLUX_JOB_SIZE / FLUX_JOB_NNODES``, which assumes an even job.

    Flux exports no per-node count (flux-environment(7)): an uneven job is a :class:`LayoutError` naming even ones.
    """
    assert row.num_nodes is not None
    share, rest = divmod(world_size, nodes)
    if not rest and local_rank < share:
        return share
    if rest:
        why = f"{row.world_size}={world_size} tasks do not divide over {row.num_nodes}={nodes} nodes"
        variable, value = row.world_size, str(world_size)
    else:
        why = f"{row.local_rank}={local_rank} is past an even share of {share} per node"
        variable, value = row.local_rank, str(local_rank)
    fewer, more = max(1, share), share + 1
    raise LayoutError(
        f"Flux started an uneven job: {why}, and Flux exports no per-node task count (only this task's index on "
        f"its node), so this process cannot know how many tasks share its node.",
        f"Give every node the same number of tasks: `flux run -N {nodes} --tasks-per-node={fewer}` "
        f"({fewer * nodes} tasks) or `--tasks-per-node={more}` ({more * nodes} tasks).",
        variable=variable,
        value=value,
        launcher=row.name,
    )
