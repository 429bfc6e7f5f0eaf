"""Every subcommand and flag of the CLI, ``--json`` included, with any values: a result or one named error.

:data:`OPTIONS` has a strategy for every option of every command, and a test walks the argparse parser so that a new
command or flag fails until it is covered here. Nothing is launched: ``exec``'s ``execvp``, ``simcluster``'s
``mpirun``, ``run``'s supervisor and the demo are replaced, names resolve on this machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import Explained
from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.cli_parser import JSON_COMMANDS, build_parser
from lightning_mpi_env.tools.simcluster import SimulatedCluster
from lightning_mpi_env.tools.simulated_launch import LAUNCHER_KEYS, SCHEDULERS

HOSTILE = ["", "x", "-1", "0", "1e3", "\u0663", "9" * 40, "nan", "a=b", "--"]
COUNT = st.one_of(st.integers(1, 4).map(str), st.sampled_from(HOSTILE))
SECONDS = st.one_of(st.sampled_from(["0.5", "2", "86400", "86401", "inf"]), st.sampled_from(HOSTILE))
FLAG: st.SearchStrategy[list[str]] = st.just([])


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """``run`` makes its state folder under the working folder: each test's goes to its own, not the checkout."""
    monkeypatch.chdir(tmp_path)


def _one(values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return values.map(lambda value: [value])


def _choice(*choices: str) -> st.SearchStrategy[list[str]]:
    return _one(st.sampled_from([*choices, "bogus"]))


COMMAND = st.lists(st.sampled_from(["true", "--", "python", "-c", "pass", "--json", "srun", "mpirun"]), max_size=4)
"""A command after the options (``exec``, ``simcluster``, ``run``), ``--`` or not."""

COMMON = {"-h": FLAG, "--help": FLAG, "--debug": FLAG}
OPTIONS: dict[str, dict[str, st.SearchStrategy[list[str]]]] = {
    "": {**COMMON, "--version": FLAG, "--json": FLAG},
    "show": {**COMMON, "--json": FLAG},
    "simulate": {
        **COMMON,
        "--nodes": _one(COUNT),
        "--per-node": _one(COUNT),
        "--ppn": _one(COUNT),
        "--np": _one(COUNT),
        "--map-by": _choice("slot", "node"),
        "--launcher": _choice(*LAUNCHER_KEYS),
        "--scheduler": _choice(*SCHEDULERS),
        "--strategy": _choice("ddp_mpi", "ddp", "fsdp", "deepspeed"),
        "--json": FLAG,
    },
    "exec": {**COMMON, "--overwrite": FLAG, "cmd": COMMAND},
    "torchrun-args": {
        **COMMON,
        "--nproc-per-node": _one(st.one_of(COUNT, st.sampled_from(["gpu", "cpu", "auto"]))),
        "--json": FLAG,
    },
    "run": {
        **COMMON,
        "--restarts": _one(COUNT),
        "--backoff": _one(SECONDS),
        "--probe-timeout": _one(SECONDS),
        "--grace": _one(SECONDS),
        "--min-nodes": _one(COUNT),
        "--leave-out-stragglers": FLAG,
        "--state-dir": _one(st.sampled_from(["state", ""])),
        "cmd": COMMAND,
    },
    "doctor": {**COMMON, "--json": FLAG},
    "simcluster": {
        **COMMON,
        "--nodes": _one(COUNT),
        "--per-node": _one(COUNT),
        "--ppn": _one(COUNT),
        "--np": _one(COUNT),
        "--map-by": _choice("slot", "node"),
        "-x": _one(st.sampled_from(["A=1", "MASTER_ADDR=127.0.0.1", "1A=2", "B"])),
        "--export": _one(st.sampled_from(["A=1", "=1"])),
        "--timeout": _one(SECONDS),
        "cmd": COMMAND,
    },
    "demo": {"args": COMMAND},
}
"""Each command's options (and ``cmd`` or ``args``, the words after them) with the values drawn for them."""
POSITIONAL = ("cmd", "args")

LAUNCH = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29611",
}
ENVIRONMENTS = st.sampled_from(
    [
        {},
        LAUNCH,
        {**LAUNCH, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},  # two on a node: torchrun-args refuses it
        {**LAUNCH, "OMPI_COMM_WORLD_RANK": "x"},
        {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": "10x", "LIGHTNING_MPI_ENV_STALL_TIMOUT": "1"},
    ]
)


def _parser_options() -> set[tuple[str, str]]:
    """Every (command, option) of the parser; ``""`` for the options before the command, ``cmd`` for positionals."""
    parser = build_parser()
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.add((name, ""))
                for sub_action in sub._actions:
                    found.update((name, option) for option in sub_action.option_strings or [sub_action.dest])
        else:
            found.update(("", option) for option in action.option_strings)
    return found


def test_every_command_and_flag_is_covered():
    covered = {(command, option) for command, options in OPTIONS.items() for option in options}
    covered |= {(command, "") for command in OPTIONS if command}
    assert _parser_options() == covered


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(name for name in OPTIONS if name)))
    options = OPTIONS[command]
    required = [name for name in ("--nodes", "--per-node") if command == "simulate" and draw(st.integers(0, 9)) > 0]
    flags = sorted(set(options) - set(POSITIONAL))
    others = draw(st.lists(st.sampled_from(flags), unique=True, max_size=4)) if flags else []
    argv = draw(st.lists(st.sampled_from(sorted(OPTIONS[""])), unique=True, max_size=1)) + [command]
    for name in dict.fromkeys([*required, *others]):
        argv += [name, *draw(options[name])]
    for name in POSITIONAL:
        if name in options:
            argv += draw(options[name])
    return argv


