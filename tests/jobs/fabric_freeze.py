"""A Fabric loop on every rank of a real launch, one rank of which freezes itself (SIGSTOP) at a given step.

Usage: python fabric_freeze.py --strategy ddp|ddp_mpi --freeze RANK:STEP [--steps N] [--tag TAG]

``--strategy ddp`` is Lightning's DDP with ``plugins=[MPIClusterEnvironment()]`` and a loop that never calls
``environment.progress(step)``: the stall watchdog sees no progress marks at all. ``ddp_mpi`` marks progress in
each ``fabric.backward()``. The launcher's own rank variable is not read here: Fabric's global rank is, so the same
script runs under ``mpirun`` and ``srun``. Rank 0 prints ``JOB id=...`` (the Slurm job and step, where there is one);
the frozen rank prints ``FREEZE rank=R step=S time=T`` (wall clock) right before it stops itself; with
``--freeze-once FILE`` only the first run that gets there does (a node fault that a relaunch leaves behind). Each
rank that finishes prints ``DONE rank=R host=H``.
"""

import argparse
import os
import signal
import socket
import sys
import time

import torch
from lightning.fabric import Fabric

import lightning_mpi_env  # noqa: F401  (registers "ddp_mpi")
from lightning_mpi_env import MPIClusterEnvironment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "instrumented"))
from tamper import first_time  # noqa: E402  (the one "fault only the first time" marker, trainer_job.py's too)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["ddp", "ddp_mpi"], default="ddp")
    parser.add_argument("--freeze", required=True, help="RANK:STEP")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--tag", help="ignored: marks the processes of one run")
    parser.add_argument("--freeze-once", help="a file: freeze only if it does not exist yet, and make it (one fault)")
    parser.add_argument(
        "--checkpoint",
        help="the loop's own checkpoint (docs/preemption.md, Fabric): loaded where it exists, saved each --every steps",
    )
    parser.add_argument("--every", type=int, default=5, help="steps between two saves of --checkpoint")
    args = parser.parse_args()
    frozen_rank, frozen_step = (int(part) for part in args.freeze.split(":"))
    plugins = [MPIClusterEnvironment()] if args.strategy == "ddp" else []
    fabric = Fabric(
        accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=args.strategy, plugins=plugins
    )
    fabric.launch()
    if fabric.global_rank == 0:
        step_id = f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"
        print(f"JOB id={step_id}\n", end="", flush=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if args.checkpoint and os.path.exists(args.checkpoint):
        fabric.load(args.checkpoint, state)  # a relaunched step goes on from the loop's last save
    first = state["step"]
    print(f"START rank={fabric.global_rank} step={first} time={time.time()!r}\n", end="", flush=True)
    for step in range(first, args.steps):
        if fabric.global_rank == frozen_rank and step == frozen_step and first_time(args.freeze_once):
            print(f"FREEZE rank={frozen_rank} step={step} time={time.time()!r}\n", end="", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = model(torch.ones(8, 4)).sum()
        fabric.backward(loss)  # no environment.progress(step) here, ever
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.05)
        if args.checkpoint and (step + 1) % args.every == 0:
            state["step"] = step + 1
            fabric.save(args.checkpoint + ".tmp", state)
            fabric.barrier()
            if fabric.global_rank == 0:
                os.replace(args.checkpoint + ".tmp", args.checkpoint)  # whole or not at all
    print(f"DONE rank={fabric.global_rank} host={socket.gethostname()} first={first}\n", end="", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
