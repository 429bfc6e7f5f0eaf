"""The launch as Lightning meets it: who started the processes, where Lightning is in its life cycle, the ranks."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.torch_names import LIGHTNING_SPAWN_VARIABLES, TORCH
from lightning_mpi_env.core.values import as_count, parse_count

if TYPE_CHECKING:
    from lightning_mpi_env.recovery.restart import Generation


class LaunchMode(Enum):
    """Who starts the processes, and so who decides the global ranks."""

    PER_RANK = "one launcher process per rank"
    """``mpirun -np 8`` with 4 devices x 2 nodes: the launcher's ranks are the truth."""
    PER_NODE = "one launcher process per node"
    """``mpirun --map-by ppr:1:node``: Lightning starts the workers on each node; node rank = launcher rank."""
    NO_LAUNCHER = "no launcher"
    """``python train.py``: one node, Lightning starts the workers, like Lightning's ``LightningEnvironment``."""

    @property
    def managed_by_lightning(self) -> bool:
        """Whether Lightning starts the local workers and assigns the global ranks."""
        return self is not LaunchMode.PER_RANK


class Stage(Enum):
    """Where the environment is in Lightning's life cycle, told apart by the order of Lightning's public calls."""

    CONFIGURED = "configured"
    PROPOSED = "proposed"
    """A Trainer or Fabric proposed ranks once; a launch may read the address to start Lightning's own workers."""
    SETTING_UP = "setting up"
    """The strategy proposed the ranks again: the next read of the address, before ``init_process_group``, meets."""
    MET = "met"
    """The roll call is done (or off): the ranks are final."""


@dataclass(frozen=True)
class Ranks:
    """This process's ranks as they stand; replaced as a whole by the launch mode, the settings and the roll call."""

    global_rank: int
    world_size: int
    local_rank: int | None
    """``None``: Lightning sets ``LOCAL_RANK`` in each worker it starts (``ddp_spawn``), read when asked."""
    node_rank: int
    num_nodes: int | None


def _mode_and_ranks(layout: RankLayout, env: Mapping[str, str], spawned: bool) -> tuple[LaunchMode, Ranks]:
    if spawned:
        local_rank = parse_count(env[TORCH.local_rank], variable=TORCH.local_rank)
        world_size = parse_count(env[TORCH.world_size], variable=TORCH.world_size, minimum=1)
        per_node = world_size // layout.world_size
        return LaunchMode.PER_NODE, Ranks(
            global_rank=layout.rank * per_node + local_rank,
            world_size=world_size,
            local_rank=local_rank,
            node_rank=layout.rank,
            num_nodes=layout.world_size,
        )
    if layout.launcher is None:
        local = env.get(TORCH.local_rank)
        node = env.get(TORCH.node_rank) or env.get(TORCH.group_rank)
        return LaunchMode.NO_LAUNCHER, Ranks(
            global_rank=0,
            world_size=1,
            local_rank=None if local is None else parse_count(local, variable=TORCH.local_rank),
            node_rank=0 if node is None else parse_count(node, variable=TORCH.node_rank),
            num_nodes=1,
        )
    return LaunchMode.PER_RANK, Ranks(
        global_rank=layout.rank,
        world_size=layout.world_size,
        local_rank=layout.local_rank,
        node_rank=layout.node_rank,
        num_nodes=layout.num_nodes,
    )


def read_launch(env: Mapping[str, str], generation: Generation | None = None) -> tuple[RankLayout, LaunchMode, Ranks]:
    """The layout, the launch mode, and this process's ranks before Lightning proposes any.

    In a ``generation`` of ``restartable`` (one process per rank), the ranks are the generation's: the world may have
    shrunk, and the survivors been renumbered.
    """
    if all(name in env for name in LIGHTNING_SPAWN_VARIABLES):
        fresh = {name: value for name, value in env.items() if name not in (TORCH.local_rank, TORCH.world_size)}
        worker = from_env(fresh)
        if is_lightning_worker(worker, env):
            return (worker, *_mode_and_ranks(worker, env, True))
    layout = from_env(env)
    mode, ranks = _mode_and_ranks(layout, env, False)
    if generation is not None and mode is LaunchMode.PER_RANK:
        rank, size, node, nodes = generation.rank, generation.world_size, generation.node_rank, generation.num_nodes
        ranks = replace(ranks, global_rank=rank, world_size=size, node_rank=node, num_nodes=nodes)
    return layout, mode, ranks


def is_lightning_worker(layout: RankLayout, env: Mapping[str, str]) -> bool:
    """Whether Lightning started this process as a worker of a one-process-per-node launch."""
    launcher = layout.launcher
    if launcher is None or launcher.local_size is None or layout.local_size != 1:
        return False
    node, local, size = (as_count(env[name]) for name in (TORCH.node_rank, TORCH.local_rank, TORCH.world_size))
    if node is None or local is None or size is None:
        return False
    per_node, remainder = divmod(size, layout.world_size)
    return node == layout.rank and remainder == 0 and per_node > 1 and local < per_node


def is_per_node_launch(layout: RankLayout, num_devices: int, num_nodes: int) -> bool:
    """Whether the launch started one process per node, on which Lightning starts ``num_devices`` workers itself."""
    return layout.local_size == 1 and num_devices > 1 and num_nodes == layout.world_size and layout.is_even


def find_free_port() -> int:
    """A port free on this host now (as Lightning's ``LightningEnvironment`` takes one)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port
