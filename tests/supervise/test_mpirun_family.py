"""Which family an mpirun/mpiexec is, asked from the launcher itself (``--version``), real and injected."""

from __future__ import annotations

import os
import subprocess

import pytest

from lightning_mpi_env.core.errors import MpiEnvError, MpirunLineError
from lightning_mpi_env.supervise.mpirun_family import detect_family
from lightning_mpi_env.supervise.mpirun_options import INTEL_MPI_LINE, MPICH_LINE, OPEN_MPI_LINE
from lightning_mpi_env.tools.simcluster import find_mpirun
from tests.clusters import hydra


def _printing(stdout: str, returncode: int = 0):
    """A ``run`` that answers ``stdout`` and records what it was asked."""
    asked: list[list[str]] = []

    def run(argv, **_options):
        asked.append(list(argv))
        return subprocess.CompletedProcess(argv, returncode, stdout, "")

    run.asked = asked  # type: ignore[attr-defined]
    return run


def test_the_launcher_is_asked_for_its_version_once():
    run = _printing("mpirun (Open MPI) 5.0.11\n")
    assert detect_family("mpirun", run=run) is OPEN_MPI_LINE
    assert run.asked == [["mpirun", "--version"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (
            _printing("mpirun (Open MPI) 4.1.6\n"),
            r"'mpirun' is Open MPI 4; the supervisor reads the lines of Open MPI 5",
        ),
        (
            _printing("mpiexec (OpenRTE) 3.1.0\n"),
            r"printed 'mpiexec \(OpenRTE\) 3.1.0' \(exit status 0\): not Open MPI",
        ),
        (_printing("", 127), r"printed 'nothing' \(exit status 127\)"),
    ],
)
def test_a_launcher_of_no_family_read_here_is_named(run, message):
    with pytest.raises(MpirunLineError, match=message) as caught:
        detect_family("mpirun", run=run)
    assert caught.value.hint


@pytest.mark.parametrize(
    "error", [FileNotFoundError(2, "No such file or directory"), subprocess.TimeoutExpired("x", 30)]
)
def test_a_launcher_that_does_not_run_is_named(error):
    def run(argv, **_options):
        raise error

    with pytest.raises(MpirunLineError, match=r"'mpirun' --version did not run") as caught:
        detect_family("mpirun", run=run)
    assert "PATH" in caught.value.hint


@pytest.mark.mpi
def test_the_installed_open_mpi_is_told():
    try:
        mpirun = find_mpirun()
    except MpiEnvError as error:
        pytest.skip(str(error))
    assert detect_family(mpirun) is OPEN_MPI_LINE


@pytest.mark.mpi
@pytest.mark.hydra
@pytest.mark.parametrize(("kind", "family"), [("mpich", MPICH_LINE), ("intelmpi", INTEL_MPI_LINE)])
def test_the_installed_hydras_are_told_apart(kind, family):
    reason = hydra.unavailable_reason(kind)
    if reason:
        pytest.skip(reason)
    bin_dir = hydra.ensure_venv(kind)
    # Both install `mpirun` too; Intel MPI's is a script that runs `mpiexec.hydra` from PATH.
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    assert detect_family(str(bin_dir / "mpiexec"), env=env) is family
    assert detect_family(str(bin_dir / "mpirun"), env=env) is family
