"""Fault injection under mpirun or srun (tests, benchmarks): tamper one rank's environment, then run the command.

Usage: python tamper.py [--rank R (--claim C | --world-size N | --exit | --never-start | --stall S:HOW |
--block PLACE)] [--torch-env] -- COMMAND...

On the process whose launcher rank is R (Open MPI's ``OMPI_COMM_WORLD_RANK``, else srun's ``SLURM_PROCID``),
``--claim C`` makes it claim rank C (a duplicate), ``--world-size N`` makes it claim a job of N ranks (a rank that
disagrees with the others), and ``--exit`` makes it exit with status 0 before anything starts (a rank that never
arrives, while the launcher waits for the others), ``--never-start`` makes it sleep, alive, instead (a node whose
file system hangs: the launcher waits for it too), ``--stall S:HOW`` makes it stall at its training step S
(``block``: it sleeps, alive; ``freeze``: it stops itself with SIGSTOP; a number of seconds: it works alone that
long, then goes on), through the instrumented jobs' ``INSTRUMENTED_STALL`` variable. ``--block PLACE`` makes it
block, alive, where a job calls ``block_here(PLACE)`` (``INSTRUMENTED_BLOCK``): ``loader``, each item its data
loaders read (with workers, in the worker), so its first batch never comes; ``setup``, before a Fabric job sets up
its model: before its first step, while the others wait for it in a collective; ``validation``, in a Trainer job's
validation step after the sanity check, while the others wait for it after their validation.
``INSTRUMENTED_START_GATE=DIR:COUNT`` makes the instrumented jobs wait, just before they start training, until COUNT
processes have reached that point (each leaves a file in DIR): a test of the rendezvous then measures the rendezvous,
not how unevenly 4 imports of torch and Lightning share 2 busy cores (up to 23 s apart in CI).
``--torch-env`` then exports what a job script for Lightning's own environment would (``LOCAL_RANK``,
``NODE_RANK`` for block placement), computed from the (tampered) Open MPI variables.
"""

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path

GATE_LIMIT = 300
"""Seconds a process waits at the start gate at most, then goes on: a rank that failed before it never arrives."""


def start_gate() -> None:
    """Wait until every live rank of this job has reached its start (``INSTRUMENTED_START_GATE=DIR:COUNT``)."""
    gate = os.environ.get("INSTRUMENTED_START_GATE")
    if gate is None:
        return
    folder, count = Path(gate.rsplit(":", 1)[0]), int(gate.rsplit(":", 1)[1])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{os.uname().nodename}-{os.getpid()}").touch()
    deadline = time.monotonic() + GATE_LIMIT
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def stall_here(rank: int, step: int) -> None:
    """Stall this rank at this step when tamper.py asked for it (``INSTRUMENTED_STALL=STEP:block|freeze|SECONDS``)."""
    wanted = os.environ.get("INSTRUMENTED_STALL")
    if wanted is None or int(wanted.split(":")[0]) != step:
        return
    how = wanted.split(":")[1]
    if how not in ("block", "freeze"):  # rank 0 sampling or evaluating alone, say: slow, then it goes on
        print(f"STALL: rank {rank} works alone for {how} s at step {step}\n", end="", flush=True)
        time.sleep(float(how))
        return
    print(f"STALL: rank {rank} {'blocks' if how == 'block' else 'freezes'} at step {step}\n", end="", flush=True)
    if how == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def block_here(place: str) -> None:
    """Block for good, alive, when tamper.py asked for it here (``INSTRUMENTED_BLOCK=RANK:PLACE``)."""
    wanted = os.environ.get("INSTRUMENTED_BLOCK")
    if wanted is None or wanted.split(":", 1)[1] != place:
        return
    rank = wanted.split(":")[0]
    print(f"BLOCK: rank {rank} blocks in {place} pid={os.getpid()} time={time.time()!r}\n", end="", flush=True)
    parent, deadline = os.getppid(), time.monotonic() + 3600
    while time.monotonic() < deadline:
        if os.getppid() != parent:  # a loader worker whose rank's process ended: no one waits for it any more
            raise SystemExit(1)
        time.sleep(0.5)


