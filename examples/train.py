"""A Lightning training script that runs under mpirun/mpiexec/srun with one extra line: the plugin.

    mpirun -np 8 --map-by ppr:4:node python examples/train.py --devices 4 --num-nodes 2

`--devices` x `--num-nodes` must match what the launcher started (the plugin says so at once if not). On CPUs the
script uses gloo; on GPUs, NCCL. Set `--namespace pytorch_lightning` to use the standalone package instead.
Prints one `RESULT {json}` line per rank.
"""

import argparse
import importlib
import json
import socket

import torch

from lightning_mpi_env import MPIClusterEnvironment

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--namespace", choices=["lightning.pytorch", "pytorch_lightning"], default="lightning.pytorch")
parser.add_argument("--devices", type=int, default=1)
parser.add_argument("--num-nodes", type=int, default=1)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
pl = importlib.import_module(args.namespace)


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(256, 8, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


gpus = torch.cuda.is_available()
trainer = pl.Trainer(
    accelerator="gpu" if gpus else "cpu",
    devices=args.devices,
    num_nodes=args.num_nodes,
    strategy=pl.strategies.DDPStrategy(process_group_backend="nccl" if gpus else "gloo"),
    plugins=[MPIClusterEnvironment()],  # ranks, node rank and main address from the launcher; no mpi4py
    max_epochs=args.epochs,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
torch.manual_seed(0)  # the same initial weights on every rank
model = Regression()
trainer.fit(model)
print(
    "RESULT "
    + json.dumps(
        {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "hostname": socket.gethostname(),
            "loss": round(float(trainer.callback_metrics["train_loss"]), 6),
            "weight_sum": round(float(model.layer.weight.detach().sum()), 6),
        }
    )
    + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
    end="",
    flush=True,
)
