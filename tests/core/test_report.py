"""How an uncaught error is shown (``lightning_mpi_env.core.report``): one line per rank under a launcher, the user's
frames in a single process, everything with ``LIGHTNING_MPI_ENV_DEBUG=1``; the excepthook in fresh interpreters."""

import socket
import subprocess
import sys
import textwrap

import pytest

from lightning_mpi_env.core.errors import LayoutError, RendezvousError
from lightning_mpi_env.core.launchers import LAUNCHERS
from lightning_mpi_env.core.report import debugging, rank_prefix, render
from lightning_mpi_env.core.settings import VARIABLE

DEBUG_VARIABLE = VARIABLE["debug"]

HOST = socket.gethostname()
OPEN_MPI_RANK_3 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
BAD_RANK = "OMPI_COMM_WORLD_RANK='x' (Open MPI) is not a non-negative integer."


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        (" No ", False),
        ("OFF", False),
        ("1", True),
        ("true", True),
        ("yes", True),
        ("full", True),
    ],
)
def test_debugging(value, expected):
    assert debugging({} if value is None else {DEBUG_VARIABLE: value}) is expected


def test_rank_prefix_outside_a_launcher_is_empty():
    assert rank_prefix({}) == ""
    assert rank_prefix({"SLURM_PROCID": "3"}) == ""  # a batch script, not a job step


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=[launcher.key for launcher in LAUNCHERS])
def test_rank_prefix_names_rank_and_host_under_every_launcher(launcher):
    assert rank_prefix({launcher.marker: "7", launcher.rank: "7"}) == f"rank 7 on {HOST}: "


def test_rank_prefix_without_the_rank_variable_says_so():
    # Hydra marks its processes with MPI_LOCALRANKID; the global rank is PMI_RANK.
    assert rank_prefix({"MPI_LOCALRANKID": "0"}) == f"rank ? on {HOST}: "


def test_render_outside_a_launcher_is_none():
    assert render(LayoutError("problem", "fix"), {}) is None


def test_render_is_one_line_naming_class_rank_host_problem_and_hint():
    error = RendezvousError("Rank 3 of 4 never\n   arrived.", "Check\nthe port.")
    assert render(error, OPEN_MPI_RANK_3) == (
        f"RendezvousError: rank 3 on {HOST}: Rank 3 of 4 never arrived. HINT: Check the port.\n"
    )


# --- the excepthook, in a fresh interpreter -------------------------------------------------------------------------

BAD_LAUNCH = """
import lightning_mpi_env
from lightning_mpi_env import from_env
from lightning_mpi_env.core.report import install_excepthook

install_excepthook()  # as MPIClusterEnvironment() does; an import alone installs nothing


def read_launch():
    return from_env({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "4",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})


read_launch()
"""


def _run(tmp_path, code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(program), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
    )


def _frames(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith("File ")]


def test_alone_the_users_frames_and_the_message(tmp_path):
    result = _run(tmp_path, BAD_LAUNCH)
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    frames = _frames(result.stderr)
    assert [frame.rsplit(" in ", 1)[1] for frame in frames] == ["<module>", "read_launch"]
    assert all(str(tmp_path / "program.py") in frame for frame in frames)
    assert "lightning_mpi_env" not in "".join(frames)
    assert result.stderr.endswith(
        f"LayoutError: {BAD_RANK}\nHINT: Start every rank with Open MPI's `mpirun`/"
        "`mpiexec`, which sets OMPI_COMM_WORLD_* itself.\n"
    )


def test_under_a_launcher_one_line(tmp_path):
    result = _run(tmp_path, BAD_LAUNCH, **OPEN_MPI_RANK_3)
    assert result.returncode == 1
    assert result.stderr == (
        f"LayoutError: rank 3 on {HOST}: {BAD_RANK} HINT: Start every rank with Open MPI's `mpirun`/`mpiexec`, "
        "which sets OMPI_COMM_WORLD_* itself.\n"
    )


def test_debug_shows_the_full_traceback(tmp_path):
    result = _run(tmp_path, BAD_LAUNCH, **OPEN_MPI_RANK_3, LIGHTNING_MPI_ENV_DEBUG="1")
    assert result.returncode == 1
    frames = _frames(result.stderr)
    assert any("lightning_mpi_env/core/layout.py" in frame for frame in frames), result.stderr
    assert frames[0].endswith("in <module>")
    assert result.stderr.endswith(
        f"LayoutError: {BAD_RANK}\nHINT: Start every rank with Open MPI's `mpirun`/"
        "`mpiexec`, which sets OMPI_COMM_WORLD_* itself.\n"
    )


def test_other_errors_keep_pythons_traceback(tmp_path):
    result = _run(tmp_path, "import lightning_mpi_env\n\n\ndef step():\n    raise ValueError('boom')\n\n\nstep()\n")
    assert result.returncode == 1
    assert [frame.rsplit(" in ", 1)[1] for frame in _frames(result.stderr)] == ["<module>", "step"]
    assert result.stderr.endswith("ValueError: boom\n")


HOOKED = """
import sys
sys.excepthook = lambda kind, value, trace: sys.stderr.write(f"CUSTOM {kind.__name__}\\n")
import lightning_mpi_env
from lightning_mpi_env.core.report import install_excepthook

install_excepthook()
if sys.argv[-1] == "ours":
    lightning_mpi_env.from_env({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "4",
                                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
raise ValueError("boom")
"""


def test_another_excepthook_keeps_other_errors(tmp_path):
    # IPython, rich: whoever formatted exceptions before keeps doing so for everything but this package's errors.
    assert _run(tmp_path, HOOKED, "other").stderr == "CUSTOM ValueError\n"
    ours = _run(tmp_path, HOOKED, "ours", **OPEN_MPI_RANK_3).stderr
    assert ours.startswith(f"LayoutError: rank 3 on {HOST}: {BAD_RANK} HINT: ")
    assert ours.count("\n") == 1


INERT_IMPORT = """
import signal, sys, warnings
hook, finders, filters = sys.excepthook, list(sys.meta_path), list(warnings.filters)
handlers = {number: signal.getsignal(number) for number in signal.valid_signals() if number not in (9, 19)}
import lightning_mpi_env
from lightning_mpi_env import from_env, jax_distributed_kwargs, torch_env
from_env({}), torch_env({}), jax_distributed_kwargs({})
assert sys.excepthook is hook, "excepthook changed"
assert list(warnings.filters) == filters, "warnings filters changed"
assert {number: signal.getsignal(number) for number in handlers} == handlers, "signal handlers changed"
added = [finder for finder in sys.meta_path if finder not in finders]
assert len(added) <= 1 and len(sys.meta_path) == len(finders) + len(added), added
print("INERT", len(added), flush=True)
"""


def test_the_import_and_the_core_change_no_process_wide_state(tmp_path):
    # Importing the package, and the standard-library API, leave the excepthook, warnings filters and signal
    # handlers alone; one import finder (registering "ddp_mpi" when Lightning comes) is the only addition.
    result = _run(tmp_path, INERT_IMPORT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "INERT 1\n"
