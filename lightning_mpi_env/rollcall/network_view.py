"""What one host sees of the main host: what its name resolves to, and this host's interfaces."""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import NamedTuple

from lightning_mpi_env.core.errors import FabricWarning
from lightning_mpi_env.core.network import Interface, Resolution, local_interfaces, owner, resolve
from lightning_mpi_env.core.settings import VARIABLE


class NetworkView(NamedTuple):
    """What one host sees of the main host: its own name, what the main host resolves to, its interfaces."""

    host: str
    resolution: Resolution
    interfaces: tuple[Interface, ...]

    @classmethod
    def here(cls, main_address: str) -> NetworkView:
        """This host's view of ``main_address``, interfaces with an address only; a failed probe leaves them out."""
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


def off_fabric(ifname: str, view: NetworkView) -> FabricWarning | None:
    """On rank 0's node: the warning when the main host resolves to a network other than interface ``ifname``'s.

    The ranks then meet (the roll call, torch's store) over that other network, while gloo and NCCL use ``ifname``;
    where it does not connect the nodes, they never arrive. Loopback (every rank on one node) is no other network.
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
