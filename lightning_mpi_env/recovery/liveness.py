"""Which processes of the job have ended: each holds a connection to rank 0, which a process's end closes at once.

A killed rank cannot answer the alarm (:mod:`.agreement`), and without this rank 0 would wait ``settle`` seconds for
it. Every other process connects once to a socket rank 0 listens on (its port in the store) and says which launch
rank it is and its process id; the kernel closes the connection when the process ends, however it ends, and rank
0's watcher thread sees it at once. A frozen process keeps its connection open: for it, ``settle`` still decides.
The rank's copy of its connection must not live on in processes it forks (a data loader worker would hold it open
after the rank died): :func:`.connections.not_inherited` closes it in them.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

KEY = "lightning_mpi_env/liveness"
"""The port rank 0's watcher listens on, for the job's processes to connect to."""

HELLO_BYTES = 64
"""The most a process says when it connects: one line, ``<launch rank> <pid>``."""

CONNECT_TIMEOUT = 10.0

MAX_WAITING = 1024
"""The most connections rank 0 holds that have not said who they are: strangers cannot take every descriptor."""


class Watcher:
    """Rank 0: the thread that accepts each process's connection and notes the launch ranks whose process ended."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        dual = socket.has_dualstack_ipv6()  # the main address may be either family
        self._listener = socket.create_server(
            ("", 0), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        )
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._latest: dict[int, socket.socket] = {}  # launch rank -> its newest process's connection
        self._ended: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lightning-mpi-env-liveness", daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._listener.getsockname()[1])

    def start(self, store: Store) -> Watcher:
        """Publish the port in ``store`` and start the thread; returns this watcher."""
        store.set(KEY, str(self.port))
        self._thread.start()
        return self

    def ended(self, launch_rank: int) -> bool:
        """Whether the newest process that said it is ``launch_rank`` has ended (its connection closed)."""
        with self._lock:
            return launch_rank in self._ended

    def close(self) -> None:
        """Stop the thread and close every connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _run(self) -> None:
        said: dict[socket.socket, bytes] = {}  # what each connection said so far, until its hello is whole
        ranks: dict[socket.socket, int] = {}
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                connection = key.fileobj
                assert isinstance(connection, socket.socket)
                if connection is self._listener:
                    self._accept(said)
                    continue
                try:
                    data = connection.recv(HELLO_BYTES)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data and connection in ranks:
                    continue  # a process says nothing after its hello
                if data:
                    said[connection] += data
                    rank = _hello(said[connection], self._world_size)
                    if rank is not None:
                        ranks[connection] = rank
                        del said[connection]
                        with self._lock:
                            self._latest[rank] = connection
                            self._ended.discard(rank)
                    if rank is not None or (len(said[connection]) < HELLO_BYTES and b"\n" not in said[connection]):
                        continue
                self._selector.unregister(connection)  # ended, or a stranger that said something else
                connection.close()
                said.pop(connection, None)
                rank = ranks.pop(connection, None)
                with self._lock:
                    if rank is not None and self._latest.get(rank) is connection:
                        self._ended.add(rank)

    def _accept(self, said: dict[socket.socket, bytes]) -> None:
        """Take a connection, unless :data:`MAX_WAITING` have not said who they are yet."""
        try:
            accepted, _ = self._listener.accept()
        except OSError:
            return
        if len(said) >= MAX_WAITING:
            accepted.close()
            return
        accepted.setblocking(False)
        self._selector.register(accepted, selectors.EVENT_READ)
        said[accepted] = b""


def _hello(raw: bytes, world_size: int) -> int | None:
    """The launch rank a connection said it is (one line: ``<launch rank> <pid>``); ``None`` until the line came.

    Anything else (a stranger on the port) is ``None`` too.
    """
    if not raw.endswith(b"\n"):
        return None
    parts = raw[:-1].split(b" ")
    if len(parts) == 2 and all(part.isdigit() and len(part) <= 10 for part in parts):
        rank = int(parts[0])
        return rank if 0 < rank < world_size else None
    return None


def connect(store: Store, host: str, launch_rank: int, pid: int) -> socket.socket | None:
    """This process's connection to rank 0's watcher (``None``: none could be made; ``settle`` then decides).

    The port read back from ``store`` is checked; the connection is kept open for the process's life.
    """
    from torch.distributed import DistError

    try:
        raw = store.get(KEY)[:8]
    except DistError:
        return None
    if not (raw.isdigit() and 0 < int(raw) < 65536):
        return None
    try:
        connection = socket.create_connection((host, int(raw)), timeout=CONNECT_TIMEOUT)
        connection.sendall(f"{launch_rank} {pid}\n".encode())
    except OSError:
        return None
    return connection
