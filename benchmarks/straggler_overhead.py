"""What the straggler watch costs a training step, side by side with it off.

Two measures, in one run:

1. The progress marks alone: the Trainer's four marks a step (``Watchdog.mark``, the only part of the watch that runs
   on the training loop's thread) with the watch on and off, interleaved, median of ``--repeat`` rounds of
   ``--marks`` steps; and the watchdog thread's median of a full window, once per report.
2. The instrumented Trainer job on two simulated nodes x 2 ranks (gloo, CPU), the stall watchdog on in both,
   ``LIGHTNING_MPI_ENV_STRAGGLERS`` on (the default) and ``0``, interleaved: rank 0's training loop per step.

Usage: ``.venv/bin/python benchmarks/straggler_overhead.py [--repeat 7] [--samples 4000] [--jobs 5]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # requeue_overhead.py's job runner, beside this file

from requeue_overhead import run  # noqa: E402

from lightning_mpi_env.core.settings import DEFAULT_STRAGGLER_FACTOR, DEFAULT_STRAGGLER_WINDOW  # noqa: E402
from lightning_mpi_env.rollcall.store_values import Report  # noqa: E402
from lightning_mpi_env.rollcall.stragglers import StragglerWatch, WorkTimes  # noqa: E402
from lightning_mpi_env.rollcall.watchdog import Watchdog  # noqa: E402

TRAINER_MARKS = (1, 2, 3, 0)
"""The phases a Trainer step marks: its start, before backward, after backward, its end."""


def marks_per_second(watched: bool, steps: int) -> float:
    """Seconds per step of the Trainer's marks on a watchdog (not started) with the straggler watch on or off."""
    dog = Watchdog(
        lambda seconds: None,  # type: ignore[arg-type,return-value]  (never started: marks only)
        rank=1,
        world_size=4,
        host="node0",
        timeout=300.0,
        straggler_factor=DEFAULT_STRAGGLER_FACTOR if watched else 0.0,
        straggler_window=DEFAULT_STRAGGLER_WINDOW,
    )
    mark = dog.mark
    started = time.perf_counter()
    for step in range(steps):
        for phase in TRAINER_MARKS:
            mark(step, phase)
    return (time.perf_counter() - started) / steps


def window_median_seconds(rounds: int) -> float:
    """Seconds for one median of a full window: the watchdog thread's cost per report."""
    times = WorkTimes(DEFAULT_STRAGGLER_WINDOW)
    for step in range(DEFAULT_STRAGGLER_WINDOW):
        times.add(0.1 + step / 1000)
    started = time.perf_counter()
    for _ in range(rounds):
        times.median()
    return (time.perf_counter() - started) / rounds


def judge_seconds(world: int, rounds: int) -> float:
    """Seconds for rank 0's straggler judgement of ``world`` reports, one of them a straggler (once a report)."""
    reports = [
        Report(rank, f"nid{rank // 4:05d}", 400, 100, 0, 1, "train.py:42", work=0.2 if rank == 7 else 0.1, worked=100)
        for rank in range(world)
    ]
    watch = StragglerWatch(DEFAULT_STRAGGLER_FACTOR, DEFAULT_STRAGGLER_WINDOW)
    started = time.perf_counter()
    for _ in range(rounds):
        watch.judge(reports)
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds of the marks' measure")
    parser.add_argument("--marks", type=int, default=200_000, help="steps of marks per round")
    parser.add_argument("--jobs", type=int, default=5, help="runs of the job per configuration (0: none)")
    parser.add_argument("--samples", type=int, default=4000, help="samples of the job (4 ranks, batches of 4)")
    args = parser.parse_args()
    marks: dict[bool, list[float]] = {True: [], False: []}
    for index in range(args.repeat):
        for watched in (True, False) if index % 2 else (False, True):
            marks[watched].append(marks_per_second(watched, args.marks))
    median_cost = statistics.median(window_median_seconds(10_000) for _ in range(args.repeat))
    judged = {world: statistics.median(judge_seconds(world, 5) for _ in range(args.repeat)) for world in (1024, 16384)}
    jobs: dict[str, list[float]] = {"on": [], "off": []}
    steps = 0
    configurations = {"on": {"LIGHTNING_MPI_ENV_REQUEUE": "0"}, "off": {"LIGHTNING_MPI_ENV_REQUEUE": "0"}}
    configurations["off"]["LIGHTNING_MPI_ENV_STRAGGLERS"] = "0"
    with tempfile.TemporaryDirectory() as workdir:
        from lightning_mpi_env.tools.simcluster import SimulatedCluster

        cluster = SimulatedCluster(Path(workdir))
        for index in range(args.jobs):
            for name in ("on", "off") if index % 2 else ("off", "on"):
                seconds, steps = run(cluster, args.samples, configurations[name], workdir)
                jobs[name].append(seconds / steps)
            print(f"  job run {index + 1}: on {jobs['on'][-1] * 1000:.3f} ms, off {jobs['off'][-1] * 1000:.3f} ms")
    load = os.getloadavg()
    on, off = statistics.median(marks[True]), statistics.median(marks[False])
    job_on, job_off = (statistics.median(jobs[name]) if jobs[name] else 0.0 for name in ("on", "off"))
    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| measure | watch off | watch on | added |")
    print("|---|---|---|---|")
    print(
        f"| the Trainer's 4 marks a step, median of {args.repeat} x {args.marks} steps | {off * 1e6:.3f} us | "
        f"{on * 1e6:.3f} us | {(on - off) * 1e6:+.3f} us a step |"
    )
    print(f"| the watchdog thread's median of a window of {DEFAULT_STRAGGLER_WINDOW}, once a report | | "
          f"{median_cost * 1e6:.2f} us | {median_cost * 1e6:.2f} us a second |")  # fmt: skip
    for world, seconds in judged.items():
        print(f"| rank 0's straggler judgement of {world:,} reports, once a report | | {seconds * 1000:.2f} ms | |")
    if not args.jobs:
        return
    print(
        f"| the job (2 nodes x 2 ranks, gloo), rank 0's training loop a step, median of {args.jobs}, {steps} steps | "
        f"{job_off * 1000:.3f} ms | {job_on * 1000:.3f} ms | {(job_on / job_off - 1) * 100:+.1f}% |"
    )
    print(f"\nThe marks' added cost against the job's step: {(on - off) / job_off * 100:.4f}% of a step.")


if __name__ == "__main__":
    main()
