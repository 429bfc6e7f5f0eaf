"""Fixtures of the recovery tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

SERVER = """
import time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


class StoreProcess:
    """A ``TCPStore`` server in a process of its own, as rank 0's is, which the test can freeze (``SIGSTOP``)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())  # it listens

    def freeze(self) -> None:
        """Stop the server and return once it has stopped: a signal sent is not yet a signal taken, and a server
        still running reads the next request, which then waits inside it rather than unread on its port."""
        os.kill(self.process.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.process.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status


@pytest.fixture
def store_process() -> Iterator[StoreProcess]:
    serving = StoreProcess()
    try:
        yield serving
    finally:  # ends the requests still held by the frozen server too
        serving.process.kill()
        serving.process.wait()