def _loopback_getaddrinfo(host, port, *args, **kwargs):
    if host in ("localhost", "127.0.0.1"):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command_lines(), env=ENVIRONMENTS)
def test_any_command_line_is_a_result_or_one_named_error(capsys, argv, env):
    done = subprocess.CompletedProcess(args=[], returncode=0)
    with (
        mock.patch.dict(os.environ, {"PATH": os.environ["PATH"], **env}, clear=True),
        mock.patch("socket.getaddrinfo", _loopback_getaddrinfo),
        mock.patch("lightning_mpi_env.tools.cli._execvp", return_value=0),
        mock.patch("lightning_mpi_env.tools.cli.supervise", return_value=0),
        mock.patch.object(SimulatedCluster, "run", return_value=done),
        mock.patch("lightning_mpi_env.tools.demo.main", return_value=0),
    ):
        raised: Exception | None = None
        try:
            status = main(argv)
        except Exception as error:
            raised = error
    if raised is not None:  # only under --debug, and only our own errors
        assert "--debug" in argv, (argv, raised)
        assert isinstance(raised, Explained), (argv, raised)
        return
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert status in (0, 1, 2), (argv, status, err)
    options = argv[: argv.index("--")] if "--" in argv else argv
    command = next(word for word in argv if word in OPTIONS)
    helped = status == 0 and {"-h", "--help", "--version"} & set(options)  # argparse's help, not a result
    if command not in JSON_COMMANDS:
        assert not out.startswith("{"), (argv, out)  # --json refused where there is no result: no JSON either
    if "--json" in options and command in JSON_COMMANDS and not helped:
        (line,) = out.splitlines()
        result = json.loads(line)
        assert result["ok"] is (status == 0), (argv, result)
        if status == 2 or "error" in result:
            assert set(result["error"]) == {"kind", "problem", "hint", "variable", "value", "launcher"}
    elif status in (1, 2) and command != "doctor":  # doctor's findings are its report
        assert err.splitlines()[-1].startswith("lightning-mpi-env: error: "), (argv, err)  # one form everywhere
        assert "HINT: " in err.splitlines()[-1], (argv, err)
