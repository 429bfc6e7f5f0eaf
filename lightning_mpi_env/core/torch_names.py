"""The names of the variables torch, torchrun and Lightning read: one record, the one place they are spelled.

They are not one launcher's row. ``MASTER_ADDR`` and ``MASTER_PORT`` are read under every launcher (torch's
``env://`` rendezvous), ``NODE_RANK`` is Lightning's own, and the PMIx row borrows ``WORLD_SIZE`` and the local
sizes; the torchrun row of :mod:`lightning_mpi_env.core.launchers` takes its rank variables from here too. Every
module that reads, exports or names one of them uses :data:`TORCH` (``tests/test_project.py`` checks that no other
module spells them). Standard library only.
"""

from __future__ import annotations

from typing import NamedTuple


class TorchNames(NamedTuple):
    """The variable names of torch's ``env://`` rendezvous, torchrun's workers and Lightning's launchers.

    Sources: https://docs.pytorch.org/docs/stable/distributed.html#environment-variable-initialization (``env://``),
    https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables (torchrun), and Lightning's
    ``_SubprocessScriptLauncher`` (``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` for the processes it starts).
    """

    rank: str = "RANK"
    """Global rank (``env://``, torchrun)."""
    world_size: str = "WORLD_SIZE"
    """Number of processes in the job (``env://``, torchrun)."""
    local_rank: str = "LOCAL_RANK"
    """Rank on this node (torchrun; Lightning's subprocess launcher)."""
    local_world_size: str = "LOCAL_WORLD_SIZE"
    """Number of processes on this node (torchrun)."""
    node_rank: str = "NODE_RANK"
    """Index of this node (Lightning's own)."""
    group_rank: str = "GROUP_RANK"
    """Index of the worker group: the node's index with one group per node (torchrun)."""
    master_addr: str = "MASTER_ADDR"
    """Host of rank 0, where every process meets (``env://``)."""
    master_port: str = "MASTER_PORT"
    """Port on :attr:`master_addr` (``env://``)."""


TORCH = TorchNames()
"""The one record of these names."""

LIGHTNING_SPAWN_VARIABLES: tuple[str, ...] = (
    TORCH.master_addr,
    TORCH.master_port,
    TORCH.node_rank,
    TORCH.local_rank,
    TORCH.world_size,
)
"""What Lightning's subprocess launcher exports to the processes it starts (``_SubprocessScriptLauncher``)."""

__all__ = ["LIGHTNING_SPAWN_VARIABLES", "TORCH", "TorchNames"]
