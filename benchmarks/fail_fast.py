"""Fail-fast benchmark: the plugin with ``ddp``, ``ddp_mpi`` and Fabric against Lightning's default DDP, side by side.

Real ``mpirun`` jobs on the simulated two-node cluster (:mod:`lightning_mpi_env.tools.simcluster`), 2 ranks per node,
gloo on the CPU. The configurations (:data:`CONFIGS`) run interleaved, in a rotating order, so that load from other
work on the machine hits them alike; every figure is a median over ``--repeat`` runs (5 by default):

- **duplicate rank** (rank 3 claims rank 1) and **missing rank** (rank 3 exits with status 0 before anything
  starts): launch to the named error on the terminal. Beside it, the *start-up floor*: when the last rank called
  ``fit()``/``launch()`` (its ``FIT pid=`` line: Python, torch and Lightning imported, Trainer built), since no check
  inside Lightning can come sooner. Lightning's default DDP gets a bounded wait (``--bound``) and is reported as "no
  error within N s" when still running; then mpirun gets SIGTERM (what a scheduler sends at the end of a job) and the
  table says how many processes were left 10 s later. Its runs are fewer (``--default-fault-repeat``): they are
  bounded waits, not measurements.
- **healthy job**: launch to the first training step of rank 0 (its ``FIRST_STEP`` line), against Lightning's
  default DDP given a correct torchrun-style environment (``LOCAL_RANK``, ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT``, as a job script for Lightning's own environment exports them).

Goals, checked in the table: a duplicate named within the start-up floor + 2 s; a missing rank named within the
start-up floor + the rendezvous timeout + 5 s (the roll call starts counting when the ranks reach it); a healthy
job's first step within 1.05 x the default DDP's. The error shown is the first ``RendezvousError`` line; the cell
says when it was not this fault's own message (:data:`EXPECTED`).

The jobs are ``examples/instrumented/trainer_job.py`` and ``fabric_job.py`` (``--strategy ddp|ddp_mpi``,
``--devices``, ``--num-nodes``, ``--tag``; ``RESULT``, ``FIT pid=`` and ``FIRST_STEP rank=R time=T`` lines), with
``tamper.py`` for the faults. Where a job prints no ``FIT``/``FIRST_STEP`` line, its cell says so.

Usage: ``.venv/bin/python benchmarks/fail_fast.py [--repeat 5] [--bound 120] [--rendezvous-timeout 20]``
"""

from __future__ import annotations

import argparse
import os
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_call_scale import machine_description  # the machine line both benchmarks print (benchmarks/ is on path)

from lightning_mpi_env.tools.simcluster import SimulatedCluster, processes_with

ROOT = Path(__file__).resolve().parents[1]
INSTRUMENTED = ROOT / "examples" / "instrumented"
TAMPER = str(INSTRUMENTED / "tamper.py")
NAMED_ERROR = re.compile(r"RendezvousError: ")
ANY_ERROR = re.compile(r"(Error|error):")


@dataclass(frozen=True)
class Config:
    """One way to start the job."""

    label: str
    """Column heading."""
    job: str
    """The instrumented job under ``examples/instrumented``."""
    arguments: tuple[str, ...]
    """The job's options."""
    baseline: bool = False
    """Lightning's default DDP and environment: the torchrun-style variables exported by ``tamper.py``."""

    @property
    def error(self) -> re.Pattern[str]:
        """What counts as the error being shown: ours by name; for the default DDP, any error."""
        return ANY_ERROR if self.baseline else NAMED_ERROR


