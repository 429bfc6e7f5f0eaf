"""One job step under the supervisor: run it, pass its output on, watch its state folder, end it if it hangs."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import BinaryIO

from lightning_mpi_env.core.records import RECORD_NAME

GRACE = 10.0
"""Seconds a step has to end once a failure record is written, before the supervisor kills its launcher."""
TICK = 0.5
"""Seconds between two looks at the step."""
MAX_LINE = 1 << 16
"""The longest line of the launcher's standard error read at once (a longer one is passed on in pieces)."""
MAX_ERRORS = 1 << 20
"""The most characters of the launcher's standard error kept (its end)."""


@dataclass
class StepEnd:
    """How a step ended."""

    status: int
    """The launcher's exit status; 128 + N for a signal."""
    errors: str = ""
    abandoned: bool = False
    """The launcher was killed :data:`GRACE` seconds after a failure record, without ending by itself."""


def recorded(folder: str) -> bool:
    """Whether a failure record is in ``folder`` (by its name only; :func:`read_records` reads it)."""
    try:
        with os.scandir(folder) as entries:
            return any(RECORD_NAME.match(entry.name) for entry in entries)
    except OSError:
        return False


def run_step(
    argv: Sequence[str],
    env: Mapping[str, str],
    folder: str,
    *,
    tick: Callable[[], object] = lambda: None,
    grace: float = GRACE,
) -> StepEnd:
    """Run one step to its end, passing its stderr on and ``SIGINT``/``SIGTERM`` to it, ``tick`` every :data:`TICK` s.

    Once a failure record appears, the launcher is killed after ``grace`` seconds: the step of a hung node does not
    end until Slurm declares the node down (``SlurmdTimeout``), as the signal never reaches it.
    """
    process = subprocess.Popen(list(argv), env=dict(env), stderr=subprocess.PIPE)
    assert process.stderr is not None
    end = StepEnd(0)
    kept: collections.deque[str] = collections.deque()
    lock = threading.Lock()  # a process that outlives the launcher may hold its stderr open: the reader goes on
    reader = threading.Thread(target=_pass_on, args=(process.stderr, kept, lock), daemon=True)
    reader.start()

    def forward(signum: int, frame: FrameType | None) -> None:
        process.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        verdict_at: float | None = None
        while process.poll() is None:
            tick()
            if verdict_at is None and recorded(folder):
                verdict_at = time.monotonic()
            if verdict_at is not None and time.monotonic() - verdict_at > grace:
                process.kill()
                end.abandoned = True
                break
            time.sleep(TICK)
        status = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    reader.join(timeout=5)  # the launcher's last lines; a task that keeps the pipe open is not waited for
    tick()
    end.status = 128 - status if status < 0 else status
    with lock:
        end.errors = "".join(kept)[-MAX_ERRORS:]
    return end


def _pass_on(stream: BinaryIO, kept: collections.deque[str], lock: threading.Lock) -> None:
    size = 0
    for raw in iter(lambda: stream.readline(MAX_LINE), b""):
        out = getattr(sys.stderr, "buffer", None)
        if out is not None:
            out.write(raw)
            out.flush()
        else:  # a text stream without bytes underneath (a test's capture)
            sys.stderr.write(raw.decode(errors="replace"))
        with lock:
            kept.append(raw.decode(errors="replace"))
            size += len(kept[-1])
            while size > 2 * MAX_ERRORS and len(kept) > 1:  # keep the end, in bounded memory
                size -= len(kept.popleft())
