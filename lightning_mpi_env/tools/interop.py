"""The resolved layout in the forms other tools read: torchrun's variables, torchrun's arguments, JAX's kwargs.

None of them writes to ``os.environ`` or imports torch or JAX.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from typing import TypedDict

from lightning_mpi_env.core.errors import ApproximateNodeRankWarning, DeviceIndexWarning, LayoutError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.network import socket_ifname_exports
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.settings import interface_name
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.gpu.devices import DeviceBasis, own_device, unknown_device
from lightning_mpi_env.gpu.devices import visible_devices as visible_devices
from lightning_mpi_env.gpu.nccl import installed_torch, nccl2_device, nccl_is_nccl2

TORCH_VARIABLES: tuple[str, ...] = (
    TORCH.rank,
    TORCH.local_rank,
    TORCH.world_size,
    TORCH.local_world_size,
    TORCH.node_rank,
    TORCH.group_rank,
    TORCH.master_addr,
    TORCH.master_port,
)
"""What torchrun exports to each worker and :func:`torch_env` reproduces (``GROUP_RANK`` is torchrun's node rank)."""

PYTHON_ADDS = ("LC_CTYPE", "__PYVENV_LAUNCHER__")
"""Variables CPython may set in its own environment as it starts: ``LC_CTYPE`` when it coerces the C locale (PEP
538), ``__PYVENV_LAUNCHER__`` from macOS's framework launcher. Neither is meant for the command ``exec`` runs."""


def started_with(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the :data:`PYTHON_ADDS` that this process did not start with (``/proc/self/environ``)."""
    try:
        with open("/proc/self/environ", "rb") as start:
            names = {os.fsdecode(entry.partition(b"=")[0]) for entry in start.read().split(b"\0")}
    except OSError:  # no /proc (macOS): as it is
        return dict(environ)
    return {name: value for name, value in environ.items() if name in names or name not in PYTHON_ADDS}


_SAFE_WORD = re.compile(r"^[A-Za-z0-9._:\[\]%-]+$")


class JaxDistributedKwargs(TypedDict):
    """The keyword arguments of ``jax.distributed.initialize``."""

    coordinator_address: str
    """``host:port`` of rank 0."""
    num_processes: int
    process_id: int
    local_device_ids: list[int]
    """The accelerators this process drives, as indices into the devices it sees."""


def _layout(env: Mapping[str, str] | None) -> tuple[RankLayout, Mapping[str, str]]:
    environ = os.environ if env is None else env
    layout = from_env(environ)
    for warning in layout.warnings:  # as the Lightning plugin does without its roll call
        warnings.warn(warning, stacklevel=3)
    return layout, environ


def torch_layout_env(layout: RankLayout) -> dict[str, str]:
    """The torchrun-style variables for an already resolved layout (see :func:`torch_env`)."""
    return {
        TORCH.rank: str(layout.rank),
        TORCH.local_rank: str(layout.local_rank),
        TORCH.world_size: str(layout.world_size),
        TORCH.local_world_size: str(layout.local_size),
        TORCH.node_rank: str(layout.node_rank),
        TORCH.group_rank: str(layout.node_rank),
        TORCH.master_addr: layout.main_address,
        TORCH.master_port: str(layout.main_port),
    }


def torch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables torchrun would export to this process (:data:`TORCH_VARIABLES`), from ``env`` (``os.environ``).

    With them in ``os.environ``, an unmodified ``torch.distributed.init_process_group()`` (``env://``) works under
    ``mpirun``/``srun``; ``lightning-mpi-env exec`` exports exactly these. With ``LIGHTNING_MPI_ENV_IFNAME`` set, also
    ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` (those not already set to it).

    Raises:
        LayoutError: If the launcher's variables are malformed, missing, contradictory or stale.
        SettingError: If ``LIGHTNING_MPI_ENV_IFNAME`` names no interface of this host, or contradicts
            ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``.
    """
    layout, environ = _layout(env)
    for warning in [*node_rank_warnings(layout), *device_warnings(layout, environ)]:
        warnings.warn(warning, stacklevel=2)
    return {**torch_layout_env(layout), **fabric_env(environ)}


def fabric_env(env: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for ``LIGHTNING_MPI_ENV_IFNAME``, where not set already."""
    return socket_ifname_exports(interface_name(env), env)


def node_rank_warnings(layout: RankLayout) -> list[ApproximateNodeRankWarning]:
    """A warning when the exported ``NODE_RANK``/``GROUP_RANK`` is assumed from a placement rule, not proven.

    A block or round-robin rule assumes every node runs as many ranks as this one, which one process cannot check
    (``mpirun -n 6 --host a:4,b:4`` looks like 3 x 2 from node ``b``). The Lightning plugin's roll call makes the
    node rank exact; ``exec`` and :func:`torch_env` have none, so they say so. Nothing when the layout already
    warned about its node rank (an unknown placement).
    """
    if layout.node_rank_is_exact or any(isinstance(w, ApproximateNodeRankWarning) for w in layout.warnings):
        return []
    return [
        ApproximateNodeRankWarning(
            f"NODE_RANK={layout.node_rank} (and GROUP_RANK) is assumed from the {layout.placement.value} rule: "
            f"{layout.launcher_name} exports no node index, and this process cannot check that every node runs "
            f"{layout.local_size} ranks as its own does.",
            "init_process_group needs only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which are exact. Where "
            "your program reads NODE_RANK, launch as many ranks on every node (Open MPI: `--map-by ppr:N:node`), or "
            "use the Lightning plugin, whose roll call makes the node rank exact.",
            variable=TORCH.node_rank,
            value=str(layout.node_rank),
            launcher=layout.launcher_name,
        )
    ]


def device_warnings(
    layout: RankLayout, env: Mapping[str, str], torch_version: tuple[int, ...] | None = None
) -> list[DeviceIndexWarning]:
    """A warning when ``LOCAL_RANK`` is not this rank's device index (the launcher bound GPUs per task).

    Scripts that call ``torch.cuda.set_device(int(os.environ[TORCH.local_rank]))`` then fail with "invalid device
    ordinal"; the warning names the index to use, by the rule of :func:`local_device_ids`, and how to pass it to
    ``init_process_group`` as ``device_id``. Under torch 2.15's ``nccl`` backend (``nccl2``), which binds
    ``LOCAL_RANK % visible devices`` without one, it also says which GPU that would be (``torch_version``: the
    installed torch's by default).
    """
    choice = own_device(visible_devices(env), local_rank=layout.local_rank, local_size=layout.local_size)
    if choice.basis is DeviceBasis.NONE or choice.index == layout.local_rank:
        return []
    device = f"index {choice.index} ({choice.basis.value})" if choice.index is not None else "not known here"
    index = "N" if choice.index is None else str(choice.index)
    torch_version = installed_torch() if torch_version is None else torch_version
    nccl2 = ""
    if nccl_is_nccl2(torch_version, env):
        bound = nccl2_device({TORCH.local_rank: str(layout.local_rank)}, layout.rank, len(choice.visible))
        if bound != choice.index:
            nccl2 = (
                f" torch {'.'.join(map(str, torch_version))}'s nccl backend (nccl2) binds cuda:{bound} "
                f"({TORCH.local_rank} % {len(choice.visible)}) unless init_process_group gets device_id."
            )
    return [
        DeviceIndexWarning(
            f"LOCAL_RANK={layout.local_rank} is not this rank's device: it sees {choice.seen()}, so its device is "
            f"{device} ({layout.launcher_name}).{nccl2}",
            "Choose the device with `lightning_mpi_env.jax_distributed_kwargs()['local_device_ids']` or the index "
            f"above, not with LOCAL_RANK, and pass it on: `torch.cuda.set_device({index})`, "
            f'`init_process_group("nccl", device_id=torch.device("cuda", {index}))` (docs/launchers.md, "torch 2.15"); '
            'under Lightning, `strategy="ddp_mpi"` chooses it and passes it.',
            variable=choice.variable or None,
            value=",".join(choice.visible),
            launcher=layout.launcher_name,
        )
    ]


def torchrun_args(env: Mapping[str, str] | None = None, *, nproc_per_node: int | str = 1) -> list[str]:
    """The rendezvous arguments for a job that starts one process per node, which then runs torchrun.

    The launcher's world becomes torchrun's nodes: ``--nnodes`` is the launcher's world size and ``--node_rank``
    its rank; ``nproc_per_node`` is torchrun's (a count, or ``gpu``/``cpu``/``auto``).

    Raises:
        LayoutError: If more than one process runs on this node, or the layout cannot be resolved.
    """
    layout, _ = _layout(env)
    if layout.local_size != 1:
        launcher = layout.launcher_name
        raise LayoutError(
            f"{launcher} started {layout.local_size} processes on this node "
            f"({layout.sources.get('local_size', 'local size')}={layout.local_size}), but torchrun-args needs "
            f"exactly one per node: torchrun itself starts the {nproc_per_node} worker(s) on each node.",
            "Start one process per node: Open MPI `mpirun -npernode 1` (or `--map-by ppr:1:node`), MPICH/Intel MPI "
            "`mpiexec -ppn 1`, Slurm `srun --ntasks-per-node=1`, Flux `flux run --tasks-per-node=1`.",
            variable=layout.sources.get("local_size"),
            value=str(layout.local_size),
            launcher=launcher,
        )
    if not _SAFE_WORD.match(layout.main_address):
        raise LayoutError(
            f"The main address {layout.main_address!r} (from {layout.sources.get('main_address')}) is not a plain "
            f"host name, so it cannot be passed through `$(lightning-mpi-env torchrun-args)` unquoted.",
            "Set MASTER_ADDR to the plain host name or IP address of the first node.",
            variable=layout.sources.get("main_address"),
            value=layout.main_address,
            launcher=layout.launcher_name,
        )
    return [
        f"--nnodes={layout.world_size}",
        f"--node_rank={layout.rank}",
        f"--nproc_per_node={nproc_per_node}",
        f"--master_addr={layout.main_address}",
        f"--master_port={layout.main_port}",
    ]


def local_device_ids(layout: RankLayout, env: Mapping[str, str]) -> list[int]:
    """The accelerator this rank drives, as an index into the devices it sees (by the rule of ``own_device``).

    Raises:
        LayoutError: If this process sees a subset of several devices that its own variables cannot place it in.
    """
    choice = own_device(visible_devices(env), local_rank=layout.local_rank, local_size=layout.local_size)
    if choice.basis is DeviceBasis.NONE:
        return [layout.local_rank]  # no device listed: JAX runs on the CPU, the index is unused
    if choice.index is None:
        raise unknown_device(
            choice, local_rank=layout.local_rank, local_size=layout.local_size, launcher=layout.launcher_name
        )
    return [choice.index]


def jax_distributed_kwargs(env: Mapping[str, str] | None = None) -> JaxDistributedKwargs:
    """Keyword arguments for ``jax.distributed.initialize(**jax_distributed_kwargs())`` under any launcher.

    JAX's own cluster detection misses Open MPI 5 (no ``OMPI_MCA_orte_hnp_uri``) and most schedulers' host lists;
    this resolves them like the Lightning plugin does. JAX is not imported.

    Raises:
        LayoutError: If the layout cannot be resolved or the visible devices do not fit the local ranks.
    """
    layout, environ = _layout(env)
    host = f"[{layout.main_address}]" if ":" in layout.main_address else layout.main_address  # IPv6 literal
    return JaxDistributedKwargs(
        coordinator_address=f"{host}:{layout.main_port}",
        num_processes=layout.world_size,
        process_id=layout.rank,
        local_device_ids=local_device_ids(layout, environ),
    )
