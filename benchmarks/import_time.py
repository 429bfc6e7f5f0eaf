"""Import cost of `import lightning_mpi_env` plus `from_env(os.environ)`, from the wheel and the editable install.

Builds the wheel of this checkout, installs it (no dependencies: the core needs the standard library only) into a
fresh virtual environment, and reads ``python -X importtime`` there and in this checkout's ``.venv`` (editable). The
figure is the cumulative time of the ``lightning_mpi_env`` row: this package's modules and every standard-library
module they bring in, nothing the interpreter had loaded before. Medians of ``--repeat`` runs, side by side.

Usage: ``.venv/bin/python benchmarks/import_time.py [--repeat 15]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = "import os, lightning_mpi_env; lightning_mpi_env.from_env(os.environ)"


def importtime(python: str) -> tuple[int, int, list[str]]:
    """Microseconds: the package's cumulative import time, its own modules' share, and the modules it loaded."""
    err = subprocess.run([python, "-X", "importtime", "-c", PROGRAM], capture_output=True, text=True, check=True).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            self_us, cumulative, name = line[len("import time:") :].split("|")
            rows.append((name.strip(), int(self_us), int(cumulative)))
    # -X importtime lists a module after everything it imported, with their time in its cumulative figure.
    start = next(i for i, row in enumerate(rows) if row[0] == "lightning_mpi_env")
    ours = sum(row[1] for row in rows if row[0].startswith("lightning_mpi_env"))
    return rows[start][2], ours, [row[0] for row in rows[: start + 1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        wheels = Path(work) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(wheels)], check=True
        )
        venv = Path(work) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        wheel = next(wheels.glob("lightning_mpi_env-*.whl"))
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True)
        pythons = {"wheel (fresh venv)": str(venv / "bin" / "python"), "editable (.venv)": sys.executable}
        results: dict[str, list[tuple[int, int, list[str]]]] = {name: [] for name in pythons}
        for _ in range(args.repeat):  # interleaved, so that load from elsewhere hits both alike
            for name, python in pythons.items():
                results[name].append(importtime(python))
    load = os.getloadavg()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"\n`{PROGRAM}`, `-X importtime`, median of {args.repeat} runs:\n")
    print("| install | `lightning_mpi_env` cumulative | its own modules | min - max |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cumulative = [run[0] for run in runs]
        own = [run[1] for run in runs]
        print(
            f"| {name} | {statistics.median(cumulative) / 1000:.1f} ms | {statistics.median(own) / 1000:.1f} ms | "
            f"{min(cumulative) / 1000:.1f} - {max(cumulative) / 1000:.1f} ms |"
        )
    outside = ("torch", "lightning", "typing_extensions", "lightning_utilities")
    heavy = [name for name in results["wheel (fresh venv)"][0][2] if name.split(".")[0] in outside]
    print(f"\nModules outside the standard library loaded: {heavy or 'none'}")


if __name__ == "__main__":
    main()
