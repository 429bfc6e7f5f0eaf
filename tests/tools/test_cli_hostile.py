"""The command line over every subcommand, ``--json`` included, against the classes of hostile input a new user met.

(a) an operating-system error (an output that cannot be written, a folder that cannot be made, a path refused) or an
empty command is one named line with the path or value and a fix, exit 1 (the system) or 2 (the command line), never
"failed unexpectedly" or a traceback; (b) a name or value with control characters is echoed escaped, so no line of
the output can be forged; (c) ``exec`` hands its command the environment it meant to, nothing Python added; (d) every
documented maximum is enforced, as a usage error. Then the exit statuses, the one error form, the help's width and
``doctor``'s noise. Nothing is launched: ``exec``'s ``execvpe``, ``simcluster``'s ``mpirun``, ``run``'s supervisor
and the demo are replaced.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.cli_parser import JSON_COMMANDS, PROG
from lightning_mpi_env.tools.simcluster import MAX_NODES, MAX_SLOTS, SimulatedCluster

WIDTH = 120
OPEN_MPI_5 = {  # what plain `mpirun` of Open MPI 5 gives a rank: its own variables and PMIx's
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "PMIX_RANK": "0",
    "PMIX_NAMESPACE": "prterun-vm-1234@1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29611",
}
COMMAND_LINES = {
    "show": [["show"], ["show", "--json"], ["--json", "show"]],
    "simulate": [["simulate", "--nodes", "3", "--ppn", "2"], ["simulate", "--nodes", "2", "--ppn", "2", "--json"]],
    "exec": [["exec", "--", "true"]],
    "torchrun-args": [["torchrun-args"], ["torchrun-args", "--json"]],
    "run": [["run", "--", "srun", "true"]],
    "doctor": [["doctor"], ["doctor", "--json"], ["--json", "doctor"]],
    "simcluster": [["simcluster", "--", "true"]],
    "demo": [["demo"]],
}
"""A line that works, for every subcommand (``--json`` where it is taken, before and after the command's name)."""
EVERY_LINE = [line for lines in COMMAND_LINES.values() for line in lines]
FORGED = "\nlightning-mpi-env: error: FORGED\r\x1b[2K\x85\u2028\u202e"
"""A value that would print a line of its own, overwrite one or reverse it, if echoed raw."""


def _fake_supervise(words, policy, *, say=lambda line: print(line, file=sys.stderr), **kwargs):
    say(f"{PROG} run: launch: {' '.join(words)}")  # the supervisor echoes the step's words, as the real one does
    return 0


def _loopback_getaddrinfo(host, port, *args, **kwargs):
    if host in ("localhost", "127.0.0.1"):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """``run`` makes its state folder under the working folder: each test's goes to its own, not the checkout."""
    monkeypatch.chdir(tmp_path)


def _run(argv, env=None, **patches):
    """``main(argv)`` in ``env`` (PATH kept) with nothing launched; ``patches``: further targets and side effects."""
    done = subprocess.CompletedProcess(args=[], returncode=0)
    targets = {
        "socket.getaddrinfo": mock.patch("socket.getaddrinfo", _loopback_getaddrinfo),
        "execvpe": mock.patch("lightning_mpi_env.tools.cli.os.execvpe", side_effect=FileNotFoundError),
        "execvp": mock.patch("lightning_mpi_env.tools.cli.os.execvp", side_effect=FileNotFoundError),
        "supervise": mock.patch("lightning_mpi_env.tools.cli.supervise", _fake_supervise),
        "cluster": mock.patch.object(SimulatedCluster, "run", return_value=done),
    }
    if importlib.util.find_spec("lightning_mpi_env.tools.demo") is not None:  # the demo's own module, when there
        targets["demo"] = mock.patch("lightning_mpi_env.tools.demo.main", return_value=0)
    for name, side_effect in patches.items():
        targets[name] = mock.patch(name, side_effect=side_effect)
    with mock.patch.dict(os.environ, {"PATH": os.environ["PATH"], **(env or {})}, clear=True):
        for patch in targets.values():
            patch.start()
        try:
            return main(argv)
        finally:
            mock.patch.stopall()


def _named_error(err: str) -> str:
    """The one error line of ``err``: ``lightning-mpi-env: error: ... HINT: ...``, no traceback, no bug report."""
    assert "Traceback" not in err
    assert "failed unexpectedly" not in err, err
    errors = [line for line in err.splitlines() if line.startswith(f"{PROG}: error: ")]
    assert len(errors) == 1, err
    assert " HINT: " in errors[0], err
    return errors[0]


# --- (a) operating-system errors and empty commands ----------------------------------------------------------------


class _Unwritable:
    """A standard output that the system refuses (a full disk, a descriptor gone)."""

    encoding = "utf-8"

    def __init__(self, number: int) -> None:
        self.number = number

    def write(self, text: str) -> int:
        raise OSError(self.number, os.strerror(self.number))

    def flush(self) -> None:
        raise OSError(self.number, os.strerror(self.number))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    argv=st.sampled_from([*EVERY_LINE, ["--help"], ["show", "--help"], ["bogus"], ["show", "--json", "--yaml"]]),
    stdout=st.sampled_from([None, errno.ENOSPC, errno.EIO, errno.EBADF]),
)
def test_an_output_that_cannot_be_written_is_one_named_error(capsys, argv, stdout):
    with mock.patch("sys.stdout", None if stdout is None else _Unwritable(stdout)):
        status = _run(argv, OPEN_MPI_5)
    err = capsys.readouterr().err
    if argv[0] in ("exec", "run", "simcluster", "demo"):  # a command that prints nothing of its own
        assert status in (0, 127), (argv, status, err)  # 127: exec's command, replaced here, "not found"
        return
    if status == 0:  # a closed stdout: argparse writes its help to stderr
        assert stdout is None, (argv, err)
        assert "--help" in argv, (argv, err)
        return
    assert status in (1, 2), (argv, status, err)
    line = _named_error(err)
    if status == 1:
        assert "standard output" in line, line


