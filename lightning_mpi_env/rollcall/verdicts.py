"""The roll call's verdicts: what the ranks' claims say, as pure functions (standard library only).

Every process registers a :class:`Claim`; the functions here turn claims into the one error naming a duplicate,
missing or disagreeing rank (:class:`~lightning_mpi_env.core.errors.RendezvousError`), and host names into exact
node ranks (hosts are numbered by the lowest global rank on each: node 0 holds rank 0). The store protocol that
gathers the claims is :mod:`lightning_mpi_env.rollcall.store`.
"""

from __future__ import annotations

import collections
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_mpi_env.core.devices import BINDING_HINT, DeviceView, assign_devices, lost_peer_links
from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.settings import VARIABLE

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
    visible_set: tuple[str, ...] | None = None
    """Identifiers of the accelerators this process sees (its ``CUDA_VISIBLE_DEVICES`` list, else the physical
    indices); ``None`` when unknown or when the job runs on the CPU."""
    visible_variable: str = ""
    """The variable that lists :attr:`visible_set`; empty when none is set."""
    device_index: int | None = None
    """The index into :attr:`visible_set` this rank already drives; ``None`` when the roll call is to say."""
    any_layout: bool = False
    """Whether this rank's strategy trains on any layout the launch gives (``"ddp_mpi"``): nodes may then run
    different numbers of ranks. The hosts may differ in size only when every rank says so."""
    local_size: int | None = None
    """How many ranks run on this node, as the launcher says (``OMPI_COMM_WORLD_LOCAL_SIZE``...); ``None`` where
    Lightning, not a launcher, laid out the ranks. It tests a placement rule against the ranks that arrived."""

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
        """Read back a stored claim, checked (:mod:`~lightning_mpi_env.rollcall.wire`, the one parser of the store)."""
        from lightning_mpi_env.rollcall.wire import claim_of, read  # wire builds claims: imported when used

        return read("claim", text, claim_of(None))

    def device_view(self) -> DeviceView | None:
        """What this claim says about its devices, for :func:`~lightning_mpi_env.core.devices.assign_devices`."""
        if self.visible_set is None:
            return None
        return DeviceView(
            self.rank, self.host, self.local_rank, self.visible_set, self.visible_variable, self.device_index
        )


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
    """Number of ranks on this process's host (the same on every host, unless the ranks take any layout)."""


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


def assign_nodes(hosts: Sequence[str], rank: int, *, any_layout: bool = False) -> NodeAssignment:
    """``rank``'s node assignment among ``hosts`` (one host name per global rank), as :func:`assign_all` makes it.

    >>> assign_nodes(["b", "a", "b", "a"], 3)
    NodeAssignment(node_rank=1, num_nodes=2, local_rank=1, local_size=2)
    >>> assign_nodes(["a", "b", "a", "a"], 3, any_layout=True)
    NodeAssignment(node_rank=0, num_nodes=2, local_rank=2, local_size=3)
    """
    return assign_all(hosts, any_layout=any_layout)[rank]


