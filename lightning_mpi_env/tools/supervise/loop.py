"""The supervisor's loop: run the step, read its failure records, decide, relaunch without the hosts to blame.

Each step gets a folder of its own, ``<state>/<job>/step-<n>``, which the child alone sees as
``LIGHTNING_MPI_ENV_STATE_DIR``; the timeline goes to stderr and to ``<state>/<job>/timeline.jsonl``. The exit status
is the last step's. ``SIGINT`` and ``SIGTERM`` to the supervisor go to the step (srun ends its tasks on them) and end
the loop. What is not here yet (``docs/notes/issue-24-status.md``): node counts without spares, the health probe,
``died`` records with a host, resume, launchers other than ``srun``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from lightning_mpi_env.core.errors import FailureRecordError
from lightning_mpi_env.core.failures import read_records
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.tools.supervise.policy import Action, RestartPolicy, StepOutcome, describe
from lightning_mpi_env.tools.supervise.srun_line import SrunLine
from lightning_mpi_env.tools.supervise.timeline import Event, EventKind, Timeline, Value

DEFAULT_STATE = ".lightning-mpi-env-run"
"""The state folder under the working directory (a batch job's, on a file system every node sees)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_step(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run one step and return its exit status (128 + N for a signal); forward SIGINT/SIGTERM to it meanwhile."""
    process = subprocess.Popen(list(argv), env=dict(env))

    def forward(signum: int, frame: FrameType | None) -> None:
        process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 128 - status if status < 0 else status


def supervise(
    words: Sequence[str],
    policy: RestartPolicy,
    *,
    env: Mapping[str, str],
    state: str = DEFAULT_STATE,
    say: Callable[[str], object] = lambda line: print(line, file=sys.stderr, flush=True),
    run: Callable[[Sequence[str], Mapping[str, str]], int] = run_step,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """Run the srun line ``words`` under ``policy`` until it succeeds or the policy stops; the last step's status.

    Raises:
        SrunLineError: The line is not one the supervisor can relaunch (before anything runs).
    """
    line = SrunLine.parse(words)
    line.excluded()  # a malformed or file exclusion is refused before the first step
    identity = job_identity(env)
    job = _UNSAFE.sub("_", identity[0]) if identity is not None else f"pid-{os.getpid()}"
    root = Path(state) / job
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "timeline.jsonl", "a", encoding="utf-8") as journal:

        def keep(text: str) -> None:
            journal.write(text + "\n")
            journal.flush()  # a reader (or the next step's supervisor) sees each event as it happens

        timeline = Timeline(say, keep)
        excluded: list[str] = []
        step = 0
        while True:
            step += 1
            folder = root / f"step-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            argv = line.with_excluded(excluded)
            timeline.add(Event(EventKind.LAUNCH, step, " ".join(argv), fields={"argv": list(argv)}))
            status = run(argv, {**env, VARIABLE["state_dir"]: str(folder)})
            try:
                records = tuple(read_records(str(folder)))
            except FailureRecordError as error:
                say(f"lightning-mpi-env run: {error.one_line()}")
                records = ()
            outcome = StepOutcome(status, records)
            if status != 0:
                failure: dict[str, Value] = {"status": status, "hosts": list(outcome.hosts_to_blame)}
                timeline.add(Event(EventKind.FAILURE, step, describe(outcome), fields=failure))
            decision = policy.decide(outcome)
            if decision.action is Action.DONE:
                timeline.add(Event(EventKind.DONE, step, "the step succeeded", fields={"status": status}))
                return status
            if decision.action is Action.STOP:
                reason = decision.reason.value if decision.reason is not None else None
                stop: dict[str, Value] = {"status": status, "reason": reason}
                timeline.add(Event(EventKind.STOP, step, decision.message, fields=stop))
                return status
            new = [host for host in decision.exclude if host not in excluded]
            if new:
                excluded.extend(new)
                timeline.add(Event(EventKind.EXCLUDED, step, ", ".join(new), fields={"hosts": new}))
            timeline.add(
                Event(
                    EventKind.RELAUNCH,
                    step + 1,
                    f"{decision.message}; in {decision.wait:g} s",
                    fields={"wait": decision.wait},
                )
            )
            sleep(decision.wait)


__all__ = ["DEFAULT_STATE", "run_step", "supervise"]
