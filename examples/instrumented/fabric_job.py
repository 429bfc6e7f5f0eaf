"""An instrumented Lightning Fabric job: one JSON line per rank saying where it ran and what it trained on.

The Fabric counterpart of trainer_job.py. Run it under your launcher to check a cluster (unique ranks, node ranks
matching the hosts, disjoint data shards, a correct all_reduce, identical weights):
`mpirun -np 4 --map-by ppr:2:node python examples/instrumented/fabric_job.py --devices 2 --num-nodes 2`.
`--strategy ddp` is Lightning's DDP with `plugins=[MPIClusterEnvironment()]`; `--strategy ddp_mpi` is this
package's strategy. The tests run it on simulated nodes.
"""

import argparse
import importlib
import json
import os
import socket
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_mpi_env import MPIClusterEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tamper.py, beside this file
from tamper import stall_here, start_gate, step_seconds  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", choices=["lightning.fabric", "lightning_fabric"], default="lightning.fabric")
    parser.add_argument("--strategy", choices=["ddp", "ddp_mpi"], default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tag", help="ignored: marks the processes of one run")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in every training step (a long job)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader(num_workers=...)")
    parser.add_argument(
        "--slow-rank",
        metavar="RANK:FACTOR",
        help="that rank (or `all`) sleeps FACTOR times --step-seconds in each step: a straggler, or a slow job",
    )
    parser.add_argument("--steps", type=int, help="train this many steps, over as many epochs as it takes")
    parser.add_argument("--root-dir", help="where --save-every saves its checkpoints (fabric.save)")
    parser.add_argument("--save-every", type=int, default=0, help="fabric.save() every this many steps")
    parser.add_argument(
        "--slow-save",
        type=float,
        default=0.0,
        help="rank 0 takes this many seconds more to save each checkpoint, while the others wait in its barrier",
    )
    args = parser.parse_args()
    fabric_module = importlib.import_module(args.namespace)

    if args.strategy == "ddp_mpi":
        import lightning_mpi_env  # noqa: F401  (registers "ddp_mpi")

        plugins = []
    else:
        plugins = [MPIClusterEnvironment()]
    fabric = fabric_module.Fabric(
        accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy=args.strategy, plugins=plugins
    )
    start_gate()  # a test of the rendezvous waits here for the other ranks to finish their imports
    print(f"FIT pid={os.getpid()}\n", end="", flush=True)  # the start-up floor: any check in launch() comes later
    fabric.launch()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    # Sample i is (i, [i, i, i, i], 2 i); Fabric gives each rank its own shard (a DistributedSampler).
    index = torch.arange(args.samples)
    x = index.float().unsqueeze(1).repeat(1, 4)
    dataset = TensorDataset(index, x, x.sum(dim=1, keepdim=True) * 0.5)
    data = fabric.setup_dataloaders(DataLoader(dataset, batch_size=4, num_workers=args.workers))
    seen = []
    for step, (indices, batch_x, batch_y) in enumerate(batches(data, args.steps)):
        if not seen:
            print(f"FIRST_STEP rank={fabric.global_rank} time={time.time()!r} step=0\n", end="", flush=True)
        seen += indices.tolist()
        stall_here(fabric.global_rank, step)
        time.sleep(step_seconds(args, fabric.global_rank))
        loss = torch.nn.functional.mse_loss(model(batch_x) / 100, batch_y / 100)
        if plugins:  # with the plugin, the loop tells the stall watchdog it reached backward ("ddp_mpi" does itself)
            plugins[0].progress(step)
        fabric.backward(loss)
        if step == 0:  # "ddp_mpi" notes SIGTERM from the first backward on (lightning_mpi_env/rollcall/sigterm.py)
            print(f"FIRST_BACKWARD rank={fabric.global_rank}\n", end="", flush=True)
        optimizer.step()
        optimizer.zero_grad()
        if args.save_every and (step + 1) % args.save_every == 0:
            if fabric.global_rank == 0:
                print(f"CHECKPOINT rank=0 step={step + 1} for {args.slow_save} s\n", end="", flush=True)
                time.sleep(args.slow_save)
            fabric.save(os.path.join(args.root_dir, f"step-{step + 1}.ckpt"), {"model": model, "step": step + 1})
    rank_sum = fabric.all_reduce(torch.tensor(float(fabric.global_rank)), reduce_op="sum")
    print(
        "RESULT "
        + json.dumps(
            {
                "global_rank": fabric.global_rank,
                "local_rank": fabric.local_rank,
                "node_rank": fabric.node_rank,
                "world_size": fabric.world_size,
                "strategy": type(fabric.strategy).__name__,
                "ddp_module": next(c.__module__ for c in type(fabric.strategy).__mro__ if c.__name__ == "DDPStrategy"),
                "hostname": socket.gethostname(),
                "seen": seen,
                "rank_sum": float(rank_sum),
                "weights": [
                    round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
                ],
            }
        )
        + "\n",  # newline included: one write, so lines of ranks sharing stdout never merge
        end="",
        flush=True,
    )


def batches(data, steps):
    """The loader's batches: one epoch, or ``steps`` batches over as many epochs as they take."""
    if steps is None:
        yield from data
        return
    done = 0
    while True:
        for batch in data:
            yield batch
            done += 1
            if done == steps:
                return


if __name__ == "__main__":  # not when pytest imports it to look for doctests
    main()
