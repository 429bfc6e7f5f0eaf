"""Shared fixtures; real-MPI tests may not skip in CI."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import settings

from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.clusters.lanes import lane_of

JOBS = Path(__file__).parent / "jobs"
"""Programs only the tests run (a single rendezvous claim)."""
INSTRUMENTED = Path(__file__).parents[1] / "examples" / "instrumented"
"""The instrumented Lightning job and the fault injector, shared with the benchmarks."""
TRAINER_JOB = INSTRUMENTED / "trainer_job.py"
TAMPER = INSTRUMENTED / "tamper.py"


def start_gate(folder: Path, ranks: int) -> dict[str, str]:
    """Hold each rank of an instrumented job before its fit until ``ranks`` processes got there (``tamper.py``).

    A test of the rendezvous with a short timeout needs it: under load, one rank's imports finished 23 s after
    another's in CI, and a rank then names rank 0 as never answering (true, and not the fault under test).
    """
    return {"INSTRUMENTED_START_GATE": f"{folder}:{ranks}"}


LEAN_SITE = JOBS / "site"
"""Put first on ``PYTHONPATH`` of the run: its ``sitecustomize`` makes the tests' Python processes start faster."""
# Job scripts run under mpirun; they are programs, not test modules (doctest collection would execute them).
collect_ignore_glob = ["jobs/*"]
pytest_plugins = ["tests.clusters.fixtures"]

# No per-example deadline: a loaded login node runs one example in seconds, and no test asserts on timing.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

INSTALLING_FIXTURES = frozenset({"deepspeed", "hydra_cluster", "jax_python", "newer_torch", "oldest_lightning"})
"""Fixtures that install a launcher or a venv on first use (minutes on a fresh machine): whole suite only."""

SMOKE = (
    "tests/core/test_layout.py",  # every launcher's variables read into a layout, and the errors for bad ones
    "tests/core/test_launchers.py",
    "tests/core/test_placement.py",
    "tests/core/test_schedulers.py",
    "tests/core/test_settings.py",
    "tests/tools/test_cli.py",  # show, simulate, exec, torchrun-args, doctor through the command line
    "tests/tools/test_simulate.py",
    "tests/test_docs.py",
    "tests/test_examples.py::test_the_demo_trains_with_the_readme_line",
    "tests/test_examples.py::test_each_demo_step_title_says_what_it_runs",
)
"""The first check, ``pytest -m smoke``, besides the real jobs marked ``smoke`` in their modules: these modules (or
tests), less their hypothesis properties, their real launcher jobs and what :data:`SMOKE_LEAVES_OUT` names.

The default run runs all of them too; the smoke set only picks a fast, representative part of it.
"""
SMOKE_LEAVES_OUT = frozenset(
    {
        "tests/test_docs.py::test_runnable_snippets_run",  # a fresh interpreter each, which imports Lightning
        "tests/test_docs.py::test_the_smoke_tier_is_a_fast_first_check_of_each_layer",  # a pytest of its own
    }
)
"""Tests of a :data:`SMOKE` module left out of the smoke set: each starts a slow process of its own."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        help="run the whole suite: every real launcher job and first-use install, not only the smoke set",
    )


def is_slow(item: pytest.Item) -> bool:
    """Whether a test runs only in the whole suite (``pytest --runslow``), not in the default run.

    Marked ``slow``; or a real launcher job (``mpi``) outside the ``smoke`` set; or a user of a fixture that installs
    a launcher or venv on first use.
    """
    if item.get_closest_marker("slow") is not None:
        return True
    if item.get_closest_marker("mpi") is not None and item.get_closest_marker("smoke") is None:
        return True
    return not INSTALLING_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def in_smoke_table(item: pytest.Item) -> bool:
    """Whether :data:`SMOKE` names the test's module or the test, and :data:`SMOKE_LEAVES_OUT` does not name it."""
    module, _, rest = item.nodeid.partition("::")
    test = f"{module}::{getattr(item, 'originalname', rest)}"  # without its parameters
    if test in SMOKE_LEAVES_OUT or (module not in SMOKE and test not in SMOKE):
        return False
    return not getattr(getattr(item, "obj", None), "is_hypothesis_test", False)


