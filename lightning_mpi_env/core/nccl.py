"""torch 2.15's ``nccl`` backend and ``device_id``: which GPU a rank's communicator takes (standard library only).

In torch 2.15 ``init_process_group(backend="nccl")`` resolves to the in-tree ``nccl2`` backend
(pytorch/pytorch#192281; ``TORCH_DIST_USE_NCCL2=0`` or ``backend="nccl-legacy"`` roll it back). ``nccl2`` starts its
communicator at once, on the ``device_id`` given to ``init_process_group``; without one it takes, among the devices
the process sees, ``LOCAL_RANK % count`` where ``LOCAL_RANK`` is set, else ``global rank % count``
(``_nccl2_device`` in torch 2.15.0's ``torch/distributed/distributed_c10d.py``). Neither is the device a rank drives
under per-task binding (``srun --gpu-bind=closest``) or on nodes that run fewer ranks than they have GPUs. So
wherever this package chooses the device, it passes it as ``device_id``; where it cannot, it says so with these rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import as_count

NCCL2_SWITCH = "TORCH_DIST_USE_NCCL2"
"""torch 2.15's switch: ``0`` makes ``backend="nccl"`` the legacy ``ProcessGroupNCCL`` again (read when
``torch.distributed`` is imported)."""

NCCL_LEGACY = "nccl-legacy"
"""The backend name that keeps the legacy ``ProcessGroupNCCL`` in torch 2.15, whatever :data:`NCCL2_SWITCH` says."""

NCCL2_DEFAULT_SINCE = (2, 15)
"""The first torch whose ``backend="nccl"`` is ``nccl2`` (pytorch/pytorch#192281)."""

TORCH_DEVICE_ID_SINCE = (2, 3)
"""The first torch for which Lightning passes ``device_id`` (its ``_TORCH_GREATER_EQUAL_2_3``); we do the same."""

NCCL_BACKENDS = frozenset({"nccl", "nccl2"})
"""Backend names that reach ``nccl2`` in torch 2.15 (``"nccl"`` unless switched off)."""


def version_numbers(version: str) -> tuple[int, ...]:
    """``"2.15.0+cu132"`` as ``(2, 15, 0)``; ``()`` for anything else.

    >>> version_numbers("2.15.0+cu132"), version_numbers("2.13.0+cpu"), version_numbers("x")
    ((2, 15, 0), (2, 13, 0), ())
    """
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(part) for part in numbers.groups("0")) if numbers else ()


def installed_torch() -> tuple[int, ...]:
    """The installed torch's version as numbers, from its metadata (torch is not imported); ``()`` if none."""
    try:
        return version_numbers(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return ()


def nccl_is_nccl2(torch_version: tuple[int, ...], env: Mapping[str, str], backend: str | None = "nccl") -> bool:
    """Whether ``backend`` is torch 2.15's ``nccl2`` in a process with ``env``.

    >>> nccl_is_nccl2((2, 15, 0), {}), nccl_is_nccl2((2, 15, 0), {"TORCH_DIST_USE_NCCL2": "0"})
    (True, False)
    """
    if torch_version < NCCL2_DEFAULT_SINCE or backend not in NCCL_BACKENDS:
        return False
    return backend == "nccl2" or env.get(NCCL2_SWITCH) != "0"


def nccl2_device(env: Mapping[str, str], global_rank: int, device_count: int) -> int | None:
    """The device index ``nccl2`` takes when ``init_process_group`` gets no ``device_id``; ``None`` without GPUs.

    A ``LOCAL_RANK`` that is not a count (:func:`~lightning_mpi_env.core.values.as_count`) counts as unset.

    >>> nccl2_device({"LOCAL_RANK": "3"}, 7, 2), nccl2_device({}, 5, 4), nccl2_device({}, 5, 0)
    (1, 1, None)
    """
    if device_count <= 0:
        return None
    local = as_count(env.get(TORCH.local_rank, ""))  # bounded: a LOCAL_RANK of 5,000 digits is no count
    return (global_rank if local is None else local) % device_count


__all__ = [
    "NCCL2_DEFAULT_SINCE",
    "NCCL2_SWITCH",
    "NCCL_BACKENDS",
    "NCCL_LEGACY",
    "TORCH_DEVICE_ID_SINCE",
    "installed_torch",
    "nccl2_device",
    "nccl_is_nccl2",
    "version_numbers",
]
