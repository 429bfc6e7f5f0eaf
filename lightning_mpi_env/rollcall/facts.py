"""What this process can say about its software and device, for its claim in the roll call (imports torch)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def local_facts(backend: str | None = None) -> dict[str, Any]:
    """What this process can say about its software and device, for :meth:`Claim.here`.

    Args:
        backend: The process group backend, when the strategy states it; else the default for the device.
    """
    versions = {"python": platform.python_version()}
    for name in ("torch", "lightning", "pytorch_lightning", "lightning_mpi_env"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            versions[name] = version
    import torch

    device, device_id, visible = "", "", None
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # the strategy set the device up already (Lightning 2.2+)
            index = torch.cuda.current_device()
            device = f"cuda:{index}"
            device_id = _gpu_id(torch, index)
    else:
        visible, device = 0, "cpu"
    if backend is None and device:
        backend = "nccl" if device.startswith("cuda") else "gloo"
    return {
        "versions": versions,
        "backend": backend or "",
        "device": device,
        "device_id": device_id,
        "visible_devices": visible,
    }


def _gpu_id(torch: Any, index: int) -> str:
    properties = torch.cuda.get_device_properties(index)
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        return str(uuid)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    listed = [item.strip() for item in visible.split(",") if item.strip()]
    return listed[index] if index < len(listed) else str(index)


__all__ = ["local_facts"]
