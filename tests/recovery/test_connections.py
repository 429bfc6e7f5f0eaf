"""The group's connections: found, shut down (and only they), and not left open in forked children.

Real TCP sockets on loopback stand for gloo's: a listener, connected pairs, and a connection to a "store" port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.recovery.connections import GroupConnections, not_inherited, open_sockets, shut_to

LIMIT = 60.0  # only ends a hang


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(LIMIT)
    yield server
    server.close()


def connect(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    """A connected pair: (this end, the listener's end)."""
    near = socket.create_connection(listener.getsockname(), timeout=LIMIT)
    far, _ = listener.accept()
    far.settimeout(LIMIT)
    return near, far


def test_only_the_connections_opened_since_are_found(listener: socket.socket):
    before = open_sockets()
    near, far = connect(listener)
    found = GroupConnections.opened_since(before, 1)
    assert near.fileno() in found.sockets
    assert far.fileno() in found.sockets
    assert listener.fileno() not in found.sockets  # opened before
    near.close()
    far.close()


def test_shut_ends_the_peers_wait_and_leaves_listeners_and_the_store_alone(listener: socket.socket):
    store = socket.socket()
    store.bind(("127.0.0.1", 0))
    store.listen()
    before = open_sockets()
    near, far = connect(listener)
    own_listener = socket.socket()  # a listener the group opened (gloo's): shut down, gloo would abort
    own_listener.bind(("127.0.0.1", 0))
    own_listener.listen()
    to_store = socket.create_connection(store.getsockname(), timeout=LIMIT)
    store_end, _ = store.accept()
    connections = GroupConnections.opened_since(before, store.getsockname()[1])
    # Both ends of the one connection (this process opened both), not the listener, not the store's two ends.
    assert connections.shut() == 2
    assert far.recv(1) == b""  # a wait on the connection ends at once: end of stream
    to_store.sendall(b"x")
    assert store_end.recv(1) == b"x"  # the store's connection works
    probe = socket.create_connection(own_listener.getsockname(), timeout=LIMIT)  # the listener still accepts
    own_listener.accept()[0].close()
    for each in (near, far, own_listener, to_store, store_end, probe, store):
        each.close()


def test_a_number_that_names_another_socket_now_is_left_alone(listener: socket.socket):
    before = open_sockets()
    near, far = connect(listener)
    connections = GroupConnections.opened_since(before, 1)
    number = near.fileno()
    near.close()
    other, other_far = connect(listener)  # the lowest free number: most likely the one just closed
    if other.fileno() != number:
        os.dup2(other.fileno(), number)  # make it so
        reused = socket.socket(fileno=number)
    else:
        reused = other
    reused.sendall(b"y")
    connections.shut()
    assert other_far.recv(1) == b"y"
    reused.sendall(b"z")  # still open both ways
    assert other_far.recv(1) == b"z"
    for each in (far, other, other_far, reused):
        with contextlib.suppress(OSError):  # other and reused may be one socket
            each.close()


KILLED_PARENT = textwrap.dedent(
    """
    import os, signal, socket, sys, time
    from lightning_mpi_env.recovery.connections import GroupConnections, not_inherited, open_sockets, shut_to

    before = open_sockets()
    connection = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    if sys.argv[2] == "on":
        not_inherited(GroupConnections.opened_since(before, 1))
    ready, say_ready = os.pipe()
    child = os.fork()  # as a DataLoader worker: it lives on after its parent, a while
    if child == 0:  # past the at-fork hooks already
        os.write(say_ready, b"r")
        time.sleep(120)
        os._exit(0)
    os.read(ready, 1)
    print(child, os.readlink(f"/proc/self/fd/{connection.fileno()}"), flush=True)
    sys.stdin.readline()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("hook", ["on", "off"])
def test_a_killed_processs_connections_close_with_it_not_with_its_forked_child(listener: socket.socket, hook: str):
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, str(listener.getsockname()[1]), hook],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None
    assert parent.stdout is not None
    far, _ = listener.accept()
    far.settimeout(LIMIT)
    pid, link = parent.stdout.readline().split()
    child = int(pid)
    try:
        held = set()
        for name in os.listdir(f"/proc/{child}/fd"):
            with contextlib.suppress(OSError):
                held.add(os.readlink(f"/proc/{child}/fd/{name}"))
        # Without the hook, the child (a DataLoader worker) holds the connection open after its parent's death.
        assert (link in held) == (hook == "off")
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.wait(LIMIT) == -signal.SIGKILL
        if hook == "on":
            assert far.recv(1) == b""  # closed with the parent
            os.kill(child, 0)  # while the child lives (it would raise once the child is gone)
    finally:
        os.kill(child, signal.SIGKILL)
        far.close()


def test_outside_restartable_a_forked_child_keeps_what_it_inherited(listener: socket.socket):
    before = open_sockets()
    near, far = connect(listener)
    not_inherited(GroupConnections.opened_since(before, 1))
    not_inherited(None)  # as restartable ends
    child = os.fork()
    if child == 0:  # the child: is its copy still open?
        os._exit(0 if os.path.exists(f"/proc/self/fd/{near.fileno()}") else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    near.close()
    far.close()


def test_shut_to_the_store_port_ends_a_request_a_frozen_store_holds(store_process, listener: socket.socket):
    # The request waits on a stopped server without end; once its connection is shut down it fails at once. Other
    # connections (a peer's) stay up.
    store = dist.TCPStore("127.0.0.1", store_process.port, None, False, timeout=timedelta(seconds=LIMIT))
    peer = socket.create_connection(listener.getsockname(), timeout=LIMIT)
    accepted, _ = listener.accept()
    store_process.freeze()
    outcome: list[BaseException] = []

    def request() -> None:
        try:
            store.get("never")
        except BaseException as error:  # noqa: BLE001  # the test looks at it
            outcome.append(error)

    waiting = threading.Thread(target=request, daemon=True)
    waiting.start()
    until(lambda: unread_at(store_process.port))  # the request reached the frozen server: it is waiting
    assert shut_to(store_process.port) >= 1
    waiting.join(LIMIT)
    assert not waiting.is_alive()
    assert [isinstance(error, dist.DistError) for error in outcome] == [True]
    accepted.sendall(b"x")
    assert peer.recv(1) == b"x"  # not a store connection: still up
    peer.close()
    accepted.close()


def unread_at(port: int) -> bool:
    """Whether a connection accepted on ``port`` of this machine holds bytes its process has not read."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                unread = int(fields[4].split(":")[1], 16)
                if local_port == port and unread:
                    return True
    return False


def until(condition, limit: float = LIMIT) -> None:
    """Wait for ``condition`` (the limit only ends a hang)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "no event within the limit"
        time.sleep(0.01)