@pytest.mark.parametrize("argv", [["show"], ["show", "--json"], ["doctor", "--json"], ["--help"]])
def test_a_full_disk_under_stdout_is_one_named_error_in_a_real_process(argv):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "lightning_mpi_env", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert _named_error(done.stderr).startswith(f"{PROG}: error: cannot write the ")
    assert done.stderr.count("\n") == 1, done.stderr  # nothing more when Python exits


def test_a_state_folder_that_is_a_file_is_one_named_error(tmp_path, capsys):
    blocker = tmp_path / "state"
    blocker.write_text("a file, not a folder")
    for state in (blocker, blocker / "below"):
        with mock.patch.dict(os.environ, {"PATH": os.environ["PATH"]}, clear=True):
            assert main(["run", "--state-dir", str(state), "--", "srun", "python", "train.py"]) == 1
        line = _named_error(capsys.readouterr().err)
        assert f"--state-dir {str(state)[:20]!r}"[:-1] in line
        assert "cannot be made or written" in line
        assert "Give --state-dir a folder you may write" in line


def test_leave_out_stragglers_without_periodic_checkpoints_is_one_named_error(tmp_path, capsys):
    allocation = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]"}
    with mock.patch.dict(os.environ, allocation, clear=True):
        line = ["run", "--leave-out-stragglers", "--state-dir", str(tmp_path / "state"), "--"]
        assert main([*line, "srun", "--nodes=2", "python", "train.py"]) == 1
    line = _named_error(capsys.readouterr().err)
    assert "--leave-out-stragglers ends the step at a periodic checkpoint" in line, line
    assert "Export LIGHTNING_MPI_ENV_CHECKPOINT_EVERY=N for the step" in line, line
    assert list((tmp_path / "state").iterdir()) == []  # refused before any step ran


def test_a_temporary_folder_that_cannot_be_made_is_one_named_error(tmp_path, capsys):
    blocker = tmp_path / "tmp"
    blocker.write_text("a file, not a folder")
    with mock.patch.object(tempfile, "tempdir", str(blocker)):
        assert _run(["simcluster", "--", "true"]) == 1
    line = _named_error(capsys.readouterr().err)
    assert "simcluster cannot make its work folder in the temporary directory" in line
    assert "TMPDIR" in line


