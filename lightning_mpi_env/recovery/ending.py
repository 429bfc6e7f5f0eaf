"""Ending a lost rank's process where it may still live (frozen): the launcher would otherwise wait for it.

``srun`` and ``mpirun`` wait for every task of their step; a frozen task that the others went on without would hold
the step to its time limit. Each rank posts where it runs (its node, process id and the process's start time) once.
After the agreement, every survivor sends ``SIGKILL`` to each lost rank's process on its own node (any launcher),
and rank 0 runs a one-task command on each lost rank's node beside the step where the launcher has one (its
``on_node``: ``srun --jobid J --overlap -w NODE``), asking again with a back-off until the process is gone or the
attempts run out. Either way only the process that started at that time is ended (a process id can be reused).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError, escaped
from lightning_mpi_env.core.launchers import NODE_NAME, on_node_command
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.recovery.connections import shut_to
from lightning_mpi_env.recovery.worlds import FOREIGN_WRITE

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

KEY = "lightning_mpi_env/task/"
"""Add a launch rank: ``"<node> <pid> <start>"``, where that rank runs."""

ATTEMPTS = 5

ENDING_WAIT = 300.0
"""Seconds the end of ``restartable`` waits for the ending of lost processes, or a replacement's step, still under
way (the ending is bounded itself)."""

COMMAND_TIMEOUT = 30.0
"""Seconds one attempt may take (a launcher that cannot reach the node's daemon may hang)."""

SCRIPT = (
    'started() { set -- $(sed "s/.*) //" "/proc/$1/stat" 2>/dev/null); [ "${1:-Z}" != Z ] && echo "${20}"; }; '
    '[ "$(started "$1")" = "$2" ] && kill -KILL "$1"; sleep 0.1; [ "$(started "$1")" != "$2" ]'
)
"""Run on the node with the process id and start time: kill it if it is that process; succeed once it is gone (a
zombie is gone: it waits only for its parent)."""


def process_start(pid: int | str = "self") -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field); ``""`` if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read(4096).rpartition(") ")[2].split()
    except OSError:
        return ""
    return fields[19] if len(fields) > 19 else ""


def post_task(store: Store, layout: RankLayout, env: Mapping[str, str], rank: int) -> None:
    """Say where launch rank ``rank`` (this process) runs: its node (:func:`this_node`), process id and start."""
    node, start = this_node(layout, env), process_start()
    if NODE_NAME.fullmatch(node) and start.isdigit():
        store.set(f"{KEY}{rank}", f"{node} {os.getpid()} {start}")


def this_node(layout: RankLayout, env: Mapping[str, str]) -> str:
    """This process's node: the launcher's variable for it (srun's ``SLURMD_NODENAME``), else the host name."""
    launcher = layout.launcher
    named = env.get(launcher.node_name, "") if launcher is not None and launcher.node_name is not None else ""
    return named or socket.gethostname()


def read_task(raw: bytes, key: str) -> tuple[str, str, str]:
    """``(node, pid, start)`` read back from ``key``, each checked.

    Raises:
        RecoveryError: Anything else, naming the key and the value.
    """
    text = raw[:320].decode("ascii", "replace")
    parts = text.split(" ")
    if (
        len(raw) <= 300
        and len(parts) == 3
        and NODE_NAME.fullmatch(parts[0])
        and all(part.isdigit() and len(part) <= 20 for part in parts[1:])
    ):
        return parts[0], parts[1], parts[2]
    raise RecoveryError(
        f"where a lost rank ran, under {key} in the job's store, is {text!r}, not a node, a process id and a start",
        FOREIGN_WRITE,
        variable=key,
        value=text,
    )


def posted_task(store: Store, launch_rank: int) -> tuple[str, str, str] | None:
    """Where launch rank ``launch_rank`` said it runs, ``(node, pid, start)``; ``None``: nothing readable."""
    from torch.distributed import DistError

    key = f"{KEY}{launch_rank}"
    try:
        return read_task(store.get(key), key) if store.check([key]) else None
    except (DistError, RecoveryError):
        return None