CONFIGS = (
    Config("plugin + ddp (Trainer)", "trainer_job.py", ("--strategy", "ddp")),
    Config("ddp_mpi (Trainer)", "trainer_job.py", ("--strategy", "ddp_mpi")),
    Config("Fabric + ddp_mpi", "fabric_job.py", ("--strategy", "ddp_mpi")),
    Config("default DDP (Trainer, torchrun-style env)", "trainer_job.py", ("--plain-ddp",), baseline=True),
)
FAULTS = {"duplicate rank": ["--rank", "3", "--claim", "1"], "missing rank": ["--rank", "3", "--exit"]}
EXPECTED = {"duplicate rank": "Duplicate rank 1", "missing rank": "Rank 3 of 4 never arrived"}
"""What the first error shown should say. Under load, with a short rendezvous timeout, a rank may instead report
that rank 0 never answered (rank 0 started later than the timeout): also named, but not this fault's message."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        return int(probe.getsockname()[1])


def run_job(
    cluster: SimulatedCluster, config: Config, fault: list[str], *, bound: float, rendezvous_timeout: float
) -> dict[str, Any]:
    """One mpirun job: when the error was shown (or the first step taken), and how it ended."""
    tag = f"bench-{uuid.uuid4().hex[:10]}"
    job = [sys.executable, str(INSTRUMENTED / config.job), "--devices", "2", "--num-nodes", "2", "--tag", tag]
    wrapper = [sys.executable, TAMPER, *fault, *(["--torch-env"] if config.baseline else []), "--"]
    export = {
        "MASTER_ADDR": "127.0.0.2",
        "MASTER_PORT": str(free_port()),
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(rendezvous_timeout),
    }
    command = cluster.mpirun([*wrapper, *job, "--samples", "64", *config.arguments], export=export)
    lines: list[tuple[float, str]] = []
    start = time.time()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert process.stdout is not None
    output = process.stdout
    reader = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in output), daemon=True)
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
    errors = [(when - start, line) for when, line in lines if config.error.search(line)]
    shown = [when for when, _ in errors]
    first_steps = [float(value) for value in re.findall(r"FIRST_STEP rank=0 time=([0-9.]+)", text)]
    fit_called = [when - start for when, line in lines if line.startswith("FIT pid=")]
    return {
        "returncode": returncode,
        "elapsed": elapsed,
        "first_step": first_steps[0] - start if first_steps else None,
        "clear_error": bool(shown) and returncode not in (None, 0),
        "error_shown": shown[0] if shown else None,
        "error_line": errors[0][1].strip() if errors else "",
        "last_fit_call": max(fit_called) if len(fit_called) >= 3 else None,  # the 3 ranks that start, at least
        "leftover": left,
        "tail": text[-800:],
    }


def median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def fault_cell(runs: list[dict[str, Any]], config: Config, name: str, args: argparse.Namespace) -> str:
    """The table cell of one configuration for one fault, with its goal checked (ours only)."""
    done = [run for run in runs if run["clear_error"]]
    if len(done) < len(runs):
        hung = [run for run in runs if run["returncode"] is None]
        left = max((run["leftover"] for run in runs), default=0)
        cell = f"no error within {args.bound:g} s in {len(hung)}/{len(runs)} runs (after SIGTERM, {left} left)"
        return cell if config.baseline else f"{cell} **FAIL**"
    shown = median([run["error_shown"] for run in done])
    floor = median([run["last_fit_call"] for run in done])
    assert shown is not None
    cell = f"{shown:.1f} s (floor {'n/a' if floor is None else f'{floor:.1f} s'}; n={len(done)})"
    if config.baseline:
        return cell
    expected = sum(EXPECTED[name] in run["error_line"] for run in done)
    if expected < len(done):
        cell += f", this fault's message in {expected}/{len(done)}"
    if floor is None:
        return f"{cell}, goal not checked ({config.job} printed no FIT line)"
    allowed = 2.0 if name == "duplicate rank" else args.rendezvous_timeout + 5.0
    return f"{cell} {'PASS' if shown <= floor + allowed else '**FAIL**'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per cell")
    parser.add_argument("--default-fault-repeat", type=int, default=1, help="runs per default-DDP fault cell")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds to wait for the default DDP's error")
    parser.add_argument("--rendezvous-timeout", type=float, default=20.0)
    parser.add_argument("--job-limit", type=float, default=300.0, help="seconds any other job may take (a safety net)")
    args = parser.parse_args()
    before = machine_description()
    print(f"machine: {before}", flush=True)
    faults: dict[str, dict[str, list[dict[str, Any]]]] = {name: {c.label: [] for c in CONFIGS} for name in FAULTS}
    healthy: dict[str, list[dict[str, Any]]] = {config.label: [] for config in CONFIGS}
    with tempfile.TemporaryDirectory() as workdir:
        cluster = SimulatedCluster(Path(workdir))
        for index in range(args.repeat):
            order = CONFIGS[index % len(CONFIGS) :] + CONFIGS[: index % len(CONFIGS)]  # rotate who goes first
            for name, fault in FAULTS.items():
                for config in order:
                    if config.baseline and index >= args.default_fault_repeat:
                        continue
                    limit = args.bound if config.baseline else args.job_limit
                    run = run_job(cluster, config, fault, bound=limit, rendezvous_timeout=args.rendezvous_timeout)
                    faults[name][config.label].append(run)
                    if not config.baseline and not run["clear_error"]:
                        print(f"  UNEXPECTED ({name}, {config.label}): {run}", flush=True)
            for config in order:
                run = run_job(cluster, config, [], bound=args.job_limit, rendezvous_timeout=args.rendezvous_timeout)
                healthy[config.label].append(run)
            print(
                f"  round {index + 1}/{args.repeat}: "
                + "; ".join(
                    f"{label}: error {[round(r['error_shown'] or -1, 1) for r in faults['duplicate rank'][label]]}"
                    f" first step {[round(r['first_step'] or -1, 1) for r in healthy[label]]}"
                    for label in healthy
                ),
                flush=True,
            )

    labels = [config.label for config in CONFIGS]
    print(
        "\nFail fast on 2 simulated nodes x 2 ranks (Open MPI over loopback, gloo, CPU); median of n interleaved "
        f"runs; rendezvous timeout {args.rendezvous_timeout:g} s.\nMachine: {before} (at the start); load average "
        f"at the end {', '.join(f'{value:.2f}' for value in os.getloadavg())}.\n"
    )
    print(f"| | {' | '.join(labels)} | goal |")
    print(f"|---|{'---|' * len(labels)}---|")
    goals = {
        "duplicate rank": "named within the start-up floor + 2 s",
        "missing rank": f"named within the start-up floor + {args.rendezvous_timeout + 5:g} s (timeout + 5 s)",
    }
    for name in FAULTS:
        cells = [fault_cell(faults[name][config.label], config, name, args) for config in CONFIGS]
        print(f"| {name}: launch to the error | {' | '.join(cells)} | {goals[name]} |")
    baseline = median([run["first_step"] for run in healthy[CONFIGS[-1].label]])
    cells = []
    for config in CONFIGS:
        runs = healthy[config.label]
        first = median([run["first_step"] for run in runs])
        if first is None:
            cells.append(f"n/a ({config.job} printed no FIRST_STEP line)")
        elif config.baseline or baseline is None:
            cells.append(f"{first:.2f} s (n={len(runs)})")
        elif config.job != "trainer_job.py":
            cells.append(f"{first:.2f} s (n={len(runs)}; a Fabric loop, not compared with the Trainer)")
        else:
            ratio = first / baseline
            cells.append(f"{first:.2f} s (n={len(runs)}), x{ratio:.3f} {'PASS' if ratio <= 1.05 else '**FAIL**'}")
    print(f"| healthy: launch to first step | {' | '.join(cells)} | <= 1.05 x default DDP |")


if __name__ == "__main__":
    main()
