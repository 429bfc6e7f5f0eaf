"""Three generations of one process's group (``recovery.groups.Group``) on one store, as ``restartable`` takes them.

Generation 1: ranks 0, 1 and 2. Rank 2 then ends without a word (its connections close with it, as a killed
rank's do); the survivors' next collective fails on them, and they leave. Generation 2: ranks 0 and 1 alone.
Generation 3: a new process (role 3) joins as rank 2, as a replacement does. Each process writes what it saw of
each generation (whether the group was reconfigured, its identity, rank and size, and an all-reduce's sum) to
``<out>/<role>.json``.

Usage: ``group_generations.py <role 0-3> <port> <out>``; rank 0 serves the store and starts role 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_mpi_env.recovery.connections import GroupConnections, open_sockets
from lightning_mpi_env.recovery.groups import Group
from lightning_mpi_env.recovery.worlds import World

TIMEOUT = 60.0

role, port, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
store = dist.TCPStore(
    "127.0.0.1", port, is_master=role == 0, timeout=timedelta(seconds=TIMEOUT), wait_for_workers=False
)
group = Group(store, "gloo", TIMEOUT)
facts: list[dict] = []


def total(rank: int) -> float:
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    return float(x.item())


def generation(world: World, rank: int) -> GroupConnections:
    before = open_sockets()
    group.open(world, rank)
    connections = GroupConnections.opened_since(before, port)
    facts.append(
        {
            "generation": world.number,
            "reconfigured": group.reconfigurable,
            "group": id(dist.group.WORLD),
            "rank": dist.get_rank(),
            "size": dist.get_world_size(),
            "sum": total(rank),
        }
    )
    return connections


def finish() -> None:
    (out / f"{role}.json").write_text(json.dumps({"torch": torch.__version__, "facts": facts}))


if role == 3:  # the replacement: rank 2 of generation 3
    generation(World(3, (0, 1, 3), lost=()), 2)
    group.close()
    finish()
    store.set("done/3", "")
    sys.exit(0)

connections = generation(World(1, (0, 1, 2)), role)
if role == 2:
    finish()
    os._exit(0)  # no goodbye: its connections close with the process
try:
    total(role)
    raise AssertionError("an all-reduce with a peer gone went through")
except RuntimeError as error:
    group.leave(error, connections)
connections = generation(World(2, (0, 1), lost=(2,)), role)
replacement = subprocess.Popen([sys.executable, __file__, "3", str(port), str(out)]) if role == 0 else None
group.leave(RuntimeError("the world grows back"), connections)
generation(World(3, (0, 1, 3)), role)
group.close()
finish()
if replacement is not None:  # rank 0 serves the store until the others are done
    store.wait(["done/3"])
    replacement.wait(TIMEOUT)
