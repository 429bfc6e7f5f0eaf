"""How many ranks run on this node, and on every node, for the launchers that export counts rather than a local size.

Slurm's ``srun`` exports every node's count of the step, compressed (``SLURM_STEP_TASKS_PER_NODE=2(x3),1``), with
this node's index (``SLURM_NODEID``): the whole layout is exact, even or not; in a heterogeneous step this node's
count is found by its name (``SLURMD_NODENAME``). Flux exports only the node count (:func:`flux_local_size`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import expand_tasks_per_node, nodelist_position
from lightning_mpi_env.core.launchers import Launcher
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, SHOWN_CHARACTERS, shown

HET_SIZE = "SLURM_HET_SIZE"
"""Set in every heterogeneous Slurm job (the number of its components); sbatch(1), salloc(1), srun(1)."""

NODE_NAME = "SLURMD_NODENAME"
"""srun(1): "Name of the node running the task"; set by ``slurmstepd`` for every task."""

STEP_NODELIST = "SLURM_STEP_NODELIST"
"""srun(1): the step's nodes, in the order of ``SLURM_STEP_TASKS_PER_NODE``."""

STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
"""srun(1): the step's number of tasks, set even where ``srun --preserve-env`` keeps the job's ``SLURM_NTASKS``."""

EVEN_SHARE = "assumed even"
"""Ends the source of a local size divided out of the world size (Flux)."""


class NodeCounts(NamedTuple):
    """Every node's number of ranks, as the launcher lists them, and where this node is in the list."""

    counts: tuple[int, ...]
    """Every node's count, in the order of the launcher's list (``SLURM_STEP_NODELIST``'s)."""
    position: int
    """This node's index into :attr:`counts`."""
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
    """Every node's count from ``SLURM_STEP_TASKS_PER_NODE``, checked against the world size and the node index.

    Args:
        env: The process environment.
        row: The launcher row with ``tasks_per_node`` and ``node_rank`` (``srun``'s).
        world_size: The world size already read (``SLURM_NTASKS``).
        node: The node index already read (``SLURM_NODEID``).

    Raises:
        LayoutError: If the counts are malformed, add up to another world size, list fewer nodes than the index
            needs, give this node more than ``MAX_LOCAL_SIZE`` ranks, or (in a heterogeneous step) do not name
            this node.
    """
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
        # env_array_for_step (src/common/env.c): "If preserve_env is true, the variables SLURM_NNODES, SLURM_NTASKS
        # and SLURM_TASKS_PER_NODE remain unchanged": the job's, under a step of another size.
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
    # srun.c, _reorder_het_job_recs: the step's node list and its task counts are sorted by host name, while
    # slurmstepd sets SLURM_NODEID to the component's node offset plus the node's index in its component.
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

    srun sorts the node list of such a step by host name (``_reorder_het_job_recs``), and no variable of one task
    says which node runs rank 0: a guess would leave every rank waiting at the wrong host.
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

    Flux exports no per-node count (flux-environment(7)), so a job whose size does not divide by its nodes, or a
    task whose ``FLUX_TASK_LOCAL_ID`` is past an even share, proves the job uneven and this node's count unknown.

    Raises:
        LayoutError: Naming the variables, the two even launches nearest to this one and the fix.
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


__all__ = [
    "EVEN_SHARE",
    "HET_SIZE",
    "NODE_NAME",
    "STEP_NODELIST",
    "STEP_NUM_TASKS",
    "NodeCounts",
    "flux_local_size",
    "het_step_needs_main_address",
    "launch_conflict",
    "slurm_node_counts",
]
