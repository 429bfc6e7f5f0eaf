"""What checkpoint-and-requeue costs a healthy job: the collective check after every training step.

With requeue on (a scheduler's job id in the environment), every rank asks the others after each training step
whether any got the requeue signal (``reduce_boolean_decision``: one small all-reduce). This runs the instrumented
Trainer job (``examples/instrumented/trainer_job.py``, gloo, CPU) on two simulated nodes x 2 ranks, with requeue on
(``JOB_ID`` set, Grid Engine) and off (``LIGHTNING_MPI_ENV_REQUEUE=0``), interleaved, and reports the median
training-loop time (first step to the end of ``fit()``, rank 0) and the difference per step.

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


def run(cluster: SimulatedCluster, samples: int, requeue: bool, root: str) -> tuple[float, int]:
    """Rank 0's training-loop seconds and its number of steps."""
    export = {"MASTER_ADDR": "127.0.0.2", "JOB_ID": "4242", "OMP_NUM_THREADS": "1"}
    if not requeue:
        export["LIGHTNING_MPI_ENV_REQUEUE"] = "0"
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
    times: dict[bool, list[float]] = {True: [], False: []}
    steps = 0
    with tempfile.TemporaryDirectory() as workdir:
        cluster = SimulatedCluster(Path(workdir))
        for index in range(args.repeat):
            for requeue in (True, False) if index % 2 == 0 else (False, True):
                seconds, steps = run(cluster, args.samples, requeue, workdir)
                times[requeue].append(seconds)
            print(f"  run {index + 1}: on {times[True][-1]:.2f} s, off {times[False][-1]:.2f} s", flush=True)
    load = os.getloadavg()
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; 2 simulated nodes x 2 "
        f"ranks, gloo, {steps} steps per rank, median of {args.repeat}\n"
    )
    print("| requeue | training loop (rank 0) | per step |")
    print("|---|---|---|")
    print(f"| on | {on:.2f} s | {on / steps * 1000:.2f} ms |")
    print(f"| off | {off:.2f} s | {off / steps * 1000:.2f} ms |")
    print(f"| difference | {on - off:+.2f} s ({(on / off - 1) * 100:+.1f}%) | {(on - off) / steps * 1000:+.3f} ms |")


if __name__ == "__main__":
    main()
