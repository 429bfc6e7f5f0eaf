"""Rank 0's liveness watcher on real sockets and processes: a process that ends (killed, or exits) is seen ended; one
that lives, or a newer process for the same rank, is not; strangers on the port change nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.recovery.liveness import KEY, Watcher, connect

LIMIT = 60.0  # only a hang takes this long

CONNECTED = """
import os, sys, time
import torch.distributed as dist
from datetime import timedelta
from lightning_mpi_env.recovery.liveness import connect
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=timedelta(seconds=30))
line = connect(store, "127.0.0.1", int(sys.argv[2]), os.getpid())
print("CONNECTED" if line is not None else "NONE", flush=True)
time.sleep(600)
"""


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


@pytest.fixture
def watcher(store):
    watching = Watcher(4).start(store)
    yield watching
    watching.close()


def until(condition, what: str) -> None:
    """Wait for ``condition`` (an event the watcher's thread makes), bounded only against a hang."""
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def process(store, rank: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CONNECTED, str(store.port), str(rank)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "CONNECTED"
    return child


def test_the_port_is_in_the_store(store, watcher):
    assert store.get(KEY) == str(watcher.port).encode()


def test_a_killed_process_is_seen_ended_and_a_living_one_is_not(store, watcher):
    killed, living = process(store, 2), process(store, 3)
    try:
        until(lambda: not watcher.ended(2), "rank 2 connected")
        killed.send_signal(signal.SIGKILL)
        killed.wait(LIMIT)
        until(lambda: watcher.ended(2), "rank 2's end seen")
        assert not watcher.ended(3)
        assert not watcher.ended(1)  # no process said it is rank 1: nothing is known of it
    finally:
        for child in (killed, living):
            child.kill()
            child.wait()


def test_a_newer_process_for_the_rank_is_not_ended(store, watcher):
    first = process(store, 2)
    first.kill()
    first.wait()
    until(lambda: watcher.ended(2), "the first process's end seen")
    replacement = process(store, 2)  # a replacement says it is rank 2
    try:
        until(lambda: not watcher.ended(2), "the replacement taken as rank 2")
    finally:
        replacement.kill()
        replacement.wait()


@pytest.mark.parametrize("said", [b"0 1\n", b"4 1\n", b"-1 1\n", b"2\n", b"x" * 100, b"2 1 3\n"])
def test_a_stranger_changes_nothing(store, watcher, said):
    real = process(store, 2)
    try:
        with socket.create_connection(("127.0.0.1", watcher.port), timeout=10) as stranger:
            stranger.sendall(said)
            stranger.settimeout(LIMIT)
            if said.endswith(b"\n") or len(said) >= 64:
                assert hung_up(stranger)
        assert not watcher.ended(2)
    finally:
        real.kill()
        real.wait()


def hung_up(connection: socket.socket) -> bool:
    """Whether the other end closed ``connection`` (an end of file, or a reset where data were left unread)."""
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_port_in_the_store_that_is_no_port_is_no_connection(store):
    store.set(KEY, "99999")
    assert connect(store, "127.0.0.1", 2, os.getpid()) is None
