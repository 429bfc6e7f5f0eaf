"""Where the ranks meet: ``MASTER_ADDR`` checked, and the main port, the same on every rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import AddressError
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, parse_port, shown

if TYPE_CHECKING:
    from lightning_mpi_env.core.launchers import Launcher

DEFAULT_MAIN_PORT = 29500
"""The main port when neither ``MASTER_PORT`` nor a job identity is available (PyTorch's own default)."""

DEFAULT_PORT_SOURCE = "default"
"""The source recorded for :data:`DEFAULT_MAIN_PORT`: without a launcher the port is then picked free on this host."""

DERIVED_PORT_RANGE = range(20000, 30000)
"""Ports derived from a job's identity fall in here: below Linux's ephemeral range (32768 and up)."""


def given_main_address(env: Mapping[str, str], launcher: Launcher | None) -> str | None:
    """``MASTER_ADDR`` if set (:func:`check_host`): brackets around IPv6 dropped; a port or URL is an AddressError."""
    value = env.get(TORCH.master_addr)
    if not value:
        return None
    where = launcher.name if launcher is not None else "no launcher"
    bracketed = value.startswith("[") and value.endswith("]") and value.count(":") >= 2
    if bracketed:
        return check_host(value[1:-1], variable=TORCH.master_addr, launcher=launcher.name if launcher else None)
    if value.count(":") != 1 and not value.startswith("[") and "/" not in value:
        return check_host(value, variable=TORCH.master_addr, launcher=launcher.name if launcher else None)
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "<host of rank 0>"
    port = port if port.isascii() and port.isdigit() else "<port>"
    raise AddressError(
        f"MASTER_ADDR={shown(value)} ({where}) is not a host name or an address: it holds a port or a URL. "
        f"Taken as a host, the main address would be wrong (JAX would get '[{value[:SHOWN_CHARACTERS]}]:port').",
        f"Put the host alone in MASTER_ADDR and the port in MASTER_PORT: `export MASTER_ADDR={host} "
        f"MASTER_PORT={port}`. IPv6 addresses work as they are (`fe80::1`) or in brackets (`[fe80::1]`).",
        variable=TORCH.master_addr,
        value=value[:SHOWN_CHARACTERS],
        launcher=launcher.name if launcher is not None else None,
    )


MAX_HOST_NAME = 253
"""The longest host name DNS carries (RFC 1035), dots included."""

MAX_LABEL = 63
"""The longest label (the text between two dots) of a host name (RFC 1035)."""

_HOST_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
"""What a label may hold: RFC 1123's letters, digits and hyphens, and the underscore some sites' names have."""


def host_syntax_problem(host: str) -> str | None:
    """Why ``host`` is neither a host name (RFC 1035/1123, underscores too) nor an IP address, or ``None``; no lookup.

    >>> host_syntax_problem("-oX=y")
    "a label starts or ends with '-'"
    """
    if not host.isascii() or not host.isprintable():
        return "it has a character that is not printable ASCII (a control character, or bytes that are not ASCII)"
    if ":" in host:
        import ipaddress  # Here, not at the top: only an IPv6 main address needs it.

        address, _, zone = host.partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return "it has a ':' but is not an IPv6 address"
        if "%" in host and not (zone and set(zone) <= _HOST_CHARACTERS | {"."}):
            return "its IPv6 zone (after '%') is not an interface name"
        return None
    name = host[:-1] if host.endswith(".") else host
    if not name.strip():
        return "it is blank"
    if len(host) > MAX_HOST_NAME:
        return f"it is longer than {MAX_HOST_NAME} characters"
    for label in name.split("."):
        if not label:
            return "it has an empty label (two dots in a row, or a dot first)"
        if len(label) > MAX_LABEL:
            return f"a label is longer than {MAX_LABEL} characters"
        if label.startswith("-") or label.endswith("-"):  # `-oX=y` would read as an option on a command line
            return "a label starts or ends with '-'"
        if not set(label) <= _HOST_CHARACTERS:
            odd = next(char for char in label if char not in _HOST_CHARACTERS)
            return f"it has the character {odd!r}: a host name has letters, digits, '-', '_' and dots"
    return None


def check_host(host: str, *, variable: str, launcher: str | None, source: str = "") -> str:
    """``host`` when it is a host name or an IP address (:func:`host_syntax_problem`); else an :class:`AddressError`."""
    problem = host_syntax_problem(host)
    if problem is None:
        return host
    where = launcher if launcher is not None else "no launcher"
    taken = f" ({source})" if source else ""
    raise AddressError(
        f"{variable}{taken}={shown(host)} ({where}) is not a host name or an IP address: {problem}.",
        "Set MASTER_ADDR to the host name (letters, digits, '-' and dots) or the IP address of rank 0's node, and "
        "pass it to every rank.",
        variable=variable,
        value=host[:SHOWN_CHARACTERS],
        launcher=launcher,
    )


def main_port(env: Mapping[str, str], launcher: Launcher | None) -> tuple[int, str]:
    """``MASTER_PORT``; else derived from the launch's or the job's identity; else :data:`DEFAULT_MAIN_PORT`."""
    name = launcher.name if launcher is not None else None
    if TORCH.master_port in env:
        port = parse_port(
            env[TORCH.master_port],
            variable=TORCH.master_port,
            launcher=name,
            hint="export MASTER_PORT=<a free port such as 29500>, or unset it to derive one from the job id.",
        )
        return port, TORCH.master_port
    if launcher is not None and launcher.job_identity and all(env.get(v) for v in launcher.job_identity):
        identity = "/".join(env[variable] for variable in launcher.job_identity)
        return derive_port(identity), f"derived from {'+'.join(launcher.job_identity)}"
    job = job_identity(env)
    if job is not None:
        return derive_port(job[0]), f"derived from {'+'.join(job[1])}"
    return DEFAULT_MAIN_PORT, DEFAULT_PORT_SOURCE


def derive_port(identity: str) -> int:
    """A port in :data:`DERIVED_PORT_RANGE`, the same for one job identity everywhere (a hash spreads ids apart)."""
    import hashlib  # Here, not at the top: most jobs set MASTER_PORT or have none to derive it from.

    digest = int.from_bytes(hashlib.sha256(identity.encode("utf-8", "surrogateescape")).digest()[:8], "big")
    return DERIVED_PORT_RANGE.start + digest % len(DERIVED_PORT_RANGE)
