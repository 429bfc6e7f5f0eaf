"""How much the mixed-import hook slows ``import lightning``: fresh interpreters, interleaved, medians.

Two figures:

1. ``hook``: ``import lightning`` timed inside a fresh interpreter that has already imported ``lightning_mpi_env``,
   with our ``sys.meta_path`` finder left in place ("with") or taken out ("without"). Same preloaded modules on
   both sides, so the difference is the hook alone (lookups, wrapped loaders, callbacks, frame walks).
2. ``process``: wall time of a whole fresh ``python -c "import lightning"`` against
   ``python -c "import lightning_mpi_env, lightning"``: what a user pays in all, our own import included.

Usage: ``python benchmarks/import_hook_overhead.py [--repeat 15]``.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

CHILD = """\
import sys, time
import lightning_mpi_env
if sys.argv[1] == "without":
    from lightning_mpi_env import _import_hooks
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _import_hooks._PostImportFinder)]
start = time.perf_counter()
import lightning
print(time.perf_counter() - start)
"""


def hook_run(side: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, side], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def process_run(side: str) -> float:
    code = "import lightning" if side == "without" else "import lightning_mpi_env, lightning"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def report(name: str, without: list[float], with_: list[float]) -> None:
    a, b = statistics.median(without), statistics.median(with_)
    print(
        f"{name:8s} without {a * 1e3:8.1f} ms   with {b * 1e3:8.1f} ms   "
        f"difference {(b - a) * 1e3:+7.1f} ms   ratio {b / a:.4f} ({(b / a - 1) * 100:+.2f}%)   "
        f"n={len(without)}, spread without {min(without) * 1e3:.0f}-{max(without) * 1e3:.0f} ms, "
        f"with {min(with_) * 1e3:.0f}-{max(with_) * 1e3:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    import lightning  # noqa: F401 - warm the file cache once, outside the timings

    results: dict[str, dict[str, list[float]]] = {name: {"without": [], "with": []} for name in ("hook", "process")}
    for index in range(args.repeat):
        # Alternate which side goes first, so drift on a shared machine hits both alike.
        sides = ("without", "with") if index % 2 == 0 else ("with", "without")
        for side in sides:
            results["hook"][side].append(hook_run(side))
        for side in sides:
            results["process"][side].append(process_run(side))
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPU(s), {platform.platform()}")
    for name, sides in results.items():
        report(name, sides["without"], sides["with"])


if __name__ == "__main__":
    main()
