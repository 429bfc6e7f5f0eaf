"""The launch as Lightning meets it: who started the processes, this process's ranks, the stages, the mismatches."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import RankLayout, from_env
from lightning_mpi_env.core.torch_names import LIGHTNING_SPAWN_VARIABLES, TORCH
from lightning_mpi_env.core.values import as_count, parse_count


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
    """Made; no Trainer or Fabric has proposed ranks yet."""
    PROPOSED = "proposed"
    """A Trainer or Fabric was built with it (its first rank proposal); a launch may read the address to start
    Lightning's own workers."""
    SETTING_UP = "setting up"
    """The strategy proposed the ranks again in ``setup_environment``: ``init_process_group`` comes next, and the
    next read of ``main_address``/``main_port`` runs the roll call."""
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


def initial_mode_and_ranks(layout: RankLayout, env: Mapping[str, str], spawned: bool) -> tuple[LaunchMode, Ranks]:
    """The launch mode, and this process's ranks before Lightning proposes any."""
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


def read_launch(env: Mapping[str, str]) -> tuple[RankLayout, bool]:
    """The layout, and whether Lightning started this process as a worker of a one-process-per-node launch.

    Lightning's workers carry the launcher's variables plus its own ``LIGHTNING_SPAWN_VARIABLES``: their
    ``LOCAL_RANK``/``WORLD_SIZE`` are not stale. Elsewhere those two are parsed as stale.
    """
    if not all(name in env for name in LIGHTNING_SPAWN_VARIABLES):
        return from_env(env), False
    layout = from_env({name: value for name, value in env.items() if name not in (TORCH.local_rank, TORCH.world_size)})
    if is_lightning_worker(layout, env):
        return layout, True
    return from_env(env), False


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


EVEN_LAUNCH: Mapping[str, str] = {
    "openmpi": "mpirun -np {world} --map-by ppr:{per}:node",
    "mpich": "mpiexec -n {world} -ppn {per}",
    "slurm": "srun --ntasks={world} --ntasks-per-node={per}",
}
"""How each launcher (by its key) starts ``{world}`` ranks, ``{per}`` on every node: the hints' examples."""

_EVEN_ANY = "{world} ranks, {per} on every node"


def even_launch(layout: RankLayout, world: int | str, per: int | str) -> str:
    """``mpirun -np 4 --map-by ppr:2:node`` in the launcher's own words (``world`` ranks, ``per`` on each node).

    >>> from lightning_mpi_env.core.layout import from_env
    >>> even_launch(from_env({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
    ...     "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2,1", "MASTER_ADDR": "a"}), 4, 2)
    '`srun --ntasks=4 --ntasks-per-node=2`'
    """
    key = layout.launcher.key if layout.launcher is not None else ""
    template = EVEN_LAUNCH.get(key)
    if template is None:
        return _EVEN_ANY.format(world=world, per=per)
    return f"`{template.format(world=world, per=per)}`"


def known_node_count(layout: RankLayout) -> int | None:
    """The number of nodes where the launcher proves it (also for an uneven launch); else ``None``."""
    if layout.ranks_per_node:
        return len(layout.ranks_per_node)
    if layout.num_nodes is not None and layout.num_nodes_is_exact:
        return layout.num_nodes
    return None


def _even_alternatives(layout: RankLayout) -> str:
    """Even launches that fit the nodes of this one, in the launcher's words, for an uneven launch's hint."""
    nodes = known_node_count(layout)
    if nodes is None or nodes < 2:
        return f"the same number N of ranks on every node, e.g. {even_launch(layout, '<nodes x N>', 'N')}"
    fewer, more = layout.world_size // nodes, -(-layout.world_size // nodes)
    options = [even_launch(layout, nodes * per, per) for per in dict.fromkeys((more, fewer)) if per >= 1]
    return f"the same number of ranks on each of the {nodes} nodes, e.g. {' or '.join(options)}"


