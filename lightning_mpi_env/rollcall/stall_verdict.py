"""The stall watchdog's verdict: rank 0 writes it once; every rank that reads it says why and exits at one moment.

Exit status 1 on every rank makes the launcher end the job: the main thread is blocked in a collective, which no
exception can interrupt. Where the launcher would still wait for a frozen rank (``srun`` by default), one rank then
ends the step with the scheduler's command (:attr:`~lightning_mpi_env.core.launchers.Launcher.end_step`).
"""

from __future__ import annotations

import json
import os
import shutil
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

    from lightning_mpi_env.core.rank_layout import RankLayout

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


def step_end(launch: RankLayout | None) -> tuple[tuple[str, ...], str]:
    """The command that ends ``launch``'s step, ``()`` where there is none or it is not on PATH; and its hint.

    The hint is the launcher's option that ends a step when one rank fails, for a step that outlives the command.
    """
    if launch is None or launch.launcher is None:
        return (), ""
    command = launch.end_step if launch.end_step and shutil.which(launch.end_step[0]) is not None else ()
    return tuple(command), launch.launcher.end_hint


END_STEP_RETRIES = 4
"""Requests to end the step after the first, each after a wait twice the last (1, 2, 4, 8 s), while this rank, which
runs inside the step, is still alive: the scheduler may have lost a request. Then 16 s more, and it gives up."""


def end_at(
    error: StallError,
    exit_at: float,
    *,
    rank: int,
    end_step: Sequence[str],
    exit: Callable[[int], object],
    end_hint: str = "",
) -> None:
    """Say why, then end this process at ``exit_at`` (wall clock), when every rank ends too; then ``end_step``.

    Ranks that ended at different moments would wake the others' collectives with "connection closed by peer"
    tracebacks that bury the cause; until then, what the blocked main thread prints goes nowhere.
    """
    text = render(error) or f"StallError: {error.one_line()}\n"
    if end_step:
        text += ending_line(rank, end_step)
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
        end_step_now(end_step, said, retries=END_STEP_RETRIES if exit is os._exit else 0, hint=end_hint)
    exit(1)


def ending_line(rank: int, end_step: Sequence[str]) -> str:
    """The line of the rank that ends the job step, said before it does."""
    return f"lightning-mpi-env: rank {rank} ends the job step: {' '.join(end_step)}\n"


def end_step_now(
    command: Sequence[str],
    said: int,
    *,
    retries: int = 0,
    hint: str = "",
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Run the scheduler's command that ends this step; say on ``said`` (a copy of stderr, or -1) when it failed.

    The command runs inside the step it ends, so the step's SIGKILL can reach it before it exits: that death is the
    step ending, not a failure to end it. A process still alive after it asks again, ``retries`` times with a
    growing wait, then says once that the step outlived every request (``hint``: what ends it when a rank fails)
    and returns, for the caller to exit.
    """
    wait, waited = 1.0, 0.0
    for attempt in range(retries + 1):
        failure = _run_end_step(command)
        if failure and attempt == 0:
            _say_on(said, f"lightning-mpi-env: could not end the job step with `{' '.join(command)}` ({failure}).")
        if retries == 0:
            return
        sleep(wait)
        waited += wait
        wait *= 2
    instead = f"add {hint}" if hint else "end a step when one of its ranks fails"
    _say_on(
        said,
        f"lightning-mpi-env: the job step still runs {waited:.0f} s after {retries + 1} requests "
        f"`{' '.join(command)}`: the scheduler lost them or cannot end it. To end the step when a rank fails, "
        f"{instead}; else the step runs until its time limit. This rank exits now.",
    )


def _run_end_step(command: Sequence[str]) -> str:
    """Run ``command`` once: ``""`` when it ended the step (or the step's SIGKILL ended it), else why not."""
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if done.returncode in (0, -signal.SIGKILL):
        return ""
    return done.stderr.decode(errors="replace").strip()[-300:] or f"exit status {done.returncode}"


def _say_on(said: int, line: str) -> None:
    """One line on ``said`` (a copy of stderr, kept while stderr itself is silenced), or on stderr when -1."""
    if said >= 0:
        os.write(said, (line + "\n").encode())
    else:
        say(line)
