"""A Lightning Fabric loop for mpirun, mpiexec or srun that checkpoints and resumes when its job is requeued.

    mpirun -np 4 --map-by ppr:2:node python examples/fabric_train.py   # 2 nodes x 2 GPUs
    TRAIN="python examples/fabric_train.py" sbatch examples/jobs/slurm_srun.sbatch

The devices and the number of nodes come from the launch (`--devices` and `--num-nodes`, where given, are checked
against it). Fabric has no loop of its own to stop, so after each step the loop asks the environment whether the
scheduler's warning signal came (`requeue_requested`); then it saves and the job goes back in the queue
(`requeue_now`). It also saves every `--save-every` steps, for a job that ends without warning. Started again, it
resumes from the newest checkpoint in the job's own folder, `runs/<job id>`. With the standalone `lightning_fabric`
package, import from it and from `lightning_mpi_env.lightning_fabric` instead. Rank 0 prints each save and the step it
resumes from; every rank prints one `RESULT {json}` line at the end.
"""

import argparse
import json
import os
import socket

import torch
from lightning.fabric import Fabric

from lightning_mpi_env.fabric import MPIDDPStrategy

# The job's id (Slurm, PBS, LSF, Grid Engine), which a requeued job keeps: its checkpoints stay apart from others'.
JOB = next(
    (os.environ[name] for name in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID") if name in os.environ), "local"
)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--devices", type=int, help="processes per node (the launch's by default)")
parser.add_argument("--num-nodes", type=int, help="nodes (the launch's by default)")
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--save-every", type=int, default=50)
parser.add_argument("--root-dir", default=os.path.join("runs", JOB), help="the job's checkpoints (runs/<job id>)")
args = parser.parse_args()

fabric = Fabric(strategy=MPIDDPStrategy(), devices=args.devices or "auto", num_nodes=args.num_nodes or 1)
environment = fabric.strategy.cluster_environment  # the MPIClusterEnvironment: the scheduler's signal and requeue
fabric.launch()

torch.manual_seed(0)  # the same initial weights on every rank
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = fabric.setup(model, optimizer)
state = {"model": model, "optimizer": optimizer, "step": 0}


def save():
    path = os.path.join(args.root_dir, f"step-{state['step']:09d}.ckpt")  # names sort by step
    fabric.save(path + ".tmp", state)  # rank 0 writes, every rank waits for it
    if fabric.global_rank == 0:
        os.replace(path + ".tmp", path)  # whole or not at all: a save cut off is never resumed
        print(f"saved {path}", flush=True)


os.makedirs(args.root_dir, exist_ok=True)
saved = sorted(name for name in os.listdir(args.root_dir) if name.endswith(".ckpt"))
resumed_from = os.path.join(args.root_dir, saved[-1]) if saved else None
if resumed_from:
    fabric.load(resumed_from, state)  # the model's and optimizer's state, and the step
    if fabric.global_rank == 0:
        print(f"resuming from {resumed_from} at step {state['step']}", flush=True)
first_step = state["step"]
for step in range(first_step, args.steps):
    generator = torch.Generator().manual_seed(step * fabric.world_size + fabric.global_rank)  # this rank's batch
    x = torch.randn(16, 8, generator=generator).to(fabric.device)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    fabric.backward(loss)
    optimizer.step()
    state["step"] = step + 1
    if environment.requeue_requested(fabric):  # every rank asks after every step
        save()
        environment.requeue_now(fabric)  # rank 0 puts the job back in the queue; every rank exits
    if state["step"] % args.save_every == 0:
        save()

print(
    "RESULT "
    + json.dumps(
        {
            "global_rank": fabric.global_rank,
            "local_rank": fabric.local_rank,
            "node_rank": fabric.node_rank,
            "world_size": fabric.world_size,
            "hostname": socket.gethostname(),
            "resumed_from": resumed_from,
            "first_step": first_step,
            "step": state["step"],
            "weight_sum": round(float(model.weight.detach().sum()), 6),
        }
    )
    + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
    end="",
    flush=True,
)
