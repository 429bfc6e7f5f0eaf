"""Whether a rank sees the GPU the launch gave it: the launch's choice (``gpu/devices.py``) against torch's view."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_mpi_env.gpu.devices import DeviceChoice

DEVICE_HINT = (
    'Use strategy="ddp_mpi", which drives the device the launch gave each rank; and leave CUDA_VISIBLE_DEVICES as '
    "the launcher set it in the job script (bind one GPU per task with `srun --gpus-per-task=1`, or show each rank "
    "all of the node's GPUs)."
)


@dataclass(frozen=True)
class TorchDevices:
    """What torch sees on this rank."""

    count: int
    """CUDA devices torch sees (0: none, or no CUDA)."""
    current: int | None = None
    """The device this rank drives (``torch.cuda.current_device()``), ``None`` before CUDA is set up."""
    uuid: str = ""
    """The UUID of the device at the launch's index, where torch says it; else ``""``."""


def device_fault(choice: DeviceChoice, seen: TorchDevices) -> str | None:
    """What differs between the device the launch gave this rank and what torch sees; ``None`` where they agree.

    Nothing is compared where the launch gave no device (``choice.index`` is ``None``: the roll call says why).

    >>> from lightning_mpi_env.gpu.devices import DeviceBasis
    >>> choice = DeviceChoice(1, DeviceBasis.WHOLE_NODE, ("0", "1"), "CUDA_VISIBLE_DEVICES")
    >>> device_fault(choice, TorchDevices(2, current=1)) is None
    True
    >>> device_fault(choice, TorchDevices(2, current=0))
    "drives cuda:0, but the launch gave it cuda:1 (CUDA_VISIBLE_DEVICES='0,1', its device '1')"
    """
    index = choice.index
    if index is None:
        return None
    given = f"cuda:{index} ({choice.seen()}, its device {choice.device_id!r})"
    if seen.count == 0:
        return f"sees no CUDA device, but the launch gave it {given}"
    if index >= seen.count:
        return f"sees {seen.count} CUDA device(s), but the launch gave it {given}"
    if seen.current is not None and seen.current != index:
        return f"drives cuda:{seen.current}, but the launch gave it {given}"
    listed = choice.device_id
    if seen.uuid and listed.startswith("GPU-") and not seen.uuid.startswith(listed.removeprefix("GPU-")):
        return f"finds GPU-{seen.uuid} at cuda:{index}, but the launch gave it {listed} ({choice.seen()})"
    return None


def torch_devices(index: int) -> TorchDevices:
    """What torch sees on this rank, the UUID of the device at ``index`` with it (imports torch)."""
    import torch

    if not torch.cuda.is_available():
        return TorchDevices(0)
    count = int(torch.cuda.device_count())
    current = int(torch.cuda.current_device()) if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]
    uuid = ""
    if 0 <= index < count:
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    return TorchDevices(count, current, uuid)
