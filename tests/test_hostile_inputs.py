"""Hostile inputs (issue 23, item 4): each gives a result or one named error, never a traceback, a hang or gigabytes.

Two parts. A table of every hostile input the issue lists, each run through the CLI (``python -m lightning_mpi_env``)
or the API in a child process under an address-space cap, with a bound on its time and its peak memory. Then a
hypothesis test that drives the CLI's ``main()`` in this process, and ``from_env``, with hostile values, under
``tracemalloc``. The bounds are generous, to catch the hang and blow-up class only: the figures are measured by
``benchmarks/hostile_inputs.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.cli_parser import PROG

CAP_BYTES = 1 << 30
"""The child's address space: a blow-up ends in a MemoryError here instead of taking the machine."""

PEAK_MB = 100
"""What any hostile input may cost, at most, in resident memory (the interpreter itself takes about 20 MB)."""

HANG_S = 60
"""Past this a case is a hang (each takes well under a second alone; a login node's load may slow it)."""

OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
HUGE = str(10**17)
NODELIST_40 = ",".join(f"n{item}x[1-999999]" for item in range(40))
CLI = ("-m", "lightning_mpi_env")

_CHILD = """
import json, resource, subprocess, sys
argv, env, cap, bound = json.loads(sys.argv[1])
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
try:
    done = subprocess.run(argv, env=env, capture_output=True, timeout=bound, preexec_fn=limit)
    result = {"rc": done.returncode, "out": done.stdout.decode(errors="replace")}
    result["err"] = done.stderr.decode(errors="replace")
except subprocess.TimeoutExpired:
    result = {"rc": None, "out": "", "err": "hang"}
result["peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps(result))
"""


def _api(code: str) -> tuple[str, ...]:
    # One named error of ours: its class and line on stdout, exit 1; anything else is a traceback (exit 1 too, but
    # the test then finds no NAMED line).
    return (
        "-c",
        "import sys\nfrom lightning_mpi_env import MpiEnvError, torch_env, jax_distributed_kwargs\n"
        "from lightning_mpi_env.core.settings import Settings\n"
        f"try:\n    print('RESULT', {code})\nexcept MpiEnvError as error:\n"
        "    print('NAMED', type(error).__name__, error.one_line()); sys.exit(1)\n",
    )


def _host_files(root: Path) -> dict[str, str]:
    fifo = root / "fifo"
    os.mkfifo(fifo)
    big = root / "big"
    with big.open("wb") as file:  # 1 GB, its first line a host (a hole after it: nothing to write)
        file.write(b"node001\n")
        file.truncate(10**9)
    zeros = root / "zeros"
    with zeros.open("wb") as file:
        file.truncate(10**9)
    return {"fifo": str(fifo), "big": str(big), "zeros": str(zeros)}


# name, argv after the interpreter, environment, exit status, what stdout+stderr holds
HOSTILE = [
    ("exec, sizes 10^17", (*CLI, "exec", "--", "true"), {**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": HUGE,
     "OMPI_COMM_WORLD_LOCAL_SIZE": HUGE, "MASTER_ADDR": "nodea"}, 1, "more than the 16777216 ranks of one job"),
    ("exec, local size 10^17", (*CLI, "exec", "--", "true"), {**OPEN_MPI, "OMPI_COMM_WORLD_LOCAL_SIZE": HUGE,
     "MASTER_ADDR": "nodea"}, 1, "more than the 16384 ranks on one node"),
    ("torch_env, local size 10^17", _api("torch_env()"), {**OPEN_MPI, "OMPI_COMM_WORLD_LOCAL_SIZE": HUGE,
     "MASTER_ADDR": "nodea"}, 1, "NAMED LayoutError"),
    ("jax kwargs, local size 10^17", _api("jax_distributed_kwargs()"), {**OPEN_MPI, "OMPI_COMM_WORLD_LOCAL_SIZE":
     HUGE, "MASTER_ADDR": "nodea"}, 1, "NAMED LayoutError"),
    ("torchrun-args, local size 10^17", (*CLI, "torchrun-args"), {**OPEN_MPI, "OMPI_COMM_WORLD_LOCAL_SIZE": HUGE,
     "MASTER_ADDR": "nodea"}, 1, "more than the 16384 ranks on one node"),
    ("show, 40 x n[1-999999]", (*CLI, "show"), {**OPEN_MPI, "SLURM_JOB_NODELIST": NODELIST_40}, 1,
     "it lists more than 1000000 hosts"),
    ("show, first of login1,n[1-999999]", (*CLI, "show"), {**OPEN_MPI, "SLURM_JOB_NODELIST": "login1,n[1-999999]"},
     0, "main_address=login1 (SLURM_JOB_NODELIST (first host))"),
    ("show, heterogeneous step of 999999 nodes, this one last", (*CLI, "show"), {"SLURM_STEP_ID": "0",
     "SLURM_PROCID": "999999", "SLURM_NTASKS": "1000000", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
     "SLURM_STEP_TASKS_PER_NODE": "1(x999998),2", "SLURM_STEP_NODELIST": "n[1-999999]", "SLURMD_NODENAME": "n999999",
     "SLURM_HET_SIZE": "2", "MASTER_ADDR": "n1"}, 0,
     "local_size=2 (SLURM_STEP_TASKS_PER_NODE[SLURMD_NODENAME])"),
    ("show, PBS_NODEFILE FIFO", (*CLI, "show"), {**OPEN_MPI, "PBS_NODEFILE": "{fifo}"}, 1,
     "is a FIFO, not a regular file"),
    ("show, PBS_NODEFILE /dev/zero", (*CLI, "show"), {**OPEN_MPI, "PBS_NODEFILE": "/dev/zero"}, 1,
     "/dev/zero is a character device"),
    ("show, 1 GB PBS_NODEFILE", (*CLI, "show"), {**OPEN_MPI, "PBS_NODEFILE": "{big}"}, 0,
     "main_address=node001 (PBS_NODEFILE (first host))"),
    ("show, 1 GB PE_HOSTFILE of NULs", (*CLI, "show"), {**OPEN_MPI, "PE_HOSTFILE": "{zeros}"}, 1,
     "names no host in its first 1048576 bytes"),
    ("doctor, MASTER_ADDR=a..b", (*CLI, "doctor"), {**OPEN_MPI, "MASTER_ADDR": "a..b"}, 1, "an empty label"),
    ("doctor, 64-character label", (*CLI, "doctor"), {**OPEN_MPI, "MASTER_ADDR": "a" * 64}, 1,
     "a label is longer than 63 characters"),
    ("doctor, non-UTF-8 MASTER_ADDR", (*CLI, "doctor"), {**OPEN_MPI, "MASTER_ADDR": "node\udcff"}, 1,
     "not printable ASCII"),
    ("doctor, MASTER_ADDR and a FIFO host file", (*CLI, "doctor"), {**OPEN_MPI, "MASTER_ADDR": "127.0.0.1",
     "MASTER_PORT": "1", "PBS_NODEFILE": "{fifo}"}, None, "[ok] layout: RankLayout("),
    *[
        (f"timeout {value!r}", _api("Settings.from_env(__import__('os').environ)"),
         {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": value}, 1, "NAMED SettingError")
        for value in ("1e18", "1e-300", "\u0663", "1_0")
    ],
    *[
        (f"show, MASTER_ADDR={value!r}", (*CLI, "show"), {**OPEN_MPI, "MASTER_ADDR": value}, 1,
         "is not a host name or an IP address")
        for value in (" ", "a\nb", "-oX=y")
    ],
    ("simulate 100 x 100", (*CLI, "simulate", "--nodes", "100", "--per-node", "100"), {}, 0, "# OK"),
    ("simulate 10^17 x 10^17", (*CLI, "simulate", "--nodes", str(10**17), "--ppn", str(10**17), "--np", "1"), {}, 2,
     "more than the 65536 slots"),
    ("simulate 10^18 x 10^18", (*CLI, "simulate", "--nodes", str(10**18), "--ppn", str(10**18), "--np", "1"), {}, 2,
     "must be a positive integer"),
    ("simulate 10^8 nodes", (*CLI, "simulate", "--nodes", str(10**8), "--ppn", "1", "--np", "1"), {}, 2,
     "more than the 65536 slots"),
    ("simulate 5000 digits", (*CLI, "simulate", "--nodes", "9" * 5000, "--ppn", "1"), {}, 2,
     "must be a positive integer"),
]  # fmt: skip


@pytest.fixture(scope="module")
def host_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _host_files(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize(("name", "argv", "env", "status", "said"), HOSTILE, ids=[case[0] for case in HOSTILE])
def test_each_hostile_input_is_a_result_or_one_named_error(host_files, name, argv, env, status, said):
    environ = {"PATH": os.environ["PATH"], **{key: value.format(**host_files) for key, value in env.items()}}
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    spec = json.dumps([[sys.executable, *argv], environ, CAP_BYTES, HANG_S])
    probe = subprocess.run(
        [sys.executable, "-c", _CHILD, spec], capture_output=True, text=True, timeout=HANG_S + 60, check=True
    )
    result = json.loads(probe.stdout)
    assert result["rc"] is not None, f"{name}: still running after {HANG_S} s"
    output = result["out"] + result["err"]
    assert "Traceback" not in output
    assert "MemoryError" not in output
    assert said in output
    if status is not None:
        assert result["rc"] == status, output
    if result["rc"] == 1 and argv[0] == "-m" and argv[2] != "doctor":
        (line,) = result["err"].splitlines()  # one line, its HINT included
        assert line.startswith(f"{PROG}: error: ")
        assert "HINT:" in line
    assert result["peak_mb"] < PEAK_MB, f"{name}: {result['peak_mb']:.0f} MB"


# --- in this process: main() and from_env with hostile values, under tracemalloc -----------------------------------

HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "a\nb",
            "-oX=y",
            "a..b",
            "a" * 64,
            "node\udcff",
            "\u0663",
            "1_0",
            "1e18",
            "1e-300",
            "-1",
            "+3",
            HUGE,
            "9" * 5000,
            NODELIST_40,
            "n[1-999999]",
            "/dev/zero",
            "/",
            "0" * 30,
            "inf",
            "nan",
        ]
    ),
    st.text(st.characters(exclude_characters="\x00"), max_size=40),
    st.integers(-(10**20), 10**20).map(str),
)
VARIABLES = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_NODELIST",
    "PBS_NODEFILE",
    "PE_HOSTFILE",
    "LSB_MCPU_HOSTS",
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "LIGHTNING_MPI_ENV_STALL_TIMEOUT",
    "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT",
    "LIGHTNING_MPI_ENV_ROLL_CALL",
    "LIGHTNING_MPI_ENV_IFNAME",
    "LIGHTNING_MPI_ENV_MAIN_HOST",
    "SLURM_JOB_ID",
]
COMMANDS = [
    ["show"],
    ["show", "--json"],
    ["doctor"],
    ["exec", "--", "true"],
    ["torchrun-args", "--nproc-per-node", "2"],
]
HOSTILE_ENV = st.dictionaries(st.sampled_from(VARIABLES), HOSTILE_VALUES, min_size=1, max_size=4)
SIMULATE_SIZES = st.one_of(st.integers(1, 6), st.sampled_from([0, 10**6, 10**18, 10**40])).map(str)


def _loopback_getaddrinfo(host, port, *args, **kwargs):
    """``socket.getaddrinfo`` kept on this machine: the codec check of the real one, then loopback or not found."""
    if isinstance(host, str):
        host.encode("idna")  # what the real one does first: a UnicodeError for a..b or a 64-character label
    if host in ("localhost", "127.0.0.1", "::1"):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def _bounded(run):
    tracemalloc.start()
    start = time.monotonic()
    try:
        outcome = run()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < PEAK_MB << 20, f"{peak >> 20} MB"
    assert time.monotonic() - start < HANG_S
    return outcome


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(COMMANDS), extra=HOSTILE_ENV)
def test_the_cli_answers_hostile_environments_in_one_line(capsys, command, extra):
    env = {**OPEN_MPI, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611", **extra}
    with (
        mock.patch.dict(os.environ, env, clear=True),
        mock.patch("socket.getaddrinfo", _loopback_getaddrinfo),
        mock.patch("lightning_mpi_env.tools.cli._execvp", return_value=0),  # exec would replace this process
    ):
        status = _bounded(lambda: main(command))
    out, err = capsys.readouterr()
    assert status in (0, 1), (status, err)
    assert "Traceback" not in out + err
    if status == 1 and command[0] != "doctor":
        errors = [line for line in err.splitlines() if not line.startswith(f"{PROG}: warning: ")]
        (error,) = errors
        assert error.startswith(f"{PROG}: error: ")
        assert "HINT:" in error
    if command[0] == "doctor":
        assert out.startswith("rank ") or out.startswith("[")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=SIMULATE_SIZES, ppn=SIMULATE_SIZES, launcher=st.sampled_from(["openmpi", "slurm", "pals", "flux"]))
def test_simulate_answers_any_size_in_one_line(capsys, nodes, ppn, launcher):
    status = _bounded(lambda: main(["simulate", "--nodes", nodes, "--ppn", ppn, "--launcher", launcher]))
    _, err = capsys.readouterr()
    assert status in (0, 1, 2)
    assert "Traceback" not in err
    if status == 1 and f"{PROG}: problem: " not in err:  # a named error, not the table's problems
        assert err.startswith(f"{PROG}: error: ")
        assert err.count("\n") == 1


@settings(max_examples=100, deadline=None)
@given(extra=HOSTILE_ENV)
def test_from_env_gives_a_layout_or_one_named_error(extra):
    def resolve():
        try:
            return from_env({**OPEN_MPI, **extra})
        except MpiEnvError as error:
            return error

    outcome = _bounded(resolve)
    assert isinstance(outcome, MpiEnvError) or outcome.world_size >= 1


SRUN_STEP = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2,1(x2)",
    "SLURM_STEP_NODELIST": "n[1-3]",
    "SLURMD_NODENAME": "n2",
    "SLURM_HET_SIZE": "2",
    "MASTER_ADDR": "n1",
}
"""A task of a heterogeneous srun step (issue 25): its per-node counts are found by SLURMD_NODENAME."""
SLURM_VARIABLES = [*SRUN_STEP, "SLURM_STEP_NUM_TASKS"]
SLURM_VALUES = st.one_of(
    HOSTILE_VALUES,
    st.sampled_from(["n[1-999999]", "1(x999999)", "n999999", "n[1-2][1-999999]", "0(x5)", "2(x0)", "n[3-1]"]),
)


@settings(max_examples=100, deadline=None)
@given(extra=st.dictionaries(st.sampled_from(SLURM_VARIABLES), SLURM_VALUES, min_size=1, max_size=4))
def test_a_heterogeneous_srun_step_gives_a_layout_or_one_named_error(extra):
    def resolve():
        try:
            return from_env({**SRUN_STEP, **extra})
        except MpiEnvError as error:
            return error

    outcome = _bounded(resolve)
    assert isinstance(outcome, MpiEnvError) or outcome.local_size in outcome.ranks_per_node
