"""Where a test run's CPU goes, machine-wide: the busy time of every core, and the CPU of each kind of process.

``rusage`` cannot say it: the ranks of a real job are children of ``prted`` daemons (or of ``slurmstepd``), whose
CPU never reaches the test process. This script runs a command (by default the whole suite, ``CI=true``), reads the
machine's busy time from ``/proc/stat`` before and after, and samples every process's CPU from ``/proc/<pid>/stat``
every ``--interval`` seconds, keeping the last value each process showed. It prints the wall time, the busy CPU and
the share of the cores it is, then the CPU by kind of process: a Python program by its script's name (``py
trainer_job.py``), by ``-m module`` or by the start of its ``-c`` code, anything else by its executable. A process
that lives less than one interval is missed, and the sampler itself shows as ``py suite_cpu.py``; the busy time is
exact. Both count every process on the machine, not only the command's: run it on an otherwise idle machine.

Usage: ``.venv/bin/python benchmarks/suite_cpu.py [--interval 0.25] [--top 40] [-- COMMAND ...]``
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from roll_call_scale import machine_description  # the machine line every benchmark prints (benchmarks/ is on path)

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (all but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def kind_of(command_line: bytes, name: str) -> str:
    """A short name for what a process runs, from its ``/proc/<pid>/cmdline``."""
    argv = [part.decode(errors="replace") for part in command_line.split(b"\0") if part]
    if not argv:
        return name
    if not os.path.basename(argv[0]).startswith("python"):
        return os.path.basename(argv[0])
    rest = [part for part in argv[1:] if part not in ("-u", "-B", "-E", "-I", "-s") and not part.startswith("-X")]
    if rest[:1] == ["-m"]:
        return "py -m " + " ".join(rest[1:3])
    if rest[:1] == ["-c"] and len(rest) > 1:
        return "py -c " + rest[1].strip()[:50].replace("\n", "; ")
    return "py " + os.path.basename(rest[0]) if rest else "py"


def sample(stop: threading.Event, interval: float, seen: dict[int, list]) -> None:
    """Until ``stop``: each process's kind, its CPU when first seen (0 if it started after the first pass), and now."""
    first = True
    while not stop.is_set():
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    text = stat.read()
                fields = text.rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
                if pid not in seen:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        kind = kind_of(cmdline.read(), text.split("(", 1)[1].rsplit(")", 1)[0])
                    seen[pid] = [kind, cpu if first else 0.0, cpu]
                else:
                    seen[pid][2] = cpu
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
        first = False
        stop.wait(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("command", nargs="*", help="what to run (default: the suite, CI=true)")
    args = parser.parse_args()
    command = args.command or [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    print(machine_description())
    seen: dict[int, list] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(stop, args.interval, seen), daemon=True)
    busy, start = busy_seconds(), time.monotonic()
    sampler.start()
    completed = subprocess.run(command, cwd=ROOT, env={"CI": "true", **os.environ}, check=False)
    wall, busy = time.monotonic() - start, busy_seconds() - busy
    stop.set()
    sampler.join()
    cores = os.cpu_count() or 1
    share = busy / wall / cores
    print(f"\nexit status {completed.returncode}; wall {wall:.0f} s", end="; ")
    print(f"busy {busy:.0f} s of CPU ({share:.0%} of {cores} cores)\n")
    by_kind: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for kind, first, last in seen.values():
        by_kind[kind] += last - first
        count[kind] += 1
    print("| CPU | processes | kind |\n|---|---|---|")
    for kind, cpu in by_kind.most_common(args.top):
        print(f"| {cpu:.1f} s | {count[kind]} | `{kind}` |")


if __name__ == "__main__":
    main()
