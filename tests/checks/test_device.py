"""The GPU check's comparison: the device the launch gave a rank against what torch sees (no GPU needed)."""

import pytest

from lightning_mpi_env.checks.device import TorchDevices, device_fault, torch_devices
from lightning_mpi_env.gpu.devices import DeviceBasis, DeviceChoice, PhysicalDevices

WHOLE_NODE = DeviceChoice(1, DeviceBasis.WHOLE_NODE, PhysicalDevices(4))
BOUND = DeviceChoice(0, DeviceBasis.ONLY_DEVICE, ("GPU-8c6f1a2b",), "CUDA_VISIBLE_DEVICES")
NONE_GIVEN = DeviceChoice(None, DeviceBasis.NONE, (), "CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize(
    ("choice", "seen", "expected"),
    [
        (WHOLE_NODE, TorchDevices(4, current=1), None),
        (WHOLE_NODE, TorchDevices(4, current=None), None),  # CUDA not set up yet: nothing to compare but the count
        (WHOLE_NODE, TorchDevices(4, current=0), "drives cuda:0, but the launch gave it cuda:1"),
        (WHOLE_NODE, TorchDevices(1, current=0), "sees 1 CUDA device(s), but the launch gave it cuda:1"),
        (WHOLE_NODE, TorchDevices(0), "sees no CUDA device, but the launch gave it cuda:1"),
        (BOUND, TorchDevices(1, current=0, uuid="8c6f1a2b-0000-1111"), None),
        (BOUND, TorchDevices(1, current=0, uuid="ffff0000-0000-1111"), "finds GPU-ffff0000-0000-1111 at cuda:0"),
        (BOUND, TorchDevices(1, current=0), None),  # torch says no UUID: nothing more to compare
        (NONE_GIVEN, TorchDevices(2, current=0), None),
    ],
)
def test_the_launch_s_device_against_torch_s_view(choice, seen, expected):
    fault = device_fault(choice, seen)
    if expected is None:
        assert fault is None
    else:
        assert fault is not None
        assert fault.startswith(expected), fault


def test_a_fault_names_the_variable_and_the_device_listed():
    fault = device_fault(BOUND, TorchDevices(0))
    assert (
        fault == "sees no CUDA device, but the launch gave it cuda:0 (CUDA_VISIBLE_DEVICES='GPU-8c6f1a2b', its "
        "device 'GPU-8c6f1a2b')"
    )


def test_torch_s_view_on_this_machine_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the view is the GPU's")
    assert torch_devices(0) == TorchDevices(0)
