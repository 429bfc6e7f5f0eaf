"""The connections a process group opened: shut when this process leaves it after a failure, and not inherited.

A gloo group keeps one TCP connection to each peer; a peer's collective fails when one closes. Two things keep them
open when they should close:

- torch keeps a group that ``DistributedDataParallel`` used alive after ``destroy_process_group()`` (its threads and
  connections stay), so a peer waiting on this process inside a collective would wait the group's timeout. Shutting
  the connections down (both ways) fails that peer's wait at once (:meth:`GroupConnections.shut`).
- A process forked after the group opened (a ``DataLoader`` worker) holds copies of them, so a killed rank's
  connections stay open until its workers notice their parent is gone (up to 5 s). While ``restartable`` runs, a
  forked child closes its copies first thing (:func:`not_inherited`).

Only the sockets the group's initialisation opened are touched, each checked to be the same socket still (its inode);
shut down only if a connected TCP stream, neither listening (gloo's listener) nor to or from the job's store.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

FD_FOLDER = "/proc/self/fd"

_not_inherited: GroupConnections | None = None  # what a process forked now closes (None: nothing)
_hook_in = False  # os.register_at_fork cannot take a hook back: it goes in once, and does nothing while this is None


def open_sockets() -> dict[int, str]:
    """This process's socket descriptors now, each with its link (``socket:[inode]``); empty without ``/proc``."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(FD_FOLDER)
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(f"{FD_FOLDER}/{name}")
        except OSError:
            continue  # closed since the listing
        if link.startswith("socket:") and name.isdigit():
            found[int(name)] = link
    return found


@dataclass(frozen=True)
class GroupConnections:
    """The sockets that appeared while a process group opened, and the ports whose connections they must not touch.

    Those are the store's, and the liveness watcher's (:mod:`.liveness`), which accepts connections meanwhile.
    """

    sockets: dict[int, str]
    kept_ports: tuple[int, ...]

    @classmethod
    def opened_since(cls, before: dict[int, str], *kept_ports: int) -> GroupConnections:
        """The sockets open now that were not open (as the same socket) at ``before``."""
        now = open_sockets()
        return cls({fd: link for fd, link in now.items() if before.get(fd) != link}, kept_ports)

    def shut(self) -> int:
        """Shut down each of them that is still the same connected TCP stream, on none of the kept ports; how many."""
        return _shut(self.sockets, lambda ports: not set(ports) & set(self.kept_ports))


def shut_to(port: int) -> int:
    """Shut down this process's connections to ``port`` (the job's store, whose server stopped answering); how many.

    A request blocked on one fails at once, and its thread ends: one still inside torch as the interpreter exits
    aborts the process.
    """
    return _shut(open_sockets(), lambda ports: ports[1] == port)


def _shut(sockets: dict[int, str], wanted: Callable[[tuple[int, int]], bool]) -> int:
    """Shut down each of ``sockets`` still the same connected TCP stream, whose (own, peer) ports are ``wanted``."""
    now = open_sockets()
    done = 0
    for fd, link in sockets.items():
        if now.get(fd) != link:
            continue  # closed, or the number now names another socket
        try:
            connection = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with connection:
            ports = _stream_ports(connection)
            if ports is not None and wanted(ports):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    continue  # not connected any more
                done += 1
    return done


def _stream_ports(connection: socket.socket) -> tuple[int, int] | None:
    """A connected TCP stream's own port and its peer's; ``None`` for any other socket."""
    if connection.family not in (socket.AF_INET, socket.AF_INET6) or connection.type != socket.SOCK_STREAM:
        return None
    try:
        if connection.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return None  # a listener: gloo aborts the process when its accept fails
        return connection.getsockname()[1], connection.getpeername()[1]
    except OSError:
        return None  # not connected


def not_inherited(connections: GroupConnections | None) -> None:
    """From now on, a process forked from this one closes its copies of ``connections``; ``None``: it closes nothing.

    The hook is the process's for good (``os.register_at_fork`` has no way to take it back); outside ``restartable``,
    which passes ``None`` as it ends, it does nothing.
    """
    global _not_inherited, _hook_in
    _not_inherited = connections
    if not _hook_in and connections is not None:
        os.register_at_fork(after_in_child=_close_copies)
        _hook_in = True


def _close_copies() -> None:
    """In a child just forked: close the copies of the group's sockets it inherited (the same sockets still)."""
    global _not_inherited
    connections, _not_inherited = _not_inherited, None
    if connections is None:
        return
    now = open_sockets()
    for fd, link in connections.sockets.items():
        if now.get(fd) == link:
            try:
                os.close(fd)
            except OSError:
                continue
