"""Multi-homed nodes: this host's interfaces, what the main host resolves to, and the fabric the user chose."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.values import shown

SOCKET_IFNAME_VARIABLES: tuple[str, ...] = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The variables through which gloo and NCCL take the interface to use (both read only the environment)."""

_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
_IF_INET6 = "/proc/net/if_inet6"


class Interface(NamedTuple):
    """One network interface of this host."""

    name: str
    addresses: tuple[str, ...]
    """Its addresses with prefix length (``10.0.0.5/16``); empty when it has none."""

    def describe(self) -> str:
        """``"ib0 10.10.0.5/16"``, or ``"ib0 (no address)"``."""
        return f"{self.name} {' '.join(self.addresses)}" if self.addresses else f"{self.name} (no address)"


def parse_if_inet6(text: str) -> dict[str, list[str]]:
    """The IPv6 addresses per interface in ``/proc/net/if_inet6``, link-local ones left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or len(fields[0]) != 32:
            continue
        try:
            address = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            prefix = int(fields[2], 16)
        except ValueError:
            continue
        if not address.is_link_local:
            found.setdefault(fields[5], []).append(f"{address}/{prefix}")
    return found


def _ipv4(name: str) -> list[str]:
    """``["10.0.0.5/16"]`` for the interface ``name``, or ``[]`` when it has no IPv4 address."""
    import fcntl  # here, not at the top: POSIX only, and only a roll call in trouble or the fabric setting asks

    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            address = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24])
            netmask = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFNETMASK, request)[20:24])
        except OSError:  # no IPv4 address (EADDRNOTAVAIL), or the interface went away
            return []
    prefix = ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen
    return [f"{address}/{prefix}"]


def _read_if_inet6() -> str:
    try:
        with open(_IF_INET6, encoding="ascii") as file:
            return file.read()
    except OSError:  # no IPv6 on this host
        return ""


def local_interfaces(
    *,
    names: Callable[[], Sequence[str]] | None = None,
    ipv4: Callable[[str], list[str]] = _ipv4,
    read_if_inet6: Callable[[], str] = _read_if_inet6,
) -> tuple[Interface, ...]:
    """Every interface of this host with its addresses, in the kernel's order (probes injectable for tests)."""
    listed = names() if names is not None else [name for _, name in socket.if_nameindex()]
    ipv6 = parse_if_inet6(read_if_inet6())
    return tuple(Interface(name, (*ipv4(name), *ipv6.get(name, ()))) for name in listed)


def describe_interfaces(interfaces: Sequence[Interface]) -> str:
    """``"lo 127.0.0.1/8 ::1/128, ib0 10.10.0.5/16"``, for messages."""
    return ", ".join(interface.describe() for interface in interfaces) or "none found"


class Resolution(NamedTuple):
    """What a host name resolved to on this host."""

    host: str
    addresses: tuple[str, ...]
    """The addresses, in the resolver's order; empty when it did not resolve."""
    error: str = ""

    def describe(self) -> str:
        """``"lme-main resolves to 127.0.0.2"``, or why it does not, for messages."""
        if self.addresses:
            return f"{self.host} resolves to {', '.join(self.addresses)}"
        return f"{self.host} does not resolve ({self.error or 'no address'})"


def resolve(host: str, port: int | None = None) -> Resolution:
    """What ``host`` resolves to here (``getaddrinfo``, TCP), without duplicates."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        return Resolution(host, (), str(getattr(error, "strerror", None) or error))
    return Resolution(host, tuple(dict.fromkeys(str(info[4][0]) for info in found)))


def owner(address: str, interfaces: Sequence[Interface]) -> str | None:
    """The interface that holds ``address``, else the one on whose network it lies; ``None`` when neither."""
    try:
        target = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    networks = [
        (interface.name, ipaddress.ip_interface(item)) for interface in interfaces for item in interface.addresses
    ]
    for name, network in networks:
        if network.ip == target:
            return name
    for name, network in networks:
        if target in network.network and network.network.prefixlen > 0:
            return name
    return None


def apply_host_template(template: str, host: str) -> str:
    """The main host's name on the fabric: ``template`` with ``{host}`` replaced; ``host`` when no template."""
    return template.replace("{host}", host) if template else host


def host_of_fabric_name(template: str, name: str) -> str:
    """The host whose fabric name (as failure records name it) under ``template`` is ``name``; else ``name``.

    >>> host_of_fabric_name("{host}-ib", "n1-ib"), host_of_fabric_name("{host}-ib", "n1"), host_of_fabric_name("", "a")
    ('n1', 'n1', 'a')
    """
    prefix, _, suffix = template.partition("{host}")
    if template and len(name) > len(prefix) + len(suffix) and name.startswith(prefix) and name.endswith(suffix):
        return name[len(prefix) : len(name) - len(suffix)]
    return name


def contradicting_ifname(ifname: str, env: Mapping[str, str], variable: str) -> SettingError | None:
    """The error where ``GLOO_SOCKET_IFNAME`` or ``NCCL_SOCKET_IFNAME`` names another interface than ``ifname``.

    NCCL reads its value as prefixes, ``=ib0`` as exactly ib0: the same interface. ``variable`` is the setting's name.
    """
    for name in SOCKET_IFNAME_VARIABLES if ifname else ():
        given = env.get(name, "")
        if given and given.removeprefix("=") != ifname:
            return SettingError(
                f"{variable}={shown(ifname)} asks gloo and NCCL to use interface {ifname}, but {name}={shown(given)} "
                "is set to another: the two settings contradict each other.",
                f"Set one of them: unset {name} (then {variable} sets it), or unset {variable}, or give both the "
                "same interface.",
                variable=variable,
                value=ifname,
            )
    return None


def socket_ifname_exports(
    ifname: str,
    env: Mapping[str, str],
    interfaces: Callable[[], Sequence[Interface]] = local_interfaces,
) -> dict[str, str]:
    """The ``*_SOCKET_IFNAME`` to export for ``ifname``; a SettingError if this host lacks it or one names another."""
    if not ifname:
        return {}
    variable = "LIGHTNING_MPI_ENV_IFNAME"
    contradiction = contradicting_ifname(ifname, env, variable)
    if contradiction is not None:
        raise contradiction
    found = interfaces()
    if ifname not in {interface.name for interface in found}:
        raise SettingError(
            f"{variable}={shown(ifname)}, but host {socket.gethostname()} has no interface {ifname} (it has "
            f"{describe_interfaces(found)}).",
            f"Set {variable} to the fabric's interface on every node (`ip -brief addr` lists them: InfiniBand is "
            "often ib0, Slingshot hsn0), or unset it.",
            variable=variable,
            value=ifname,
        )
    return {name: ifname for name in SOCKET_IFNAME_VARIABLES if not env.get(name)}
