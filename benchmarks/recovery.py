"""In-process recovery (``restartable``) against the relaunch (``lightning-mpi-env run``), side by side, in parts.

On the three-node simulated Slurm cluster of the tests (real slurmctld and slurmd), inside ``salloc --no-kill -N3``,
the same job, ``examples/instrumented/trainer_job.py`` (a Trainer, ``ddp_mpi``, gloo, CPU, 4 ranks on 2 nodes, 60
steps, a periodic checkpoint every 5), loses a rank at step 10, once:

- ``killed``: rank 3 is killed (``SIGKILL``); ``frozen``: rank 2 stops (``SIGSTOP``);
- **relaunch**: ``run`` relaunches the step on the nodes left and it resumes from the step-10 checkpoint
  (``benchmarks/relaunch.py``'s run; its parts: detection, teardown, probe, relaunch and resume);
- **shrink**: ``--restartable shrink`` (``restartable(fit, shrink=True)``), the step ``srun --kill-on-bad-exit=0``
  under ``run``: the 3 survivors go on in their processes from rank 0's state in memory;
- **replace**: ``--restartable replace`` (``restartable(fit)``): the same, with a new process on the spare node in
  the lost rank's place (4 ranks again). The in-process parts, each to the slowest survivor:
  **failed** (the fault to the failed collective), **left** (the group left), **agreed** (the lost rank named: the
  verdict), **opened** (the next generation's group open on the same store), **restored** (rank 0's state handed
  over), **first step** (its first training step begins: ``FIRST_STEP``).

Both totals run from the fault (the rank's ``KILL``/``FREEZE`` line) to the first training step after it. The runs
are interleaved, ``--repeat`` times each (3); each part is a median. The last lines give, per fault, the in-process
total over the relaunch's (``x0.25``) for each in-process mode, and whether the healthy ranks kept their processes.

Usage: ``.venv/bin/python benchmarks/recovery.py [--repeat 3] [--stall-timeout 20]``
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the simulated Slurm cluster is the tests' (tests/clusters/slurm.py)

from relaunch import JOB, run_once  # noqa: E402  (benchmarks/ is on the path)
from roll_call_scale import machine_description  # noqa: E402

from tests.clusters.slurm import SlurmCluster  # noqa: E402

FAULTS = {"killed": ["--kill", "3:10"], "frozen": ["--freeze", "2:10"]}
MODES = ("relaunch", "shrink", "replace")
"""The relaunch, and restartable's two worlds: the survivors alone, or with a new process on the spare node."""
IN_PROCESS = ("failed", "left", "agreed", "opened", "restored", "first step", "total")
RELAUNCH = ("detection", "teardown", "probe", "relaunch and resume", "total")
LINE = re.compile(r"^(FIT|FIRST_STEP|RECOVERED|KILL|FREEZE) (.*)$")


