"""Pytest fixtures for the real launchers and schedulers of :mod:`tests.clusters` (loaded by ``conftest.py``).

Each fixture installs what it needs, once and idempotently (``apt-get`` for Slurm and MUNGE as root, a venv per
Hydra), so that the README's one test command runs everything on a fresh machine. Where that cannot work (not
root, no network) the tests skip saying why, and ``conftest.py`` turns such a skip into a failure when ``CI`` is set.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.clusters import hydra
from tests.clusters.locks import file_lock
from tests.clusters.slurm import ClusterBusyError, SlurmCluster

SLURM_BASE_PORTS = 4
"""Base ports tried, 10 apart from ``LME_SLURM_BASE_PORT`` (16817), when another test run holds the first."""

REAL_LAUNCH_LOCK = Path(tempfile.gettempdir()) / "lightning-mpi-env-real-launch.lock"
"""Held by a test while it runs a real launcher job (``mpi`` mark), by whichever process, worker or session."""


@contextmanager
def real_launch_lock() -> Iterator[None]:
    """Hold the machine's lock for real launcher jobs: one job at a time on the simulated hosts 127.0.0.2/3.

    Every launcher puts its ranks there: two jobs at once could clash on a main port and would stretch each
    other's timeouts on 2 cores. ``conftest.py`` also puts these tests in one xdist group, but pytest-xdist 3.8
    ignores groups under pytest 9.2 (pytest-xdist#1386), and a second pytest run on the machine is no xdist worker:
    a file lock holds for all of them. Fixtures of a wider scope that run a job (a batch job shared by a module's
    tests) take it themselves; it is not reentrant.
    """
    with file_lock(REAL_LAUNCH_LOCK):
        yield


@pytest.fixture(autouse=True)
def _one_real_launch_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``mpi`` (a real launcher job) run under :func:`real_launch_lock`."""
    if request.node.get_closest_marker("mpi") is None:
        yield
        return
    with real_launch_lock():
        yield


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running two-node Slurm cluster (``node1``, ``node2``), shared by the session's tests (~1 s start).

    One per pytest process: where xdist spreads its tests over two workers, the second starts its own on the next
    base port (each numbers its jobs apart, so ports derived from job ids differ too).
    """
    reason = SlurmCluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        SlurmCluster.ensure_installed()
    except (RuntimeError, subprocess.SubprocessError) as error:  # no network, no package index...
        pytest.skip(f"cannot install Slurm and MUNGE with apt-get: {error}")
    cluster = _start_slurm()
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_slurm() -> SlurmCluster:
    first = SlurmCluster().base_port
    busy = ClusterBusyError(f"no free base port from {first}")
    for base_port in range(first, first + 10 * SLURM_BASE_PORTS, 10):
        # Another session on this machine (a second pytest run) may hold the ports: take the next ones.
        try:
            return SlurmCluster(base_port=base_port).start()
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


__all__ = ["hydra_cluster", "real_launch_lock", "slurm_cluster"]
