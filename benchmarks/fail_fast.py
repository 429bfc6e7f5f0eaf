"""Fail-fast benchmark: ``strategy="ddp_mpi"`` against Lightning's default DDP, from real ``mpirun`` jobs.

Runs on the simulated two-node cluster (:mod:`lightning_mpi_env.simcluster`), 2 ranks per node, and reports side by
side, as medians over ``--repeat`` runs (runs of the two strategies interleaved, so that load from other jobs on the
machine hits both alike):

- launch to a clear error, for a duplicated rank (rank 3 claims rank 1) and a missing rank (rank 3 exits with status
  0 before the rendezvous); the default DDP gets a bounded wait (``--bound``, 120 s) and is reported as "no error
  within 120 s" when it is still running then. After the bound, mpirun gets SIGTERM and the script reports whether
  every rank was gone 10 s later (a clean teardown). The ratio is taken on the time the error is shown; the time
  the last rank called ``fit()`` (Python, torch and Lightning imported, Trainer built) is shown beside it, as that
  start-up is the floor for any check inside ``fit()``.
- launch to the first training step of a healthy job; the default DDP gets a correct environment (``LOCAL_RANK``,
  ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` exported as a job script for Lightning would).

Usage: ``.venv/bin/python benchmarks/fail_fast.py [--repeat 3] [--bound 120] [--rendezvous-timeout 20]``
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from lightning_mpi_env.simcluster import SimulatedCluster, processes_with

ROOT = Path(__file__).resolve().parents[1]
JOB = str(ROOT / "examples" / "instrumented" / "trainer_job.py")
TAMPER = str(ROOT / "examples" / "instrumented" / "tamper.py")
ERROR_PATTERNS = {
    "ddp_mpi": re.compile(r"RendezvousError: (Duplicate rank|Rank \d+ of \d+ never arrived)"),
    "ddp": re.compile(r"(Error|error):"),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        return int(probe.getsockname()[1])


def run_job(cluster: SimulatedCluster, strategy: str, fault: list[str], bound: float, timeout: float) -> dict:
    """One mpirun job; returns seconds to exit or to the first step, and how it ended."""
    tag = f"bench-{uuid.uuid4().hex[:10]}"
    job = [sys.executable, JOB, "--samples", "64", "--tag", tag]
    if strategy == "ddp_mpi":
        job += ["--strategy", "ddp_mpi"]
        wrapper = [sys.executable, TAMPER, *fault, "--"]
    else:
        job += ["--plain-ddp"]
        wrapper = [sys.executable, TAMPER, *fault, "--torch-env", "--"]
    export = {
        "MASTER_ADDR": "127.0.0.2",
        "MASTER_PORT": str(free_port()),
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(timeout),
    }
    command = cluster.mpirun([*wrapper, *job], export=export)
    lines: list[tuple[float, str]] = []
    start = time.time()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in process.stdout), daemon=True)
    reader.start()
    try:
        returncode: int | None = process.wait(timeout=bound)
        elapsed = time.time() - start
    except subprocess.TimeoutExpired:
        returncode, elapsed = None, bound
        process.send_signal(signal.SIGTERM)  # what a scheduler does at the end of a job's time
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=10)
    time.sleep(1)
    left = len(processes_with(tag))
    text = "".join(line for _, line in lines)
    shown = [when - start for when, line in lines if ERROR_PATTERNS[strategy].search(line)]
    first_steps = [float(t) for t in re.findall(r"FIRST_STEP rank=0 time=([0-9.]+)", text)]
    fit_called = [when - start for when, line in lines if line.startswith("FIT pid=")]
    return {
        "returncode": returncode,
        "elapsed": elapsed,
        "first_step": first_steps[0] - start if first_steps else None,
        "clear_error": bool(shown) and returncode not in (None, 0),
        "error_shown": shown[0] if shown else None,
        "last_fit_call": max(fit_called) if fit_called else None,
        "leftover": left,
        "tail": text[-600:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (ddp_mpi faults, healthy jobs)")
    parser.add_argument("--default-fault-repeat", type=int, default=1, help="runs per default-DDP fault cell")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds to wait for the default DDP's error")
    parser.add_argument("--rendezvous-timeout", type=float, default=20.0)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}; simulated 2 nodes x 2 ranks (Open MPI over loopback), gloo, CPU only",
        flush=True,
    )
    faults = {"duplicate rank": ["--rank", "3", "--claim", "1"], "missing rank": ["--rank", "3", "--exit"]}
    with tempfile.TemporaryDirectory() as workdir:
        cluster = SimulatedCluster(Path(workdir))
        rows = []
        for name, fault in faults.items():
            runs: dict[str, list[dict]] = {"ddp_mpi": [], "ddp": []}
            for index in range(args.repeat):
                runs["ddp_mpi"].append(run_job(cluster, "ddp_mpi", fault, args.bound, args.rendezvous_timeout))
                if index < args.default_fault_repeat:
                    runs["ddp"].append(run_job(cluster, "ddp", fault, args.bound, args.rendezvous_timeout))
                print(
                    f"  {name} #{index + 1}: "
                    + ", ".join(f"{k}={[round(r['elapsed'], 1) for r in v]}" for k, v in runs.items()),
                    flush=True,
                )
            rows.append((name, runs))
        healthy: dict[str, list[dict]] = {"ddp_mpi": [], "ddp": []}
        for index in range(args.repeat):
            for strategy in ("ddp_mpi", "ddp") if index % 2 == 0 else ("ddp", "ddp_mpi"):
                healthy[strategy].append(run_job(cluster, strategy, [], 300, args.rendezvous_timeout))
            print(
                f"  healthy #{index + 1}: "
                + ", ".join(f"{k}={[r['first_step'] for r in v]}" for k, v in healthy.items()),
                flush=True,
            )

    print(
        f"\nLaunch to a clear error (rendezvous timeout {args.rendezvous_timeout:g} s; default DDP bounded at "
        f"{args.bound:g} s), median of n runs:"
    )
    print("| fault | ddp_mpi | default DDP | ddp_mpi / default (error shown) |")
    print("|---|---|---|---|")
    for name, runs in rows:
        cells = []
        for strategy in ("ddp_mpi", "ddp"):
            done = [r for r in runs[strategy] if r["clear_error"]]
            if len(done) == len(runs[strategy]):
                shown = statistics.median(r["error_shown"] for r in done)
                start_up = statistics.median(r["last_fit_call"] for r in done if r["last_fit_call"] is not None)
                cells.append(
                    (
                        shown,
                        f"error shown at {shown:.1f} s (last rank called fit() at {start_up:.1f} s), job ended at "
                        f"{statistics.median(r['elapsed'] for r in done):.1f} s (n={len(done)})",
                    )
                )
            else:
                hung = len(runs[strategy]) - len(done)
                left = max(r["leftover"] for r in runs[strategy])
                cells.append(
                    (
                        args.bound,
                        f"no error within {args.bound:g} s ({hung}/{len(runs[strategy])} runs; "
                        f"after SIGTERM, {left} process(es) left)",
                    )
                )
        ratio = (
            f"< 1/{args.bound / cells[0][0]:.0f}" if cells[1][0] >= args.bound else f"{cells[0][0] / cells[1][0]:.2f}"
        )
        print(f"| {name} | {cells[0][1]} | {cells[1][1]} | {ratio} |")
    print("\nLaunch to first training step of a healthy job (rank 0), median of n runs:")
    medians = {
        k: statistics.median(r["first_step"] for r in v if r["first_step"] is not None) for k, v in healthy.items()
    }
    print("| ddp_mpi | default DDP (correct environment) | ratio |")
    print("|---|---|---|")
    ddp_mpi, ddp = medians["ddp_mpi"], medians["ddp"]
    print(
        f"| {ddp_mpi:.2f} s (n={len(healthy['ddp_mpi'])}) | {ddp:.2f} s (n={len(healthy['ddp'])}) "
        f"| {ddp_mpi / ddp:.3f} |"
    )
    for name, runs in rows:
        for strategy, rs in runs.items():
            for r in rs:
                if not r["clear_error"] and strategy == "ddp_mpi":
                    print(f"\nUNEXPECTED ({name}, {strategy}): {r}")


if __name__ == "__main__":
    main()