def task_node(store: Store, launch_rank: int) -> str:
    """The node launch rank ``launch_rank`` said it runs on; ``""`` where it said none (or nothing readable)."""
    task = posted_task(store, launch_rank)
    return task[0] if task is not None else ""


def end_here(store: Store, layout: RankLayout, env: Mapping[str, str], launch_ranks: Iterable[int]) -> None:
    """Send ``SIGKILL`` to the processes of ``launch_ranks`` that run on this node, if each is still the one posted."""
    node = this_node(layout, env)
    for rank in launch_ranks:
        task = posted_task(store, rank)
        if task is not None and task[0] == node:
            _kill(task[1], task[2])


def end_rank_0(
    task: tuple[str, str, str] | None,
    layout: RankLayout,
    env: Mapping[str, str],
    port: int,
    failure: RecoveryError,
    *,
    ask: bool,
) -> None:
    """Where rank 0's store (``port``) does not answer (rank 0 frozen, or gone): end the process it posted (``task``).

    First, shut this process's connections to the store, which its requests may still wait on. The launcher would
    wait for a frozen rank 0. On this node by a signal; on another, where ``ask`` (one survivor asks), by the
    launcher's command on that node, as :func:`end_lost` runs it (bounded), and nothing where it has none. Before,
    it says ``failure`` (why): ``mpirun`` may end this process as soon as rank 0's has.
    """
    shut_to(port)
    if task is None:
        return
    node, pid, start = task
    if node == this_node(layout, env):
        if _running(pid, start):
            _say(f"{failure.problem}; ending rank 0's process {pid} on {node} (it still runs)")
            _kill(pid, start)
        return
    prefix = on_node_command(layout.launcher, env, node) if ask else None
    if prefix is not None:
        _say(f"{failure.problem}; ending rank 0's process {pid} on {node} if it still runs")
        _end_all([(0, node, pid, (*prefix, "sh", "-c", SCRIPT, "sh", pid, start))])


def _running(pid: str, start: str) -> bool:
    """Whether process ``pid`` of this node is the one that started at ``start``, and not this one."""
    return int(pid) not in (0, os.getpid()) and process_start(pid) == start  # 0 would be this process group


def _kill(pid: str, start: str) -> None:
    """``SIGKILL`` to process ``pid`` of this node if it is still the one that started at ``start`` (not this one)."""
    if _running(pid, start):
        with contextlib.suppress(OSError):  # gone meanwhile
            os.kill(int(pid), signal.SIGKILL)


def end_lost(store: Store, layout: RankLayout, env: Mapping[str, str], launch_ranks: Iterable[int]) -> threading.Thread:
    """Start a thread that ends the processes of ``launch_ranks`` that still live; join it before the program ends."""
    from torch.distributed import DistError

    commands = []
    for rank in launch_ranks:
        key = f"{KEY}{rank}"
        try:
            if not store.check([key]):
                continue
            node, pid, start = read_task(store.get(key), key)
        except (DistError, RecoveryError) as error:
            _say(f"cannot end lost rank {rank}'s process: {error}")
            continue
        prefix = on_node_command(layout.launcher, env, node)
        if prefix is not None:
            commands.append((rank, node, pid, (*prefix, "sh", "-c", SCRIPT, "sh", pid, start)))
    thread = threading.Thread(target=_end_all, args=(commands,), name="lightning-mpi-env-ending", daemon=True)
    thread.start()
    return thread


def _end_all(commands: list[tuple[int, str, str, tuple[str, ...]]]) -> None:
    for rank, node, pid, command in commands:
        why = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(2 ** (attempt - 1))
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                why = str(error)
            else:
                if done.returncode == 0:
                    break
                why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        else:
            _say(
                f"could not end lost rank {rank}'s process {pid} on {node} ({why[:200]}); the step ends when it"
                " does: end it there, or the job (`scancel`)"
            )


def _say(line: str) -> None:
    print(f"lightning-mpi-env: {escaped(line)}", file=sys.stderr, flush=True)
