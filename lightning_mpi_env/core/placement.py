"""Which node a process runs on, when the launcher exports no node index: what one process can and cannot know.

A launcher such as Open MPI exports the global rank, the world size and *this* node's local rank and size, nothing
about the other nodes. ``mpirun -n 6 --host a:4,b:4`` runs 4 ranks on ``a`` and 2 on ``b``; rank 4 (local rank 0 of
2) looks exactly like the third node of an even 3 x 2 job. So a node index or node count derived from these numbers
is an assumption (every node runs as many ranks as this one), never exact, unless every rank of the launch runs on
this node. The roll call makes it exact by exchanging host names.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import NamedTuple

from lightning_mpi_env.core.errors import ApproximateNodeRankWarning
from lightning_mpi_env.core.launchers import Launcher


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
"""Ends the source of a node count divided out of the world size: it assumes every node runs as many ranks."""


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
    """Whether every rank of the launch runs on this node: the one case the node values are known from one process.

    >>> every_rank_here(4, 4), every_rank_here(6, 2)
    (True, False)
    """
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


__all__ = ["ASSUMED_EVEN", "DEALING", "NodeGuess", "Placement", "every_rank_here", "guess_node", "num_nodes_source"]
