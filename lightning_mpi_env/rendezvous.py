"""A fail-fast rendezvous over one ``torch.distributed.TCPStore``, run before ``init_process_group``.

Every process registers what it claims (rank, host, local rank, process id, world size, main port) in the store that
rank 0 serves on the main address and port. A rank claimed twice, a world size or port that differs between
processes, ranks that never arrive and uneven ranks per host each end *every* process with a
:class:`RendezvousError` that names the ranks, hosts and process ids, instead of a silent wait in
``init_process_group``. On success the same store is handed to ``init_process_group(store=...)``, so no second port
is opened, and node ranks come from the exchanged host names (node 0 holds rank 0), whatever the placement.

This module needs torch but not Lightning.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta

from torch._C._distributed_c10d import TCPStore

from lightning_mpi_env.errors import LayoutError

RENDEZVOUS_TIMEOUT_VARIABLE = "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT"
"""Environment variable that sets the rendezvous timeout in seconds."""

DEFAULT_RENDEZVOUS_TIMEOUT = 120.0
"""Seconds to wait for every rank to arrive, unless told otherwise. Separate from the collective timeout."""

REPORT_GRACE = 5.0
"""Seconds past the timeout that ranks other than 0 wait for rank 0's report of who is missing."""

KEY_PREFIX = "lightning_mpi_env/"
"""Prefix of every key this rendezvous writes, apart from those of ``init_process_group``."""

_ABORT = KEY_PREFIX + "abort"
_ARRIVED = KEY_PREFIX + "arrived"
_WORLD = KEY_PREFIX + "world"
_HOSTS = KEY_PREFIX + "hosts"

_MISSING_CAUSES = (
    "Likely causes: MASTER_ADDR/MASTER_PORT differ between nodes or point at the wrong host, a firewall blocks the "
    "port between nodes, or a node failed to start its ranks (check the launcher's and the scheduler's logs)."
)


class RendezvousError(LayoutError):
    """The processes of one job do not add up: duplicate, missing or disagreeing ranks."""


def rendezvous_error(problem: str, hint: str) -> RendezvousError:
    """Build a :class:`RendezvousError` whose message ends with the fix.

    >>> print(rendezvous_error("Rank 3 never arrived.", "Check the launcher's log."))
    Rank 3 never arrived.
    HINT: Check the launcher's log.
    """
    return RendezvousError(f"{problem}\nHINT: {hint}")


@dataclass(frozen=True)
class Claim:
    """What one process says about itself, as registered in the store."""

    rank: int
    """Global rank this process claims."""
    world_size: int
    """Number of processes this process expects."""
    host: str
    """This process's host name."""
    local_rank: int
    """Local rank from the launcher (or Lightning)."""
    pid: int
    """Process id, to tell two claimants apart."""
    main_address: str
    """Where this process looks for rank 0."""
    main_port: int
    """Port this process uses on the main address."""

    @classmethod
    def here(cls, *, rank: int, world_size: int, local_rank: int, main_address: str, main_port: int) -> Claim:
        """The claim of the calling process, with its own host name and process id."""
        return cls(rank, world_size, socket.gethostname(), local_rank, os.getpid(), main_address, main_port)

    def describe(self) -> str:
        """``"host nodeb (pid 4242, local rank 1)"``, for messages."""
        return f"host {self.host} (pid {self.pid}, local rank {self.local_rank})"

    def to_json(self) -> str:
        """The claim as stored."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Claim:
        """Read back a stored claim."""
        return cls(**json.loads(text))


@dataclass(frozen=True)
class NodeAssignment:
    """Node and local ranks found by exchanging host names."""

    node_rank: int
    """Index of this process's host, numbered by the lowest global rank on each host."""
    num_nodes: int
    """Number of distinct hosts."""
    local_rank: int
    """Position of this process among the ranks on its host, in global rank order."""
    local_size: int
    """Number of ranks on each host."""


