"""Lightning's ``CUDAAccelerator`` on the CPU, for the strategies that take no other accelerator.

Lightning's ``DeepSpeedStrategy`` (``setup_environment`` checks ``isinstance``) and a Trainer's ``FSDPStrategy`` (the
accelerator connector refuses ``accelerator="cpu"``) need it, and this machine has no GPU. A subclass of Lightning's
public ``CUDAAccelerator`` whose devices are CPUs is the public way to hand the Trainer an accelerator of one's own;
the strategies then run on gloo.
"""

import importlib

import torch


def cpu_as_cuda(package: str) -> type:
    """The accelerator class for Lightning's ``package`` (``lightning.pytorch`` or ``pytorch_lightning``)."""
    accelerators = importlib.import_module(package + ".accelerators")

    class CPUAsCUDA(accelerators.CUDAAccelerator):
        """Lightning's CUDA accelerator on the CPU (see the module docstring)."""

        def setup_device(self, device):
            pass  # torch.cuda.set_device: no CUDA here

        def setup(self, trainer):
            pass  # CUDA flags and memory stats

        def teardown(self):
            pass

        @staticmethod
        def parse_devices(devices):
            return list(range(int(devices)))

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("cpu", index) for index in devices]

        @staticmethod
        def auto_device_count():
            return 1

        @staticmethod
        def is_available():
            return True

    return CPUAsCUDA
