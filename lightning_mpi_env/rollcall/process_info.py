"""What this process says about its software and device in its roll call claim (imports torch when asked)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping
from typing import Any

from lightning_mpi_env.gpu.devices import seen_devices


def _cuda_device_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def process_info(
    backend: str | None = None,
    *,
    accelerator: str = "",
    device_index: int | None = None,
    environ: Mapping[str, str] | None = None,
    device_count: Callable[[], int] = _cuda_device_count,
) -> dict[str, Any]:
    """What this process can say about its software and device, for :meth:`Claim.here`.

    ``backend``, ``accelerator`` (``"cuda"``) and ``device_index`` are what the strategy states before it sets the
    device up; else the device's default backend and the current CUDA device, once set. ``device_count`` counts the
    devices seen when no variable of ``environ`` (``os.environ`` by default) restricts them.
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
        # Unset, the process sees every device of the node (torch's count creates no CUDA context).
        variable, identifiers = seen_devices(env, device_count())
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
