"""The roll call: every rank of a job checks in on one ``torch.distributed.TCPStore`` before ``init_process_group``.

Every process registers what it claims (rank, host, local rank, process id, world size, main port, the versions of
Python, torch and Lightning, its backend and device) in the store that rank 0 serves on the main address and port. A
rank claimed twice, ranks that never arrive, a rank that disagrees with rank 0, two ranks on one host that would
drive one GPU, and ranks spread unevenly over the hosts each end *every* process with a :class:`RendezvousError`
naming the ranks, hosts and values, instead of a silent wait in ``init_process_group``.

Any rank can reach the verdict, from what the store holds: the rank that sees the problem first writes it under
one key, and every rank raises it. Rank 0 serves the store with ``multi_tenant=True``, so the store that
``init_process_group(init_method="env://")`` then opens on the same port is this very server: no second port.

Node ranks come from the exchanged host names: hosts are numbered by the lowest global rank on each (node 0 holds
rank 0), exact under any placement. This module needs torch (imported when a roll call runs), not Lightning.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from lightning_mpi_env.compat import store_append, store_multi_set
from lightning_mpi_env.errors import RendezvousError, SettingError

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

RENDEZVOUS_TIMEOUT_VARIABLE = "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT"
"""Environment variable that sets the roll call's timeout in seconds."""

DEFAULT_RENDEZVOUS_TIMEOUT = 120.0
"""Seconds to wait for every rank to arrive, unless told otherwise. Separate from the collective timeout."""

VERDICT_GRACE = 5.0
"""Seconds past the timeout to wait for a verdict another rank is writing (everyone arrived just in time)."""

KEY_PREFIX = "lightning_mpi_env/"
"""Prefix of every key the roll call writes, apart from those of ``init_process_group``."""

_REGISTERED = KEY_PREFIX + "registered"
_ARRIVED = KEY_PREFIX + "arrived"
_ARRIVED_RANKS = KEY_PREFIX + "arrived_ranks"
_VERDICT = KEY_PREFIX + "verdict"
_READ = KEY_PREFIX + "verdict_read"

MISSING_CAUSES = (
    "Likely causes: MASTER_ADDR/MASTER_PORT differ between nodes or point at the wrong host, a firewall blocks the "
    "port between nodes, or a node failed to start its ranks (check the launcher's and the scheduler's logs)."
)


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
    versions: Mapping[str, str] = field(default_factory=dict)
    """``python``, ``torch``, ``lightning``/``pytorch_lightning`` and ``lightning_mpi_env`` versions, where known."""
    backend: str = ""
    """The process group backend this rank will use; empty when unknown."""
    device: str = ""
    """The device this rank will drive (``cuda:1``, ``cpu``); empty when not set up yet."""
    device_id: str = ""
    """The physical accelerator behind :attr:`device` (a GPU's UUID); empty on the CPU or when unknown."""
    visible_devices: int | None = None
    """How many accelerators this process sees; ``None`` when unknown."""
    expected: tuple[int, int] | None = None
    """``(devices, num_nodes)`` of the Trainer/Fabric, when known."""

    @classmethod
    def here(
        cls, *, rank: int, world_size: int, local_rank: int, main_address: str, main_port: int, **facts: Any
    ) -> Claim:
        """The claim of the calling process, with its own host name and process id."""
        return cls(rank, world_size, socket.gethostname(), local_rank, os.getpid(), main_address, main_port, **facts)

    def describe(self) -> str:
        """``"host nodeb (pid 4242, local rank 1)"``, for messages."""
        return f"host {self.host} (pid {self.pid}, local rank {self.local_rank})"

    def to_json(self) -> str:
        """The claim as stored."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Claim:
        """Read back a stored claim."""
        data = json.loads(text)
        if data.get("expected") is not None:
            data["expected"] = tuple(data["expected"])
        return cls(**data)


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


@dataclass
class RendezvousResult:
    """A roll call that everyone answered: the open store and this process's place."""

    store: TCPStore
    """The store; on rank 0 it serves the port until this object is dropped."""
    claim: Claim
    """This process's claim."""
    nodes: NodeAssignment
    """This process's node assignment."""
    summary: str = ""
    """One line saying who met where, for rank 0 to print."""
    _hosts: tuple[str, ...] | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        """The host name of every rank, by global rank (read from the store on first use)."""
        if self._hosts is None:
            self._hosts = tuple(json.loads(self.store.get(KEY_PREFIX + "hosts")))
        return self._hosts


