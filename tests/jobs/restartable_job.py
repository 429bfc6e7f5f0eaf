"""A plain PyTorch DDP job under ``lightning_mpi_env.restartable``, shaped like a user's: a ``DataLoader`` with a
worker, momentum SGD, the model and optimizer state kept after each step. One rank can SIGKILL or SIGSTOP itself.

Every item of the data is a pure function of its index, and each step takes the next ``world_size * BATCH`` items
(rank ``r`` the ``r``-th slice), so the test can compute the weights a job that shrank at a given step must end with.
Each process leaves ``started-<launch rank>-<pid>`` in ``--out`` as it starts (a replacement: the rank it replaces);
each rank writes ``rank-<launch rank>.json`` there at the end: its process id and node, the world size of each step
it finished, when each part of the recovery ended and when it finished the first step after it, and its final
weights; the rank that kills or stops itself writes when, to ``fault``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_mpi_env import Generation, from_env, restartable
from lightning_mpi_env.core.settings import REPLACES
from lightning_mpi_env.recovery.replacement import read_joining

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "instrumented"))
from tamper import first_time  # noqa: E402  (the one "fault only the first time" marker)

BATCH = 4
FEATURES = 3
LR = 0.05
MOMENTUM = 0.9


def item(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([math.sin(index * (k + 1) * 0.37) for k in range(FEATURES)], dtype=torch.float64)
    y = torch.tensor([math.cos(index * 0.11) + 0.5 * x.sum().item()], dtype=torch.float64)
    return x, y


class Items(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return item(index)


def model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1, dtype=torch.float64)


def resume(generation: Generation) -> tuple[torch.nn.Linear, torch.optim.SGD, int, int]:
    """The model, the optimizer, the step and the item position: fresh, or as the generation resumed them."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    step, position = 0, 0
    if generation.resumed is not None:
        net.load_state_dict(generation.resumed["model"])
        optimizer.load_state_dict(generation.resumed["optimizer"])
        step, position = generation.resumed["step"], generation.resumed["position"]
    return net, optimizer, step, position


def weights(net: torch.nn.Module) -> list[float]:
    return [float(v) for v in torch.cat([p.detach().flatten() for p in net.parameters()])]


def batches(position: int, size: int, rank: int, steps: int) -> list[list[int]]:
    """Rank ``rank``'s items for each of ``steps`` steps from item ``position``, in a world of ``size``."""
    return [
        list(range(position + (s * size + rank) * BATCH, position + (s * size + rank + 1) * BATCH))
        for s in range(steps)
    ]


def fault_now(args: argparse.Namespace, launch_rank: int, step: int) -> None:
    """The faulty rank kills or stops itself before step ``--fault-step``, saying when in ``fault`` (its replacement,
    which does that step again, does not)."""
    if (
        launch_rank == args.fault_rank
        and step == args.fault_step
        and REPLACES not in os.environ
        and first_time(args.fault_once)
    ):
        (args.out / "fault").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP if args.freeze else signal.SIGKILL)


def parser() -> argparse.ArgumentParser:
    arguments = argparse.ArgumentParser()
    arguments.add_argument("--out", type=Path, required=True)
    arguments.add_argument("--steps", type=int, default=20)
    arguments.add_argument("--fault-rank", type=int, default=-1)
    arguments.add_argument("--fault-step", type=int, default=-1)
    arguments.add_argument("--shrink", action="store_true")
    arguments.add_argument("--freeze", action="store_true", help="the faulty rank stops (SIGSTOP) instead of dying")
    arguments.add_argument(
        "--replacement-start", type=float, default=0.0, help="seconds a replacement sleeps first: a slow node's start"
    )
    arguments.add_argument(
        "--fault-once", help="a file: the fault happens only where it makes it (not after a relaunch)"
    )
    arguments.add_argument("--swallow", action="store_true", help="each step's error is caught, and the loop goes on")
    arguments.add_argument("--replacement-fails-once", help="a file: only the replacement that makes it exits 3 first")
    arguments.add_argument(
        "--replacement-freezes-rank-0",
        action="store_true",
        help="the replacement stops (SIGSTOP) rank 0's process as it starts: rank 0 freezes while the survivors wait",
    )
    return arguments


def start_as_replacement(args: argparse.Namespace) -> None:
    """A replacement's start, as slow or as failed as the test asks (before ``restartable``, as imports are)."""
    if REPLACES not in os.environ:
        return
    if args.replacement_fails_once is not None and first_time(args.replacement_fails_once):
        raise SystemExit(3)
    if args.replacement_freezes_rank_0:  # the simulated nodes share this machine's processes
        (rank_0,) = args.out.glob("started-0-*")
        os.kill(int(rank_0.name.rsplit("-", 1)[1]), signal.SIGSTOP)
        (args.out / "froze-rank-0").touch()
    time.sleep(args.replacement_start)


def this_launch_rank() -> int:
    """The launch rank this process has, or replaces (a replacement's launcher sees a step of one task)."""
    joining = read_joining(os.environ)
    return joining.rank if joining is not None else from_env(os.environ).rank


def finish(args: argparse.Namespace, launch_rank: int, record: dict) -> None:
    record["pid"], record["node"] = os.getpid(), socket.gethostname()
    record["torch"] = torch.__version__.split("+")[0]
    (args.out / f"rank-{launch_rank}.json").write_text(json.dumps(record))


def main(args: argparse.Namespace, launch_rank: int, record: dict) -> None:
    def train(generation: Generation) -> None:
        net, optimizer, step, position = resume(generation)
        record["generations"].append([generation.number, generation.rank, generation.world_size, step])
        record.setdefault("reconfigured", []).append(generation.reconfigured)
        if generation.recovered:
            record["recovered"] = generation.recovered
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        size, rank = generation.world_size, generation.rank
        sampler = batches(position, size, rank, args.steps - step)
        for x, y in DataLoader(Items(), batch_sampler=sampler, num_workers=1):
            fault_now(args, launch_rank, step)
            optimizer.zero_grad()
            try:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                optimizer.step()
            except RuntimeError:  # --swallow: a program that catches a step's error and goes on
                if not args.swallow:
                    raise
                print(f"SWALLOWED rank={launch_rank} step={step}", flush=True)
            step, position = step + 1, position + size * BATCH
            record["worlds"].append(size)
            if generation.number > 1 and "recovered_at" not in record:
                record["recovered_at"] = time.time()  # the first step done after the recovery
            generation.keep(
                {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "position": position}
            )
        record["weights"] = weights(net)

    restartable(train, shrink=args.shrink)


if __name__ == "__main__":
    arguments = parser().parse_args()
    launch_rank = this_launch_rank()
    (arguments.out / f"started-{launch_rank}-{os.getpid()}").touch()  # one file per process that ever started
    start_as_replacement(arguments)
    record: dict = {"generations": [], "worlds": []}
    main(arguments, launch_rank, record)
    finish(arguments, launch_rank, record)