SYSTEM_CALLS = {  # what each subcommand asks of the system first, to be refused
    "show": "lightning_mpi_env.tools.cli.from_env",
    "simulate": "lightning_mpi_env.tools.cli.simulate",
    "exec": "lightning_mpi_env.tools.cli.from_env",
    "torchrun-args": "lightning_mpi_env.tools.cli.torchrun_args",
    "run": "lightning_mpi_env.tools.cli.supervise",
    "doctor": "lightning_mpi_env.tools.cli.diagnose",
    "simcluster": "lightning_mpi_env.tools.simcluster.SimulatedCluster.run",
    "demo": "lightning_mpi_env.tools.demo.main",
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.sampled_from(EVERY_LINE), number=st.sampled_from([errno.EACCES, errno.ENOTDIR, errno.EROFS]))
def test_a_refusal_of_the_system_names_its_path(capsys, argv, number):
    command = next(word for word in argv if word in COMMAND_LINES)
    refusal = OSError(number, os.strerror(number), f"/d{FORGED}")
    status = _run(argv, OPEN_MPI_5, **{SYSTEM_CALLS[command]: refusal})
    out, err = capsys.readouterr()
    assert status == 1, (argv, err)
    line = _named_error(err)
    assert os.strerror(number) in line
    assert r"'/d\nlightning-mpi-env: error: FORGED\r\x1b" in line  # the path, escaped: on this one line
    assert "FORGED" in line
    if "--json" in argv:
        result = json.loads(out)
        assert (result["ok"], result["error"]["kind"], result["error"]["value"]) == (False, "SystemRefusal",
                                                                                     f"/d{FORGED}")  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", ""],
        ["exec", "--", ""],
        ["exec", "--", " ", "x"],
        ["run", "--", ""],
        ["run", ""],
        ["simcluster", "--", ""],
        ["exec", "--", "a\0b"],
        ["show", "--json", "\0"],
    ],
)
def test_an_empty_command_or_a_nul_is_a_usage_error(argv, capsys):
    assert _run(argv) == 2
    out, err = capsys.readouterr()
    line = _named_error(err)
    assert "\0" not in line
    if "--json" in argv:
        assert json.loads(out)["error"]["kind"] == "UsageError"


# --- (b) names and values with control characters: echoed escaped -------------------------------------------------

HOSTILE = st.sampled_from([FORGED, "\r[ok] forged", "\x1b[31mred", "a\tb\x0bc", "\x00x", "x\u2029y"])


@st.composite
def hostile_lines(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """A command line of any subcommand, ``--json`` included, with a hostile word or variable somewhere."""
    value = draw(HOSTILE)
    argv = list(draw(st.sampled_from(EVERY_LINE)))
    command = next(word for word in argv if word in COMMAND_LINES)
    where = draw(st.sampled_from(["extra", "option", "word", "env value", "env name"]))
    env = dict(OPEN_MPI_5)
    if where == "extra":
        argv.insert(argv.index(command) + 1, f"--{value}")
    elif where == "option":
        options = {"simulate": ["--map-by", "--nodes"], "torchrun-args": ["--nproc-per-node"], "run": ["--state-dir"],
                   "simcluster": ["-x", "--timeout"]}.get(command, ["--bogus"])  # fmt: skip
        argv[argv.index(command) + 1 : argv.index(command) + 1] = [draw(st.sampled_from(options)), value]
    elif where == "word":
        argv.append(value)
    else:
        value = value.replace("\x00", "")  # no environment holds one
        name = draw(st.sampled_from(["MASTER_ADDR", "OMPI_COMM_WORLD_RANK", "CUDA_VISIBLE_DEVICES", "RANK"]))
        if where == "env name":
            name = f"LIGHTNING_MPI_ENV_X{value}"
        env[name] = value
    return argv, env


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=hostile_lines())
def test_no_echoed_value_forges_or_overwrites_a_line(capsys, case):
    argv, env = case
    with mock.patch("lightning_mpi_env.tools.cli_output.WIDTH", 10_000, create=True):  # a finding a line
        status = _run(argv, env)
    out, err = capsys.readouterr()
    assert status in (0, 1, 2, 127), (argv, status, err)
    for line in (out + err).split("\n"):
        assert line.isprintable(), (argv, line)  # no line break, return, escape or reversal survives
        assert not line.startswith(f"{PROG}: error: FORGED"), (argv, out, err)
    if "--json" in argv and status in (0, 1) and out:
        assert json.loads(out)["ok"] is (status == 0)


