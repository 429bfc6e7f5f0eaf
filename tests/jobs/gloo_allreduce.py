"""One gloo all-reduce over torchrun's variables (as `lightning-mpi-env exec` exports them); prints one JSON line.

Usage: python gloo_allreduce.py
"""

import json
import os


def main():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    names = ("RANK", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    print(json.dumps({"sum": total.item(), **{name: os.environ.get(name) for name in names}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
