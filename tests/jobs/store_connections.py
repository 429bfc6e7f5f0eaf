"""Rank 0 counts the connections its store server holds once ``"ddp_mpi"`` opened the process group (Fabric).

Usage: python store_connections.py. Rank 0 prints ``CONNECTIONS start=N training=M world=W``: N, the ranks'
connections to its store right after every rank opened the process group; M, the most it saw once every rank's
watchdog thread had begun (none with ``LIGHTNING_MPI_ENV_STALL_TIMEOUT=0`` and ``LIGHTNING_MPI_ENV_REQUEUE=0``).
Every rank prints ``DONE rank=R``.
"""

import contextlib
import os
import sys
import time

LIMIT = 120.0
"""Seconds rank 0 waits at most for the watchdogs' connections: only a hang takes longer."""


def server_connections(port):
    """This process's established sockets whose local port is ``port``: one per client of its store server."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") in inodes
    return count


def main():
    import torch
    from lightning.fabric import Fabric

    from lightning_mpi_env.fabric import MPIDDPStrategy

    fabric = Fabric(strategy=MPIDDPStrategy(), accelerator="cpu")
    fabric.launch()
    fabric.barrier()  # every rank opened the process group: its one client is connected
    world, port = fabric.world_size, fabric.strategy.cluster_environment.main_port
    if fabric.global_rank == 0:
        start = server_connections(port)
        training = start
        off = ("LIGHTNING_MPI_ENV_STALL_TIMEOUT", "LIGHTNING_MPI_ENV_REQUEUE")
        watched = any(os.environ.get(name) != "0" for name in off)
        deadline = time.monotonic() + LIMIT
        while watched and training < 2 * world and time.monotonic() < deadline:
            time.sleep(0.05)  # each rank's watchdog thread connects once it starts, right after the group opened
            training = max(training, server_connections(port))
        print(f"CONNECTIONS start={start} training={training} world={world}\n", end="", flush=True)
    total = fabric.all_reduce(torch.ones(1), reduce_op="sum")
    print(f"DONE rank={fabric.global_rank} total={total.item():g}\n", end="", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
