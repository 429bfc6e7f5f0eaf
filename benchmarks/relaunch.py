"""From a fault to the first training step after the relaunch, under ``lightning-mpi-env run``, split in parts.

On the three-node simulated Slurm cluster of the tests (``tests/clusters/slurm.py``: real slurmctld and slurmd, each
node in its own UTS namespace), inside ``salloc --no-kill -N3``, the supervisor runs ``srun -N2 -n4
--ntasks-per-node=2 examples/instrumented/trainer_job.py`` (``ddp_mpi``, gloo, CPU) for 60 steps with a periodic
checkpoint every 5 (``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY``). At step 10, the first step only, a fault hits node2:

- ``frozen``: rank 2 stops (``SIGSTOP``): the stall watchdog names it after the stall timeout;
- ``killed``: rank 3 is killed (``SIGKILL``): the other ranks fail at once, srun says which task a signal ended;
- ``hung node``: rank 2 stops and so does node2's slurmd: the step cannot end there, and the supervisor kills srun
  after ``--grace``.

The faults run interleaved, in a rotating order, ``--repeat`` times each (3), and each part is a median:

- **detection**: the fault (the rank's ``FREEZE``/``KILL`` line) to the verdict (the failure record's time, or the
  end of the step where srun's lines are the verdict);
- **teardown**: the verdict to the end of the failed step (the supervisor's ``failure`` event);
- **probe**: the end of the step to the relaunch: the backoff (``--backoff 1``) and the health probe of the hosts
  left;
- **relaunch and resume**: the relaunch to the relaunched step's first training step (``first_step``: Python, torch
  and Lightning start, the roll call, the checkpoint loaded, one step);
- **total**: the fault to that first step. The issue's bar: the stall timeout + 30 s.

Usage: ``.venv/bin/python benchmarks/relaunch.py [--repeat 3] [--stall-timeout 20]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the simulated Slurm cluster is the tests' (tests/clusters/slurm.py)

from roll_call_scale import machine_description  # noqa: E402  (benchmarks/ is on the path)

from tests.clusters.slurm import SlurmCluster  # noqa: E402

JOB = ROOT / "examples" / "instrumented" / "trainer_job.py"
FAULTS = {"frozen": ["--freeze", "2:10"], "killed": ["--kill", "3:10"], "hung node": ["--freeze", "2:10"]}
PARTS = ("detection", "teardown", "probe", "relaunch and resume", "total")


def run_once(cluster: SlurmCluster, fault: str, stall_timeout: int, work: Path) -> dict[str, float]:
    """One supervised job with ``fault``; each part's seconds."""
    state, marker = work / "state", work / "fault-once"
    train = [sys.executable, str(JOB), "--strategy", "ddp_mpi", "--zero-config", "--steps", "60"]
    train += ["--root-dir", str(work / "root"), "--freeze-once", str(marker), *FAULTS[fault]]
    supervisor = [sys.executable, "-m", "lightning_mpi_env", "run", "--restarts", "2", "--backoff", "1"]
    supervisor += ["--probe-timeout", "10", "--state-dir", str(state), "--"]
    step = ["srun", "-N2", "-n4", "--ntasks-per-node=2", *train]
    env = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(stall_timeout), "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY": "5"}
    stop_slurmd = threading.Event()
    hanging = threading.Thread(target=_hang_when, args=(cluster, marker, stop_slurmd), daemon=True)
    if fault == "hung node":
        hanging.start()
    try:
        done = cluster.run(["salloc", "--no-kill", "-N3", "--ntasks-per-node=2", *supervisor, *step], 900, env)
    finally:
        stop_slurmd.set()
        if fault == "hung node":
            hanging.join()
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{fault}: the supervised job failed ({done.returncode}):\n{output[-4000:]}")
    (journal,) = state.glob("*/timeline.jsonl")
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    fault_at = min(
        float(line.rsplit("time=", 1)[1])
        for line in done.stdout.splitlines()
        if " time=" in line and line.startswith(("FREEZE", "KILL"))
    )
    failure = next(event for event in events if event["event"] == "failure")
    relaunch = next(event for event in events if event["event"] == "relaunch")
    first = next(event for event in events if event["event"] == "first_step" and event["step"] == 2)
    verdict = failure["verdict_at"] if failure["verdict_at"] is not None else failure["when"]
    return {
        "detection": verdict - fault_at,
        "teardown": failure["when"] - verdict,
        "probe": relaunch["when"] - failure["when"],
        "relaunch and resume": first["when"] - relaunch["when"],
        "total": first["when"] - fault_at,
    }


def _hang_when(cluster: SlurmCluster, marker: Path, done: threading.Event) -> None:
    # node2's slurmd stops right after the fault (its marker file appears), and goes on when the job is over.
    pid = cluster.daemon_pid("node2")
    while not done.wait(0.05):
        if marker.exists():
            os.kill(pid, signal.SIGSTOP)
            done.wait()
            os.kill(pid, signal.SIGCONT)
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stall-timeout", type=int, default=20)
    args = parser.parse_args()
    seconds: dict[str, dict[str, list[float]]] = {fault: {part: [] for part in PARTS} for fault in FAULTS}
    order = list(FAULTS)
    with SlurmCluster(nodes=3, base_port=16977).start() as cluster, tempfile.TemporaryDirectory() as scratch:
        for round_number in range(args.repeat):
            for fault in order[round_number % len(order) :] + order[: round_number % len(order)]:
                work = Path(scratch) / f"{fault.replace(' ', '-')}-{round_number}"
                work.mkdir()
                parts = run_once(cluster, fault, args.stall_timeout, work)
                for part, value in parts.items():
                    seconds[fault][part].append(value)
                print(
                    f"{fault}, round {round_number + 1}: " + ", ".join(f"{p} {v:.1f} s" for p, v in parts.items()),
                    flush=True,
                )
                time.sleep(2)  # the nodes' last step ends
    print(f"\nMachine: {machine_description()}")
    print(
        f"3 simulated Slurm nodes, 2 used + 1 spare, 4 ranks, stall timeout {args.stall_timeout} s, "
        f"median of {args.repeat}\n"
    )
    print("| fault | " + " | ".join(PARTS) + " | bar (timeout + 30 s) |")
    print("|---|" + "---|" * (len(PARTS) + 1))
    for fault in FAULTS:
        medians = {part: statistics.median(values) for part, values in seconds[fault].items()}
        cells = " | ".join(f"{medians[part]:.1f} s" for part in PARTS)
        bar = args.stall_timeout + 30
        print(f"| {fault} | {cells} | {'met' if medians['total'] <= bar else 'missed'} ({bar} s) |")


if __name__ == "__main__":
    main()