# --- (c) exec: the environment meant, nothing Python added -----------------------------------------------------------


def test_exec_gives_its_command_exactly_the_environment_meant():
    # A bare environment (the C locale): Python coerces it to C.UTF-8 and sets LC_CTYPE in its own (PEP 538).
    env = {"PATH": os.environ["PATH"], **{k: v for k, v in OPEN_MPI_5.items() if not k.startswith("PMIX")}}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([sys.executable, "-m", "lightning_mpi_env", "exec", "--", "env", "-0"], env=env,
                          capture_output=True, timeout=120, check=True)  # fmt: skip
    child = dict(entry.split("=", 1) for entry in done.stdout.decode().split("\0") if entry)
    exported = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0",
                "GROUP_RANK": "0"}  # fmt: skip
    assert child == {**env, **exported}


# --- (d) every documented maximum, enforced as a usage error ------------------------------------------------------

MAXIMA = [
    (["simcluster", "--nodes", str(MAX_NODES + 1), "--", "true"], f"at most {MAX_NODES}"),
    (["simcluster", "--per-node", str(MAX_SLOTS + 1), "--", "true"], f"at most {MAX_SLOTS}"),
    (["simcluster", "--nodes", str(MAX_NODES), "--per-node", "5", "--", "true"], f"the {MAX_SLOTS} slots"),
    (["simcluster", "--nodes", "100"], f"at most {MAX_NODES}"),
    (["simcluster", "--timeout", "86401", "--", "true"], "at most 86400"),
    (["simulate", "--nodes", "65537", "--per-node", "1", "--np", "1"], "65536 slots"),
    (["simulate", "--nodes", str(10**17), "--per-node", str(10**17), "--np", "1", "--json"], "65536 slots"),
    (["torchrun-args", "--nproc-per-node", "16385"], "at most 16384"),
    (["torchrun-args", "--nproc-per-node", "16385", "--json"], "at most 16384"),
    (["run", "--min-nodes", str(2**24 + 1), "--", "mpirun", "true"], f"at most {2**24}"),
    (["run", "--restarts", "1001", "--", "srun", "true"], "from 0 to 1000"),
    (["run", "--grace", "86401", "--", "srun", "true"], "at most 86400"),
]


@pytest.mark.parametrize(("argv", "said"), MAXIMA)
def test_every_documented_maximum_is_a_usage_error(argv, said, capsys):
    assert _run(argv) == 2
    out, err = capsys.readouterr()
    assert said in _named_error(err)
    if "--json" in argv:
        assert json.loads(out)["error"]["kind"] == "UsageError"


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["simcluster", "--nodes", str(MAX_NODES), "--per-node", str(MAX_SLOTS // MAX_NODES), "--", "true"], 0),
        (["simulate", "--nodes", "256", "--per-node", "256", "--np", "1"], 0),
        (["torchrun-args", "--nproc-per-node", "16384"], 0),
    ],
)
def test_the_maximum_itself_is_taken(argv, status, capsys):
    assert _run(argv, OPEN_MPI_5 if argv[0] == "torchrun-args" else {}) == status, capsys.readouterr().err


# --- exit statuses, one error form, --json everywhere or refused ---------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["simcluster", "--np", "5"],
        ["simcluster", "--np", "5", "--", "true"],
        ["simcluster", "--nodes", "100", "--", "true"],
        ["run"],
        ["run", "--", "true"],
        ["run", "--", "python", "train.py"],
        ["run", "--min-nodes", "2", "--", "srun", "python", "train.py"],
        ["exec"],
        ["--json", "exec", "--", "true"],
        ["--json", "run", "--", "srun", "true"],
        ["--json", "simcluster", "--", "true"],
        ["show", "--bogus"],
        ["--bogus", "show"],
    ],
)
def test_every_usage_error_exits_2_in_one_form_and_prints_no_json_where_none_is_taken(argv, capsys):
    assert _run(argv) == 2
    out, err = capsys.readouterr()
    line = _named_error(err)
    assert err.splitlines()[-1] == line  # the error is the last line (a usage line may come before it)
    command = next((word for word in argv if word in COMMAND_LINES), None)
    if command not in JSON_COMMANDS:
        assert out == ""


