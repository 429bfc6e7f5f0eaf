"""The health probe: before a relaunch, each host it may use runs a one-task step, within a time limit.

Under Slurm (an ``srun`` line) the probe is a step of its own; an ``mpirun`` line's probe is its own launcher on that
host alone (:meth:`~.mpirun_line.MpirunLine.probe_line`), through the same agent the step uses.

A host whose ``slurmd`` hangs or is gone cannot start a step: srun waits on it for ``MessageTimeout`` and more,
and Slurm declares the node down only after ``SlurmdTimeout`` (300 s by default). The probe, ``srun --nodes=1
--ntasks=1 --nodelist=<host> --overlap true`` per host, all at once, finds it within :data:`PROBE_TIMEOUT`; a host
that does not answer in time, or whose step fails, is left out of the relaunch like a host a verdict blames.
``--overlap`` lets the probe share CPUs with a step Slurm still counts on that host (an abandoned one), so a busy
but healthy host passes. On time out, srun is killed (``SIGKILL``: on ``SIGTERM`` it waits for the hung node).
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
    """The probe's srun line for ``host``.

    >>> probe_line("node3")
    ['srun', '--nodes=1', '--ntasks=1', '--nodelist=node3', '--overlap', '--job-name=lightning-mpi-env-probe', 'true']
    """
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
    """Probe ``hosts`` at once; the hosts that failed, each with what went wrong in a few words.

    ``line_for``: each host's probe line (srun's, :func:`probe_line`, by default; an ``mpirun`` line's own launcher
    otherwise: :meth:`~.mpirun_line.MpirunLine.probe_line`).
    """
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


__all__ = ["MAX_PROBLEM", "PROBE_TIMEOUT", "probe", "probe_line"]