def settings_mismatch(
    layout: RankLayout, api: str, num_devices: int, num_nodes: int, visible: tuple[str, list[str]] | None = None
) -> LayoutError:
    """``devices``/``num_nodes`` of the Trainer or Fabric (``api``) that do not fit the launch.

    ``visible`` is the rank's device variable and list: a list shorter than the ranks per node is per-task GPU
    binding, under which Lightning's own strategies would drive ``cuda:<local rank>``.
    """
    assert layout.launcher is not None
    bound = ""
    if visible is not None and 0 < len(visible[1]) < layout.local_size:
        bound = (
            f" This rank sees {visible[0]}={','.join(visible[1])!r}, a subset of the node's GPUs (per-task binding),"
            f' where Lightning\'s own strategies drive cuda:<local rank>: use strategy="ddp_mpi", which drives '
            "each rank's own device."
        )
    wanted = num_devices * num_nodes
    relaunch = ""
    if wanted > 1:  # one rank in all is what devices/num_nodes left out say, hardly what a launch of many meant
        relaunch = (
            f", or launch {wanted} ranks with {num_devices} per node ({even_launch(layout, wanted, num_devices)})"
        )
    guessed, maybe_uneven = "", ""
    if not layout.num_nodes_is_exact:
        # The per-node figures are this node's: another node may run another number of ranks.
        guessed = f" ({layout.launcher.name} exports no node count: the node count assumes every node runs as many.)"
        maybe_uneven = (
            " If nodes run different numbers of ranks (an uneven launch), no devices/num_nodes fits: use "
            'strategy="ddp_mpi" and pass neither.'
        )
    return LayoutError(
        f"{layout.launcher.name} launched {layout.describe_world()} ({layout.num_nodes} node(s); "
        f"{layout.sources['world_size']}={layout.world_size}, {layout.sources['local_size']}="
        f"{layout.local_size}), but {api}(devices={num_devices}, num_nodes={num_nodes}) expects "
        f"{num_devices * num_nodes} ranks, {num_devices} per node.{guessed}",
        f"Use {api}(devices={layout.local_size}, num_nodes={layout.num_nodes}){relaunch}.{maybe_uneven}{bound}",
        variable=layout.sources["world_size"],
        value=str(layout.world_size),
        launcher=layout.launcher.name,
    )


def uneven_layout(layout: RankLayout, api: str, num_devices: int, num_nodes: int) -> LayoutError:
    """A launch whose nodes run different numbers of ranks, under a strategy of Lightning's own (the plugin)."""
    assert layout.launcher is not None
    return LayoutError(
        f"{layout.launcher.name} placed ranks unevenly: this node runs {layout.sources['local_size']}="
        f"{layout.local_size} of {layout.world_size} ranks ({layout.sources['world_size']}), and other nodes "
        f"run another number. Lightning's own strategies (ddp, fsdp, deepspeed, ...) take the same number on every "
        f"node (global rank = node rank x devices + local rank), so no {api}(devices=..., num_nodes=...) describes "
        f"this launch ({api}(devices={num_devices}, num_nodes={num_nodes}) was given).",
        'Use strategy="ddp_mpi" with no devices/num_nodes: it takes the world size, each rank\'s rank and device '
        "and the data sampler from the launch, so it trains on any layout. Strategies whose device mesh needs the "
        "same number of ranks on every node (FSDP hybrid sharding, ModelParallel) need an even launch: "
        f"{_even_alternatives(layout)}.",
        variable=layout.sources["local_size"],
        value=str(layout.local_size),
        launcher=layout.launcher.name,
    )


def devices_against_launch(layout: RankLayout, api: str, num_devices: int) -> LayoutError:
    """``devices`` given to ``"ddp_mpi"`` that is not this node's number of ranks, on a launch that may be uneven."""
    assert layout.launcher is not None
    return LayoutError(
        f"{api}(devices={num_devices}) was given, but {layout.launcher.name} started "
        f"{layout.sources['local_size']}={layout.local_size} rank(s) on this node, of {layout.world_size} "
        f"({layout.sources['world_size']}); nodes run different numbers of ranks, so no one devices value fits.",
        'Leave devices (and num_nodes) out: strategy="ddp_mpi" takes each node\'s number of ranks from the launch.',
        variable=layout.sources["local_size"],
        value=str(layout.local_size),
        launcher=layout.launcher.name,
    )


