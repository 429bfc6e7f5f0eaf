"""``--json``: one object on one line for every command that prints a result, ``"ok"``, errors and warnings as data."""

from __future__ import annotations

import argparse
import json
import os
from unittest import mock

import pytest

from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.cli_parser import JSON_COMMANDS, build_parser
from tests.layouts import OPEN_MPI_RANK_5 as OPEN_MPI_RANK_ON_NODEA

OPEN_MPI_RANK_5 = {**OPEN_MPI_RANK_ON_NODEA, "MASTER_ADDR": "127.0.0.1"}
ONE_PER_NODE = {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}

RESULTS = {
    "show": (["show", "--json"], OPEN_MPI_RANK_5),
    "simulate": (["simulate", "--nodes", "2", "--per-node", "2", "--json"], {}),
    "torchrun-args": (["torchrun-args", "--nproc-per-node", "gpu", "--json"], ONE_PER_NODE),
    "doctor": (["doctor", "--json"], OPEN_MPI_RANK_5),
}
"""A run of each command that prints a result; ``exec``, ``run`` and ``simcluster`` run a command instead."""


@pytest.fixture
def environ():
    """Sets a clean environment (PATH kept) for one call of ``main``."""

    def run(env, argv):
        with mock.patch.dict(os.environ, {"PATH": os.environ["PATH"], **env}, clear=True):
            return main(argv)

    return run


def _one_object(out: str) -> dict[str, object]:
    assert out.count("\n") == 1, out  # one line: under mpirun every rank writes one
    result = json.loads(out)
    assert isinstance(result, dict)
    return result


def test_every_command_that_prints_a_result_takes_json():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    with_json = {name for name, sub in commands.items() if any("--json" in a.option_strings for a in sub._actions)}
    assert with_json == set(RESULTS) == set(JSON_COMMANDS)


@pytest.mark.parametrize("command", sorted(RESULTS))
def test_json_is_one_object_on_one_line_with_ok(command, environ, capsys):
    argv, env = RESULTS[command]
    assert environ(env, argv) == 0
    result = _one_object(capsys.readouterr().out)
    assert result["ok"] is True


def test_simulate_json_of_an_uneven_launch_with_warnings_is_data_not_a_type_error(environ, capsys):
    argv = ["simulate", "--nodes", "2", "--ppn", "2", "--np", "3", "--map-by", "node", "--strategy", "ddp", "--json"]
    assert environ({}, argv) == 1  # uneven under ddp: a problem, as without --json
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    result = _one_object(captured.out)
    assert (result["ok"], result["even"], result["ranks_per_node"]) == (False, False, {"node001": 2, "node002": 1})
    assert result["problems"]
    warned = [warning for row in result["ranks"] for warning in row["warnings"]]
    assert warned
    assert {warning["kind"] for warning in warned} == {"ApproximateNodeRankWarning"}
    assert all(warning["problem"] and warning["hint"] for warning in warned)
    assert [row["node_rank_exact"] for row in result["ranks"]] == [False, False, False]


def test_show_json_says_which_values_are_exact(environ, capsys):
    assert environ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, ["show", "--json"]) == 0
    result = _one_object(capsys.readouterr().out)
    assert (result["node_rank_exact"], result["num_nodes_exact"], result["num_nodes"]) == (True, True, 1)


def test_torchrun_args_json_is_the_argument_list(environ, capsys):
    assert environ(ONE_PER_NODE, ["torchrun-args", "--json"]) == 0
    assert _one_object(capsys.readouterr().out)["args"] == [
        "--nnodes=8",
        "--node_rank=5",
        "--nproc_per_node=1",
        "--master_addr=127.0.0.1",
        "--master_port=29611",
    ]


@pytest.mark.parametrize(
    ("argv", "env", "status", "kind", "variable", "value"),
    [
        (["show", "--json"], {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "x"}, 1, "LayoutError",
         "OMPI_COMM_WORLD_RANK", "x"),
        (["torchrun-args", "--json"], OPEN_MPI_RANK_5, 1, "LayoutError", None, None),
        (["simulate", "--nodes", "2", "--per-node", "2", "--np", "5", "--json"], {}, 2, "UsageError", "--np", "5"),
        (["simulate", "--nodes", "x", "--per-node", "2", "--json"], {}, 2, "UsageError", "--nodes", None),
        (["show", "--yaml", "--json"], {}, 2, "UsageError", None, None),
        (["simulate", "--nodes", str(10**17), "--per-node", str(10**17), "--np", "1", "--json"], {}, 2,
         "UsageError", "--nodes", str(10**17)),
        (["--json", "simulate", "--nodes", "x", "--per-node", "2"], {}, 2, "UsageError", "--nodes", None),
    ],
)  # fmt: skip
def test_an_error_under_json_is_an_object_with_the_same_status(argv, env, status, kind, variable, value, environ,
                                                             capsys):  # fmt: skip
    assert environ(env, argv) == status
    assert environ(env, [arg for arg in argv if arg != "--json"]) == status  # the same without --json
    out, err = capsys.readouterr()
    first, _ = out.split("\n", 1)
    result = _one_object(first + "\n")
    assert result["ok"] is False
    error = result["error"]
    assert isinstance(error, dict)
    assert set(error) == {"kind", "problem", "hint", "variable", "value", "launcher"}
    assert (error["kind"], error["problem"] != "", error["hint"] != "") == (kind, True, True)
    if variable is not None:
        assert (error["variable"], error["value"]) == (variable, value)
    assert err.count("error: ") == 2  # the person reading the log is told too, with and without --json
    assert "Traceback" not in err


def test_an_unexpected_exception_is_one_line_not_a_traceback(environ, capsys):
    with mock.patch("lightning_mpi_env.tools.cli.simulate", side_effect=RuntimeError("boom")):
        assert environ({}, ["simulate", "--nodes", "1", "--per-node", "1"]) == 1
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1
        assert "simulate failed unexpectedly: RuntimeError: boom HINT: Run it again with --debug" in captured.err
        assert environ({}, ["simulate", "--nodes", "1", "--per-node", "1", "--json"]) == 1
        assert _one_object(capsys.readouterr().out)["error"]["kind"] == "InternalError"  # type: ignore[index]
        with pytest.raises(RuntimeError, match="boom"):
            environ({}, ["simulate", "--nodes", "1", "--per-node", "1", "--debug"])
