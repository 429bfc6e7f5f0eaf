"""Lightning Fabric under mpirun/mpiexec/srun: the same plugin, passed to Fabric.

    mpirun -np 4 --map-by ppr:2:node python examples/fabric_train.py --devices 2 --num-nodes 2

Prints one `RESULT {json}` line per rank.
"""

import argparse
import json
import socket

import torch
from lightning.fabric import Fabric

from lightning_mpi_env import MPIClusterEnvironment

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--num-nodes", type=int, default=1)
args = parser.parse_args()

gpus = torch.cuda.is_available()
fabric = Fabric(
    accelerator="gpu" if gpus else "cpu",
    devices=args.devices,
    num_nodes=args.num_nodes,
    strategy="ddp",
    plugins=[MPIClusterEnvironment()],
)
fabric.launch()

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = fabric.setup(model, optimizer)
x = torch.randn(16, 8, device=fabric.device) + fabric.global_rank
loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
fabric.backward(loss)
optimizer.step()
total = fabric.all_reduce(torch.tensor(float(fabric.global_rank), device=fabric.device), reduce_op="sum")
print(
    "RESULT "
    + json.dumps(
        {
            "global_rank": fabric.global_rank,
            "local_rank": fabric.local_rank,
            "node_rank": fabric.node_rank,
            "world_size": fabric.world_size,
            "hostname": socket.gethostname(),
            "all_reduce": float(total),
        }
    )
    + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
    end="",
    flush=True,
)
