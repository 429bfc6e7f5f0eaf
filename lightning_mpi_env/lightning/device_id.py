"""Warn where no ``device_id`` reaches ``init_process_group`` and ``nccl2`` would bind another GPU (the plugin only)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping

from lightning_mpi_env.core.errors import DeviceIdWarning
from lightning_mpi_env.core.namespaces import NAMESPACES
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import as_count
from lightning_mpi_env.gpu.nccl import NCCL2_SWITCH, NCCL_LEGACY, installed_torch, nccl2_device, nccl_is_nccl2
from lightning_mpi_env.lightning.compat import DEVICE_ID_SINCE, package_version

FIX = (
    'Use strategy="ddp_mpi", which passes the device it chose as device_id on every Lightning; or Lightning '
    ">= 2.5.5, whose own strategies pass device_id=root_device; or keep torch's legacy NCCL backend: "
    f"`export {NCCL2_SWITCH}=0` in the job script (read when torch.distributed is imported; `mpirun -x "
    f'{NCCL2_SWITCH}=0`), or the strategy\'s process_group_backend="{NCCL_LEGACY}".'
)


def unbound_device(
    *,
    lightning: tuple[int, ...],
    torch_version: tuple[int, ...],
    env: Mapping[str, str],
    global_rank: int,
    local_rank: int,
    device_count: int,
) -> DeviceIdWarning | None:
    """The warning for a rank whose ``nccl2`` communicator would not be on ``cuda:<local rank>``, else ``None``.

    >>> warning = unbound_device(lightning=(2, 1, 4), torch_version=(2, 15, 0), env={}, global_rank=2, local_rank=0,
    ...                          device_count=4)
    >>> warning.problem.split(", not")[0].split("(nccl2) ")[1]
    'will bind rank 2 (local rank 0) to cuda:2 (its global rank 2 % 4 GPU(s))'
    """
    if lightning >= DEVICE_ID_SINCE or device_count <= 0 or not nccl_is_nccl2(torch_version, env):
        return None
    bound = nccl2_device(env, global_rank, device_count)
    if bound is None or bound == local_rank:
        return None
    local = as_count(env.get(TORCH.local_rank, ""))  # what nccl2_device took: a count, else the global rank
    why = (
        f"{TORCH.local_rank}={local} % {device_count} GPU(s)"
        if local is not None
        else f"its global rank {global_rank} % {device_count} GPU(s)"
    )
    version = ".".join(map(str, lightning))
    return DeviceIdWarning(
        f"Lightning {version} calls init_process_group without device_id, and the nccl backend of torch "
        f"{'.'.join(map(str, torch_version))} (nccl2) will bind rank {global_rank} (local rank {local_rank}) to "
        f"cuda:{bound} ({why}), not to cuda:{local_rank}, the device Lightning sets up for it: its communicator "
        'then sits on another GPU than its model, or two ranks share one ("Duplicate GPU detected").',
        FIX,
        variable=TORCH.local_rank if local is not None else None,
        value=None if local is None else str(local),
    )


def lightning_in_use() -> tuple[int, ...]:
    """The oldest version among the Lightning namespaces imported so far (``()`` when none is)."""
    versions = [
        package_version(namespace.fabric)
        for namespace in NAMESPACES
        if namespace.fabric.partition(".")[0] in sys.modules
    ]
    return min((version for version in versions if version), default=())


def warn_unbound_device(global_rank: int, local_rank: int) -> None:
    """Warn (:func:`unbound_device`) right before Lightning's own strategy calls ``init_process_group``."""
    lightning = lightning_in_use()
    torch_version = installed_torch()
    if not lightning or lightning >= DEVICE_ID_SINCE or not nccl_is_nccl2(torch_version, os.environ):
        return  # before asking CUDA anything
    import torch

    warning = unbound_device(
        lightning=lightning,
        torch_version=torch_version,
        env=os.environ,
        global_rank=global_rank,
        local_rank=local_rank,
        device_count=torch.cuda.device_count(),
    )
    if warning is not None:
        warnings.warn(warning, stacklevel=3)
