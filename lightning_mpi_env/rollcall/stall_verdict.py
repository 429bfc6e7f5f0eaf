"""The stall watchdog's verdict: rank 0 writes it once; every rank that reads it says why and exits at one moment.

Exit status 1 on every rank makes the launcher end the job: the main thread is blocked in a collective, which no
exception can interrupt. Where the launcher would still wait for a frozen rank (``srun`` by default), one rank then
ends the step with the scheduler's command (:attr:`~lightning_mpi_env.core.launchers.Launcher.end_step`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.core.report import render
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.rollcall.store_values import stall_verdict

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

KEY = "lightning_mpi_env/watchdog/"
VERDICT = KEY + "verdict"
EVENTS = KEY + "events"
"""A count every rank's thread reads once per interval (``add(EVENTS, 0)``): zero until a verdict or a stop
request is written, so a healthy job reads nothing else."""


def say(line: str) -> None:
    """One line of this package's on stderr."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def write_verdict(store: TCPStore, stall: StallError, exit_at: float) -> None:
    """Rank 0 stores the verdict and counts it as an event, for every rank's thread to read at its next interval."""
    fields = {"problem": stall.problem, "hint": stall.hint, "value": stall.value, "exit_at": exit_at}
    store.set(VERDICT, json.dumps(fields))
    store.add(EVENTS, 1)


def stored_verdict(data: object) -> tuple[StallError, float]:
    """A parser of the stored verdict: the error every rank shows, and the wall-clock second at which it ends."""
    verdict = stall_verdict(data)
    error = StallError(verdict.problem, verdict.hint, variable=VARIABLE["stall_timeout"], value=verdict.value)
    return error, verdict.exit_at


def store_silent(seconds: float, timeout: float) -> StallError:
    """The verdict of a rank whose requests to rank 0's store went unanswered for ``seconds``."""
    return StallError(
        f"Rank 0's store (the main address) has not answered this rank's watchdog for "
        f"{seconds:.0f} s: rank 0 or its node froze or is overloaded.",
        "Look at rank 0's host.",
        variable=VARIABLE["stall_timeout"],
        value=f"{timeout:g}",
    )


def end_at(
    error: StallError, exit_at: float, *, rank: int, end_step: Sequence[str], exit: Callable[[int], object]
) -> None:
    """Say why, then end this process at ``exit_at`` (wall clock), when every rank ends too; then ``end_step``.

    Ranks that ended at different moments would wake the others' collectives with "connection closed by peer"
    tracebacks that bury the cause; until then, what the blocked main thread prints goes nowhere.
    """
    text = render(error) or f"StallError: {error.one_line()}\n"
    if end_step:
        text += f"lightning-mpi-env: rank {rank} ends the job step: {' '.join(end_step)}\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    said = -1
    if exit is os._exit:
        said = os.dup(2)
        silence = os.open(os.devnull, os.O_WRONLY)
        os.dup2(silence, 1)
        os.dup2(silence, 2)
    time.sleep(max(0.0, min(exit_at - time.time(), 30.0)))
    if end_step:
        end_step_now(end_step, said)
    exit(1)


def end_step_now(command: Sequence[str], said: int) -> None:
    """Run the scheduler's command that ends this step; say on ``said`` (a copy of stderr, or -1) when it failed.

    The command runs inside the step it ends, so the step's SIGKILL can reach it before it exits: that death is the
    step ending, not a failure to end it.
    """
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        ended = done.returncode in (0, -signal.SIGKILL)
        failure = "" if ended else done.stderr.decode(errors="replace").strip()[-300:]
        failure = failure or ("" if ended else f"exit status {done.returncode}")
    except (OSError, subprocess.TimeoutExpired) as error:
        failure = f"{type(error).__name__}: {error}"
    if failure:
        line = f"lightning-mpi-env: could not end the job step with `{' '.join(command)}` ({failure}).\n"
        if said >= 0:
            os.write(said, line.encode())
        else:
            say(line.rstrip())
