"""Build the variables a launcher would give one process, from the launcher's table row."""

from __future__ import annotations

from lightning_mpi_env.core.launchers import Launcher

OPEN_MPI_RANK_5 = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "nodea",
    "MASTER_PORT": "29611",
}
"""Rank 5 of 8 under Open MPI, 4 ranks a node (rank 1 of node 1), rank 0 at ``nodea:29611``: the CLI tests' launch."""


def launcher_env(
    launcher: Launcher, *, rank: int, world_size: int, local_rank: int, local_size: int, node: int, num_nodes: int
) -> dict[str, str]:
    """The variables ``launcher`` sets for one process (uniform ranks per node for Slurm's task counts)."""
    env = {launcher.marker: "0"}
    env[launcher.rank] = str(rank)
    env[launcher.world_size] = str(world_size)
    env[launcher.local_rank] = str(local_rank)
    if launcher.local_size is not None:
        env[launcher.local_size] = str(local_size)
    if launcher.node_rank is not None:
        env[launcher.node_rank] = str(node)
    if launcher.tasks_per_node is not None:
        env[launcher.tasks_per_node] = f"{local_size}(x{num_nodes})"
    if launcher.num_nodes is not None:
        env[launcher.num_nodes] = str(num_nodes)
    return env


def placed(nodes: int, per_node: int, placement: str) -> list[tuple[int, int, int]]:
    """``(rank, local_rank, node)`` for every process of an even layout placed by ``block`` or ``round-robin``."""
    world = nodes * per_node
    if placement == "block":
        return [(rank, rank % per_node, rank // per_node) for rank in range(world)]
    return [(rank, rank // nodes, rank % nodes) for rank in range(world)]
