"""The names of the variables torch, torchrun and Lightning read (under any launcher), spelled here only."""

from __future__ import annotations

from typing import NamedTuple


class TorchNames(NamedTuple):
    """The variable names of torch's ``env://`` rendezvous, torchrun's workers and Lightning's launchers.

    Sources: https://docs.pytorch.org/docs/stable/distributed.html#environment-variable-initialization (``env://``),
    https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables (torchrun), and Lightning's
    ``_SubprocessScriptLauncher`` (``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` for the processes it starts).
    """

    rank: str = "RANK"
    world_size: str = "WORLD_SIZE"
    local_rank: str = "LOCAL_RANK"
    local_world_size: str = "LOCAL_WORLD_SIZE"
    node_rank: str = "NODE_RANK"
    """Lightning's own."""
    group_rank: str = "GROUP_RANK"
    """torchrun's worker group: the node's index with one group per node."""
    master_addr: str = "MASTER_ADDR"
    master_port: str = "MASTER_PORT"


TORCH = TorchNames()

LIGHTNING_SPAWN_VARIABLES: tuple[str, ...] = (
    TORCH.master_addr,
    TORCH.master_port,
    TORCH.node_rank,
    TORCH.local_rank,
    TORCH.world_size,
)
"""What Lightning's subprocess launcher exports to the processes it starts (``_SubprocessScriptLauncher``)."""