@pytest.mark.parametrize(("argv", "command"), [(["show", "--yaml"], "show"), (["doctor", "--fix"], "doctor"),
                                                (["simulate", "--nodes", "2", "--bogus"], "simulate")])  # fmt: skip
def test_a_usage_error_points_to_its_command_s_help(argv, command, capsys):
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {PROG} {command} ")
    assert _named_error(err).endswith(f"HINT: See `{PROG} {command} --help`.")


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_json_before_the_command_is_taken_as_after_it(command, capsys):
    tail = ["--nodes", "2", "--per-node", "2"] if command == "simulate" else []
    before = _run(["--json", command, *tail], OPEN_MPI_5)
    first = json.loads(capsys.readouterr().out)
    after = _run([command, *tail, "--json"], OPEN_MPI_5)
    second = json.loads(capsys.readouterr().out)
    assert before == after
    assert first.keys() == second.keys()


def test_runtime_failures_exit_1_in_the_same_form(capsys):
    assert _run(["show"], {**OPEN_MPI_5, "OMPI_COMM_WORLD_RANK": "x"}) == 1
    assert _named_error(capsys.readouterr().err).startswith(f"{PROG}: error: OMPI_COMM_WORLD_RANK='x'")
    assert _run(["exec", "--", "no-such-command"], OPEN_MPI_5) == 127
    assert _named_error(capsys.readouterr().err).startswith(f"{PROG}: error: exec: command not found")


# --- lines of at most 120 characters: help, doctor's findings, simulate's notes ------------------------------------

SUBCOMMANDS = ["", *COMMAND_LINES]


@pytest.mark.parametrize("command", [name for name in SUBCOMMANDS if name != "demo"])
def test_every_help_is_at_most_120_characters_wide_on_a_wide_terminal(command):
    env = {**os.environ, "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "lightning_mpi_env", *([command] if command else []), "--help"],
                          env=env, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) > 3
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert not re.search(r"-\n", done.stdout), "an option broken at its hyphen"


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["doctor"], {**OPEN_MPI_5, "LIGHTNING_MPI_ENV_STALL_TIMOUT": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}),
        (["doctor"], {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                      "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "SLURM_JOB_NODELIST": "n[1-2]", "MASTER_ADDR": "x" * 60}),
        (["simulate", "--nodes", "40", "--ppn", "3", "--np", "100", "--launcher", "flux"], {}),
        (["simulate", "--nodes", "3", "--ppn", "4", "--np", "10", "--strategy", "ddp"], {}),
        (["simulate", "--nodes", "3", "--ppn", "2", "--launcher", "intelmpi"], {}),
        # The lone rank of an uneven Slurm step: show's trainer line says why no devices/num_nodes fits.
        (["show"], {"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
                    "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "n[1-2]"}),
        (["show"], {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                    "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "a"}),
    ],
)  # fmt: skip
def test_doctor_and_simulate_lines_are_at_most_120_characters(argv, env, capsys):
    _run(argv, env)
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if not line.startswith(f"{PROG}: error: ")]  # errors: one line
    assert max(len(line) for line in [*out.splitlines(), *warnings]) <= WIDTH


# --- noise ----------------------------------------------------------------------------------------------------------


def test_doctor_says_nothing_of_pmix_under_plain_open_mpi_5(capsys):
    _run(["doctor"], OPEN_MPI_5)
    out = capsys.readouterr().out
    assert "[ok] launcher: Open MPI" in out
    assert "PMIx" not in out


def test_doctor_still_names_another_launcher_s_variables(capsys):
    _run(["doctor"], {**OPEN_MPI_5, "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"})
    assert "[info] launcher: Slurm srun variables" in capsys.readouterr().out


def test_the_demo_is_a_command(capsys):
    with mock.patch("lightning_mpi_env.tools.demo.main", return_value=3) as demo:
        assert main(["demo", "--timeout", "5", "--help"]) == 3
    demo.assert_called_once_with(["--timeout", "5", "--help"])
    assert "run a small real mpirun training job" in _help_of([])


def _help_of(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "lightning_mpi_env", *argv, "--help"], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout
