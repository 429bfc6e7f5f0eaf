"""``init_process_group``'s store work alone against the roll call followed by that work on the roll call's store.

Thousands of simulated ranks on this machine, as in ``roll_call_scale.py``: rank 0 in its own process serves the
store; ranks 1..N-1 are threads, ``--ranks-per-process`` to a process (each with its own ``TCPStore`` client), run
in a private mount namespace with ``hosts: files`` where the machine's resolver stalls. Two configurations,
interleaved (their order alternates from one repeat to the next), medians and ranges:

- **init**: what ``init_process_group(init_method="env://")`` does with the store, by torch's own functions:
  ``torch.distributed.rendezvous._create_c10d_store`` (rank 0 serves a ``multi_tenant`` libuv ``TCPStore``, every
  other rank connects a client; every rank adds itself to the store's ``init/`` key and rank 0 waits for all N),
  ``store.set_timeout``, then ``PrefixStore("default_pg", store)`` and
  ``torch.distributed.distributed_c10d._store_based_barrier`` with the default group's name (``"0"``), as
  ``init_process_group`` runs it with ``TORCH_DIST_INIT_BARRIER=1`` (torch 2.13 skips it by default, so the time at
  which the last rank had its store is shown too).
- **rollcall+init**: the real :func:`lightning_mpi_env.rollcall.store.rendezvous`, then what
  ``init_process_group(store=result.store)`` does with a given store, as the ``ddp_mpi`` strategy calls it:
  ``PrefixStore("default_pg", result.store)`` and the same barrier, on the rank's one roll-call client.

Not simulated: the backend's own setup (gloo's full mesh, NCCL's communicator), the same in both. The time is from
rank 0's start until the last rank is through the barrier.

Counts come from one more run per size and configuration, not timed, in which every rank stops at the end of each
step until rank 0's process has read its connections:

- requests: in the benchmark's own processes ``torch.distributed.TCPStore`` is replaced by a factory returning a
  counting ``Store`` around the real client (the package never does this); each call on it is one request. The
  constructor's wait for workers (init: every rank adds itself to ``init/``, rank 0 reads it every 10 ms until all
  N did) is made through the counting store, so it counts; the connection's own handshake does not. Medians over
  ranks 1..N-1 and their maximum; rank 0 apart.
- connections: ESTABLISHED TCP sockets on the server's port held by rank 0's process (its file descriptors matched
  against ``/proc/net/tcp`` and ``tcp6``), at the end of the roll call, at the end of init, and while training:
  after each rank opened its stall watchdog's client as the package does (``RendezvousResult.client``: a
  ``clone()`` of its store where torch has ``Store.clone``) and sent one request on it; init alone has no
  watchdog. Rank 0's process then holds 2N + 512 files; where that many cannot be had, that count says "not run".
- rank 0's judging time: ``judged_in`` of its result, where the package's result carries it.

On one machine all clients share one range of ephemeral ports towards each destination address, so the clients of
the P-th process of ranks connect to loopback addresses of their own (``127.1.x.y`` for the roll call,
``127.2.x.y`` for init; x.y is P), the same interface and server, as each node of a job has its own ports.

The garbage collector: one interpreter holding many ranks allocates for all of them, enough to start a full
collection that walks every object torch's import made, in every process at once; a job's rank allocates for one.
``--gc freeze`` (the default) collects and freezes each process's objects before the start, in both configurations;
each run line counts the full collections that still happened. ``--gc as-is`` leaves the collector alone.

Memory: every process of ranks imports torch. A probe process measures what one costs after its imports (its RSS,
and the private part of it, which every process pays; the rest is the shared libraries, paid once) and what a rank
adds (its client and watchdog client, both ends); a packing whose estimate exceeds 90% of the memory available
now is refused, not run into swap, and the header names the fewest ranks a process that fit each size.

Usage: ``.venv/bin/python benchmarks/roll_call_vs_init.py [--sizes 1024 4096 16384] [--repeat 3]
[--ranks-per-process 512]``
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from roll_call_scale import (  # noqa: E402  (the script beside this one)
    claims,
    expect,
    files_only_resolver,
    free_port,
    machine_description,
    port_open,
    say,
    slowest_reverse_lookup,
)

MODES = ("init", "rollcall+init")
ROLL_CALL, INIT, TRAINING = "roll call", "init", "training"
SPARE_FILES = 512
"""Open files a process needs besides its sockets (libraries, pipes, /proc reads)."""
MEMORY_SHARE = 0.9
"""The share of the memory available now that a packing may plan to use."""
PROBE_RANKS = 64


# --- packing and memory -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Packing:
    """Rank 0 in a process of its own; ranks 1..N-1 as threads, at most ``per_process`` to a process."""

    world_size: int
    per_process: int

    @property
    def processes(self) -> int:
        """Processes of ranks 1..N-1."""
        return max(1, -(-(self.world_size - 1) // self.per_process))

    def bounds(self) -> list[tuple[int, int]]:
        """``(first, end)`` ranks of each process of ranks, as even as they divide."""
        edges = [1 + (self.world_size - 1) * index // self.processes for index in range(self.processes + 1)]
        return list(itertools.pairwise(edges))

    def __str__(self) -> str:
        largest = max(end - first for first, end in self.bounds())
        return f"1 + {self.processes} x {largest}"


@dataclasses.dataclass(frozen=True)
class Memory:
    """What a process of ranks costs (MiB), from the probe, and the memory available now."""

    rss: float
    """Resident memory of a process after its imports."""
    private: float
    """The part of it no other process shares (``Private_Dirty``): every process pays it."""
    per_rank: float
    """Growth a rank adds: its client and its watchdog client, with the server's end of both."""
    available: float

    def need(self, packing: Packing) -> float:
        shared = self.rss - self.private  # the libraries' pages, in the page cache once
        return shared + (packing.processes + 1) * self.private + packing.world_size * self.per_rank

    def fits(self, packing: Packing) -> bool:
        return self.need(packing) <= MEMORY_SHARE * self.available

    def fewest(self, world_size: int) -> int | None:
        """The fewest ranks a process with which ``world_size`` ranks fit (at most 512), or ``None``."""
        return next((k for k in range(1, 513) if self.fits(Packing(world_size, k))), None)


def smaps() -> dict[str, float]:
    """This process's memory totals from ``/proc/self/smaps_rollup``, in MiB."""
    totals = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            fields = line.split()
            if len(fields) == 3 and fields[0].endswith(":") and fields[1].isdigit():
                totals[fields[0][:-1]] = int(fields[1]) / 1024
    return totals


def available_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def probe() -> None:
    """A process of ranks, measured: its imports, then ``PROBE_RANKS`` clients with a watchdog client each."""
    import torch.distributed as dist

    import lightning_mpi_env.rollcall.store  # noqa: F401  (what a process of ranks imports)

    claims(2, 1, 1, [1])  # the claim's imports too
    base = smaps()
    timeout = timedelta(seconds=60)
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False, multi_tenant=True)
    threading.stack_size(256 * 1024)
    kept: list[Any] = []
    barrier = threading.Barrier(PROBE_RANKS + 1)

    def rank(index: int) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout, wait_for_workers=False)
        client.set(f"claim/{index}", "x" * 512)  # about a claim's size
        watchdog = client.clone()
        watchdog.check([f"claim/{index}"])
        kept.append((client, watchdog))
        barrier.wait()
        barrier.wait()

    threads = [threading.Thread(target=rank, args=(index,), daemon=True) for index in range(PROBE_RANKS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    grown = smaps()
    say(
        "PROBE",
        {"rss": base["Rss"], "private": base["Private_Dirty"], "per_rank": (grown["Rss"] - base["Rss"]) / PROBE_RANKS},
    )
    barrier.wait()


# --- counting ---------------------------------------------------------------------------------------------------


def counting_store_class() -> type:
    """``CountingStore``: a ``torch.distributed.Store`` around a real client, counting the calls made on it."""
    from torch.distributed import Store

    class CountingStore(Store):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.calls = 0
            self._lock = threading.Lock()

        def __getattr__(self, name: str) -> Any:  # host, port, libuvBackend: not counted
            if name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)

        def set_timeout(self, timeout: timedelta) -> None:
            self.inner.set_timeout(timeout)

        @property
        def timeout(self) -> timedelta:
            return self.inner.timeout

        def has_extended_api(self) -> bool:
            return self.inner.has_extended_api()

        def clone(self) -> Any:  # a new connection, counted on its own
            return CountingStore(self.inner.clone())

    def counted(name: str) -> Callable[..., Any]:
        def call(self: Any, *args: Any) -> Any:
            with self._lock:
                self.calls += 1
            return getattr(self.inner, name)(*args)

        return call

    requests = ("set", "get", "add", "compare_set", "delete_key", "num_keys", "check", "wait", "append")
    for name in (*requests, "multi_get", "multi_set", "queue_push", "queue_pop", "queue_len", "list_keys"):
        if hasattr(Store, name):
            setattr(CountingStore, name, counted(name))
    return CountingStore


def install_counting() -> None:
    """Replace ``TCPStore`` where this process's code looks it up by a factory of counting stores."""
    import torch.distributed as dist
    from torch.distributed import DistStoreError

    real, counting = dist.TCPStore, counting_store_class()

    def tcp_store(
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: timedelta = timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
    ) -> Any:
        inner = real(
            host_name,
            port,
            world_size,
            is_master,
            timeout,
            wait_for_workers=False,
            multi_tenant=multi_tenant,
            master_listen_fd=master_listen_fd,
            use_libuv=use_libuv,
        )
        store = counting(inner)
        if wait_for_workers and world_size is not None:  # TCPStore::waitForWorkers, through the counting store
            store.add("init/", 1)
            deadline = time.monotonic() + timeout.total_seconds()
            while is_master and int(store.get("init/")) < world_size:
                if time.monotonic() > deadline:
                    raise DistStoreError(f"Timed out waiting for clients ({world_size} expected)")
                time.sleep(0.01)
        return store

    dist.TCPStore = tcp_store
    importlib.import_module("torch.distributed.rendezvous").TCPStore = tcp_store  # _create_c10d_store's


def calls(store: Any) -> int | None:
    """Requests made on ``store`` so far; ``None`` where it is not a counting store (not opened by the factory)."""
    value = getattr(store, "calls", None)
    return value if isinstance(value, int) else None


def server_connections(port: int) -> int:
    """ESTABLISHED TCP connections to ``port`` whose sockets this process holds (the server's end)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)  # the header
                for line in lines:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes
        except FileNotFoundError:  # no IPv6 here
            continue
    return count


# --- one process of ranks ---------------------------------------------------------------------------------------


def address(kind: int, process: int) -> str:
    """Where the clients of the ``process``-th process of ranks connect (0: rank 0's); ``kind`` 1 roll call, 2 init."""
    return "127.0.0.1" if process == 0 else f"127.{kind}.{process >> 8}.{process & 255}"


def raise_fd_limit(needed: int) -> int:
    """Raise the limit on open files to ``needed`` (the hard limit too, where allowed); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError):
            needed = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


def collections_counter(gc_mode: str) -> list[int]:
    """The cyclic garbage collector's full collections in this process from now on (one entry each).

    With ``freeze``, every object alive now (torch's import, about the same in every process of ranks) goes to the
    permanent generation first, as a job's rank would find them at its roll call: here one interpreter holds 128
    ranks and allocates for all of them, enough to start a full collection that walks torch's objects in every
    process at once (0.4-0.5 s with 9 processes on 2 cores), in either configuration, whichever allocates more.
    Young collections, which follow the ranks' own allocations, stay.
    """
    import gc

    if gc_mode == "freeze":
        gc.collect()
        gc.freeze()
    full: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(note)
    return full


def phases(mode: str, training: bool) -> list[str]:
    """The steps a rank takes, in order; ``training`` only where the package would start its watchdog."""
    return [*([ROLL_CALL] if mode == "rollcall+init" else []), INIT, *([TRAINING] if training else [])]


@dataclasses.dataclass
class Rank:
    """One simulated rank's state through its steps."""

    claim: Any
    store: Any = None
    result: Any = None
    error: str | None = None
    judged: float | None = None
    times: dict[str, float] = dataclasses.field(default_factory=dict)
    requests: dict[str, int | None] = dataclasses.field(default_factory=dict)
    kept: list[Any] = dataclasses.field(default_factory=list)
    """Every store and result this rank opened: they stay open until the process ends, as in a job."""


def step(name: str, rank: Rank, args: argparse.Namespace) -> None:
    """One step of one rank: the roll call, init's store work, or opening the watchdog's client."""
    from torch.distributed import PrefixStore, Store
    from torch.distributed.distributed_c10d import _store_based_barrier
    from torch.distributed.rendezvous import _create_c10d_store

    from lightning_mpi_env.rollcall.store import rendezvous

    timeout = timedelta(seconds=args.timeout)
    claim = rank.claim
    if name == ROLL_CALL:
        claim = dataclasses.replace(claim, main_address=address(1, args.process))
        options: dict[str, Any] = {"timeout": args.timeout}
        if args.expected_node:
            options["expected_node"] = lambda other: other // args.per_node
        result = rendezvous(claim, **options)
        rank.times["met"] = time.monotonic()
        rank.kept.append(result)
        rank.result, rank.store, rank.judged = result, result.store, getattr(result, "judged_in", None)
        rank.requests[ROLL_CALL] = calls(rank.store)
    elif name == INIT:
        before = 0
        if rank.store is None:  # init alone: init_process_group(init_method="env://") opens its store
            store = _create_c10d_store(address(2, args.process), args.port, claim.rank, args.world_size, timeout)
            store.set_timeout(timeout)
            rank.kept.append(store)
            rank.store = store
            rank.times["connected"] = time.monotonic()
        else:  # init_process_group(store=result.store)
            before = calls(rank.store) or 0
        _store_based_barrier(claim.rank, PrefixStore("default_pg", rank.store), "0", args.world_size, timeout)
        rank.times["done"] = time.monotonic()
        total = calls(rank.store)
        rank.requests[INIT] = None if total is None else total - before
    else:  # the stall watchdog's own client, as the package opens it, and its first request
        import torch.distributed as dist

        if hasattr(rank.result, "client"):
            watchdog = rank.result.client(args.timeout)
        elif hasattr(Store, "clone"):
            watchdog = rank.store.clone()
        else:
            host = address(1 if args.mode == "rollcall+init" else 2, args.process)
            watchdog = dist.TCPStore(host, args.port, args.world_size, False, timeout, wait_for_workers=False)
        rank.kept.append(watchdog)
        watchdog.check([f"watchdog/{claim.rank}"])


def ranks_process(args: argparse.Namespace) -> None:
    """Ranks ``first_rank..end_rank-1`` of one run, one thread each (rank 0's process: rank 0 alone)."""
    if args.counted:
        install_counting()  # before the package's modules look up TCPStore
    ranks = range(args.first_rank, args.end_rank)
    steps = phases(args.mode, args.counted and args.training)
    sockets = args.world_size if args.first_rank == 0 else len(ranks)
    fd_limit = raise_fd_limit((2 if TRAINING in steps else 1) * sockets + SPARE_FILES)
    threading.stack_size(256 * 1024)
    own = [Rank(claim) for claim in claims(args.world_size, args.port, args.per_node, ranks)]
    from lightning_mpi_env.rollcall.store import rendezvous

    args.expected_node = "expected_node" in inspect.signature(rendezvous).parameters  # once, not in each rank
    start, arrived, release = (threading.Barrier(len(own) + 1) for _ in range(3))

    def run(rank: Rank) -> None:
        start.wait()
        for name in steps:
            if rank.error is None:
                try:
                    step(name, rank, args)
                except Exception as error:  # noqa: BLE001 (counted and shown)
                    rank.error = f"{name}: {type(error).__name__}: {str(error)[:200]}"
            if args.counted:  # wait here until rank 0's process has read its connections
                arrived.wait()
                release.wait()

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in own]
    for thread in threads:
        thread.start()
    full_collections = collections_counter(args.gc)
    say("READY", {"fd_limit": fd_limit, "threads": len(threads)})
    sys.stdin.readline()  # GO
    full_collections.clear()
    start.wait()
    for name in steps if args.counted else []:
        arrived.wait()
        say("STEP", {"step": name, "errors": sum(rank.error is not None for rank in own)})
        if sys.stdin.readline().startswith("COUNT"):  # rank 0's process only
            say("COUNTED", {"connections": server_connections(args.port)})
            sys.stdin.readline()  # NEXT
        release.wait()
    for thread in threads:
        thread.join()
    ok = [rank for rank in own if rank.error is None]
    say(
        "DONE",
        {
            "ok": len(ok),
            "errors": [rank.error for rank in own if rank.error][:2],
            "times": {key: max(rank.times[key] for rank in ok) for key in (ok[0].times if ok else [])},
            "requests": {name: [rank.requests.get(name) for rank in ok] for name in (ROLL_CALL, INIT)},
            "judged": own[0].judged if args.first_rank == 0 else None,
            "full_collections": len(full_collections),
        },
    )
    sys.stdin.readline()  # EXIT: every rank is through


# --- the orchestrator -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Counts:
    """What the counted run of one size and configuration saw."""

    requests: dict[str, list[int | None]]
    """Per step, the requests of every rank other than 0."""
    rank0: dict[str, int | None]
    connections: dict[str, int | None]
    """Per step, ESTABLISHED connections on rank 0's server at its end; ``None``: not run."""


def one_run(
    packing: Packing, mode: str, args: argparse.Namespace, prefix: list[str], *, counted: bool, training: bool
) -> tuple[dict[str, float], float | None, Counts | None, int]:
    """One run: seconds from rank 0's start to the last rank's end of each step, rank 0's judging time, counts, and
    the full collections of the garbage collector in all processes during the run."""
    size = packing.world_size
    port = free_port()
    common = ["--mode", mode, "--world-size", str(size), "--port", str(port), "--per-node", str(args.ranks_per_node)]
    common += ["--timeout", str(args.timeout), *(["--counted"] if counted else []), *(["--training"] * training)]
    common += ["--gc", args.gc]

    def start(first: int, end: int, process: int) -> subprocess.Popen[str]:
        command = [*prefix, sys.executable, __file__, "--role", "ranks", *common]
        command += ["--first-rank", str(first), "--end-rank", str(end), "--process", str(process)]
        # stderr: torch's c10d warnings, one per connection on some machines; the outcome comes on stdout.
        return subprocess.Popen(
            command, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def send(process: subprocess.Popen[str], line: str) -> None:
        assert process.stdin is not None
        process.stdin.write(line + "\n")
        process.stdin.flush()

    server = start(0, 1, 0)
    others = [start(first, end, index + 1) for index, (first, end) in enumerate(packing.bounds())]
    processes = [server, *others]
    connections: dict[str, int | None] = {name: None for name in (ROLL_CALL, INIT, TRAINING)}
    try:
        for process in processes:
            expect(process, "READY")
        go = time.monotonic()
        for process in processes:
            if process is others[0]:
                port_open(port, go + args.timeout)
            send(process, "GO")
        for name in phases(mode, training) if counted else []:
            for process in processes:
                expect(process, "STEP")
            send(server, "COUNT")
            connections[name] = expect(server, "COUNTED")["connections"]
            for process in processes:
                send(process, "NEXT")
        done = [expect(process, "DONE") for process in processes]
        for process in processes:
            send(process, "EXIT")
    finally:
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    ok = sum(part["ok"] for part in done)
    if ok != size:
        errors = [text for part in done for text in part["errors"]]
        raise RuntimeError(f"{mode} at {size} ranks: {ok}/{size} through; e.g. {errors[:1]}")
    keys = done[0]["times"]
    steps = {key: max(part["times"][key] for part in done) - go for key in keys}
    counts = None
    if counted:
        requests = {name: [n for part in done[1:] for n in part["requests"][name]] for name in (ROLL_CALL, INIT)}
        rank0 = {name: (done[0]["requests"][name] or [None])[0] for name in (ROLL_CALL, INIT)}
        counts = Counts(requests, rank0, connections)
    return steps, done[0]["judged"], counts, sum(part["full_collections"] for part in done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per size and configuration (median shown)")
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument(
        "--ranks-per-process", type=int, default=512, help="ranks 1..N-1 as threads, at most this many a process"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="configurations to run")
    parser.add_argument("--no-counts", action="store_true", help="skip the counted run of each size and configuration")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--gc",
        choices=["freeze", "as-is"],
        default="freeze",
        help="freeze the objects alive after the imports in every process of ranks (default), or leave the collector",
    )
    parser.add_argument("--resolver", choices=["auto", "system", "files"], default="auto")
    parser.add_argument("--role", choices=["ranks", "probe"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--per-node", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--training", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "ranks":
        ranks_process(args)
    elif args.role == "probe":
        probe()
    else:
        if args.ranks_per_process < 1 or min(args.sizes) < 2:
            parser.error("--ranks-per-process takes 1 or more, --sizes 2 ranks or more")
        with tempfile.TemporaryDirectory() as workdir:
            run_all(args, workdir)


def measure_memory(prefix: list[str]) -> Memory:
    command = [*prefix, sys.executable, __file__, "--role", "probe"]
    quiet = subprocess.DEVNULL
    with subprocess.Popen(command, text=True, stdin=quiet, stdout=subprocess.PIPE, stderr=quiet) as process:
        found = expect(process, "PROBE")
    return Memory(found["rss"], found["private"], found["per_rank"], available_mib())


def run_all(args: argparse.Namespace, workdir: str) -> None:
    prefix: list[str] = []
    slowest = slowest_reverse_lookup()
    note = f"the machine's resolver (slowest of 60 reverse lookups: {slowest:.2f} s)"
    if args.resolver == "files" or (args.resolver == "auto" and slowest > 1.0):
        isolated = files_only_resolver(workdir)
        if isolated is not None:
            prefix = isolated
            note = f"ranks resolve host names from /etc/hosts only (the machine's resolver: {slowest:.2f} s)"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as port_range:
        ports = port_range.read().split()
    with open("/proc/sys/net/core/somaxconn") as somaxconn:
        backlog = somaxconn.read().strip()
    memory = measure_memory(prefix)
    print(f"machine: {os.uname().nodename}: {machine_description()}", flush=True)
    print(
        f"open files: soft {soft}, hard {hard}; ephemeral ports {'-'.join(ports)}; somaxconn {backlog}; {note}",
        flush=True,
    )
    fewest = ", ".join(f"{size}: {memory.fewest(size) or 'none'}" for size in args.sizes)
    print(
        f"memory: a process of ranks {memory.rss:.0f} MiB RSS after its imports ({memory.private:.0f} MiB private), "
        f"+{memory.per_rank * 1024:.0f} KiB a rank; {memory.available / 1024:.1f} GiB available; fewest ranks a "
        f"process that fit {MEMORY_SHARE:.0%} of it: {fewest}",
        flush=True,
    )
    print(f"packing: rank 0 alone, ranks 1..N-1 as threads, at most {args.ranks_per_process} a process", flush=True)
    frozen = "frozen after the imports" if args.gc == "freeze" else "as the interpreter leaves them (--gc as-is)"
    print(f"garbage collector: every process's objects {frozen}", flush=True)
    times: dict[tuple[int, str], list[dict[str, float]]] = {}
    judged: dict[tuple[int, str], list[float]] = {}
    counts: dict[tuple[int, str], Counts] = {}
    skipped: dict[int, str] = {}
    for size in args.sizes:
        packing = Packing(size, args.ranks_per_process)
        if not memory.fits(packing):
            skipped[size] = "memory"
            print(
                f"  N={size}: {packing} ranks would take about {memory.need(packing) / 1024:.1f} GiB, over "
                f"{MEMORY_SHARE:.0%} of the {memory.available / 1024:.1f} GiB available: not run (it would swap); "
                f"--ranks-per-process {memory.fewest(size) or '?'} fits",
                flush=True,
            )
            continue
        if raise_fd_limit(size + SPARE_FILES) < size + SPARE_FILES:
            skipped[size] = "open files"  # rank 0's server would stop accepting at the limit
            print(f"  N={size}: rank 0's server needs {size + SPARE_FILES} open files; the hard limit is {hard}")
            continue
        for index in range(args.repeat):
            for mode in args.modes if index % 2 == 0 else args.modes[::-1]:
                steps, rank0_judged, _, full = one_run(packing, mode, args, prefix, counted=False, training=False)
                times.setdefault((size, mode), []).append(steps)
                if rank0_judged is not None:
                    judged.setdefault((size, mode), []).append(rank0_judged)
                shown = ", ".join(f"{key} {value:.2f} s" for key, value in steps.items())
                print(f"  N={size} ({packing}) #{index + 1} {mode}: {shown}; full collections {full}", flush=True)
        training = raise_fd_limit(2 * size + SPARE_FILES) >= 2 * size + SPARE_FILES
        for mode in [] if args.no_counts else args.modes:
            # A job without the package has no watchdog: init alone stops at init.
            with_training = training and mode == "rollcall+init"
            _, _, found, _ = one_run(packing, mode, args, prefix, counted=True, training=with_training)
            assert found is not None
            counts[(size, mode)] = found
            print(f"  N={size} ({packing}) counts {mode}: {count_cells(found, training)}", flush=True)
    print_tables(args, memory, note, times, judged, counts, skipped)


def spread(values: Sequence[int | None]) -> str:
    known = [value for value in values if value is not None]
    if not known:
        return "not counted"
    return f"{statistics.median(known):g} (max {max(known)})"


def count_cells(counts: Counts, training_possible: bool) -> str:
    roll_call = spread(counts.requests[ROLL_CALL]) if counts.connections[ROLL_CALL] is not None else "-"
    requests = f"{roll_call} | {spread(counts.requests[INIT])}"
    rank0 = " / ".join("-" if counts.rank0[name] is None else str(counts.rank0[name]) for name in (ROLL_CALL, INIT))
    shown = []
    for name in (ROLL_CALL, INIT, TRAINING):
        value = counts.connections[name]
        if value is not None:
            shown.append(str(value))
        elif name == TRAINING and counts.connections[ROLL_CALL] is not None and not training_possible:
            shown.append("not run (open files)")
        else:
            shown.append("-")
    return f"{requests} | {rank0} | {' | '.join(shown)}"


def print_tables(
    args: argparse.Namespace,
    memory: Memory,
    note: str,
    times: dict[tuple[int, str], list[dict[str, float]]],
    judged: dict[tuple[int, str], list[float]],
    counts: dict[tuple[int, str], Counts],
    skipped: dict[int, str],
) -> None:
    def cell(size: int, mode: str, key: str = "done") -> str:
        values = [steps[key] for steps in times[(size, mode)]]
        return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"

    def median(size: int, mode: str, key: str) -> float:
        return statistics.median(steps[key] for steps in times[(size, mode)])

    print(
        f"\nN simulated ranks on one TCPStore ({args.ranks_per_node} per simulated host), packing: rank 0 alone + "
        f"processes x ranks a process; the configurations interleaved, median of {args.repeat} (range); machine "
        f"{os.uname().nodename}: {machine_description()}; {note}; garbage collector: --gc {args.gc}.\n"
    )
    print(
        "| ranks | packing | init alone | roll call + init | difference | ratio | roll call done | rank 0 judged in "
        "| init alone: last store connected |"
    )
    print(f"|{'---|' * 9}")
    for size in args.sizes:
        packing = Packing(size, args.ranks_per_process)
        if size in skipped:
            print(f"| {size} | {packing} | not run ({skipped[size]}) | - | - | - | - | - | - |")
            continue
        alone = cell(size, "init") if "init" in args.modes else "-"
        connected = f"{median(size, 'init', 'connected'):.2f} s" if "init" in args.modes else "-"
        if "rollcall+init" not in args.modes:
            print(f"| {size} | {packing} | {alone} | - | - | - | - | - | {connected} |")
            continue
        seconds = judged.get((size, "rollcall+init"))
        judging = f"{statistics.median(seconds) * 1e3:.1f} ms" if seconds else "n/a"
        both = median(size, "rollcall+init", "done")
        if "init" in args.modes:
            first = median(size, "init", "done")
            versus = f"{both - first:+.2f} s | x{both / first:.2f}"
        else:
            versus = "- | -"
        print(
            f"| {size} | {packing} | {alone} | {cell(size, 'rollcall+init')} | {versus} "
            f"| {cell(size, 'rollcall+init', 'met')} | {judging} | {connected} |"
        )
    print(
        "\nTimes from rank 0's start until the last rank is through init's store-based barrier. Roll call done: the "
        "last rank's result. Rank 0 judged in: the judging time its result reports (n/a: not reported). Last store "
        "connected: where torch 2.13's init_process_group ends by default (no barrier)."
    )
    if not counts:
        return
    print(
        "\n| ranks | configuration | requests a rank: roll call | init | rank 0: roll call / init "
        "| connections: end of roll call | end of init | while training |"
    )
    print(f"|{'---|' * 8}")
    for size in args.sizes:
        training = 2 * size + SPARE_FILES <= resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        for mode in args.modes:
            if (size, mode) in counts:
                print(f"| {size} | {mode} | {count_cells(counts[(size, mode)], training)} |")
    print(
        "\nRequests: calls on each rank's own store client, ranks 1..N-1: median (max); init alone includes the "
        "store constructor's wait for workers. Connections: ESTABLISHED sockets on rank 0's server, every rank "
        "stopped at the end of the step; while training: after each rank opened its watchdog's client "
        "(Store.clone) and sent one request on it (init alone has no watchdog)."
    )


if __name__ == "__main__":
    main()
