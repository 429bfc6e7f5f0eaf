"""What the test suite's lean interpreter setting saves a rank: fresh interpreters, side by side, medians.

A rank of a test job imports torch and Lightning, does a little, and exits. ``tests/jobs/site/sitecustomize.py``
(put on ``PYTHONPATH`` by ``tests/conftest.py`` for the whole run) collects cyclic garbage less often and skips the
collection over the module graph at exit. This script runs the same program in fresh interpreters with that folder
on ``PYTHONPATH`` ("lean") and without ("plain"), alternating, and reports the medians of each process's CPU time
(user + system, from ``wait4``) and wall time:

- ``import``: ``import torch, lightning`` (a rank's start, and an import-order scenario's cost);
- ``import, no exit``: the same, its exit cut short by ``os._exit``: what is left is the imports' own share.

Usage: ``.venv/bin/python benchmarks/lean_interpreter.py [--repeat 9]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from roll_call_scale import machine_description  # the machine line every benchmark prints (benchmarks/ is on path)

ROOT = Path(__file__).resolve().parents[1]
LEAN_SITE = ROOT / "tests" / "jobs" / "site"
PROGRAMS = {
    "import": "import torch, lightning",
    "import, no exit": "import os, torch, lightning; os._exit(0)",
}


def measure(program: str, lean: bool) -> tuple[float, float]:
    """CPU seconds and wall seconds of one fresh interpreter running ``program``."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if lean:
        env["PYTHONPATH"] = str(LEAN_SITE)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", program], env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{program!r} exited with {process.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    print(machine_description())
    print()
    print("| program | plain: CPU | lean: CPU | ratio | plain: wall | lean: wall | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, program in PROGRAMS.items():
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for index in range(args.repeat):
            for lean in (index % 2 == 0, index % 2 == 1):  # alternate which side goes first
                runs[lean].append(measure(program, lean))
        cpu = {lean: statistics.median(run[0] for run in runs[lean]) for lean in runs}
        wall = {lean: statistics.median(run[1] for run in runs[lean]) for lean in runs}
        print(
            f"| {name}: `{program}` | {cpu[False]:.2f} s | {cpu[True]:.2f} s | x{cpu[True] / cpu[False]:.2f} "
            f"| {wall[False]:.2f} s | {wall[True]:.2f} s | x{wall[True] / wall[False]:.2f} |"
        )


if __name__ == "__main__":
    main()
