"""The stall watchdog's cost: store requests per second at 1,024 and 16,384 ranks, and rank 0's reading time.

Every interval each rank sends one ``set`` (its report) and one ``add`` (the event count); rank 0 also reads every
report with ``multi_get`` (in batches of ``BATCH``) and applies the rule. This script sends exactly those
requests, for N simulated ranks, to a real ``TCPStore`` on 127.0.0.1: the ranks' requests over a few client
connections (what the store serves is the same requests; one process cannot hold 16,384 connections on 2 cores),
and rank 0's reading over its own. It reports, per world size: the interval, the requests per interval and per
second, the bytes of one report, the seconds the store took to serve one interval's requests, and rank 0's time to
read and judge every report (medians of ``--repeat`` intervals).

With ``--stall-job``, it also times real jobs (Open MPI, 2 simulated nodes x 2 ranks, gloo) in which rank 3 blocks
(alive) or freezes (``SIGSTOP``) at step 2, with ``LIGHTNING_MPI_ENV_STALL_TIMEOUT=20``, on each path with a roll
call (Trainer and Fabric, the plugin and ``ddp_mpi``): from the rank's ``STALL:`` line to the first ``StallError``
line, and to the end of the job (the goal: within the timeout plus 30 s), with its exit status.

    .venv/bin/python benchmarks/watchdog_load.py [--ranks 1024 16384] [--repeat 5] [--stall-job]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_mpi_env.rollcall.batches import BATCH as READ_CHUNK  # noqa: E402
from lightning_mpi_env.rollcall.stall import find_stall, interval_for, observe  # noqa: E402
from lightning_mpi_env.rollcall.stall_verdict import EVENTS, KEY  # noqa: E402
from lightning_mpi_env.rollcall.store_values import Report, read, report_of  # noqa: E402

CONNECTIONS = 8
TIMEOUT = 300.0


def one_interval(clients: list, reader, world: int, beat: int, seen: dict) -> tuple[float, float]:
    """Send one interval's requests of ``world`` ranks; return (seconds for the ranks', seconds for rank 0's)."""
    start = time.perf_counter()
    for rank in range(world):
        client = clients[rank % len(clients)]
        report = Report(rank, f"nid{rank // 4:05d}", 4 * beat, beat, 0, beat, "/home/u/train.py:42 in training_step")
        client.set(KEY + str(rank), report.to_json())
        client.add(EVENTS, 0)
    ranks = time.perf_counter() - start
    start = time.perf_counter()
    keys = [KEY + str(rank) for rank in range(world)]
    reports = []
    for first in range(0, world, READ_CHUNK):
        chunk = reader.multi_get(keys[first : first + READ_CHUNK])
        reports += [read("report", value, report_of(None)) for value in chunk]
    now = time.monotonic()
    observe(seen, reports, now)
    find_stall(seen, now, TIMEOUT, 3 * interval_for(TIMEOUT, world), world)
    return ranks, time.perf_counter() - start


def store_load(world: int, repeat: int) -> dict[str, float]:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    clients = [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
        for _ in range(CONNECTIONS)
    ]
    reader = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
    seen: dict = {}
    served, judged = [], []
    for beat in range(repeat + 1):
        ranks, rank_zero = one_interval(clients, reader, world, beat, seen)
        if beat:  # the first interval creates the keys
            served.append(ranks)
            judged.append(rank_zero)
    interval = interval_for(TIMEOUT, world)
    requests = 2 * world + -(-world // READ_CHUNK)
    report = Report(world - 1, "nid04095", 4000, 1000, 0, 1000, "/home/u/train.py:42 in training_step")
    return {
        "world": world,
        "interval_s": interval,
        "requests_per_interval": requests,
        "requests_per_s": requests / interval,
        "report_bytes": len(report.to_json()),
        "store_s_per_interval": statistics.median(served),
        "rank0_read_and_judge_s": statistics.median(judged),
    }


PATHS = {  # job script, strategy: the four paths that have a roll call
    "trainer-plugin": ("trainer_job.py", "ddp"),
    "trainer-ddp_mpi": ("trainer_job.py", "ddp_mpi"),
    "fabric-plugin": ("fabric_job.py", "ddp"),
    "fabric-ddp_mpi": ("fabric_job.py", "ddp_mpi"),
}


def stall_job(path: str, how: str, rank: int = 3) -> tuple[float, float, int]:
    """One job whose ``rank`` stalls (``how``: block or freeze) at step 2, with the timeout at 20 s.

    Returns the seconds from the rank's ``STALL:`` line to the first ``StallError`` line and to the job's end, and
    the job's exit status.
    """
    from lightning_mpi_env.tools.simcluster import SimulatedCluster

    instrumented = ROOT / "examples" / "instrumented"
    script, strategy = PATHS[path]
    with tempfile.TemporaryDirectory() as directory:
        cluster = SimulatedCluster.of(Path(directory), nodes=2, per_node=2)
        command = [sys.executable, str(instrumented / "tamper.py"), "--rank", str(rank), "--stall", f"2:{how}", "--"]
        command += [sys.executable, str(instrumented / script), "--strategy", strategy]
        export = {**cluster.job_environment(), "LIGHTNING_MPI_ENV_STALL_TIMEOUT": "20"}
        process = subprocess.Popen(
            cluster.mpirun(command, export=export), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        stalled = named = None
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("STALL:") and stalled is None:
                stalled = time.monotonic()
            if line.startswith("StallError:") and named is None:
                named = time.monotonic()
        process.wait(timeout=300)
        ended = time.monotonic()
        if stalled is None or named is None:
            raise SystemExit(f"{path} {how}: the job did not stall and end as planned (status {process.returncode})")
        return named - stalled, ended - stalled, process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stall-job", action="store_true")
    args = parser.parse_args()
    import torch

    print(f"machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"stall timeout {TIMEOUT:g} s (the default); {CONNECTIONS} client connections carry the ranks' requests")
    for world in args.ranks:
        row = store_load(world, args.repeat)
        print(
            f"{row['world']:>6} ranks: interval {row['interval_s']:.3f} s, {row['requests_per_interval']} requests "
            f"per interval = {row['requests_per_s']:.0f}/s, report {row['report_bytes']} B; the store served one "
            f"interval's requests in {row['store_s_per_interval']:.3f} s; rank 0 read and judged every report in "
            f"{row['rank0_read_and_judge_s'] * 1000:.1f} ms (medians of {args.repeat})"
        )
    if args.stall_job:
        print("\n| path | stalled rank | stall to the named error | stall to the job's end | exit status |")
        print("|---|---|---|---|---|")
        for path in PATHS:
            for how in ("block", "freeze"):
                named, ended, status = stall_job(path, how)
                print(f"| {path} | rank 3, {how} | {named:.1f} s | {ended:.1f} s | {status} |", flush=True)
        # Rank 0 hosts the store every watchdog reports to: the others name its silence.
        named, ended, status = stall_job("trainer-ddp_mpi", "freeze", rank=0)
        print(f"| trainer-ddp_mpi | rank 0, freeze | {named:.1f} s | {ended:.1f} s | {status} |", flush=True)


if __name__ == "__main__":
    main()
