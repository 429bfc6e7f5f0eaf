"""Under mpirun: the device "ddp_mpi" gives this rank when the launcher binds GPUs per task; one JSON line.

Usage: python bound_device.py LIST_FOR_LOCAL_RANK_0 LIST_FOR_LOCAL_RANK_1 ...

No GPU here: the task's CUDA_VISIBLE_DEVICES is set from the lists first thing, as a launcher's wrapper script does
(ALCF's set_affinity_gpu_polaris.sh), and the accelerator's device count is injected; no CUDA is set up.
"""

import json
import os
import socket
import sys


def main():
    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[1 + local_rank]

    import torch
    from lightning.pytorch.accelerators import CUDAAccelerator

    from lightning_mpi_env import MPIClusterEnvironment
    from lightning_mpi_env.lightning.strategy import strategy_class

    class VisibleGPUs(CUDAAccelerator):
        @staticmethod
        def auto_device_count():
            return len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))

    environment = MPIClusterEnvironment(rendezvous_timeout=60, stall_timeout=0)
    strategy = strategy_class("lightning.pytorch")(cluster_environment=environment)
    strategy.accelerator = VisibleGPUs()
    count = VisibleGPUs.auto_device_count()
    strategy.parallel_devices = [torch.device("cuda", index) for index in range(count)]  # as devices="auto" does
    outcome = {
        "rank": environment.global_rank(),
        "host": socket.gethostname(),
        "local_rank": local_rank,
        "device": str(strategy.root_device),
        "devices": len(strategy.parallel_devices),
    }
    # What Lightning does next: init_process_group on the roll call's store (rank 0 serves it until all joined).
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = environment.main_address, str(environment.main_port)
    torch.distributed.init_process_group("gloo", rank=environment.global_rank(), world_size=environment.world_size())
    torch.distributed.barrier()
    print("RESULT " + json.dumps(outcome) + "\n", end="", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
