"""A Lightning Trainer script for mpirun, mpiexec or srun that resumes from its checkpoint when its job is requeued.

    mpirun -np 8 --map-by ppr:4:node python examples/train.py   # 2 nodes x 4 GPUs
    srun python examples/train.py                                # in sbatch --nodes=2 --ntasks-per-node=4

The devices and the number of nodes come from the launch (`--devices` and `--num-nodes`, where given, are checked
against it). Under a scheduler that requeues (Slurm, PBS, LSF, Grid Engine), its warning signal before the time
limit makes every rank save an HPC checkpoint in the job's own folder, `runs/<job id>`, and puts the job back in the
queue; started again, the job resumes from that checkpoint (`ckpt_path=hpc_checkpoint(trainer)`). With the
standalone `pytorch_lightning` package, import from it and from `lightning_mpi_env.pytorch_lightning` instead.
Rank 0 prints the global step it trains from; every rank prints one `RESULT {json}` line at the end.
"""

import argparse
import json
import os
import socket

import torch
from lightning.pytorch import LightningModule, Trainer

from lightning_mpi_env.pytorch import MPIDDPStrategy, hpc_checkpoint

# The job's id (Slurm, PBS, LSF, Grid Engine), which a requeued job keeps: its checkpoints stay apart from others'.
JOB = next(
    (os.environ[name] for name in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID") if name in os.environ), "local"
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, help="processes per node (the launch's by default)")
parser.add_argument("--num-nodes", type=int, help="nodes (the launch's by default)")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--root-dir", default=os.path.join("runs", JOB), help="the job's checkpoints (runs/<job id>)")
args = parser.parse_args()


class Regression(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def on_train_start(self):
        self.first_global_step = self.global_step  # past 0 when resumed from a checkpoint
        self.print(f"training from global step {self.global_step}")  # rank 0 only

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


trainer = Trainer(
    strategy=MPIDDPStrategy(),  # ranks, nodes and the main address from the launcher; requeue on its signal
    devices=args.devices or "auto",
    num_nodes=args.num_nodes or 1,
    default_root_dir=args.root_dir,  # one folder per job
    max_epochs=args.epochs,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
torch.manual_seed(0)  # the same initial weights on every rank
model = Regression()
checkpoint = hpc_checkpoint(trainer)  # this job's own newest complete checkpoint; None on its first run
trainer.fit(model, ckpt_path=checkpoint)
print(
    "RESULT "
    + json.dumps(
        {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "hostname": socket.gethostname(),
            "resumed_from": checkpoint,
            "first_global_step": model.first_global_step,
            "global_step": trainer.global_step,
            "loss": round(float(trainer.callback_metrics["train_loss"]), 6),
            "weight_sum": round(float(model.layer.weight.detach().sum()), 6),
        }
    )
    + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
    end="",
    flush=True,
)
