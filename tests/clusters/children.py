"""Child processes under a time limit that only ends a hang: when one runs past it, say what it printed and where it is.

A plain ``subprocess.TimeoutExpired`` names the command and carries the output, but prints neither the output nor
the state of the processes, so a hung job and a slow one look the same in a CI log. :func:`run_child` takes the state
of the child and everything under it (``ps``: state, kernel wait, elapsed time) before stopping it, and raises
:class:`ChildTimeout`, whose message ends with both (as :class:`tests.clusters.slurm.ClientTimeout` does for Slurm's
clients). Standard library only: :mod:`tests.clusters.hydra` runs as the ranks' probe script too.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

STATE_COLUMNS = "pid,ppid,stat,wchan:24,etime,args"
"""What ``ps`` says of each process: its parent, state, kernel wait, elapsed time and command line."""


class ChildTimeout(subprocess.TimeoutExpired):
    """A child ran past its limit; the message ends with its output so far and the state of its processes."""

    def __init__(
        self, cmd: Sequence[str], timeout: float, output: str | bytes | None, stderr: str | bytes | None, state: str
    ) -> None:
        super().__init__(list(cmd), timeout, output, stderr)
        self.state = state

    def __str__(self) -> str:
        if self.output is None and self.stderr is None:
            tail = "(not captured: it went to this process's output as it came)"
        else:
            tail = (_text(self.output) + _text(self.stderr))[-4000:]
        return (
            f"{super().__str__()}\n--- its output, last 4000 characters:\n{tail}\n--- its processes then:\n{self.state}"
        )


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def process_tree(root: int) -> str:
    """``ps`` lines of ``root`` and every process under it (:data:`STATE_COLUMNS`); never raises."""
    try:
        listing = subprocess.run(
            ["ps", "-ww", "-eo", STATE_COLUMNS], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"ps failed: {error}"
    header, *rows = listing.splitlines() or [""]
    children: dict[int, list[str]] = {}
    for row in rows:
        fields = row.split(None, 2)
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(row)
    found = [row for row in rows if row.split(None, 1)[:1] == [str(root)]]
    queue = [root]
    while queue:
        for row in children.get(queue.pop(), []):
            found.append(row)
            queue.append(int(row.split(None, 1)[0]))
    return "\n".join([header, *found]) if found else f"no process {root} (it ended)"


def run_child(
    argv: Sequence[str],
    *,
    timeout: float,
    grace: float = 10.0,
    capture: bool = True,
    check: bool = False,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and wait for it; past ``timeout`` seconds, report it and stop it (SIGTERM, then SIGKILL).

    Args:
        argv: The command line.
        timeout: Seconds before the child is stopped: a limit that only ends a hang.
        grace: Seconds the child gets to end after SIGTERM (a launcher ends its ranks), before SIGKILL.
        capture: Return stdout and stderr as text; otherwise they go to this process's as they come.
        check: Raise ``subprocess.CalledProcessError`` on a non-zero exit status.
        cwd: Working directory.
        env: The child's whole environment (this process's by default).
        **popen: Further ``subprocess.Popen`` arguments (``stdin``, ``start_new_session``...).

    Raises:
        ChildTimeout: After the child was stopped, with its output and the state its processes were in.
    """
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=True, **popen) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            state = process_tree(process.pid)  # before it goes: where each of its processes waits
            output = _stop(process, grace)
            raise ChildTimeout(argv, timeout, *output, state) from None
    done = subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def _stop(process: subprocess.Popen[str], grace: float) -> tuple[str | bytes | None, str | bytes | None]:
    """SIGTERM, then SIGKILL ``grace`` seconds later; the output so far, read for at most ``grace`` s more.

    A grandchild that outlives the child may hold its output open: what it wrote by then is kept, the rest is not
    waited for.
    """
    process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
    try:
        return process.communicate(timeout=grace)
    except subprocess.TimeoutExpired as held:  # the output so far, as bytes
        return held.output, held.stderr


def communicate_from(
    process: subprocess.Popen[str],
    timeout: float,
    seen: Callable[[bytes, bytes], bool] | None,
    hang_limit: float,
) -> tuple[str, str]:
    """``process.communicate(timeout=timeout)``, the time counted from when ``seen(stdout, stderr)`` holds for the
    output so far (``None``: from now).

    For a test of a time limit itself, whose child must get that far first (say, every rank started): the limit is
    then the event tested, not a bet on how fast the child starts on a loaded machine.

    Raises:
        subprocess.TimeoutExpired: Past ``timeout`` seconds from then, or ``seen`` not holding within ``hang_limit``
            seconds (its ``timeout`` says which).
    """
    if seen is not None:
        deadline = time.monotonic() + hang_limit
        while True:
            try:
                return process.communicate(timeout=0.1)  # it ended before getting that far
            except subprocess.TimeoutExpired as so_far:  # the output so far, as bytes; none of it is lost
                if seen(so_far.output or b"", so_far.stderr or b""):
                    break
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(process.args, hang_limit) from None
    return process.communicate(timeout=timeout)


def wait_until_none(listing: Callable[[], Sequence[str]], limit: float = 60.0) -> list[str]:
    """Poll ``listing`` (say, ``lambda: processes_with(tag)``) until it is empty; what it still lists after ``limit`` s.

    A job's processes end when it ends, but a launcher that was killed leaves its daemons to end the ranks
    themselves, a moment later: wait for that, and report only what outlives a limit that ends a hang.
    """
    deadline = time.monotonic() + limit
    while True:
        left = list(listing())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


__all__ = ["ChildTimeout", "communicate_from", "process_tree", "run_child", "wait_until_none"]
