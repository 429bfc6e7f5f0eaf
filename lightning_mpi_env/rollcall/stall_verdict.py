"""The stall watchdog's verdict: rank 0 writes it once; every rank that reads it says why and exits at one moment.

Exit status 1 on every rank makes the launcher end the job: the main thread is blocked in a collective, which no
exception can interrupt. Where the launcher would still wait for a frozen rank (``srun`` by default), one rank then
ends the step with the scheduler's command (:attr:`~lightning_mpi_env.core.launchers.Launcher.end_step`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

EXIT_WAIT_LIMIT = 30.0
"""The most seconds :func:`end_at` waits for the verdict's moment."""

ASK_BOUND = float(2 ** (END_STEP_RETRIES + 1) - 1)
"""Seconds after the verdict's moment past which a rank still alive stops asking the scheduler to end its step."""

FIRST_ASK = 5.0
"""Seconds after the verdict's moment before a rank that did not send the end-step command asks itself: a healthy
scheduler's ``KILL`` ends every task of the step within a second or two, so it sees no such request at all."""

STAGGER = 1.0
"""Seconds between the first requests of ranks ``rank % STAGGER_SLOTS`` apart."""

STAGGER_SLOTS = 8

SPREAD_PER_RANK = 1 / 2000
"""Seconds over which the nodes' first requests spread, per rank of the job (at least 1 s, at most 8 s): each
host's name gives it its own moment in that window, so that no two thousand nodes ask at once."""

ENDS_WITHIN = EXIT_WAIT_LIMIT + ASK_BOUND + 5.0
"""Seconds within which :func:`end_at` ends its process, once it has shown the verdict."""


@dataclass(frozen=True)
class AskPlan:
    """When a rank still alive asks the scheduler to end its step, in seconds after the verdict's moment."""

    times: tuple[float, ...]
    bound: float
    """When a rank still alive stops asking, says what ends the step instead, and exits (``0``: it just returns)."""
    sender: bool
    """Whether this rank asks first, at once: its failure to ask is said at once, and it asks whatever its node does."""


def ask_plan(*, sender: bool, rank: int, host: str, world_size: int = 1) -> AskPlan:
    """This rank's :class:`AskPlan`: the sender's at once, every other rank's only if the first ``KILL`` missed it.

    The sender asks at once, then 1, 2, 4 and 8 s apart. Another rank first asks :data:`FIRST_ASK` s later, by
    ``rank % 8`` s and by its host's own moment in the spread (:data:`SPREAD_PER_RANK`) later still, then after
    waits of 4 s (or the spread, if longer) and twice that: one rank per node at a time (:class:`NodeTurn`), and only
    where the ``KILL`` did not come, as a delivered one ends the rank.

    >>> ask_plan(sender=True, rank=0, host="node1")
    AskPlan(times=(0.0, 1.0, 3.0, 7.0, 15.0), bound=31.0, sender=True)
    >>> [round(time) for time in ask_plan(sender=False, rank=2, host="node2", world_size=4).times]
    [7, 11, 19]
    """
    if sender:
        return AskPlan(_doubling(0.0, 1.0, ASK_BOUND), ASK_BOUND, sender=True)
    spread = min(8.0, max(1.0, world_size * SPREAD_PER_RANK))
    share = zlib.crc32(host.encode()) % 1000 / 1000
    first = FIRST_ASK + (rank % STAGGER_SLOTS) * STAGGER + share * spread
    return AskPlan(_doubling(first, max(4.0, spread), ASK_BOUND), ASK_BOUND, sender=False)


def _doubling(first: float, wait: float, bound: float) -> tuple[float, ...]:
    """``first`` and the moments after it, each wait twice the last, before ``bound``."""
    times: list[float] = []
    while first < bound:
        times.append(first)
        first, wait = first + wait, 2 * wait
    return tuple(times)


class NodeTurn:
    """This node's turn to ask for the end of one step: held by one live process of the node at a time.

    An abstract Unix socket, named by the host and the command, bound by the first rank of the node that asks; the
    kernel frees the name when that process dies (the step's ``KILL``), and the next rank alive there takes it. Where
    such names are not to be had (not Linux), every rank asks on its own plan.
    """

    def __init__(self, host: str, command: Sequence[str]) -> None:
        digest = hashlib.sha256("\0".join((host, *command)).encode()).hexdigest()[:32]
        self._name = f"\0lightning-mpi-env/end-step/{digest}"
        self._held: socket.socket | None = None

    def __call__(self) -> bool:
        """Whether it is this process's turn: it holds the name, took it now, or no such name is to be had."""
        if self._held is not None:
            return True
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            held.bind(self._name)
        except OSError as error:
            held.close()
            return error.errno != errno.EADDRINUSE  # in use: another live process of this node asks
        self._held = held
        return True

    def close(self) -> None:
        """Give the turn back (the process exits anyway; a test's does not)."""
        if self._held is not None:
            self._held.close()
            self._held = None