def nodes_against_launch(layout: RankLayout, api: str, given: int, found: int, source: str) -> LayoutError:
    """``num_nodes`` given to ``"ddp_mpi"`` that is not the number of nodes the launch used.

    ``source`` says how that number is known: the roll call's host names, or the launcher's variable.
    """
    return LayoutError(
        f"{api}(num_nodes={given}) was given, but the {layout.world_size} ranks {layout.launcher_name} launched run "
        f"on {found} node(s) ({source}).",
        f'Leave num_nodes out: strategy="ddp_mpi" takes it from the launch (or pass num_nodes={found}).',
        value=str(given),
        launcher=layout.launcher_name,
    )


def world_mismatch(layout: RankLayout, size: int) -> LayoutError:
    """A strategy about to set up ``size`` processes where the launch has another number."""
    assert layout.launcher is not None
    return LayoutError(
        f"{layout.launcher.name} launched {layout.describe_world()} ({layout.sources['world_size']}="
        f"{layout.world_size}), but the strategy is about to set up torch.distributed for {size} processes "
        "(Trainer devices x num_nodes): the missing ones would never come.",
        f"Make devices x num_nodes match the launch: devices={layout.local_size}"
        f"{f', num_nodes={layout.num_nodes}' if layout.num_nodes else ''}.",
        variable=layout.sources["world_size"],
        value=str(layout.world_size),
        launcher=layout.launcher.name,
    )


def started_by_lightning_under_launcher(layout: RankLayout, made_in_pid: int) -> LayoutError:
    """Lightning started workers (spawn or fork) from a process a launcher had started already."""
    return LayoutError(
        f"{layout.launcher_name} started this process as rank {layout.rank} of {layout.world_size} "
        f"({layout.sources['rank']}={layout.rank}), and Lightning started worker processes from it again "
        f"(pid {made_in_pid} made this environment, pid {os.getpid()} uses it): a strategy with the "
        "start method spawn or fork ('ddp_spawn', 'ddp_fork', 'ddp_notebook'). Every such worker would "
        f"claim rank {layout.rank}.",
        "Under a launcher, use strategy='ddp' or 'ddp_mpi' (Lightning then starts no processes when the "
        "launcher started one per device). To let Lightning start the workers on each node, launch one process "
        "per node (`mpirun --map-by ppr:1:node`) with strategy='ddp' or 'ddp_mpi'.",
        variable=layout.sources["rank"],
        value=str(layout.rank),
        launcher=layout.launcher_name,
    )


def find_free_port() -> int:
    """A port free on this host now (as Lightning's ``LightningEnvironment`` takes one)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port


def export_fabric(exports: Mapping[str, str]) -> dict[str, str | None]:
    """Put ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` in ``os.environ`` (gloo and NCCL read nothing else).

    Returns:
        The values they replace (``None``: unset), for :func:`restore_environment`.
    """
    previous = {name: os.environ.get(name) for name in exports}
    os.environ.update(exports)
    return previous


def check_fabric(ifname: str, main_address: str) -> None:
    """On rank 0: warn when the main host resolves here to another network than ``ifname``'s (a ``FabricWarning``)."""
    from lightning_mpi_env.rollcall.reach import NetworkView, off_fabric

    warning = off_fabric(ifname, NetworkView.here(main_address))
    if warning is not None:
        warnings.warn(warning, stacklevel=3)


def restore_environment(previous: Mapping[str, str | None]) -> None:
    """Put back the values :func:`export_fabric` replaced."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


__all__ = [
    "LIGHTNING_SPAWN_VARIABLES",
    "LaunchMode",
    "Ranks",
    "Stage",
    "EVEN_LAUNCH",
    "check_fabric",
    "devices_against_launch",
    "even_launch",
    "export_fabric",
    "find_free_port",
    "initial_mode_and_ranks",
    "is_lightning_worker",
    "known_node_count",
    "nodes_against_launch",
    "read_launch",
    "restore_environment",
    "settings_mismatch",
    "started_by_lightning_under_launcher",
    "uneven_layout",
    "world_mismatch",
]
