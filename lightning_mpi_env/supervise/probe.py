"""The health probe: before a relaunch, each host it may use runs a one-task step, all at once, within a time limit.

A host whose ``slurmd`` hangs cannot start a step, and Slurm declares it down only after ``SlurmdTimeout``: a host
that does not answer in time, or whose probe fails, is left out. ``--overlap`` lets a busy but healthy host pass (a
step Slurm still counts there). A probe past its time is killed: on ``SIGTERM`` srun waits for the hung node.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

PROBE_TIMEOUT = 20.0
"""Seconds a host has to run the probe (``--probe-timeout``)."""
MAX_PROBLEM = 300
"""The most characters of a probe's error output kept."""


def probe_line(host: str) -> list[str]:
    """The probe's srun line for ``host``."""
    return [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={host}",
        "--overlap",
        "--job-name=lightning-mpi-env-probe",
        "true",
    ]


def probe(
    hosts: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float = PROBE_TIMEOUT,
    line_for: Callable[[str], list[str]] = probe_line,
    start: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> dict[str, str]:
    """Probe ``hosts`` at once, each with ``line_for(host)``; the hosts that failed, each with what went wrong."""
    running = {
        host: start(line_for(host), env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for host in hosts
    }
    deadline = clock() + timeout
    while any(process.poll() is None for process in running.values()) and clock() < deadline:
        sleep(0.1)
    failed: dict[str, str] = {}
    for host, process in running.items():
        if process.poll() is None:
            process.kill()
            process.communicate()
            failed[host] = f"no answer in {timeout:g} s"
            continue
        error = process.communicate()[1].decode(errors="replace").strip()
        if process.returncode != 0:
            last = error.splitlines()[-1][:MAX_PROBLEM] if error else "no output"
            failed[host] = f"the probe step failed (exit status {process.returncode}): {last}"
    return failed
