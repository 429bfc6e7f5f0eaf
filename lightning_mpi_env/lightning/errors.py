"""The errors of a launch that does not fit the Trainer's or Fabric's settings, in the launcher's own words."""

from __future__ import annotations

import os
from collections.abc import Mapping

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.rollcall.claims import ANY_LAYOUT_HINT

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
    """The error for ``devices``/``num_nodes`` of the Trainer or Fabric (``api``) that do not fit the launch."""
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
    guessed, maybe_uneven, fits_if_even = "", "", ""
    if not layout.num_nodes_is_exact:
        guessed = f" ({layout.launcher.name} exports no node count: the node count assumes every node runs as many.)"
        maybe_uneven = (
            "If nodes run different numbers of ranks (an uneven launch), no devices/num_nodes fits: use "
            'strategy="ddp_mpi" and pass neither.'
        )
        fits_if_even = (
            f" If every node runs {layout.local_size}: {api}(devices={layout.local_size}, num_nodes={layout.num_nodes})"
        )
    return LayoutError(
        f"{layout.launcher.name} launched {layout.describe_world()} ({layout.num_nodes} node(s); "
        f"{layout.sources['world_size']}={layout.world_size}, {layout.sources['local_size']}="
        f"{layout.local_size}), but {api}(devices={num_devices}, num_nodes={num_nodes}) expects "
        f"{num_devices * num_nodes} ranks, {num_devices} per node.{guessed}",
        # Where the node count is a guess, the fix that holds for an uneven launch too comes first.
        f"{maybe_uneven}{fits_if_even}{relaunch}.{bound}"
        if maybe_uneven
        else f"Use {api}(devices={layout.local_size}, num_nodes={layout.num_nodes}){relaunch}.{bound}",
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
        f"{ANY_LAYOUT_HINT} {_even_alternatives(layout)}.",
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
    """``num_nodes`` given to ``"ddp_mpi"`` that is not the launch's number of nodes (known from ``source``)."""
    return LayoutError(
        f"{api}(num_nodes={given}) was given, but the {layout.world_size} ranks {layout.launcher_name} launched run "
        f"on {found} node(s) ({source}).",
        f'Leave num_nodes out: strategy="ddp_mpi" takes it from the launch (or pass num_nodes={found}).',
        value=str(given),
        launcher=layout.launcher_name,
    )


def nodes_without_launcher(api: str, num_devices: int, num_nodes: int, unset: list[str]) -> LayoutError:
    """``num_nodes`` > 1 where no launcher started this process and no other node could find it (``unset``)."""
    return LayoutError(
        f"No launcher started this process (no srun, mpirun, mpiexec, flux run or jsrun), and {api}(devices="
        f"{num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} ranks on {num_nodes} nodes: this "
        f"command starts the {num_devices} of this node only, and the others could never join it "
        f"({' and '.join(unset)} unset).",
        f"Start one process per device with the cluster's launcher and pass neither devices nor num_nodes, e.g. "
        f"`srun --nodes={num_nodes} --ntasks-per-node={num_devices} python train.py` or "
        f"`mpirun -np {num_devices * num_nodes} --map-by ppr:{num_devices}:node python train.py`. To start each node "
        "by hand instead, run the command on every node with MASTER_ADDR, MASTER_PORT and NODE_RANK set.",
        variable=unset[0],
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


def settings_error(
    layout: RankLayout,
    api: str,
    num_devices: int,
    num_nodes: int,
    *,
    any_layout: bool,
    roll_call: bool,
    visible: tuple[str, list[str]] | None,
) -> LayoutError | None:
    """The error for ``devices``/``num_nodes`` that do not fit a launch of one process per rank, or ``None``."""
    if not any_layout:
        if not layout.is_even:
            return uneven_layout(layout, api, num_devices, num_nodes)
        if (num_devices, num_nodes) != (layout.local_size, layout.num_nodes):
            return settings_mismatch(layout, api, num_devices, num_nodes, visible)
        return None
    if num_devices != layout.local_size:
        if not layout.is_even:
            return devices_against_launch(layout, api, num_devices)
        return settings_mismatch(layout, api, num_devices, num_nodes, visible)
    nodes = known_node_count(layout)
    if nodes is not None and num_nodes != nodes:
        return nodes_against_launch(layout, api, num_nodes, nodes, layout.sources["num_nodes"])
    if nodes is None and not roll_call and layout.is_even and num_nodes != layout.num_nodes:
        # No roll call will count the hosts: hold the given value to this node's reckoning.
        return settings_mismatch(layout, api, num_devices, num_nodes, visible)
    return None
