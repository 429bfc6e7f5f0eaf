"""The roll call's claims and the node ranks they add up to, as pure functions."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.gpu.devices import DeviceView, assign_devices, lost_peer_links


@dataclass(frozen=True)
class Claim:
    """What one process says about itself, as registered in the store."""

    rank: int
    world_size: int
    host: str
    local_rank: int
    pid: int
    main_address: str
    main_port: int
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
    """The accelerators this process sees (its ``CUDA_VISIBLE_DEVICES`` list, else physical indices), where known."""
    visible_variable: str = ""
    """The variable that lists :attr:`visible_set`; empty when none is set."""
    device_index: int | None = None
    """The index into :attr:`visible_set` this rank already drives; ``None`` when the roll call is to say."""
    any_layout: bool = False
    """Whether this rank's strategy (``"ddp_mpi"``) trains on any layout; hosts differ in size only if all say so."""
    local_size: int | None = None
    """How many ranks run on this node, as the launcher says; ``None`` where Lightning laid out the ranks."""

    @classmethod
    def here(
        cls, *, rank: int, world_size: int, local_rank: int, main_address: str, main_port: int, **fields: Any
    ) -> Claim:
        """The claim of the calling process, with its own host name and process id."""
        return cls(rank, world_size, socket.gethostname(), local_rank, os.getpid(), main_address, main_port, **fields)

    def describe(self) -> str:
        """``"host nodeb (pid 4242, local rank 1)"``, for messages."""
        return f"host {self.host} (pid {self.pid}, local rank {self.local_rank})"

    def to_json(self) -> str:
        """The claim as one JSON object (what :meth:`to_wire` sends when nothing is shared)."""
        return json.dumps(asdict(self), sort_keys=True)

    def shared_json(self) -> str:
        """The fields every rank of one job states alike (:data:`SHARED_FIELDS`), as JSON."""
        return json.dumps({name: getattr(self, name) for name in SHARED_FIELDS}, sort_keys=True)

    def to_wire(self) -> str:
        """The claim as stored: a line of its own fields and the shared ones' digest, then a line of the shared ones.

        The first line is a list of :data:`OWN_FIELDS` with the digest last. Rank 0 parses only a claim's own fields
        when its digest is rank 0's own; the shared line is read only to name a difference.
        """
        shared = self.shared_json()
        own = [getattr(self, name) for name in OWN_FIELDS]
        return json.dumps([*own, digest(shared)], separators=(",", ":")) + "\n" + shared

    def device_view(self) -> DeviceView | None:
        """What this claim says about its devices, for :func:`~lightning_mpi_env.gpu.devices.assign_devices`."""
        if self.visible_set is None:
            return None
        return DeviceView(
            self.rank, self.host, self.local_rank, self.visible_set, self.visible_variable, self.device_index
        )


SHARED_FIELDS = (
    "world_size",
    "main_port",
    "versions",
    "backend",
    "expected",
    "any_layout",
    "visible_devices",
    "visible_variable",
)
"""The claim's fields that every rank of one job states alike; any difference is a disagreement with rank 0."""
OWN_FIELDS = tuple(name for name in Claim.__dataclass_fields__ if name not in SHARED_FIELDS)
"""The claim's fields that are each rank's own, in their order in :class:`Claim`."""


def digest(shared: str) -> str:
    """A short digest of :meth:`Claim.shared_json`: equal digests, equal shared fields (not a signature)."""
    return hashlib.blake2b(shared.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class NodeAssignment:
    """Node and local ranks found by exchanging host names."""

    node_rank: int
    """Index of this process's host, numbered by the lowest global rank on each host."""
    num_nodes: int
    local_rank: int
    """Position of this process among the ranks on its host, in global rank order."""
    local_size: int
    """Number of ranks on this process's host (the same on every host, unless the ranks take any layout)."""


ANY_LAYOUT_HINT = (
    'Use strategy="ddp_mpi" with no devices/num_nodes: it takes the world size, each rank\'s rank and device and the '
    "data sampler from the launch, so it trains on any layout. Strategies whose device mesh needs the same number of "
    "ranks on every node (FSDP hybrid sharding, ModelParallel) need an even launch:"
)


def format_ranks(ranks: Iterable[int], runs: int | None = None) -> str:
    """``"rank 3"``, ``"ranks 8-15"`` or ``"ranks 1, 3-4"``; past ``runs`` runs of consecutive ranks, a count."""
    groups: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if groups and rank == groups[-1][-1] + 1:
            groups[-1].append(rank)
        else:
            groups.append([rank])
    shown, left = groups[:runs], sum(len(group) for group in groups[runs:]) if runs is not None else 0
    parts = [str(group[0]) if len(group) == 1 else f"{group[0]}-{group[-1]}" for group in shown]
    count = sum(len(group) for group in shown)
    return f"{'rank' if count == 1 else 'ranks'} {', '.join(parts)}" + (f" and {left} more" if left else "")


def uneven_hosts(ranks_by_host: Mapping[str, Sequence[int]]) -> RendezvousError:
    """The error for hosts that run different numbers of ranks, under a strategy that needs the same on each."""
    counts = ", ".join(f"{host}: {format_ranks(ranks)}" for host, ranks in ranks_by_host.items())
    world = sum(len(ranks) for ranks in ranks_by_host.values())
    return RendezvousError(
        f"The launch placed {world} ranks unevenly over {len(ranks_by_host)} hosts ({counts}): one launch, with "
        "nodes that run different numbers of ranks. Lightning's own strategies (ddp, fsdp, deepspeed, ...) assume "
        "the same number on every node: their global ranks, world size and data sampler would be wrong.",
        f"{ANY_LAYOUT_HINT} the same number of ranks on every host.",
        value=counts,
    )


def _ranks_by_host(hosts: Sequence[str]) -> dict[str, list[int]]:
    ranks_by_host: dict[str, list[int]] = {}
    for index, host in enumerate(hosts):
        ranks_by_host.setdefault(host, []).append(index)
    return ranks_by_host


def placement_holds(claims: Iterable[Claim], expected_node: Callable[[int], int], world_size: int) -> bool:
    """Whether the arrived ``claims`` fit the placement ``expected_node`` assumes (one rank's guess, not a fact).

    The guess assumes every node runs as many ranks as the guessing rank's, which an uneven launch breaks. Each
    claim's launcher count and local rank test it: its node must run that many ranks, this one at that position.
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
    """Each rank's device index (where it stated its visible set) and the peer-to-peer notes; raises on a shared GPU."""
    views = [view for view in (claim.device_view() for claim in claims) if view is not None]
    return assign_devices(views), lost_peer_links(views)


def assign_all(hosts: Sequence[str], *, any_layout: bool = False) -> list[NodeAssignment]:
    """The node assignment of every rank, from each rank's host (by global rank); hosts by their lowest rank.

    Hosts may run different numbers of ranks only under ``any_layout`` (every rank runs ``"ddp_mpi"``), each
    ``local_size`` then its own host's count; else that is :func:`uneven_hosts`' error.
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
