"""Shared fixtures; real-MPI tests may not skip in CI."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from lightning_mpi_env.simcluster import SimulatedCluster

JOBS = Path(__file__).parent / "jobs"
"""Programs only the tests run (a single rendezvous claim)."""
INSTRUMENTED = Path(__file__).parents[1] / "examples" / "instrumented"
"""The instrumented Lightning job and the fault injector, shared with the demo and the benchmarks."""
TRAINER_JOB = INSTRUMENTED / "trainer_job.py"
TAMPER = INSTRUMENTED / "tamper.py"
# Job scripts run under mpirun; they are programs, not test modules (doctest collection would execute them).
collect_ignore_glob = ["jobs/*"]
pytest_plugins = ["tests.clusters.fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi: runs a real mpirun job; in CI (CI set) a skip of it is a failure")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Real mpirun jobs (4 ranks each) run one at a time, on one xdist worker: concurrent jobs would share the
    # simulated hosts, whose ports (derived from each job's id) could then clash, and would stretch the rendezvous
    # timeouts of the fault tests. Measured: two lanes were no faster on 2 cores anyway.
    for item in items:
        if item.get_closest_marker("mpi") is not None:
            item.add_marker(pytest.mark.xdist_group("mpirun"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("mpi") is not None and os.environ.get("CI"):
        report.outcome = "failed"
        report.longrepr = f"real-MPI test skipped in CI (CI={os.environ['CI']!r}); it must run: {report.longrepr}"


@pytest.fixture
def cluster(tmp_path: Path) -> SimulatedCluster:
    """Two simulated nodes (127.0.0.2, 127.0.0.3) with two slots each."""
    return SimulatedCluster(tmp_path)