def pytest_configure(config: pytest.Config) -> None:
    # Before xdist starts its workers, so that they, and every process they start, inherit it (the module says why).
    # The markers are registered in pyproject.toml.
    if not os.environ.get("LMPI_TEST_PLAIN_GC") and str(LEAN_SITE) not in os.environ.get("PYTHONPATH", ""):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LEAN_SITE), os.environ.get("PYTHONPATH")]))


def python_path(*first: Path) -> str:
    """A ``PYTHONPATH`` for a job's ranks: ``first``, then the run's own (which carries :data:`LEAN_SITE`)."""
    return os.pathsep.join(filter(None, [*map(str, first), os.environ.get("PYTHONPATH")]))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the groups into node id suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Two tiers: the default run leaves out what only the whole suite runs (`--runslow`); the slow ones are marked
    # `slow` here, before pytest's own `-m` selection, so that `pytest --runslow -m slow` runs them alone.
    slow = [item for item in items if is_slow(item)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    # The first check, `pytest -m smoke`: the table's tests, marked here (after the tiers were decided, so that the
    # mark brings no real launcher job into the default run), before pytest's own `-m` selection.
    leaving = set(map(id, slow))
    for item in items:
        if id(item) not in leaving and item.get_closest_marker("mpi") is None and in_smoke_table(item):
            item.add_marker(pytest.mark.smoke)
    if not config.getoption("--runslow") and slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if id(item) not in leaving]
    # Real launcher jobs (4 ranks each) run in lanes: one xdist group each, one job at a time within a lane, the
    # lanes side by side. Much of a real job is waiting (a roll call's timeout, a stall's, a scheduler's requeue),
    # so lanes overlap waits with work. They seldom clash: each mpirun derives its own main port from its
    # PMIX_NAMESPACE, Hydra jobs take a free one, Slurm's jobs from their job ids; two jobs that run at once derive
    # the same port about once in 10,000 pairs, on any address (tests/clusters/lanes.py).
    # - Slurm's jobs share one lane: one cluster starts (a session fixture) in one worker, not one per worker;
    # - MPICH's and Intel MPI's share another (their installs, and a fixed MASTER_PORT in one scenario);
    # - Open MPI's are dealt round-robin over OPEN_MPI_LANES lanes, parametrized variants apart.
    # A file lock per lane (tests/clusters/fixtures.py) keeps a lane's jobs apart where the group does not: across
    # concurrent pytest runs, and under an xdist that drops groups.
    dealt = 0
    for item in items:
        if item.get_closest_marker("mpi") is None:
            continue
        lane = lane_of(item.fixturenames, {mark.name for mark in item.iter_markers()}, dealt)
        dealt += lane.startswith("openmpi")
        item.add_marker(pytest.mark.xdist_group(lane))


@pytest.hookimpl(tryfirst=True)  # before xdist's, which sends the node ids to the scheduler
def pytest_collection_finish(session: pytest.Session) -> None:
    # pytest-xdist 3.8 names a test's group to its scheduler by appending "@group" to the node id, written to
    # `item._nodeid`; pytest 9.2 keeps node ids in `item._id`, so no group arrived and the real jobs ran on both
    # workers at once (pytest-xdist#1386, fix pending in #1388). Append it, as xdist does, where its write did not
    # take; with the lock in tests/clusters/fixtures.py, a pytest that moves node ids again costs time, not safety.
    if not getattr(session.config.option, "loadgroup", False):  # set in xdist's workers under --dist loadgroup
        return
    for item in session.items:
        marks = item.iter_markers("xdist_group")
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in marks})
        suffix = "@" + "_".join(groups)
        node_id = getattr(item, "_id", None)
        if groups and not item.nodeid.endswith(suffix) and node_id is not None:
            item._id = type(node_id).parse(item.nodeid + suffix)


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