def format_ranks(ranks: Iterable[int]) -> str:
    """``"rank 3"``, ``"ranks 8-15"`` or ``"ranks 1, 3-4"``.

    >>> format_ranks([1, 3, 4])
    'ranks 1, 3-4'
    """
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return f"{'rank' if len(ordered) == 1 else 'ranks'} {', '.join(parts)}"


def resolve_timeout(value: float | None, env: Mapping[str, str]) -> float:
    """The roll call's timeout: the argument, else ``LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT``, else 120 s.

    Raises:
        SettingError: If the value is not a positive, finite number of seconds.

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
        raise SettingError(
            f"{source}={raw!r} is not a positive, finite number of seconds.",
            f"Set {source} to the seconds to wait for every rank to arrive, e.g. {DEFAULT_RENDEZVOUS_TIMEOUT:g}.",
            variable=source,
            value=raw,
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
    ranks_by_host = _ranks_by_host(hosts)
    sizes = {len(ranks) for ranks in ranks_by_host.values()}
    if len(sizes) != 1:
        counts = ", ".join(f"{host}: {format_ranks(ranks)}" for host, ranks in ranks_by_host.items())
        raise RendezvousError(
            f"Ranks are spread unevenly over the hosts ({counts}); Lightning needs the same number of ranks on "
            "every node.",
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


def _ranks_by_host(hosts: Sequence[str]) -> dict[str, list[int]]:
    ranks_by_host: dict[str, list[int]] = {}
    for index, host in enumerate(hosts):
        ranks_by_host.setdefault(host, []).append(index)
    return ranks_by_host


# --- the verdicts -------------------------------------------------------------------------------------------------


def duplicate_message(first: Claim, second: Claim) -> RendezvousError:
    """The error for a rank claimed twice, naming both claimants."""
    return RendezvousError(
        f"Duplicate rank {first.rank}: it is claimed by {first.describe()} and by {second.describe()}. Two "
        "processes with one rank would deadlock or corrupt training, so every rank stops.",
        "The launcher's rank variables were overridden or copied: a wrapper script or job script that exports "
        "OMPI_COMM_WORLD_RANK/PMI_RANK/SLURM_PROCID/RANK by hand, two launches sharing one MASTER_ADDR and "
        "MASTER_PORT, or a job started twice. Let the launcher set the ranks and give each job its own port.",
        value=str(first.rank),
    )


def disagreement_message(reference: Claim, other: Claim) -> RendezvousError | None:
    """The error when ``other`` disagrees with rank 0 on the job (world size, port, versions, backend, devices).

    Returns:
        The error, or ``None`` when they agree. Values either one does not know are not compared.
    """
    expects, runs, uses = [], [], []
    if other.world_size != reference.world_size:
        expects.append(f"world size {other.world_size} (rank 0 says {reference.world_size})")
    if other.main_port != reference.main_port:
        expects.append(f"main port {other.main_port} (rank 0 says {reference.main_port})")
    if other.expected is not None and reference.expected is not None and other.expected != reference.expected:
        expects.append(
            f"Trainer(devices={other.expected[0]}, num_nodes={other.expected[1]}) (rank 0 has "
            f"devices={reference.expected[0]}, num_nodes={reference.expected[1]})"
        )
    for name in sorted(set(other.versions) & set(reference.versions)):
        if other.versions[name] != reference.versions[name]:
            runs.append(f"{name} {other.versions[name]} (rank 0 runs {reference.versions[name]})")
    if other.backend and reference.backend and other.backend != reference.backend:
        uses.append(
            f"the {other.backend} backend on {other.device or 'an unknown device'} (rank 0 uses "
            f"{reference.backend} on {reference.device or 'an unknown device'})"
        )
    gpus = "nccl" in (other.backend, reference.backend)
    known = other.visible_devices is not None and reference.visible_devices is not None
    if gpus and known and other.visible_devices != reference.visible_devices:
        uses.append(f"{other.visible_devices} visible GPU(s) (rank 0 sees {reference.visible_devices})")
    phrases = [
        f"{verb} {' and '.join(items)}"
        for verb, items in (("expects", expects), ("runs", runs), ("uses", uses))
        if items
    ]
    if not phrases:
        return None
    return RendezvousError(
        f"Rank {other.rank} on {other.describe()} {'; it '.join(phrases)}; rank 0 runs on {reference.describe()}. "
        "The processes were not started by one launch with one environment.",
        "Start every rank with one launcher command and one software environment (the same Python, torch and "
        "Lightning on every node), and pass the same WORLD_SIZE/MASTER_PORT (or none) and the same Trainer "
        "arguments to all of them.",
    )


def missing_message(
    missing: Sequence[int],
    arrived: Mapping[int, Claim],
    world_size: int,
    timeout: float,
    expected_node: Callable[[int], int] | None,
    *,
    arrived_count: int | None = None,
) -> RendezvousError:
    """The error for ranks that never arrived, saying where they were expected.

    Args:
        missing: The ranks that never arrived.
        arrived: Claims of arrived ranks (enough to name the host of each node that had missing ranks).
        world_size: The job's size.
        timeout: The timeout that passed.
        expected_node: Where the launcher placed each rank, when known.
        arrived_count: How many ranks arrived (``len(arrived)`` by default).
    """
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
    count = len(arrived) if arrived_count is None else arrived_count
    return RendezvousError(
        f"{format_ranks(missing).capitalize()} of {world_size} never arrived within the rendezvous timeout of "
        f"{timeout:g} s{where}. {count} rank(s) arrived.",
        f"{MISSING_CAUSES} To wait longer, raise {RENDEZVOUS_TIMEOUT_VARIABLE} or "
        "MPIClusterEnvironment(rendezvous_timeout=...).",
        value=format_ranks(missing),
    )


def device_collision(first: Claim, second: Claim) -> RendezvousError:
    """The error for two ranks on one host that would drive the same accelerator."""
    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {first.host} would both drive {first.device} "
        f"(accelerator {first.device_id}): rank {first.rank} is {first.describe()}, rank {second.rank} is "
        f"{second.describe()}. Two processes on one GPU run out of memory or deadlock in NCCL.",
        "Give each rank on a node its own GPU: launch one rank per GPU with the launcher's local ranks intact, and "
        "make CUDA_VISIBLE_DEVICES either list all of the node's GPUs for every rank or exactly one per rank "
        "(`srun --gpus-per-task=1`).",
        value=first.device_id,
    )


def local_rank_collision(first: Claim, second: Claim) -> RendezvousError:
    """The error for two ranks on one host with the same local rank."""
    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {first.host} both claim local rank {first.local_rank} "
        f"(pids {first.pid} and {second.pid}): they would use the same device and the same data shard slot.",
        "The launcher's local-rank variables were overridden or copied (a wrapper script exporting "
        "OMPI_COMM_WORLD_LOCAL_RANK/MPI_LOCALRANKID/SLURM_LOCALID/LOCAL_RANK by hand). Let the launcher set them.",
        value=str(first.local_rank),
    )


def expectation_mismatch(claims: Sequence[Claim], nodes: NodeAssignment) -> RendezvousError | None:
    """The error when the hosts do not match ``Trainer(devices, num_nodes)``, or ``None``."""
    expected = claims[0].expected
    if expected is None or (nodes.local_size, nodes.num_nodes) == expected:
        return None
    devices, num_nodes = expected
    hosts = ", ".join(dict.fromkeys(claim.host for claim in claims))
    return RendezvousError(
        f"The host names of the {len(claims)} ranks name {nodes.num_nodes} host(s) with {nodes.local_size} rank(s) "
        f"each ({hosts}), but Trainer(devices={devices}, num_nodes={num_nodes}) expects {num_nodes} node(s) with "
        f"{devices} each.",
        "Make Trainer(devices=..., num_nodes=...) match the launch; if different nodes report the same host "
        "name (containers), give each node its own host name.",
    )


def _collisions(claims: Sequence[Claim]) -> RendezvousError | None:
    by_device: dict[tuple[str, str], Claim] = {}
    by_local_rank: dict[tuple[str, int], Claim] = {}
    for claim in claims:
        if claim.device_id:
            first = by_device.setdefault((claim.host, claim.device_id), claim)
            if first is not claim:
                return device_collision(first, claim)
        first = by_local_rank.setdefault((claim.host, claim.local_rank), claim)
        if first is not claim:
            return local_rank_collision(first, claim)
    return None


def summary(claims: Sequence[Claim], seconds: float) -> str:
    """One line saying who met where: ``roll call: 4 ranks on 2 hosts (a: ranks 0-1, b: ranks 2-3) in 0.31 s``."""
    ranks_by_host = _ranks_by_host([claim.host for claim in claims])
    shown = [f"{host}: {format_ranks(ranks)}" for host, ranks in list(ranks_by_host.items())[:4]]
    if len(ranks_by_host) > 4:
        shown.append(f"... {len(ranks_by_host) - 4} more")
    return (
        f"lightning-mpi-env: roll call: all {len(claims)} ranks met on {len(ranks_by_host)} host(s) "
        f"({'; '.join(shown)}) in {seconds:.2f} s"
    )


# --- facts about this process ---------------------------------------------------------------------------------------


def local_facts(backend: str | None = None) -> dict[str, Any]:
    """What this process can say about its software and device, for :meth:`Claim.here`.

    Args:
        backend: The process group backend, when the strategy states it; else the default for the device.
    """
    versions = {"python": platform.python_version()}
    for name in ("torch", "lightning", "pytorch_lightning", "lightning_mpi_env"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if isinstance(version, str):
            versions[name] = version
    import torch

    device, device_id, visible = "", "", None
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # the strategy set the device up already (Lightning 2.2+)
            index = torch.cuda.current_device()
            device = f"cuda:{index}"
            device_id = _gpu_id(torch, index)
    else:
        visible, device = 0, "cpu"
    if backend is None and device:
        backend = "nccl" if device.startswith("cuda") else "gloo"
    return {
        "versions": versions,
        "backend": backend or "",
        "device": device,
        "device_id": device_id,
        "visible_devices": visible,
    }


def _gpu_id(torch: Any, index: int) -> str:
    properties = torch.cuda.get_device_properties(index)
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        return str(uuid)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    listed = [item.strip() for item in visible.split(",") if item.strip()]
    return listed[index] if index < len(listed) else str(index)


# --- the roll call ---------------------------------------------------------------------------------------------------


def rendezvous(
    claim: Claim,
    *,
    timeout: float,
    expected_node: Callable[[int], int] | None = None,
) -> RendezvousResult:
    """Meet every other rank in rank 0's store, or raise a named error within about ``timeout`` seconds.

    Args:
        claim: This process's claim (see :meth:`Claim.here`).
        timeout: Seconds to wait for every rank (and, for ranks other than 0, for rank 0's store to answer).
        expected_node: Maps a rank to the node the launcher placed it on, to say where missing ranks were expected.

    Returns:
        The open store and this process's node assignment.

    Raises:
        RendezvousError: On a duplicate rank, a disagreement with rank 0, ranks that never arrived, an unreachable
            rank 0, two ranks on one GPU, or uneven ranks per host. Every process of the job raises, none waits on.
    """
    from torch.distributed import DistError, DistStoreError

    start = time.monotonic()
    store = _connect(claim, timeout)
    meeting = _Meeting(store, claim, start, timeout, expected_node)
    try:
        nodes, line = meeting.run()
    except RendezvousError:
        meeting.leave()
        raise
    except DistStoreError as error:  # a wait on the store ran out: rank 0's store stopped answering
        raise meeting.lost_store(error) from error
    except DistError as error:  # the store went away: rank 0 stopped, most likely for a reason it printed
        raise meeting.lost_store(error) from error
    return RendezvousResult(store=store, claim=claim, nodes=nodes, summary=line)


def _connect(claim: Claim, timeout: float) -> TCPStore:
    import torch.distributed

    address = f"{claim.main_address}:{claim.main_port}"
    try:
        if claim.rank != 0:
            # TCPStore's own connect retries can overshoot its timeout twofold: wait for the port ourselves.
            _wait_for_port(claim.main_address, claim.main_port, time.monotonic() + timeout)
        store: TCPStore = torch.distributed.TCPStore(  # type: ignore[attr-defined]
            claim.main_address,
            claim.main_port,
            world_size=claim.world_size,
            is_master=claim.rank == 0,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
            # init_process_group's env:// store on rank 0 then shares this server (keyed by port): no second port.
            multi_tenant=True,
        )
        return store
    except (RuntimeError, TimeoutError) as error:
        if claim.rank == 0:
            raise RendezvousError(
                f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {claim.main_port} "
                f"({type(error).__name__}: {_first_line(error)}).",
                "The port is taken: by another job on this host (give each job its own MASTER_PORT, or unset it to "
                "derive one from the job id), or by a second process that also claims rank 0 here.",
                variable="MASTER_PORT",
                value=str(claim.main_port),
            ) from error
        raise RendezvousError(
            f"Rank {claim.rank} on {claim.describe()}: rank 0 never answered at the main address {address} within "
            f"the rendezvous timeout of {timeout:g} s ({type(error).__name__}).",
            f"Rank 0 or its node failed to start, MASTER_ADDR/MASTER_PORT ({address} here) point at the wrong host "
            f"or differ between nodes, or a firewall blocks the port. To wait longer, raise "
            f"{RENDEZVOUS_TIMEOUT_VARIABLE}.",
            variable="MASTER_ADDR",
            value=claim.main_address,
        ) from error


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


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
    """One rank's part in one roll call; the first rank to reach a verdict writes it for all."""

    def __init__(
        self,
        store: TCPStore,
        claim: Claim,
        start: float,
        timeout: float,
        expected_node: Callable[[int], int] | None,
    ) -> None:
        self.store = store
        self.claim = claim
        self.start = start
        self.deadline = start + timeout
        self.timeout = timeout
        self.expected_node = expected_node
        self.rank_zero: Claim | None = None

    def run(self) -> tuple[NodeAssignment, str]:
        self._register()
        if self.claim.rank != 0:
            self._compare_with_rank_zero()
        self._arrive()
        verdict = self._await_verdict()
        if "problem" in verdict:
            self._raise(verdict)
        self.store.add(_READ, 1)
        node_rank, num_nodes, local_rank, local_size = json.loads(self.store.get(f"{KEY_PREFIX}node/{self.claim.rank}"))
        return NodeAssignment(node_rank, num_nodes, local_rank, local_size), str(verdict.get("summary", ""))

    # --- steps ---------------------------------------------------------------------------------------------------

    def _register(self) -> None:
        rank = self.claim.rank
        self.store.add(_REGISTERED, 1)  # from now on rank 0 keeps the store up until this rank read the verdict
        order = self.store.add(f"{KEY_PREFIX}claims/{rank}", 1)
        self.store.set(f"{KEY_PREFIX}claim/{rank}/{order}", self.claim.to_json())
        if order > 1:
            # The second claimant knows at once; the first learns it from the verdict.
            first = Claim.from_json(self._get(f"{KEY_PREFIX}claim/{rank}/1"))
            self._conclude(duplicate_message(first, self.claim))

    def _compare_with_rank_zero(self) -> None:
        self.rank_zero = Claim.from_json(self._get(f"{KEY_PREFIX}claim/0/1"))
        problem = disagreement_message(self.rank_zero, self.claim)
        if problem is not None:
            self._conclude(problem)

    def _arrive(self) -> None:
        store_append(self.store, _ARRIVED_RANKS, f"{self.claim.rank},")
        if self.store.add(_ARRIVED, 1) == self.claim.world_size:
            self._finalize()

    def _finalize(self) -> None:
        """The last rank to arrive checks the whole table and writes everyone's node assignment."""
        world_size = self.claim.world_size
        keys = [f"{KEY_PREFIX}claim/{rank}/1" for rank in range(world_size)]
        claims = [Claim.from_json(raw) for raw in self.store.multi_get(keys)]
        for other in claims[1:]:
            problem = disagreement_message(claims[0], other)
            if problem is not None:
                self._conclude(problem)
        collision = _collisions(claims)
        if collision is not None:
            self._conclude(collision)
        hosts = [claim.host for claim in claims]
        try:
            assignments = _assign_all(hosts)
        except RendezvousError as error:
            self._conclude(error)
        mismatch = expectation_mismatch(claims, assignments[0])
        if mismatch is not None:
            self._conclude(mismatch)
        store_multi_set(
            self.store,
            [f"{KEY_PREFIX}node/{rank}" for rank in range(world_size)],
            [json.dumps([a.node_rank, a.num_nodes, a.local_rank, a.local_size]) for a in assignments],
        )
        self.store.set(KEY_PREFIX + "hosts", json.dumps(hosts))
        line = summary(claims, time.monotonic() - self.start)
        self.store.compare_set(_VERDICT, "", json.dumps({"summary": line}))

    def _await_verdict(self) -> dict[str, Any]:
        if _wait_quietly(self.store, _VERDICT, self.deadline, self.claim.world_size):
            return dict(json.loads(self.store.get(_VERDICT)))
        problem = self._missing()
        if problem is not None:
            self._conclude(problem)
        # Everyone arrived just now: the last rank is writing the verdict.
        if not _wait_quietly(self.store, _VERDICT, time.monotonic() + VERDICT_GRACE, self.claim.world_size):
            self._conclude(self._never_received(_VERDICT))
        return dict(json.loads(self.store.get(_VERDICT)))

    def leave(self) -> None:
        """On rank 0, keep serving the verdict after this process's error is shown, until every rank read it.

        Ranks still starting (importing torch) connect after the verdict; without the store they would wait out
        the timeout and blame rank 0. The wait runs at interpreter exit, after the error is printed, and ends when
        every rank of the job read the verdict or the roll call's deadline (plus a grace) passed. Under ``mpirun``
        the launcher ends the job as soon as a rank fails, sooner.
        """
        if self.claim.rank != 0 or self.claim.world_size == 1:
            return
        import atexit

        atexit.register(_serve_verdict, self.store, self.claim.world_size, max(self.deadline, time.monotonic()))

    def lost_store(self, error: BaseException) -> RendezvousError:
        address = f"{self.claim.main_address}:{self.claim.main_port}"
        who = f"rank 0 on {self.rank_zero.describe()}" if self.rank_zero is not None else "rank 0"
        return RendezvousError(
            f"Rank {self.claim.rank} on {self.claim.describe()} lost the rendezvous store at {address}, which "
            f"{who} serves ({type(error).__name__}: {_first_line(error)}).",
            "Rank 0 stopped: look for its error above (a duplicate or missing rank, or a crash). " + MISSING_CAUSES,
            variable="MASTER_ADDR",
            value=address,
        )

    # --- helpers -------------------------------------------------------------------------------------------------

    def _conclude(self, problem: RendezvousError) -> NoReturn:
        """Write ``problem`` as the verdict unless another rank wrote one first; raise the verdict that stands."""
        payload = json.dumps({"problem": problem.problem, "hint": problem.hint, "value": problem.value})
        current = json.loads(self.store.compare_set(_VERDICT, "", payload))
        if "problem" in current:
            self._raise(current)
        self.store.add(_READ, 1)
        raise problem  # the others already met (a late duplicate): this process still must not go on

    def _raise(self, verdict: Mapping[str, Any]) -> NoReturn:
        """Raise the verdict another rank (or this one) wrote, telling rank 0 it was read."""
        self.store.add(_READ, 1)
        raise RendezvousError(verdict["problem"], verdict["hint"], value=verdict.get("value"))

    def _missing(self) -> RendezvousError | None:
        """Who never arrived, read from the store: any rank can say it, not only rank 0."""
        world_size = self.claim.world_size
        arrived_text = self.store.get(_ARRIVED_RANKS).decode() if self.store.check([_ARRIVED_RANKS]) else ""
        arrived_ranks = {int(item) for item in arrived_text.split(",") if item}
        missing = sorted(set(range(world_size)) - arrived_ranks)
        if not missing:
            return None
        examples: dict[int, Claim] = {}
        if self.expected_node is not None:
            wanted = {self.expected_node(rank) for rank in missing}
            for rank in sorted(arrived_ranks):
                node = self.expected_node(rank)
                if node in wanted:
                    examples[rank] = Claim.from_json(self.store.get(f"{KEY_PREFIX}claim/{rank}/1"))
                    wanted.discard(node)
        return missing_message(
            missing, examples, world_size, self.timeout, self.expected_node, arrived_count=len(arrived_ranks)
        )

    def _get(self, key: str) -> bytes:
        """The value of ``key`` once set, giving up at the deadline (then: who is missing)."""
        if not _wait_quietly(self.store, key, self.deadline, self.claim.world_size):
            if self.store.check([_VERDICT]):
                verdict = json.loads(self.store.get(_VERDICT))
                if "problem" in verdict:
                    self._raise(verdict)
            self._conclude(self._missing() or self._never_received(key))
        value: bytes = self.store.get(key)
        return value

    def _never_received(self, key: str) -> RendezvousError:
        return RendezvousError(
            f"Rank {self.claim.rank} on {self.claim.describe()}: the rendezvous store never received {key!r} "
            f"within the rendezvous timeout of {self.timeout:g} s.",
            f"Rank 0 stopped or is overloaded. {MISSING_CAUSES}",
        )


def _wait_quietly(store: TCPStore, key: str, deadline: float, world_size: int) -> bool:
    """Whether ``key`` is set before ``deadline``, asking the store with ``check`` (which never blocks).

    ``TCPStore.wait`` would do, but each wait that runs out makes torch's C++ client log two ``[c10d] waitForInput
    ... timed out`` lines on every rank: the very noise the roll call's one named error replaces. The interval
    grows from 5 ms to a cap that scales with the job (0.25 s, 1 s at 4,096 ranks), so the server answers a
    bounded number of checks per second however many ranks wait.
    """
    interval, cap = 0.005, max(0.25, world_size / 4096)
    while not store.check([key]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, cap)
    return True


def _serve_verdict(store: TCPStore, world_size: int, deadline: float) -> None:
    """Keep ``store`` (and the server in it) alive until every rank read the verdict, or the deadline passed."""
    minimum = time.monotonic() + 3.0  # ranks that registered read the verdict within milliseconds
    try:
        while True:
            read, registered = store.add(_READ, 0), store.add(_REGISTERED, 0)
            now = time.monotonic()
            if read >= world_size or (now > minimum and now > deadline + VERDICT_GRACE and read >= registered):
                return
            if now > max(minimum, deadline + VERDICT_GRACE):
                return
            time.sleep(0.1)
    except RuntimeError:  # the store is gone already
        return


def _assign_all(hosts: Sequence[str]) -> list[NodeAssignment]:
    """:func:`assign_nodes` for every rank at once (linear in the number of ranks)."""
    ranks_by_host = _ranks_by_host(hosts)
    sizes = {len(ranks) for ranks in ranks_by_host.values()}
    if len(sizes) != 1:
        assign_nodes(hosts, 0)  # raises the uneven-hosts error
    local_size = sizes.pop()
    node_of = {host: index for index, host in enumerate(ranks_by_host)}
    local_of = {rank: index for ranks in ranks_by_host.values() for index, rank in enumerate(ranks)}
    return [NodeAssignment(node_of[host], len(node_of), local_of[rank], local_size) for rank, host in enumerate(hosts)]


__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "RENDEZVOUS_TIMEOUT_VARIABLE",
    "Claim",
    "NodeAssignment",
    "RendezvousError",
    "RendezvousResult",
    "assign_nodes",
    "disagreement_message",
    "duplicate_message",
    "format_ranks",
    "local_facts",
    "missing_message",
    "rendezvous",
    "resolve_timeout",
]
