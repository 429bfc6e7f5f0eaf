"""A Fabric job one rank of which may block before its first step, while the others wait for it in a collective.

Usage: python fabric_blocked.py --strategy ddp|ddp_mpi [--steps N] [--tag TAG]

Run under ``tamper.py --rank R --block setup``, rank R blocks for good, alive, where it would load its data, right
before ``fabric.setup``; the other ranks wait for it in DDP's first broadcast of the weights, before any progress
mark. ``--strategy ddp`` is Lightning's DDP with ``plugins=[MPIClusterEnvironment()]``, whose loop calls
``environment.progress(step)``; ``ddp_mpi`` marks progress in each ``fabric.backward()``. Each rank that finishes
prints ``DONE rank=R``.
"""

import argparse
import os
import socket
import sys

import torch
from lightning.fabric import Fabric

import lightning_mpi_env  # noqa: F401  (registers "ddp_mpi")
from lightning_mpi_env import MPIClusterEnvironment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "instrumented"))
from tamper import block_here, start_gate  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["ddp", "ddp_mpi"], default="ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--tag", help="ignored: marks the processes of one run")
    args = parser.parse_args()
    plugins = [MPIClusterEnvironment()] if args.strategy == "ddp" else []
    fabric = Fabric(
        accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=args.strategy, plugins=plugins
    )
    start_gate()  # the ranks start their roll call together, however unevenly their imports went
    fabric.launch()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    block_here("setup")  # loading this rank's data, say, from a file system that hangs
    model, optimizer = fabric.setup(model, optimizer)  # DDP broadcasts the weights: every rank waits for all
    for step in range(args.steps):
        loss = model(torch.ones(8, 4)).sum()
        if plugins:
            plugins[0].progress(step)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print(f"DONE rank={fabric.global_rank} host={socket.gethostname()}\n", end="", flush=True)


if __name__ == "__main__":
    main()
