"""A plain PyTorch DDP script with no launcher-specific code: it reads RANK, WORLD_SIZE, MASTER_ADDR, ... only.

Run it under MPI through `lightning-mpi-env exec`, which exports those variables from the launcher's own:

    mpirun -np 4 lightning-mpi-env exec -- python examples/ddp_plain.py

or once per node under torchrun (see torchrun_per_node.sh). Prints one `RESULT {json}` line per process.
"""

import json
import os
import socket
import time

import torch
import torch.distributed as dist

# NCCL on GPUs, gloo on CPUs; `init_process_group` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://).
backend = "nccl" if torch.cuda.is_available() else "gloo"
if backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
rank, world_size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")

model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.full((8, 4), float(rank), device=device)
loss = model(x).pow(2).mean()
loss.backward()
optimizer.step()

# Sum of all ranks: world_size * (world_size - 1) / 2 when every rank joined.
total = torch.tensor([float(rank)], device=device)
dist.all_reduce(total)
print(
    "RESULT "
    + json.dumps(
        {
            "rank": rank,
            "world_size": world_size,
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "-1"))),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "hostname": socket.gethostname(),
            "all_reduce": total.item(),
        }
    )
    + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
    end="",
    flush=True,
)
# On CPUs (gloo), give gloo's worker threads the GIL before the interpreter ends: the last collective's work object
# is freed there, and a worker that takes the GIL only during finalization aborts the finished rank ("terminate
# called without an active exception", status 134; pytorch/pytorch#190489). The Lightning plugin does this itself.
time.sleep(0.05)
dist.destroy_process_group()
