"""Where the ranks meet: ``MASTER_ADDR`` checked, and the main port, the same on every rank.

The port is ``MASTER_PORT``, or one derived from the launch's or the job's identity.
"""

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

DERIVED_PORT_RANGE = range(20000, 30000)
"""Ports derived from a job's identity fall in here: below Linux's ephemeral range (32768 and up)."""


def given_main_address(env: Mapping[str, str], launcher: Launcher | None) -> str | None:
    """``MASTER_ADDR`` when set and not empty: a host name or an IPv4 or IPv6 address, without a port.

    Its syntax is checked here (:func:`check_host`), not found wrong later by the resolver or a command line. An
    IPv6 literal may come in brackets (``[fe80::1]``), which are dropped, as other tools (JAX's ``[host]:port``) add
    their own. A host with a port (``g0001:29500``) or a URL is refused: it would become ``g0001:29500:29500``.

    Raises:
        AddressError: Naming the value, the launcher and the fix (where the port goes, when it holds one).

    >>> given_main_address({"MASTER_ADDR": "fe80::1"}, None), given_main_address({"MASTER_ADDR": "[::1]"}, None)
    ('fe80::1', '::1')
    """
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
    """Why ``host`` is neither a host name nor an IP address, or ``None`` when it is one.

    A host name is at most :data:`MAX_HOST_NAME` ASCII characters: labels of 1 to :data:`MAX_LABEL` letters, digits,
    hyphens or underscores, none starting or ending with a hyphen, joined by dots (one trailing dot allowed). An
    address with a ``:`` is an IPv6 address, optionally with a ``%zone``. IPv4 addresses are host names by this
    syntax. No name is looked up.

    >>> [host_syntax_problem(host) for host in ("node-01.cluster", "10.0.0.5", "fe80::1%eth0")]
    [None, None, None]
    >>> host_syntax_problem("a..b")
    'it has an empty label (two dots in a row, or a dot first)'
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
    """``host`` when it is a host name or an IP address (:func:`host_syntax_problem`).

    Args:
        host: The main address.
        variable: Where it came from (``MASTER_ADDR``, ``SLURM_JOB_NODELIST``).
        launcher: The launcher or scheduler whose variable it is, for the message.
        source: How it came from the variable, when not as it is (``first host``).

    Raises:
        AddressError: Naming the variable, the value, what is wrong with it and the fix.
    """
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
    return DEFAULT_MAIN_PORT, "default"


def derive_port(identity: str) -> int:
    """A port in :data:`DERIVED_PORT_RANGE`, the same for the same job identity on every host.

    A cryptographic hash spreads neighbouring job ids apart, unlike taking the id's last digits. Any text works,
    non-ASCII included (Flux job ids start with ``ƒ``).

    >>> derive_port("prterun-nodea-1234@1") == derive_port("prterun-nodea-1234@1")
    True
    >>> derive_port("ƒ2n7Sd1Ky") in DERIVED_PORT_RANGE
    True
    """
    import hashlib  # Here, not at the top: most jobs set MASTER_PORT or have none to derive it from.

    digest = int.from_bytes(hashlib.sha256(identity.encode("utf-8", "surrogateescape")).digest()[:8], "big")
    return DERIVED_PORT_RANGE.start + digest % len(DERIVED_PORT_RANGE)


__all__ = [
    "DEFAULT_MAIN_PORT",
    "DERIVED_PORT_RANGE",
    "MAX_HOST_NAME",
    "MAX_LABEL",
    "check_host",
    "derive_port",
    "given_main_address",
    "host_syntax_problem",
    "main_port",
]
