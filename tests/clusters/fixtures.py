"""Pytest fixtures for the real launchers and schedulers of :mod:`tests.clusters` (loaded by ``conftest.py``).

Each fixture installs what it needs, once and idempotently (``apt-get`` for Slurm and MUNGE as root, a venv per
Hydra), so that the README's one test command runs everything on a fresh machine. Where that cannot work (not
root, no network) the tests skip saying why, and ``conftest.py`` turns such a skip into a failure when ``CI`` is set.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from tests.clusters import deepspeed_venv, hydra, torch_venv
from tests.clusters.locks import file_lock
from tests.clusters.slurm import ClusterBusyError, SlurmCluster

T = TypeVar("T")

SLURM_BASE_PORTS = 4
"""Base ports tried, 10 apart from ``LME_SLURM_BASE_PORT`` (16817), when another test run holds the first."""
SPARE_PORT_OFFSET = 10 * SLURM_BASE_PORTS
"""How far above the two-node cluster's base ports the three-node cluster's start (past all of them)."""

LOCKS = Path(tempfile.gettempdir()) / "lightning-mpi-env-lanes"
"""Where each lane's lock lives (``<lane>.lock``), held by a test while it runs a real launcher job (``mpi`` mark)."""


@contextmanager
def real_launch_lock(lane: str) -> Iterator[None]:
    """Hold a lane's lock for real launcher jobs: one job at a time in each lane (:mod:`tests.clusters.lanes`).

    ``conftest.py`` also puts each lane's tests in one xdist group, but pytest-xdist 3.8 ignores groups under
    pytest 9.2 (pytest-xdist#1386), and a second pytest run on the machine is no xdist worker: a file lock holds
    for all of them. Fixtures of a wider scope that run a job (a batch job shared by a module's tests) take it
    themselves; it is not reentrant.
    """
    with file_lock(LOCKS / f"{lane}.lock"):
        yield


