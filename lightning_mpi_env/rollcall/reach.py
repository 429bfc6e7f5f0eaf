"""When ranks cannot reach rank 0's store: what each side resolved the main host to, and rank 0's interfaces.

A rank that cannot reach rank 0 cannot learn rank 0's view, so each side says its own (rank 0's through the store,
for the missing-ranks verdict): together they show a main host name that resolves to a different network on some
nodes. Standard library only.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import NamedTuple

from lightning_mpi_env.core.errors import FabricWarning, RendezvousError
from lightning_mpi_env.core.network import (
    Interface,
    Resolution,
    describe_interfaces,
    local_interfaces,
    owner,
    resolve,
)
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.rollcall.verdicts import Claim

FABRIC_HINT = (
    f"On nodes with several networks, choose the fabric: {VARIABLE['main_host']}='{{host}}i' (or your site's "
    f"pattern) for the main host's name on it, or MASTER_ADDR=<rank 0's address on it>, and {VARIABLE['ifname']}="
    "<its interface> for gloo and NCCL (docs/troubleshooting.md)."
)


class NetworkView(NamedTuple):
    """What one host sees of the main host: its own name, what the main host resolves to, its interfaces."""

    host: str
    resolution: Resolution
    interfaces: tuple[Interface, ...]

    @classmethod
    def here(cls, main_address: str) -> NetworkView:
        """This host's view of ``main_address`` (interfaces without an address left out: they carry nothing).

        Never raises: a probe that fails (no socket left, no ``if_nameindex``) leaves the interfaces out.
        """
        try:
            interfaces = tuple(interface for interface in local_interfaces() if interface.addresses)
        except OSError:
            interfaces = ()
        return cls(socket.gethostname(), resolve(main_address), interfaces)

    def resolved(self) -> str:
        """``"lme-main resolves to 127.0.0.2 (lo)"``: each address with the interface here that holds or reaches it."""
        resolution = self.resolution
        if not resolution.addresses:
            return resolution.describe()
        shown = []
        for address in resolution.addresses:
            held_by = owner(address, self.interfaces)
            shown.append(f"{address} ({held_by})" if held_by else address)
        return f"{resolution.host} resolves to {', '.join(shown)}"

    def to_json(self) -> str:
        """The view as stored."""
        return json.dumps([self.host, list(self.resolution), [[i.name, list(i.addresses)] for i in self.interfaces]])

    @classmethod
    def from_json(cls, text: str | bytes) -> NetworkView:
        """Read back a stored view, checked (:mod:`~lightning_mpi_env.rollcall.wire`, the one parser of the store)."""
        from lightning_mpi_env.rollcall.wire import network_view, read  # wire builds views: imported when used

        return read("network view", text, network_view)


def unreachable_error(
    claim: Claim, timeout: float, error: BaseException, view: NetworkView, last_attempt: str
) -> RendezvousError:
    """A rank other than 0 never reached rank 0's store: what it resolved, what it tried, its interfaces."""
    address = f"{claim.main_address}:{claim.main_port}"
    tried = f"; the last attempt failed: {last_attempt}" if last_attempt else ""
    kind = "TimeoutError" if isinstance(error, TimeoutError) else type(error).__name__
    return RendezvousError(
        f"Rank {claim.rank} on {claim.describe()}: rank 0 never answered at the main address {address} within "
        f"the rendezvous timeout of {timeout:g} s ({kind}). On this node {view.resolved()}{tried}. "
        f"This node's interfaces: {describe_interfaces(view.interfaces)}.",
        f"Rank 0 or its node failed to start, MASTER_ADDR/MASTER_PORT ({address} here) point at the wrong host "
        f"or differ between nodes, the main host's name resolves to another network here than on rank 0's node "
        f"(rank 0's own error lists what it resolved and its interfaces), or a firewall blocks the port. "
        f"{FABRIC_HINT} To wait longer, raise {VARIABLE['rendezvous_timeout']}.",
        variable=TORCH.master_addr,
        value=claim.main_address,
    )


def port_in_use(error: BaseException) -> bool:
    """Whether rank 0's store failed because its port is taken (torch says ``EADDRINUSE``)."""
    text = str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def serve_error(claim: Claim, error: BaseException) -> RendezvousError:
    """Rank 0 cannot serve the store: the port, the host and the fix (the port in use named as such)."""
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    port = claim.main_port
    if port_in_use(error):
        return RendezvousError(
            f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {port}: port {port} is already in "
            f"use on host {claim.host}, by another program or by a second process that also claims rank 0 here "
            f"({type(error).__name__}: {first_line}).",
            f"Give this job its own port: export MASTER_PORT=<a free port> to every rank, or unset MASTER_PORT to "
            f"derive one from the job id. `ss -ltnp 'sport = :{port}'` on {claim.host} shows which program holds it.",
            variable=TORCH.master_port,
            value=str(port),
        )
    return RendezvousError(
        f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {port} "
        f"({type(error).__name__}: {first_line}).",
        "The port is taken: by another job on this host (give each job its own MASTER_PORT, or unset it to "
        "derive one from the job id), or by a second process that also claims rank 0 here.",
        variable=TORCH.master_port,
        value=str(port),
    )


def with_rank_zero_view(problem: RendezvousError, view: NetworkView) -> RendezvousError:
    """``problem`` (ranks missing from a whole node) with what rank 0 resolved the main host to and its interfaces."""
    host = view.resolution.host
    return RendezvousError(
        f"{problem.problem} Rank 0's node {view.host}: {view.resolved()}; its interfaces: "
        f"{describe_interfaces(view.interfaces)}. Ranks that resolve {host} to an address none of these reach "
        "never arrive (their own errors say what they resolved).",
        f"{problem.hint} {FABRIC_HINT}",
        variable=problem.variable,
        value=problem.value,
        launcher=problem.launcher,
    )


def off_fabric(ifname: str, view: NetworkView) -> FabricWarning | None:
    """On rank 0's node: the warning when the main host resolves to a network other than interface ``ifname``'s.

    The ranks then meet (the roll call, torch's store) over that other network, while gloo and NCCL use ``ifname``;
    where it does not connect the nodes, they never arrive. Loopback (every rank on one node) is no other network.

    >>> from lightning_mpi_env.core.network import Interface, Resolution
    >>> ifaces = (Interface("eth0", ("10.0.0.5/16",)), Interface("ib0", ("10.10.0.5/16",)))
    >>> off_fabric("ib0", NetworkView("n1", Resolution("n1i", ("10.10.0.5",)), ifaces)) is None
    True
    """
    addresses = view.resolution.addresses
    if not ifname or not addresses or all(_loopback(address) for address in addresses):
        return None
    if ifname in {owner(address, view.interfaces) for address in addresses}:
        return None
    held = [address for interface in view.interfaces if interface.name == ifname for address in interface.addresses]
    variable = VARIABLE["ifname"]
    return FabricWarning(
        f"{variable}={ifname!r} names the fabric, but on rank 0's node {view.host} {view.resolved()}, not to an "
        f"address on {ifname} ({', '.join(held) or 'no address'}): the ranks meet over that network, gloo and NCCL "
        f"over {ifname}.",
        f"Give the main host's name on the fabric: {VARIABLE['main_host']}='{{host}}i' (or your site's pattern), or "
        f"MASTER_ADDR=<rank 0's address on {ifname}>.",
        variable=variable,
        value=ifname,
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


__all__ = [
    "FABRIC_HINT",
    "NetworkView",
    "off_fabric",
    "port_in_use",
    "serve_error",
    "unreachable_error",
    "with_rank_zero_view",
]
