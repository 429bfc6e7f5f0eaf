"""Where the ranks meet: ``MASTER_ADDR`` checked, and the main port, the same on every rank.

The port is ``MASTER_PORT``, or one derived from the launch's or the job's identity.

Standard library only; :mod:`lightning_mpi_env.core.layout` calls :func:`given_main_address` and :func:`main_port`
once per layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, parse_port, shown

if TYPE_CHECKING:
    from lightning_mpi_env.core.launchers import Launcher

DEFAULT_MAIN_PORT = 29500
"""The main port when neither ``MASTER_PORT`` nor a job identity is available (PyTorch's own default)."""

DERIVED_PORT_RANGE = range(20000, 30000)
"""Ports derived from a job's identity fall in here: below Linux's ephemeral range (32768 and up)."""


def given_main_address(env: Mapping[str, str], launcher: Launcher | None) -> str | None:
    """``MASTER_ADDR`` when set and not empty: a host name or an IPv4 or IPv6 address, without a port.

    An IPv6 literal may come in brackets (``[fe80::1]``); the brackets are dropped, as the other tools (JAX's
    ``[host]:port``) add their own. A host with a port (``g0001:29500``, ``[fe80::1]:29500``) or a URL is refused:
    taken as a host, it would become ``g0001:29500:29500``.

    Raises:
        LayoutError: Naming the value, the launcher and where the port goes.

    >>> given_main_address({"MASTER_ADDR": "fe80::1"}, None), given_main_address({"MASTER_ADDR": "[::1]"}, None)
    ('fe80::1', '::1')
    """
    value = env.get("MASTER_ADDR")
    if not value:
        return None
    bracketed = value.startswith("[") and value.endswith("]") and value.count(":") >= 2
    if bracketed:
        return value[1:-1]
    if value.count(":") != 1 and not value.startswith("[") and "/" not in value:
        return value
    where = launcher.name if launcher is not None else "no launcher"
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "<host of rank 0>"
    port = port if port.isascii() and port.isdigit() else "<port>"
    raise LayoutError(
        f"MASTER_ADDR={shown(value)} ({where}) is not a host name or an address: it holds a port or a URL. "
        f"Taken as a host, the main address would be wrong (JAX would get '[{value[:SHOWN_CHARACTERS]}]:port').",
        f"Put the host alone in MASTER_ADDR and the port in MASTER_PORT: `export MASTER_ADDR={host} "
        f"MASTER_PORT={port}`. IPv6 addresses work as they are (`fe80::1`) or in brackets (`[fe80::1]`).",
        variable="MASTER_ADDR",
        value=value[:SHOWN_CHARACTERS],
        launcher=launcher.name if launcher is not None else None,
    )


def main_port(env: Mapping[str, str], launcher: Launcher | None) -> tuple[int, str]:
    """``MASTER_PORT``; else derived from the launch's or the job's identity; else :data:`DEFAULT_MAIN_PORT`."""
    name = launcher.name if launcher is not None else None
    if "MASTER_PORT" in env:
        port = parse_port(
            env["MASTER_PORT"],
            variable="MASTER_PORT",
            launcher=name,
            hint="export MASTER_PORT=<a free port such as 29500>, or unset it to derive one from the job id.",
        )
        return port, "MASTER_PORT"
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


__all__ = ["DEFAULT_MAIN_PORT", "DERIVED_PORT_RANGE", "derive_port", "given_main_address", "main_port"]
