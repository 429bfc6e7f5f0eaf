"""What the node check before the first step costs: in a real 4-rank job, and at 1,024 simulated ranks.

**Job** (``--job-repeat``): the instrumented Trainer job (``examples/instrumented/trainer_job.py``, ``ddp_mpi``,
gloo, a ``ModelCheckpoint``, data loader workers) on two simulated nodes x 2 ranks under Open MPI's ``mpirun``. Each
rank times the package's own ``check_nodes`` call (this script wraps it; the package never times it), from the call
to its return: the folder probe on each node's lowest rank, the all-reduce, nothing read back. The figure per run is
the slowest rank's; median and range over the runs.

**Simulated** (``--sizes``): real ``TCPStore`` clients and real gloo process groups, one thread a rank,
``--ranks-per-process`` to a process, 4 ranks a simulated host; the store's server in this process. Gloo connects
lazily (``TORCH_GLOO_LAZY_INIT=1``), so its ring all-reduce opens two connections a rank, not a full mesh: the
backend's set-up is not simulated, the check's all-reduce is. Each rank runs :func:`run_node_check` with the folder
probe on the lowest rank of each host (one shared temporary folder; 4 ranks: 2 hosts x 2), from a common start. Two
configurations, interleaved: ``clean`` (nothing found) and ``found`` (one host's folder not writable, under DDP:
rank 0 reads its finding back). The ranks' host lookups use the hosts file only (``roll_call_scale.py``'s private
mount namespace), where the machine's resolver stalls. The figure is the time from the start until the last rank
is through; median and range.

Usage: ``.venv/bin/python benchmarks/node_check.py [--job-repeat 3] [--sizes 4 1024] [--repeat 3]
[--ranks-per-process 128] [--check-timeout 60]``
"""

from __future__ import annotations

import argparse
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from roll_call_scale import files_only_resolver  # noqa: E402  (the script beside this one)

from lightning_mpi_env.checks.node_check import TIMEOUT as CHECK_TIMEOUT  # noqa: E402  (imports no torch)

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "instrumented" / "trainer_job.py"
PER_HOST = 4
TIMEOUT = timedelta(seconds=600)


def rank_job(argv: list[str]) -> None:
    """In a rank: time each ``check_nodes`` call of the ``ddp_mpi`` strategy, then run the instrumented job."""
    from lightning_mpi_env.lightning import strategy

    check = strategy.check_nodes

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return check(*args, **kwargs)
        finally:
            print(f"NODE_CHECK seconds={time.perf_counter() - start:.6f}\n", end="", flush=True)

    strategy.check_nodes = timed
    sys.argv = [str(JOB), *argv]
    runpy.run_path(str(JOB), run_name="__main__")


