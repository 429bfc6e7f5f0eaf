"""What this process can say about its software and device, for its claim in the roll call (imports torch)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
from typing import Any

from lightning_mpi_env.core.devices import seen_devices


def _cuda_device_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def visible_set(
    environ: Mapping[str, str], device_count: Callable[[], int] = _cuda_device_count
) -> tuple[str, tuple[str, ...]]:
    """The variable listing this process's accelerators (``""`` when unset) and their identifiers.

    The rule is :func:`~lightning_mpi_env.core.devices.seen_devices` (CUDA's, ROCm's and HIP's variables); unset,
    the process sees every device of the node, ``n`` from ``device_count`` (torch's CUDA count by default, which
    creates no CUDA context).

    >>> visible_set({"CUDA_VISIBLE_DEVICES": "2,3"})
    ('CUDA_VISIBLE_DEVICES', ('2', '3'))
    >>> visible_set({}, device_count=lambda: 2)
    ('', ('0', '1'))
    """
    return seen_devices(environ, device_count())


def local_facts(
    backend: str | None = None,
    *,
    accelerator: str = "",
    device_index: int | None = None,
    environ: Mapping[str, str] | None = None,
    device_count: Callable[[], int] = _cuda_device_count,
) -> dict[str, Any]:
    """What this process can say about its software and device, for :meth:`Claim.here`.

    Args:
        backend: The process group backend, when the strategy states it; else the default for the device.
        accelerator: The device type the strategy will drive (``"cuda"``), when it says so before setting it up.
        device_index: The index into its visible set the strategy chose; else the current CUDA device, once set.
        environ: The environment to read the visible devices from; ``os.environ`` by default.
        device_count: Devices this process sees when no variable restricts them (injected by the tests).
    """
    versions = {"python": platform.python_version()}
    for name in ("torch", "lightning", "pytorch_lightning", "lightning_mpi_env"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            versions[name] = version
    import torch

    env = os.environ if environ is None else environ
    device, device_id, visible = "", "", None
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # the strategy set the device up already (Lightning 2.2+)
            index = torch.cuda.current_device()
            device = f"cuda:{index}"
            device_id = _gpu_id(torch, index, env)
    else:
        visible, device = 0, "cpu"
    if backend is None and device:
        backend = "nccl" if device.startswith("cuda") else "gloo"
    devices: dict[str, Any] = {}
    if accelerator == "cuda" or device.startswith("cuda"):  # ROCm's devices are "cuda" in torch too
        variable, identifiers = visible_set(env, device_count)
        if device_index is None and device.startswith("cuda"):
            device_index = int(device.partition(":")[2] or 0)
        devices = {"visible_set": identifiers, "visible_variable": variable, "device_index": device_index}
    return {
        **devices,
        "versions": versions,
        "backend": backend or "",
        "device": device,
        "device_id": device_id,
        "visible_devices": visible,
    }


def _gpu_id(torch: Any, index: int, environ: Mapping[str, str]) -> str:
    """The GPU's UUID; else its identifier in the visible list (the devices rule's, not CUDA's alone)."""
    properties = torch.cuda.get_device_properties(index)
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        return str(uuid)
    _, listed = seen_devices(environ, index + 1)
    return listed[index] if index < len(listed) else str(index)


__all__ = ["local_facts"]
