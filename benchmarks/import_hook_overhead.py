"""How much the mixed-import hook slows ``import lightning``: fresh interpreters, interleaved, medians.

Figures:

1. ``hook-cpu`` and ``hook-wall``: ``import lightning`` timed (CPU time of the process, and wall time) inside a
   fresh interpreter that has already imported ``lightning_mpi_env``, with our ``sys.meta_path`` finder left in
   place ("with") or taken out ("without"). Same preloaded modules on both sides, so the difference is the hook
   alone (lookups, wrapped loaders, callbacks, frame walks). CPU time is less disturbed by other jobs on a shared
   machine than wall time.
2. ``in-hook``: the CPU time spent inside the hook itself during ``import lightning`` (the fast-path lookups of
   every unwatched import, plus every callback), measured directly with thread-CPU timers around them, so time
   lost to other jobs does not count; the timers' own cost is included, so this is an upper bound.
3. ``process`` (with ``--process``): wall time of a whole fresh ``python -c "import lightning"`` against
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
from lightning_mpi_env.imports import hooks as _import_hooks
if sys.argv[1] == "without":
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _import_hooks._PostImportFinder)]
cpu, wall = time.process_time(), time.perf_counter()
import lightning
print(time.process_time() - cpu, time.perf_counter() - wall)
"""

INSTRUMENTED = """\
import sys, time
import lightning_mpi_env
from lightning_mpi_env.imports import hooks as _import_hooks
spent = [0.0, 0]
finder = _import_hooks._PostImportFinder
original = finder.find_spec
def find_spec(self, fullname, path, target=None, _original=original, _clock=time.thread_time):
    start = _clock()
    spec = _original(self, fullname, path, target)
    if fullname not in _import_hooks._watched or spec is None:  # the fast path, or nothing found
        spent[0] += _clock() - start
        spent[1] += 1
    return spec
finder.find_spec = find_spec
def timed(callback):
    def run(module):
        start = time.thread_time()
        try:
            callback(module)
        finally:
            spent[0] += time.thread_time() - start
    return run
for name, callbacks in _import_hooks._callbacks.items():
    callbacks[:] = [timed(c) for c in callbacks]
import lightning
print(spent[0], spent[1])
"""


def hook_run(side: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, side], capture_output=True, text=True, check=True).stdout
    cpu, wall = out.strip().splitlines()[-1].split()
    return float(cpu), float(wall)


def instrumented_run() -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", INSTRUMENTED], capture_output=True, text=True, check=True).stdout
    spent, calls = out.strip().splitlines()[-1].split()
    return float(spent), int(calls)


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
    parser.add_argument("--process", action="store_true", help="also time whole processes (slow, noisy)")
    args = parser.parse_args()
    import lightning  # noqa: F401 - warm the file cache once, outside the timings

    names = ("hook-cpu", "hook-wall", "process") if args.process else ("hook-cpu", "hook-wall")
    results: dict[str, dict[str, list[float]]] = {name: {"without": [], "with": []} for name in names}
    in_hook: list[float] = []
    calls = 0
    for index in range(args.repeat):
        # Alternate which side goes first, so drift on a shared machine hits both alike.
        sides = ("without", "with") if index % 2 == 0 else ("with", "without")
        for side in sides:
            cpu, wall = hook_run(side)
            results["hook-cpu"][side].append(cpu)
            results["hook-wall"][side].append(wall)
        if args.process:
            for side in sides:
                results["process"][side].append(process_run(side))
        spent, calls = instrumented_run()
        in_hook.append(spent)
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPU(s), {platform.platform()}")
    for name, sides in results.items():
        report(name, sides["without"], sides["with"])
    print(
        f"in-hook  median {statistics.median(in_hook) * 1e3:.2f} ms inside the hook during `import lightning` "
        f"({calls} finder calls), spread {min(in_hook) * 1e3:.2f}-{max(in_hook) * 1e3:.2f} ms, n={len(in_hook)}"
    )


if __name__ == "__main__":
    main()