@dataclass(frozen=True)
class RendezvousResult:
    """A successful rendezvous: the store to hand to ``init_process_group`` and this process's place."""

    store: TCPStore
    """The store, served by rank 0, still open."""
    claim: Claim
    """This process's claim."""
    nodes: NodeAssignment
    """Node and local rank from the exchanged host names."""
    hosts: tuple[str, ...]
    """Host name of every rank, by global rank."""


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks in words, with runs folded.

    >>> format_ranks([8, 9, 10, 11, 3])
    'ranks 3, 8-11'
    >>> format_ranks([5])
    'rank 5'
    """
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = previous = ordered[0] if ordered else 0
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return f"rank{'s' if len(ordered) != 1 else ''} {', '.join(runs)}"


def resolve_timeout(value: float | None, env: Mapping[str, str]) -> float:
    """The rendezvous timeout: the argument, else :data:`RENDEZVOUS_TIMEOUT_VARIABLE`, else the default.

    Raises:
        LayoutError: If the value is not a positive number of seconds.

    >>> resolve_timeout(None, {"LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": "20"})
    20.0
    >>> resolve_timeout(None, {})
    120.0
    """
    if value is not None:
        source, raw = "rendezvous_timeout", str(value)
    elif RENDEZVOUS_TIMEOUT_VARIABLE in env:
        source, raw = RENDEZVOUS_TIMEOUT_VARIABLE, env[RENDEZVOUS_TIMEOUT_VARIABLE]
    else:
        return DEFAULT_RENDEZVOUS_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise rendezvous_error(
            f"{source}={raw!r} is not a positive, finite number of seconds.",
            f"Set {source} to the seconds to wait for every rank to arrive, e.g. {DEFAULT_RENDEZVOUS_TIMEOUT:g}.",
        )
    return seconds


def assign_nodes(hosts: Sequence[str], rank: int) -> NodeAssignment:
    """Number hosts by their lowest global rank, and place ``rank`` on its host.

    Args:
        hosts: The host name of every rank, by global rank.
        rank: The rank to place.

    Raises:
        RendezvousError: If the hosts run different numbers of ranks.

    >>> assign_nodes(["b", "a", "b", "a"], 3)
    NodeAssignment(node_rank=1, num_nodes=2, local_rank=1, local_size=2)
    """
    ranks_by_host: dict[str, list[int]] = {}
    for index, host in enumerate(hosts):
        ranks_by_host.setdefault(host, []).append(index)
    sizes = {len(ranks) for ranks in ranks_by_host.values()}
    if len(sizes) != 1:
        counts = ", ".join(f"{host}: {format_ranks(ranks)}" for host, ranks in ranks_by_host.items())
        raise rendezvous_error(
            f"Ranks are spread unevenly over the hosts ({counts}); Lightning needs the same number of ranks on "
            f"every node.",
            "Launch the same number of ranks on every node, e.g. `mpirun --map-by ppr:<ranks per node>:node` "
            "(Open MPI) or `srun --ntasks-per-node=<ranks per node>`.",
        )
    order = list(ranks_by_host)  # dicts keep insertion order: by the lowest rank on each host
    host = hosts[rank]
    return NodeAssignment(
        node_rank=order.index(host),
        num_nodes=len(order),
        local_rank=ranks_by_host[host].index(rank),
        local_size=sizes.pop(),
    )


def duplicate_message(first: Claim, second: Claim) -> str:
    """The error for a rank claimed twice, naming both claimants."""
    return str(
        rendezvous_error(
            f"Duplicate rank {first.rank}: it is claimed by {first.describe()} and by {second.describe()}. Two "
            f"processes with one rank would deadlock or corrupt training, so every rank stops.",
            "The launcher's rank variables were overridden or copied: a wrapper script or job script that exports "
            "OMPI_COMM_WORLD_RANK/PMI_RANK/SLURM_PROCID/RANK by hand, two launches sharing one MASTER_ADDR and "
            "MASTER_PORT, or a job started twice. Let the launcher set the ranks and give each job its own port.",
        )
    )


def disagreement_message(reference: Claim, other: Claim) -> str | None:
    """The error when ``other`` expects another world size or main port than rank 0, or ``None``."""
    problems = []
    if other.world_size != reference.world_size:
        problems.append(f"world size {other.world_size} (rank 0 says {reference.world_size})")
    if other.main_port != reference.main_port:
        problems.append(f"main port {other.main_port} (rank 0 says {reference.main_port})")
    if not problems:
        return None
    return str(
        rendezvous_error(
            f"Rank {other.rank} on {other.describe()} expects {' and '.join(problems)}; rank 0 runs on "
            f"{reference.describe()}. The processes were not started by one launch with one environment.",
            "Start every rank with one launcher command, and pass the same WORLD_SIZE/MASTER_PORT (or none) to "
            "all of them; a job script that sets them per node must agree across nodes.",
        )
    )


def missing_message(
    missing: Sequence[int],
    arrived: Mapping[int, Claim],
    world_size: int,
    timeout: float,
    expected_node: Callable[[int], int] | None,
) -> str:
    """The error for ranks that never arrived, saying where they were expected."""
    where = ""
    if expected_node is not None:
        hosts_of_node: dict[int, set[str]] = {}
        for rank, claim in arrived.items():
            hosts_of_node.setdefault(expected_node(rank), set()).add(claim.host)
        places = []
        for node in sorted({expected_node(rank) for rank in missing}):
            ranks = format_ranks(rank for rank in missing if expected_node(rank) == node)
            hosts = sorted(hosts_of_node.get(node, ()))
            on = f"host {', '.join(hosts)}" if hosts else "a node from which no rank arrived at all"
            places.append(f"on node {node} ({on}): {ranks}" if len(missing) > 1 else f"on node {node} ({on})")
        where = f"; {'they were' if len(missing) > 1 else 'it was'} expected {'; '.join(places)}"
    return str(
        rendezvous_error(
            f"{format_ranks(missing).capitalize()} of {world_size} never arrived within the rendezvous timeout of "
            f"{timeout:g} s{where}. {len(arrived)} rank(s) arrived.",
            f"{_MISSING_CAUSES} To wait longer, raise {RENDEZVOUS_TIMEOUT_VARIABLE} or "
            f"MPIDDPStrategy(rendezvous_timeout=...).",
        )
    )


def rendezvous(
    claim: Claim,
    *,
    timeout: float,
    expected_node: Callable[[int], int] | None = None,
    poll_interval: float | None = None,
) -> RendezvousResult:
    """Meet every other rank in rank 0's store, or raise a named error within about ``timeout`` seconds.

    Args:
        claim: This process's claim (see :meth:`Claim.here`).
        timeout: Seconds to wait for every rank (and, for ranks other than 0, for rank 0's store to answer).
        expected_node: Maps a rank to the node the launcher placed it on, to say where missing ranks were expected.
        poll_interval: Seconds between looks at the store; grows with the world size by default.

    Returns:
        The open store and this process's node assignment.

    Raises:
        RendezvousError: On a duplicate rank, a disagreeing world size or port, ranks that never arrived, an
            unreachable rank 0, or uneven ranks per host. Every process of the job raises, none waits on.
    """
    deadline = time.monotonic() + timeout
    interval = poll_interval if poll_interval is not None else max(0.05, claim.world_size / 2000)
    store = _connect(claim, timeout)
    meeting = _Meeting(store, claim, deadline, interval)
    try:
        meeting.register()
        meeting.wait_for_everyone(timeout, expected_node)
        hosts = meeting.exchange_hosts()
    except RendezvousError:
        meeting.leave()
        raise
    except RuntimeError as error:  # the store went away: rank 0 stopped, most likely for a reason it printed
        raise rendezvous_error(
            f"Rank {claim.rank} on {claim.describe()} lost the rendezvous store at {claim.main_address}:"
            f"{claim.main_port} ({type(error).__name__}: {error}).",
            "Rank 0 stopped: look for its error above (duplicate or missing ranks, or a crash).",
        ) from error
    return RendezvousResult(store=store, claim=claim, nodes=assign_nodes(hosts, claim.rank), hosts=hosts)


def _connect(claim: Claim, timeout: float) -> TCPStore:
    address = f"{claim.main_address}:{claim.main_port}"
    try:
        if claim.rank != 0:
            # TCPStore's own connect retries can overshoot its timeout twofold: wait for the port ourselves.
            _wait_for_port(claim.main_address, claim.main_port, time.monotonic() + timeout)
        return TCPStore(
            claim.main_address,
            claim.main_port,
            world_size=claim.world_size,
            is_master=claim.rank == 0,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    except (RuntimeError, TimeoutError) as error:
        if claim.rank == 0:
            raise rendezvous_error(
                f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {claim.main_port} "
                f"({type(error).__name__}: {error}).",
                "The port is taken: by another job on this host (give each job its own MASTER_PORT, or unset it to "
                "derive one from the job id), or by a second process that also claims rank 0 here.",
            ) from error
        raise rendezvous_error(
            f"Rank {claim.rank} on {claim.describe()}: rank 0 never answered at the main address {address} within "
            f"the rendezvous timeout of {timeout:g} s ({type(error).__name__}).",
            f"Rank 0 or its node failed to start, MASTER_ADDR/MASTER_PORT ({address} here) point at the wrong host "
            f"or differ between nodes, or a firewall blocks the port. To wait longer, raise "
            f"{RENDEZVOUS_TIMEOUT_VARIABLE}.",
        ) from error


def _wait_for_port(host: str, port: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a connection; raise :class:`TimeoutError` at the deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing accepted a connection at {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 2.0)):
                return
        except OSError:
            time.sleep(min(0.2, max(remaining, 0.0)))


class _Meeting:
    """The steps of one rendezvous on one process; any failure is published under one abort key."""

    def __init__(self, store: TCPStore, claim: Claim, deadline: float, interval: float) -> None:
        self.store = store
        self.claim = claim
        self.deadline = deadline
        self.interval = interval

    def register(self) -> None:
        rank = self.claim.rank
        if rank == 0:
            self.store.set(_WORLD, self.claim.to_json())
        order = self.store.add(f"{KEY_PREFIX}claims/{rank}", 1)
        self.store.set(f"{KEY_PREFIX}claim/{rank}/{order}", self.claim.to_json())
        if order > 1:
            # The second claimant knows at once; the first learns through the abort key it polls.
            first = Claim.from_json(self._get(f"{KEY_PREFIX}claim/{rank}/1", grace=REPORT_GRACE))
            self._abort(duplicate_message(first, self.claim))
        reference = Claim.from_json(self._get(_WORLD, grace=0.0))
        problem = disagreement_message(reference, self.claim)
        if problem is not None:
            self._abort(problem)
        self.store.add(_ARRIVED, 1)

    def wait_for_everyone(self, timeout: float, expected_node: Callable[[int], int] | None) -> None:
        world_size = self.claim.world_size
        while self.store.add(_ARRIVED, 0) < world_size:
            self._raise_if_aborted()
            if time.monotonic() > self.deadline:
                if self.claim.rank != 0:
                    self._wait_for_report(timeout)
                self._abort(self._missing(timeout, expected_node))
            time.sleep(self.interval)
        self._raise_if_aborted()

    def exchange_hosts(self) -> tuple[str, ...]:
        world_size = self.claim.world_size
        if self.claim.rank == 0:
            keys = [f"{KEY_PREFIX}claim/{rank}/1" for rank in range(world_size)]
            claims = [Claim.from_json(raw) for raw in self.store.multi_get(keys)]
            for other in claims:
                problem = disagreement_message(self.claim, other)
                if problem is not None:
                    self._abort(problem)
            hosts = tuple(claim.host for claim in claims)
            try:
                assign_nodes(hosts, 0)
            except RendezvousError as error:
                self._abort(str(error))
            self.store.set(_HOSTS, json.dumps(hosts))
            return hosts
        return tuple(json.loads(self._get(_HOSTS, grace=REPORT_GRACE)))

    def leave(self) -> None:
        # Rank 0 serves the store: keep it up briefly so that the others can read why the job stops.
        if self.claim.rank == 0 and self.claim.world_size > 1:
            time.sleep(min(1.0, REPORT_GRACE))

    # --- helpers -------------------------------------------------------------------------------------------------

    def _missing(self, timeout: float, expected_node: Callable[[int], int] | None) -> str:
        arrived: dict[int, Claim] = {}
        missing = []
        for rank in range(self.claim.world_size):
            key = f"{KEY_PREFIX}claim/{rank}/1"
            if self.store.check([key]):
                arrived[rank] = Claim.from_json(self.store.get(key))
            else:
                missing.append(rank)
        if not missing:  # everyone arrived just now
            return ""
        return missing_message(missing, arrived, self.claim.world_size, timeout, expected_node)

    def _wait_for_report(self, timeout: float) -> None:
        """Past the deadline, give rank 0 a moment to say who is missing, then speak for ourselves."""
        end = time.monotonic() + REPORT_GRACE
        while time.monotonic() < end:
            self._raise_if_aborted()
            time.sleep(self.interval)
        raise rendezvous_error(
            f"Rank {self.claim.rank} on {self.claim.describe()}: not every rank arrived within the rendezvous "
            f"timeout of {timeout:g} s, and rank 0 did not say which.",
            _MISSING_CAUSES,
        )

    def _abort(self, message: str) -> None:
        if not message:
            return
        current = self.store.compare_set(_ABORT, "", message)
        raise RendezvousError(_text(current) or message)

    def _raise_if_aborted(self) -> None:
        if self.store.check([_ABORT]):
            raise RendezvousError(_text(self.store.get(_ABORT)))

    def _get(self, key: str, *, grace: float) -> bytes:
        """The value of ``key`` once set, watching the abort key meanwhile; never waits past the deadline+grace."""
        end = self.deadline + grace
        while not self.store.check([key]):
            self._raise_if_aborted()
            if time.monotonic() > end:
                raise rendezvous_error(
                    f"Rank {self.claim.rank} on {self.claim.describe()}: the rendezvous store never received "
                    f"{key!r} within the rendezvous timeout.",
                    f"Rank 0 stopped or is overloaded. {_MISSING_CAUSES}",
                )
            time.sleep(self.interval)
        value: bytes = self.store.get(key)
        return value


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "RENDEZVOUS_TIMEOUT_VARIABLE",
    "Claim",
    "NodeAssignment",
    "RendezvousError",
    "RendezvousResult",
    "assign_nodes",
    "format_ranks",
    "rendezvous",
    "resolve_timeout",
]
