"""Hostile inputs (issue 23, item 4): time and peak memory of each, run through the CLI or the API, one per process.

Each case runs in a fresh interpreter under an address-space cap (``--cap-mb``, 3072 by default, so a blow-up ends
in ``MemoryError`` instead of taking the machine) and a wall-clock bound (``--bound``, 60 s by default, so a hang is
reported as one). The table gives the wall time, the CPU time and the peak resident memory of the child
(``rusage``), and how the case ended: its exit status and the last line it printed. The tests
(``tests/test_hostile_inputs.py``) check the same inputs against generous bounds; this script gives the figures.

Usage: ``.venv/bin/python benchmarks/hostile_inputs.py [--cap-mb 3072] [--bound 60] [--only NAME]``
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
HUGE = str(10**17)
HUGE_LOCAL = {**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": HUGE, "OMPI_COMM_WORLD_LOCAL_SIZE": HUGE, "MASTER_ADDR": "nodea"}
NODELIST_40 = ",".join(f"n{item}x[1-999999]" for item in range(40))
CLI = [sys.executable, "-m", "lightning_mpi_env"]


def api(code: str) -> list[str]:
    return [sys.executable, "-c", f"import lightning_mpi_env as m, lightning_mpi_env.core.settings as s\n{code}"]


def cases(workdir: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    fifo = workdir / "fifo"
    os.mkfifo(fifo)
    big = workdir / "big_nodefile"
    with big.open("wb") as file:  # 1 GB: a first line, then a hole (read back as NUL bytes, no newline)
        file.write(b"node001\n")
        file.truncate(10**9)
    return [
        ("floor: `--version` (interpreter start and import)", [*CLI, "--version"], {}),
        ("exec, *_LOCAL_SIZE=10^17", [*CLI, "exec", "--", "true"], HUGE_LOCAL),
        ("torch_env(), *_LOCAL_SIZE=10^17", api("m.torch_env()"), HUGE_LOCAL),
        ("jax_distributed_kwargs(), *_LOCAL_SIZE=10^17", api("m.jax_distributed_kwargs()"), HUGE_LOCAL),
        ("show, 40 x n[1-999999]", [*CLI, "show"], {**OPEN_MPI, "SLURM_JOB_NODELIST": NODELIST_40}),
        ("show, PBS_NODEFILE=FIFO", [*CLI, "show"], {**OPEN_MPI, "PBS_NODEFILE": str(fifo)}),
        ("show, PBS_NODEFILE=/dev/zero", [*CLI, "show"], {**OPEN_MPI, "PBS_NODEFILE": "/dev/zero"}),
        ("show, 1 GB PBS_NODEFILE", [*CLI, "show"], {**OPEN_MPI, "PBS_NODEFILE": str(big)}),
        ("doctor, MASTER_ADDR=a..b", [*CLI, "doctor"], {**OPEN_MPI, "MASTER_ADDR": "a..b"}),
        ("doctor, MASTER_ADDR=64-char label", [*CLI, "doctor"], {**OPEN_MPI, "MASTER_ADDR": "a" * 64}),
        ("doctor, MASTER_ADDR=non-UTF-8", [*CLI, "doctor"], {**OPEN_MPI, "MASTER_ADDR": "node\udcff"}),
        (
            "doctor, MASTER_ADDR + FIFO host file",
            [*CLI, "doctor"],
            {**OPEN_MPI, "MASTER_ADDR": "localhost", "PBS_NODEFILE": str(fifo)},
        ),
        *[
            (
                f"timeout {value!r}",
                api("print(s.Settings.from_env(__import__('os').environ))"),
                {"LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": value},
            )
            for value in ("1e18", "1e-300", "\u0663", "1_0")
        ],
        *[
            (f"show, MASTER_ADDR={value!r}", [*CLI, "show"], {**OPEN_MPI, "MASTER_ADDR": value})
            for value in (" ", "a\nb", "-oX=y")
        ],
        ("simulate --nodes 30 --per-node 30", [*CLI, "simulate", "--nodes", "30", "--ppn", "30"], {}),
        ("simulate --nodes 100 --per-node 100", [*CLI, "simulate", "--nodes", "100", "--ppn", "100"], {}),
        (
            "simulate --nodes 10^18 --per-node 10^18",
            [*CLI, "simulate", "--nodes", str(10**18), "--ppn", str(10**18), "--np", "1"],
            {},
        ),
        (
            "simulate --nodes 10^8 --per-node 1 --np 1",
            [*CLI, "simulate", "--nodes", str(10**8), "--ppn", "1", "--np", "1"],
            {},
        ),
    ]


def run(argv: list[str], env: dict[str, str], cap_mb: int, bound: float) -> tuple[float, float, float, str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_mb << 20, cap_mb << 20))

    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    if "PYTHONPATH" in os.environ:  # to measure another checkout: PYTHONPATH=<its root>
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        env={key.encode(): value.encode("utf-8", "surrogateescape") for key, value in environ.items()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=limit,
    )
    try:
        output, _ = process.communicate(timeout=bound)
        ended = f"exit {process.returncode}"
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        ended = f"still running after {bound:g} s (killed)"
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = output.decode(errors="replace").strip().splitlines()
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, f"{ended}: {lines[-1][:150] if lines else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mb", type=int, default=3072)
    parser.add_argument("--bound", type=float, default=60.0)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, cap {args.cap_mb} MB")
    print(f"# load average {os.getloadavg()[0]:.1f}: wall times vary with it, CPU times (user + sys) less")
    print("| case | wall s | CPU s | peak MB | outcome |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for name, argv, env in cases(Path(workdir)):
            if args.only and args.only not in name:
                continue
            # Each case in its own measuring child, so ru_maxrss of RUSAGE_CHILDREN is this case's alone.
            probe = subprocess.run(
                [sys.executable, __file__, "--one", repr((argv, env, args.cap_mb, args.bound))],
                capture_output=True,
                text=True,
                check=False,
            )
            print(f"| {name} | {probe.stdout.strip() or probe.stderr.strip()[-200:]} |", flush=True)


def one(spec: str) -> None:
    import ast

    argv, env, cap_mb, bound = ast.literal_eval(spec)
    wall, cpu, peak, outcome = run(argv, env, cap_mb, bound)
    print(f"{wall:.2f} | {cpu:.2f} | {peak:.0f} | {outcome.replace('|', '/')}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        one(sys.argv[2])
    else:
        main()
