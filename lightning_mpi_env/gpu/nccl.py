"""torch 2.15's ``nccl`` backend and ``device_id``: which GPU a rank's communicator takes (standard library only).

In torch 2.15 ``backend="nccl"`` is ``nccl2`` (pytorch/pytorch#192281), which without a ``device_id`` takes
``LOCAL_RANK``, else the rank, ``% count`` (``_nccl2_device``): wrong under per-task binding, so we pass one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import as_count

NCCL2_SWITCH = "TORCH_DIST_USE_NCCL2"
"""torch 2.15's switch: ``0`` makes ``backend="nccl"`` the legacy ``ProcessGroupNCCL`` again (read at import)."""

NCCL_LEGACY = "nccl-legacy"
"""The backend name that keeps the legacy ``ProcessGroupNCCL`` in torch 2.15, whatever :data:`NCCL2_SWITCH` says."""

NCCL2_DEFAULT_SINCE = (2, 15)

TORCH_DEVICE_ID_SINCE = (2, 3)
"""The first torch for which Lightning passes ``device_id`` (its ``_TORCH_GREATER_EQUAL_2_3``); we do the same."""

NCCL_BACKENDS = frozenset({"nccl", "nccl2"})
"""Backend names that reach ``nccl2`` in torch 2.15 (``"nccl"`` unless switched off)."""


def version_numbers(version: str) -> tuple[int, ...]:
    """``"2.15.0+cu132"`` as ``(2, 15, 0)``; ``()`` for anything else."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(part) for part in numbers.groups("0")) if numbers else ()


def installed_torch() -> tuple[int, ...]:
    """The installed torch's version as numbers, from its metadata (torch is not imported); ``()`` if none."""
    try:
        return version_numbers(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return ()


def nccl_is_nccl2(torch_version: tuple[int, ...], env: Mapping[str, str], backend: str | None = "nccl") -> bool:
    """Whether ``backend`` is torch 2.15's ``nccl2`` in a process with ``env``."""
    if torch_version < NCCL2_DEFAULT_SINCE or backend not in NCCL_BACKENDS:
        return False
    return backend == "nccl2" or env.get(NCCL2_SWITCH) != "0"


def nccl2_device(env: Mapping[str, str], global_rank: int, device_count: int) -> int | None:
    """The device index ``nccl2`` takes without a ``device_id``; ``None`` without GPUs (a bad ``LOCAL_RANK``: unset)."""
    if device_count <= 0:
        return None
    local = as_count(env.get(TORCH.local_rank, ""))  # bounded: a LOCAL_RANK of 5,000 digits is no count
    return (global_rank if local is None else local) % device_count