def uneven_hosts(ranks_by_host: Mapping[str, Sequence[int]]) -> RendezvousError:
    """The error for hosts that run different numbers of ranks, under a strategy that needs the same on each."""
    counts = ", ".join(f"{host}: {format_ranks(ranks)}" for host, ranks in ranks_by_host.items())
    world = sum(len(ranks) for ranks in ranks_by_host.values())
    return RendezvousError(
        f"The launch placed {world} ranks unevenly over {len(ranks_by_host)} hosts ({counts}): one launch, with "
        "nodes that run different numbers of ranks. Lightning's own strategies (ddp, fsdp, deepspeed, ...) assume "
        "the same number on every node: their global ranks, world size and data sampler would be wrong.",
        'Use strategy="ddp_mpi" with no devices/num_nodes: it takes the world size, each rank\'s rank and device '
        "and the data sampler from the launch, so it trains on any layout. Strategies whose device mesh needs the "
        "same number of ranks on every node (FSDP hybrid sharding, ModelParallel) need an even launch: the same "
        "number of ranks on every host.",
        value=counts,
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
    settings_only = not expects
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
    if other.any_layout != reference.any_layout:
        theirs, ours = (_strategy_kind(claim) for claim in (other, reference))
        uses.append(f"{theirs} (rank 0 uses {ours})")
    phrases = [
        f"{verb} {' and '.join(items)}"
        for verb, items in (("expects", expects), ("runs", runs), ("uses", uses))
        if items
    ]
    if not phrases:
        return None
    where = f"Rank {other.rank} on {other.describe()} {'; it '.join(phrases)}; rank 0 runs on {reference.describe()}."
    if settings_only and not runs and not uses:
        return RendezvousError(
            f"{where} The ranks were given different devices/num_nodes: a script that computes them from its own "
            "node (e.g. its launcher's local size) gets different values on nodes that run different numbers of "
            "ranks.",
            "Pass the same devices/num_nodes to every rank. Where nodes run different numbers of ranks, no "
            'devices/num_nodes fits: use strategy="ddp_mpi" and pass neither; it takes them from the launch.',
        )
    return RendezvousError(
        f"{where} The processes were not started by one launch with one environment.",
        "Start every rank with one launcher command and one software environment (the same Python, torch and "
        "Lightning on every node), and pass the same WORLD_SIZE/MASTER_PORT (or none) and the same Trainer "
        "arguments to all of them.",
    )


def _strategy_kind(claim: Claim) -> str:
    return 'strategy="ddp_mpi"' if claim.any_layout else 'a strategy other than "ddp_mpi"'


def placement_holds(claims: Iterable[Claim], expected_node: Callable[[int], int], world_size: int) -> bool:
    """Whether the arrived ``claims`` fit the placement ``expected_node`` assumes (one rank's guess, not a fact).

    The guess (:func:`~lightning_mpi_env.core.placement.guess_node`) assumes every node runs as many ranks as the
    guessing rank's, which an uneven launch breaks. Each claim's launcher count and local rank test it: its node
    must run that many ranks, this one at that position.

    >>> here = [Claim(0, 4, "a", 0, 1, "a", 1, local_size=2), Claim(2, 4, "c", 0, 3, "a", 1, local_size=1)]
    >>> placement_holds(here[:1], lambda rank: rank // 2, 4), placement_holds(here, lambda rank: rank // 2, 4)
    (True, False)
    """
    sizes: collections.Counter[int] = collections.Counter()
    position: dict[int, int] = {}
    wanted = {claim.rank for claim in claims}
    for rank in range(world_size):
        node = expected_node(rank)
        if rank in wanted:
            position[rank] = sizes[node]
        sizes[node] += 1
    return all(
        claim.local_size in (None, sizes[expected_node(claim.rank)]) and claim.local_rank == position[claim.rank]
        for claim in claims
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
        f"{MISSING_CAUSES} To wait longer, raise {VARIABLE['rendezvous_timeout']} or "
        "MPIClusterEnvironment(rendezvous_timeout=...).",
        value=format_ranks(missing),
    )


def device_collision(first: Claim, second: Claim) -> RendezvousError:
    """The error for two ranks on one host that would drive the same accelerator."""
    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {first.host} would both drive {first.device} "
        f"(accelerator {first.device_id}): rank {first.rank} is {first.describe()}, rank {second.rank} is "
        f"{second.describe()}. Two processes on one GPU run out of memory or deadlock in NCCL.",
        f"{BINDING_HINT} Keep the launcher's local ranks as it set them.",
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


def collisions(claims: Sequence[Claim]) -> RendezvousError | None:
    """Two ranks on one host driving one GPU, or claiming one local rank; ``None`` when there are none."""
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


def devices_of(claims: Sequence[Claim]) -> tuple[dict[int, int | None], list[str]]:
    """Each rank's device index (of those that stated their visible set) and the peer-to-peer notes.

    Raises:
        RendezvousError: Two ranks on one host on one device.
    """
    views = [view for view in (claim.device_view() for claim in claims) if view is not None]
    return assign_devices(views), lost_peer_links(views)


def assign_all(hosts: Sequence[str], *, any_layout: bool = False) -> list[NodeAssignment]:
    """The node assignment of every rank at once (linear in the number of ranks); hosts by their lowest rank.

    Args:
        hosts: The host name of every rank, by global rank.
        any_layout: Whether hosts may run different numbers of ranks (every rank runs ``"ddp_mpi"``); each
            assignment's ``local_size`` is then its own host's count.

    Raises:
        RendezvousError: If the hosts run different numbers of ranks and ``any_layout`` is not set
            (:func:`uneven_hosts`).
    """
    ranks_by_host = _ranks_by_host(hosts)
    if not any_layout and len({len(ranks) for ranks in ranks_by_host.values()}) > 1:
        raise uneven_hosts(ranks_by_host)
    node_of = {host: index for index, host in enumerate(ranks_by_host)}
    local_of = {rank: index for ranks in ranks_by_host.values() for index, rank in enumerate(ranks)}
    return [
        NodeAssignment(node_of[host], len(node_of), local_of[rank], len(ranks_by_host[host]))
        for rank, host in enumerate(hosts)
    ]


__all__ = [
    "MISSING_CAUSES",
    "Claim",
    "NodeAssignment",
    "assign_all",
    "assign_nodes",
    "collisions",
    "devices_of",
    "device_collision",
    "disagreement_message",
    "duplicate_message",
    "expectation_mismatch",
    "format_ranks",
    "local_rank_collision",
    "missing_message",
    "placement_holds",
    "summary",
    "uneven_hosts",
]