def end_at(
    error: StallError,
    exit_at: float,
    *,
    rank: int,
    end_step: Sequence[str],
    exit: Callable[[int], object],
    end_hint: str = "",
    sends: bool = False,
    host: str = "",
    world_size: int = 1,
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Say why, then end this process at ``exit_at`` (wall clock), when every rank ends too, or end the step.

    Ranks that ended at different moments would wake the others' collectives with "connection closed by peer"
    tracebacks that bury the cause; until then, what the blocked main thread prints goes nowhere. Under
    ``end_step`` no rank ends on its own at ``exit_at``: the rank that ``sends`` the command runs it then, and every
    rank asks again on its :func:`ask_plan` while it lives, as the sender may die of its own request before the
    scheduler has reached every node. The step's ``KILL`` ends each rank it reaches; the others end at the bound.
    """
    text = render(error) or f"StallError: {error.one_line()}\n"
    if end_step and sends:
        text += ending_line(rank, end_step)
    sys.stderr.write(text)
    sys.stderr.flush()
    said = -1
    if exit is os._exit:
        said = os.dup(2)
        silence = os.open(os.devnull, os.O_WRONLY)
        os.dup2(silence, 1)
        os.dup2(silence, 2)
    sleep(max(0.0, min(exit_at - time.time(), EXIT_WAIT_LIMIT)))
    if end_step:
        ask_on_plan(
            end_step, end_hint, rank=rank, host=host, world_size=world_size, sends=sends, said=said, sleep=sleep
        )
    exit(1)


def ask_on_plan(
    end_step: Sequence[str],
    end_hint: str = "",
    *,
    rank: int,
    host: str,
    world_size: int,
    sends: bool = False,
    said: int = -1,
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Ask for the end of the step on this rank's :func:`ask_plan`, from now, on its node's turn; return at the bound.

    After a stall verdict (:func:`end_at`), and at the exit of a rank other than 0 after a failed roll call: rank 0
    sends the command once every rank read the verdict, and may die of its own request before the scheduler reached
    every node. A ``KILL`` delivered ends this rank first; at the bound it says what ends the step instead.
    """
    turn = NodeTurn(host, end_step)
    try:
        plan = ask_plan(sender=sends, rank=rank, host=host, world_size=world_size)
        ask_to_end(end_step, plan, time.time(), said=said, hint=end_hint, turn=turn, sleep=sleep)
    finally:
        turn.close()


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
    clock: Callable[[], float] = time.time,
) -> None:
    """Run the scheduler's command that ends this step; say on ``said`` (a copy of stderr, or -1) when it failed.

    A process still alive after it asks again, ``retries`` times, each after a wait twice the last (1, 2, 4... s),
    then says once that the step outlived every request (``hint``: what ends it when a rank fails) and returns, for
    the caller to exit.
    """
    bound = float(2 ** (retries + 1) - 1) if retries else 0.0
    plan = AskPlan(tuple(float(2**attempt - 1) for attempt in range(retries + 1)), bound, sender=True)
    ask_to_end(command, plan, clock(), said=said, hint=hint, sleep=sleep, clock=clock)


def ask_to_end(
    command: Sequence[str],
    plan: AskPlan,
    start: float,
    *,
    said: int = -1,
    hint: str = "",
    turn: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.time,
    run: Callable[[Sequence[str], float], str] | None = None,
) -> int:
    """Run ``command`` at ``plan``'s times after ``start`` (wall clock); returns the requests made.

    A rank other than the sender asks only on its node's ``turn``; one still alive at the bound says so. The command
    runs inside the step it ends, so the step's ``KILL`` can reach it before it exits: that death is the step ending,
    not a failure to end it, and it ends this process, which then asks no more.
    """
    run = run or _run_end_step
    asked, failure = 0, ""
    for at in plan.times:
        sleep(max(0.0, start + at - clock()))
        if not turn() and not plan.sender:
            continue  # another live rank of this node asks
        failure = run(command, max(1.0, min(10.0, start + plan.bound - clock())) if plan.bound else 10.0)
        asked += 1
        if failure and plan.sender and asked == 1:
            _say_on(said, f"lightning-mpi-env: could not end the job step with `{' '.join(command)}` ({failure}).")
    if plan.bound:
        sleep(max(0.0, start + plan.bound - clock()))
        _say_on(said, outlived_line(command, asked, clock() - start, hint, failure))
    return asked


def outlived_line(command: Sequence[str], asked: int, waited: float, hint: str, failure: str = "") -> str:
    """The one line of a rank still alive at its bound: the step outlived the requests; what ends it instead."""
    requests = f"{asked} requests" if asked else "the requests of this node's other ranks"
    last = f" (the last: {failure})" if failure else ""
    instead = f"add {hint}" if hint else "end a step when one of its ranks fails"
    return (
        f"lightning-mpi-env: the job step still runs {waited:.0f} s after {requests} `{' '.join(command)}`{last}: "
        f"the scheduler lost them or cannot end it. To end the step when a rank fails, {instead}; else the step "
        f"runs until its time limit. This rank exits now."
    )


def _run_end_step(command: Sequence[str], timeout: float = 10.0) -> str:
    """Run ``command`` once: ``""`` when it ended the step (or the step's SIGKILL ended it), else why not."""
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
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