def in_process_once(
    cluster: SlurmCluster, fault: str, mode: str, stall_timeout: int, work: Path
) -> tuple[dict[str, float], bool]:
    """One job under ``run`` that goes on in its processes after ``fault`` (``mode``: ``shrink`` or ``replace``): each
    part's seconds, and whether the survivors kept their processes (each survivor's pid in both generations)."""
    marker = work / "fault-once"
    train = [sys.executable, str(JOB), "--strategy", "ddp_mpi", "--zero-config", "--steps", "60"]
    train += ["--restartable", mode, "--root-dir", str(work / "root"), "--freeze-once", str(marker)]
    train += ["--result-dir", str(work), *FAULTS[fault]]
    state = ["--state-dir", str(work / "state")]
    supervisor = [sys.executable, "-m", "lightning_mpi_env", "run", "--restarts", "1", *state]
    step = ["srun", "-N2", "-n4", "--ntasks-per-node=2", "--kill-on-bad-exit=0", *train]
    env = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(stall_timeout), "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": "5"}
    done = cluster.run(["salloc", "--no-kill", "-N3", "--ntasks-per-node=2", *supervisor, "--", *step], 900, env)
    output = done.stdout + done.stderr
    lines = [match.groups() for match in map(LINE.match, done.stdout.splitlines()) if match]
    fault_at = min(float(rest.rsplit("time=", 1)[1]) for word, rest in lines if word in ("KILL", "FREEZE"))
    recovered = [json.loads(rest.split(" ", 2)[2]) for word, rest in lines if word == "RECOVERED"]
    survived = [times for times in recovered if "failed" in times]  # a replacement recovered nothing of its own
    ranks = 3 if mode == "shrink" else 4
    if done.returncode != 0 or len(survived) != 3 or len(list(work.glob("result-*.json"))) != ranks:
        raise RuntimeError(f"{fault}, {mode}: the job did not recover ({done.returncode}):\n{output[-4000:]}")
    firsts = [float(rest.split("time=", 1)[1].split()[0]) for word, rest in lines if word == "FIRST_STEP"]
    after = max(first for first in firsts if first > fault_at)
    parts = {part: max(times[part] for times in survived) - fault_at for part in IN_PROCESS[:5]}
    parts["first step"] = parts["total"] = after - fault_at
    pids = [rest.split("pid=", 1)[1].split()[0] for word, rest in lines if word == "FIT"]
    said = [rest for word, rest in lines if word == "RECOVERED" and "failed" in rest]
    survivors = {rest.split("pid=", 1)[1].split()[0] for rest in said}
    kept = len(survivors) == 3 and all(pids.count(pid) == 2 for pid in survivors) and len(set(pids)) == ranks + 1
    return parts, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stall-timeout", type=int, default=20)
    args = parser.parse_args()
    runs = [(fault, mode) for fault in FAULTS for mode in MODES]
    seconds: dict[tuple[str, str], dict[str, list[float]]] = {run: {} for run in runs}
    kept: dict[tuple[str, str], list[bool]] = {run: [] for run in runs}
    with SlurmCluster(nodes=3, base_port=16987).start() as cluster, tempfile.TemporaryDirectory() as scratch:
        for round_number in range(args.repeat):
            for fault, mode in runs[round_number % len(runs) :] + runs[: round_number % len(runs)]:
                work = Path(scratch) / f"{fault}-{mode}-{round_number}"
                work.mkdir()
                if mode == "relaunch":
                    parts = run_once(cluster, fault, args.stall_timeout, work)
                else:
                    parts, same = in_process_once(cluster, fault, mode, args.stall_timeout, work)
                    kept[(fault, mode)].append(same)
                for part, value in parts.items():
                    seconds[(fault, mode)].setdefault(part, []).append(value)
                print(
                    f"{fault}, {mode}, round {round_number + 1}: "
                    + ", ".join(f"{part} {value:.1f} s" for part, value in parts.items()),
                    flush=True,
                )
                time.sleep(2)  # the nodes' last step ends
    print(f"\nMachine: {machine_description()}")
    print(f"3 simulated Slurm nodes, 4 ranks on 2, stall timeout {args.stall_timeout} s, median of {args.repeat}\n")
    for mode in MODES:
        parts = RELAUNCH if mode == "relaunch" else IN_PROCESS
        print(f"| {mode}: fault | " + " | ".join(parts) + " |")
        print("|---|" + "---|" * len(parts))
        for fault in FAULTS:
            medians = {part: statistics.median(values) for part, values in seconds[(fault, mode)].items()}
            print(f"| {fault} | " + " | ".join(f"{medians[part]:.1f} s" for part in parts) + " |")
        print()
    for fault in FAULTS:
        relaunch = statistics.median(seconds[(fault, "relaunch")]["total"])
        for mode in MODES[1:]:
            ratio = statistics.median(seconds[(fault, mode)]["total"]) / relaunch
            same = all(kept[(fault, mode)])
            print(f"{fault}, {mode}: in-process / relaunch x{ratio:.2f}; healthy ranks kept their PIDs: {same}")


if __name__ == "__main__":
    main()
