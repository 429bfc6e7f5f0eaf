"""What checkpoint-and-requeue and the stall watchdog cost a healthy job's training step.

Runs the instrumented Trainer job (``examples/instrumented/trainer_job.py``, gloo, CPU) on two simulated nodes x 2
ranks, in four configurations, interleaved (each round runs all four, in a rotating order), and reports the median
training-loop time (rank 0, first step to the end of ``fit()``) and the time per step:

- ``baseline``: requeue off, watchdog off;
- ``watchdog``: the stall watchdog on (the default), requeue off;
- ``requeue``: both on, the default under a scheduler (``JOB_ID`` set, Grid Engine): the ranks agree on a stop step
  through the store, from the watchdog thread;
- ``collective``: requeue on with the roll call off, where the ranks must ask each other after every step with an
  all-reduce (what every job with requeue on paid before).

Usage: ``.venv/bin/python benchmarks/requeue_overhead.py [--repeat 5] [--samples 2000]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from lightning_mpi_env.tools.simcluster import SimulatedCluster

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "instrumented" / "trainer_job.py"


CONFIGURATIONS: dict[str, dict[str, str]] = {
    "baseline": {"LIGHTNING_MPI_ENV_REQUEUE": "0", "LIGHTNING_MPI_ENV_STALL_TIMEOUT": "0"},
    "watchdog": {"LIGHTNING_MPI_ENV_REQUEUE": "0"},
    "requeue": {},
    "collective": {"LIGHTNING_MPI_ENV_ROLL_CALL": "0"},
}


def run(cluster: SimulatedCluster, samples: int, variables: dict[str, str], root: str) -> tuple[float, int]:
    """Rank 0's training-loop seconds and its number of steps, with the settings ``variables``."""
    export = {"MASTER_ADDR": "127.0.0.2", "JOB_ID": "4242", "OMP_NUM_THREADS": "1", **variables}
    command = [sys.executable, str(JOB), "--samples", str(samples), "--root-dir", root]
    done = cluster.run(command, timeout=600, export=export)
    if done.returncode != 0:
        raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
    results = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    rank_zero = next(result for result in results if result["global_rank"] == 0)
    return float(rank_zero["train_seconds"]), int(rank_zero["global_step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    names = list(CONFIGURATIONS)
    times: dict[str, list[float]] = {name: [] for name in names}
    steps = 0
    with tempfile.TemporaryDirectory() as workdir:
        cluster = SimulatedCluster(Path(workdir))
        for index in range(args.repeat):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                seconds, steps = run(cluster, args.samples, CONFIGURATIONS[name], workdir)
                times[name].append(seconds)
            print(f"  run {index + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
    load = os.getloadavg()
    medians = {name: statistics.median(times[name]) for name in names}
    base = medians["baseline"]
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; 2 simulated nodes x 2 "
        f"ranks, gloo, {steps} steps per rank, median of {args.repeat}\n"
    )
    print("| configuration | training loop (rank 0) | per step | vs baseline |")
    print("|---|---|---|---|")
    for name in names:
        seconds = medians[name]
        print(
            f"| {name} | {seconds:.2f} s | {seconds / steps * 1000:.2f} ms | "
            f"{(seconds / base - 1) * 100:+.1f}% ({(seconds - base) / steps * 1000:+.3f} ms) |"
        )


if __name__ == "__main__":
    main()