def job_figures(repeat: int) -> list[float]:
    from lightning_mpi_env.tools.simcluster import SimulatedCluster

    slowest = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            cluster = SimulatedCluster(Path(folder))
            job = [sys.executable, __file__, "--rank-job", "--strategy", "ddp_mpi", "--validate", "--workers", "2"]
            job += ["--samples", "32", "--root-dir", str(Path(folder) / "runs")]
            result = cluster.run(job, timeout=600, export={"MASTER_ADDR": "127.0.0.2", "OMP_NUM_THREADS": "1"})
            times = [float(line.split("=")[1]) for line in result.stdout.splitlines() if line.startswith("NODE_CHECK")]
            if result.returncode != 0 or len(times) != 4:
                sys.exit(f"the job failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
            slowest.append(max(times))
            print(f"  job: slowest rank's check {max(times) * 1000:.1f} ms (ranks: {sorted(times)})", flush=True)
    return slowest


def worker(port: int, first: int, count: int, size: int, found: bool, folder: str, bound: float) -> None:
    """Ranks ``first`` .. ``first + count - 1`` as threads; each reports its end time under ``done/<rank>``."""
    import torch.distributed as dist

    from lightning_mpi_env.checks.findings import Writers
    from lightning_mpi_env.checks.node_check import Place, local_findings, run_node_check

    def rank_thread(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
        group = dist.ProcessGroupGloo(dist.PrefixStore("pg", client), rank, size, TIMEOUT)
        per_host = PER_HOST if size > 2 * PER_HOST else max(1, size // 2)  # 4 ranks: 2 hosts x 2, as the job
        host, node = f"node{rank // per_host}", rank // per_host
        place = Place(rank, size, host, node, rank % per_host == 0)
        unwritable = found and node == 1  # "found": the second host cannot write its folder
        folders = ["/proc/self/runs"] if unwritable else [folder]
        client.add("ready", 1)
        client.wait(["go"])
        outcome = run_node_check(
            client,
            place,
            local_findings(place, folders, None, min_free=1),
            writers=Writers.RANK_ZERO,
            reduce=lambda tensor: group.allreduce([tensor]),
            timeout=bound,
        )
        assert not outcome.stop, outcome
        assert rank != 0 or bool(outcome.findings) == found, outcome
        client.set(f"done/{rank}", repr(time.time()))
        client.wait(["end"])  # keep the group open until every rank is through

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(first, first + count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def simulated_once(size: int, per_process: int, found: bool, folder: str, prefix: list[str], bound: float) -> float:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    env = {**os.environ, "TORCH_GLOO_LAZY_INIT": "1", "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                str(server.port),
                str(first),
                str(min(per_process, size - first)),
                str(size),
                "1" if found else "0",
                folder,
                str(bound),
            ],
            env=env,
        )
        for first in range(0, size, per_process)
    ]
    while server.add("ready", 0) < size:
        time.sleep(0.05)
    start = time.time()
    server.set("go", "1")
    server.wait([f"done/{rank}" for rank in range(size)])
    last = max(float(server.get(f"done/{rank}")) for rank in range(size))
    server.set("end", "1")
    for process in processes:
        if process.wait() != 0:
            sys.exit(f"a worker failed: {process.returncode}")
    return last - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-repeat", type=int, default=3, help="real 4-rank jobs (0: none)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[4, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks-per-process", type=int, default=128)
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=CHECK_TIMEOUT,
        help=f"the check's bound in the simulation (the package's: {CHECK_TIMEOUT:g} s, or the rendezvous timeout)",
    )
    args = parser.parse_args()
    import torch

    load = os.getloadavg()
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}; load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}",
        flush=True,
    )
    if args.job_repeat:
        slowest = job_figures(args.job_repeat)
        print(
            f"job, 4 ranks on 2 simulated nodes: the check took {statistics.median(slowest) * 1000:.1f} ms on the "
            f"slowest rank (median of {len(slowest)}; {min(slowest) * 1000:.1f}-{max(slowest) * 1000:.1f} ms)",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as folder:
        # This machine's resolver stalls some reverse lookups (5 s each), which every c10d connection makes.
        prefix = files_only_resolver(folder) or []
        print(f"ranks' host lookups: {'the hosts file only' if prefix else 'as this machine resolves'}", flush=True)
        for size in args.sizes:
            times: dict[bool, list[float]] = {False: [], True: []}
            for round_ in range(args.repeat):
                for found in (False, True) if round_ % 2 == 0 else (True, False):  # alternate the order
                    seconds = simulated_once(size, args.ranks_per_process, found, folder, prefix, args.check_timeout)
                    times[found].append(seconds)
                    print(f"  {size} ranks, {'found' if found else 'clean'}: {seconds * 1000:.1f} ms", flush=True)
            for found, values in times.items():
                print(
                    f"simulated, {size} ranks ({-(-size // args.ranks_per_process)} process(es)), "
                    f"{'found' if found else 'clean'}: {statistics.median(values) * 1000:.1f} ms "
                    f"({min(values) * 1000:.1f}-{max(values) * 1000:.1f})",
                    flush=True,
                )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-job"]:
        rank_job(sys.argv[2:])
    elif sys.argv[1:2] == ["--worker"]:
        port, first, count, size, found = map(int, sys.argv[2:7])
        worker(port, first, count, size, bool(found), sys.argv[7], float(sys.argv[8]))
    else:
        main()