def launcher_rank() -> int:
    """This process's rank as its launcher says it: Open MPI's, else srun's."""
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "-1")))


def first_time(marker: str | None) -> bool:
    """Whether a fault happens this time: always without a marker file; else only for whoever creates it."""
    if marker is None:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


FAULTS = {"freeze": ("FREEZE", signal.SIGSTOP), "kill": ("KILL", signal.SIGKILL)}
"""What ``fault_here`` does for each fault: the line it prints first, and the signal the rank sends itself."""


def fault_here(rank: int, step: int, faults: dict[str, str | None], once: str | None = None) -> None:
    """Freeze (``SIGSTOP``) or kill (``SIGKILL``) this rank at this global step, as ``faults`` ask (``RANK:STEP``).

    With ``once`` (a file), only where the file did not exist yet; it is made first, so a step relaunched after the
    fault runs through (a node fault that the relaunch leaves behind).
    """
    for fault, where in faults.items():
        if where is not None and where == f"{rank}:{step}" and first_time(once):
            word, signum = FAULTS[fault]
            print(f"{word} rank={rank} step={step} time={time.time()!r}\n", end="", flush=True)
            os.kill(os.getpid(), signum)


def step_seconds(args: argparse.Namespace, rank: int) -> float:
    """Seconds rank ``rank`` sleeps in a step: the job's ``--step-seconds``, times ``--slow-rank RANK:FACTOR``'s
    factor where RANK is ``rank``, ``all`` (a straggler, or every rank slow alike), or ``@HOST``: every rank on the
    host of that name (a slow node, which stays slow in every step launched there)."""
    if not args.slow_rank:
        return args.step_seconds
    slow, factor = args.slow_rank.rsplit(":", 1)
    return args.step_seconds * (float(factor) if slow in ("all", str(rank), f"@{socket.gethostname()}") else 1.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int)
    fault = parser.add_mutually_exclusive_group()
    fault.add_argument("--claim", type=int)
    fault.add_argument("--world-size", type=int)
    fault.add_argument("--exit", action="store_true")
    fault.add_argument("--never-start", action="store_true", help="sleep, alive, instead of starting the command")
    fault.add_argument("--stall", help="STEP:block, STEP:freeze or STEP:SECONDS")
    fault.add_argument("--block", choices=["loader", "setup", "validation"], help="block for good at block_here(PLACE)")
    parser.add_argument("--torch-env", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    if args.rank is not None and launcher_rank() == args.rank:
        if args.exit:
            print(f"TAMPER: rank {args.rank} exits before the rendezvous\n", end="", flush=True)
            sys.exit(0)
        if args.never_start:
            print(f"TAMPER: rank {args.rank} never starts its program\n", end="", flush=True)
            time.sleep(3600)
        if args.claim is not None:
            print(f"TAMPER: rank {args.rank} claims rank {args.claim}\n", end="", flush=True)
            os.environ["OMPI_COMM_WORLD_RANK"] = str(args.claim)
            if "PMIX_RANK" in os.environ:  # both, as an environment copied from another rank has them
                os.environ["PMIX_RANK"] = str(args.claim)
            os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] = str(args.claim % int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"]))
        if args.stall is not None:
            os.environ["INSTRUMENTED_STALL"] = args.stall
        if args.block is not None:
            os.environ["INSTRUMENTED_BLOCK"] = f"{args.rank}:{args.block}"
        if args.world_size is not None:
            print(f"TAMPER: rank {args.rank} claims world size {args.world_size}\n", end="", flush=True)
            os.environ["OMPI_COMM_WORLD_SIZE"] = str(args.world_size)
    if args.torch_env:
        local_size = int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
        os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
        os.environ["NODE_RANK"] = str(int(os.environ["OMPI_COMM_WORLD_RANK"]) // local_size)
    os.execv(command[0], command)


if __name__ == "__main__":  # not when pytest imports it to look for doctests
    main()