@pytest.fixture(autouse=True)
def _one_real_launch_at_a_time_per_lane(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``mpi`` (a real launcher job) run under their lane's :func:`real_launch_lock`."""
    if request.node.get_closest_marker("mpi") is None:
        yield
        return
    group = request.node.get_closest_marker("xdist_group")
    with real_launch_lock(str(group.args[0]) if group is not None and group.args else "default"):
        yield


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running two-node Slurm cluster (``node1``, ``node2``), shared by the session's tests (~1 s start).

    One per pytest process: where xdist spreads its tests over two workers, the second starts its own on the next
    base port (each numbers its jobs apart: no job id comes twice, though two may derive one port, see
    :mod:`tests.clusters.lanes`).
    """
    yield from _running_slurm()


@pytest.fixture(scope="module")
def slurm_cluster_with_spare() -> Iterator[SlurmCluster]:
    """A running three-node Slurm cluster (``node1`` to ``node3``): two nodes for a job step and a spare.

    Its own ports (:data:`SPARE_PORT_OFFSET` above the two-node cluster's), so both can run at once; started for
    the module that uses it, since three daemons cost CPU all the while.
    """
    yield from _running_slurm(nodes=3, offset=SPARE_PORT_OFFSET)


def _running_slurm(nodes: int = 2, offset: int = 0) -> Iterator[SlurmCluster]:
    """Slurm installed (as root, from Debian's packages), a cluster of ``nodes`` started, yielded, then stopped."""
    reason = SlurmCluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        SlurmCluster.ensure_installed()
    except (RuntimeError, subprocess.SubprocessError) as error:  # no network, no package index...
        pytest.skip(f"cannot install Slurm and MUNGE with apt-get: {error}")
    cluster = _start_slurm(nodes=nodes, offset=offset)
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_slurm(nodes: int = 2, offset: int = 0) -> SlurmCluster:
    first = SlurmCluster().base_port + offset
    busy = ClusterBusyError(f"no free base port from {first}")
    for base_port in range(first, first + 10 * SLURM_BASE_PORTS, 10):
        # Another session on this machine (a second pytest run) may hold the ports: take the next ones.
        try:
            return SlurmCluster(nodes, base_port=base_port).start()
        except ClusterBusyError as error:
            busy = error
    raise busy


@pytest.fixture
def hydra_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> hydra.HydraCluster:
    """A real Hydra ``mpiexec`` over 127.0.0.2 and 127.0.0.3, of the kind the test is parametrized with.

    Use ``@pytest.mark.parametrize("hydra_cluster", ["mpich", "intelmpi"], indirect=True)``. The first use installs
    the launcher's venv under ``.venv/launchers`` (seconds; once per checkout).
    """
    kind: hydra.Kind = request.param
    reason = hydra.unavailable_reason(kind)
    if reason:
        pytest.skip(reason)
    return hydra.HydraCluster(kind, tmp_path / "job")


JAX_REQUIREMENT = "jax==0.10.2"
"""JAX from PyPI (its CPU ``jaxlib``), in a venv of its own under ``.venv/launchers/jax``, as the Hydras are."""


@pytest.fixture(scope="session")
def jax_python() -> Path:
    """A Python with JAX (CPU), installed on first use (seconds; once per checkout); no torch, no Lightning.

    Its ranks import this checkout's ``lightning_mpi_env`` from ``PYTHONPATH``: ``jax_distributed_kwargs`` needs the
    standard library only, which is what a JAX user installs it into.
    """
    try:
        bin_dir = hydra.ensure_package_venv("jax", JAX_REQUIREMENT, "python")
        subprocess.run([str(bin_dir / "python"), "-c", "import jax"], check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:  # no network, no package index...
        pytest.skip(f"cannot install or import {JAX_REQUIREMENT} in {hydra.LAUNCHERS_DIR / 'jax'}: {error}")
    return bin_dir / "python"


@pytest.fixture(scope="session")
def deepspeed() -> deepspeed_venv.DeepSpeed:
    """DeepSpeed from PyPI, in a venv of its own over this venv's torch and Lightning (:mod:`.deepspeed_venv`).

    Installed on first use (the install builds DeepSpeed's CPU collectives op: minutes on a loaded machine; once per
    checkout). Outside CI it skips when that cannot be done (no network, no C++ compiler); with ``CI`` set that is a
    failure, as for the oldest Lightning.
    """
    return installed_or_skipped(
        deepspeed_venv.ensure_venv, f"deepspeed {deepspeed_venv.VERSION}", deepspeed_venv.VENV_DIR, "DeepSpeed"
    )


@pytest.fixture(scope="session")
def newer_torch() -> Path:
    """A Python with torch 2.14.1 (the reconfigure API) over this venv's Lightning and checkout (:mod:`.torch_venv`).

    Installed on first use from this machine's disk (about a minute; once per checkout). Outside CI it skips when
    that cannot be done; with ``CI`` set that is a failure, as for DeepSpeed.
    """
    return installed_or_skipped(
        torch_venv.ensure_venv, f"torch {torch_venv.VERSION}", torch_venv.VENV_DIR, "the reconfigure path"
    )


def installed_or_skipped(install: Callable[[], T], what: str, where: Path, tested: str) -> T:
    """``install()``'s venv; where it cannot be made, a skip outside CI and a failure with ``CI`` set."""
    try:
        return install()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        reason = f"cannot install {what} into {where}: {error}"
        if os.environ.get("CI"):
            pytest.fail(f"CI={os.environ['CI']!r}: {tested} must be tested for real. {reason}")
        pytest.skip(reason)


__all__ = [
    "JAX_REQUIREMENT",
    "deepspeed",
    "hydra_cluster",
    "jax_python",
    "newer_torch",
    "real_launch_lock",
    "slurm_cluster",
    "slurm_cluster_with_spare",
]
