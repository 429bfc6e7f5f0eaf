import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_mpi_env import cli
from lightning_mpi_env.cli import main
from lightning_mpi_env.errors import LayoutError
from lightning_mpi_env.interop import TORCH_VARIABLES
from lightning_mpi_env.simcluster import SimulatedCluster

ROOT = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = Path(sys.executable).parent / "lightning-mpi-env"
DDP_SCRIPT = ROOT / "examples" / "ddp_plain.py"
MPI_TIMEOUT = 180

OPEN_MPI_RANK_5 = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "nodea",
    "MASTER_PORT": "29611",
}


@pytest.fixture
def environ():
    """A clean process environment (PATH kept), restored whole after the test (exec writes to it); a setter."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ["PATH"] = saved["PATH"]
    yield os.environ.update
    os.environ.clear()
    os.environ.update(saved)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- help and usage errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["show"], ["simulate"], ["exec"], ["torchrun-args"], ["doctor"]])
def test_help_on_every_command(command, capsys):
    assert main([*command, "--help"]) == 0
    assert "usage: lightning-mpi-env" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["launch"], "invalid choice: 'launch'"),
        (["show", "--yaml"], "unrecognized arguments: --yaml"),
        (["simulate", "--ppn", "2"], "the following arguments are required: --nodes"),
        (["simulate", "--nodes", "0", "--ppn", "2"], "argument --nodes: must be a positive integer, got '0'"),
        (["simulate", "--nodes", "two", "--ppn", "2"], "argument --nodes: must be a positive integer, got 'two'"),
        (["simulate", "--nodes", "2", "--ppn", "-1"], "argument --ppn: must be a positive integer, got '-1'"),
        (["simulate", "--nodes", "2", "--ppn", "２"], "argument --ppn: must be a positive integer"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--launcher", "lam"], "argument --launcher: invalid choice: 'lam'"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--map-by", "core"], "argument --map-by: invalid choice: 'core'"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--np", "5"], "--np 5 is more than --nodes 2 x --ppn 2 = 4"),
        (["exec"], "no command given"),
        (["exec", "--"], "no command given"),
        (["torchrun-args", "--nproc-per-node", "0"], "must be a positive integer, got '0'"),
        (["torchrun-args", "--nproc-per-node", "four"], "must be a positive integer, got 'four'"),
        (["doctor", "--fix"], "unrecognized arguments: --fix"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys, environ):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# --- show ---------------------------------------------------------------------------------------------------------


def test_show_text(capsys, environ):
    environ(OPEN_MPI_RANK_5)
    assert main(["show"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "Open MPI, block placement: rank=5 (OMPI_COMM_WORLD_RANK) world_size=8 (OMPI_COMM_WORLD_SIZE)" in out
    assert "main_address=nodea (MASTER_ADDR) main_port=29611 (MASTER_PORT)" in out


def test_show_json(capsys, environ):
    environ(OPEN_MPI_RANK_5)
    assert main(["show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["global_rank"], shown["node_rank"], shown["local_rank"], shown["world_size"]) == (5, 1, 1, 8)
    assert shown["launcher"] == "openmpi"
    assert shown["sources"]["node_rank"].startswith("OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE")


def test_show_single_process(capsys, environ):
    assert main(["show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["launcher"] is None


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "-1"}, "OMPI_COMM_WORLD_RANK='-1' (Open MPI) is negative."),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "Open MPI variables are only partly set"),
        ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "9"}, "OMPI_COMM_WORLD_RANK=9 is out of range"),
        (
            {**OPEN_MPI_RANK_5, "MASTER_ADDR": ""},
            "Open MPI started 8 ranks on 2 nodes (4 on this node), but MASTER_ADDR is not set",
        ),
        ({**OPEN_MPI_RANK_5, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number"),
        ({**OPEN_MPI_RANK_5, "WORLD_SIZE": "4"}, "WORLD_SIZE='4' disagrees with Open MPI"),
    ],
)
def test_show_bad_layout_is_one_line_exit_1(variables, message, capsys, environ):
    environ(variables)
    assert main(["show"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"lightning-mpi-env: error: {message}")
    assert captured.err.count("\n") == 1
    assert " HINT: " in captured.err


def test_debug_raises_with_traceback(environ):
    environ({"OMPI_COMM_WORLD_RANK": "0"})
    with pytest.raises(LayoutError, match="only partly set"):
        main(["--debug", "show"])
    with pytest.raises(LayoutError, match="only partly set"):
        main(["show", "--debug"])


# --- simulate -----------------------------------------------------------------------------------------------------


def test_simulate_table(capsys, environ):
    assert main(["simulate", "--nodes", "2", "--ppn", "2", "--launcher", "slurm", "--map-by", "node"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# slurm under slurm: 4 ranks on 2 node(s) x 2 slots, --map-by node"
    assert out[1].split() == [
        "host", "global_rank", "node_rank", "local_rank", "world_size", "local_size", "main", "placement",
    ]  # fmt: skip
    assert out[3].split()[:4] == ["node002", "1", "1", "0"]
    assert out[-1] == "# OK"


def test_simulate_json(capsys, environ):
    assert main(["simulate", "--nodes", "3", "--ppn", "2", "--launcher", "pals", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["global_rank"], row["node_rank"], row["local_rank"], row["world_size"]) for row in rows] == [
        (rank, rank // 2, rank % 2, 6) for rank in range(6)
    ]


def test_simulate_problems_exit_1(capsys, environ):
    assert main(["simulate", "--nodes", "2", "--ppn", "4", "--np", "6", "--launcher", "intelmpi"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "# 3 problem(s)"
    assert "problem: nodes run different numbers of ranks (node001: 4, node002: 2)" in captured.err


def test_simulate_warnings_do_not_fail(capsys, environ):
    # 3 nodes x 2 in blocks: Open MPI's node rank is a guess (the right one), so the plugin would warn.
    assert main(["simulate", "--nodes", "3", "--ppn", "2", "--scheduler", "sge"]) == 0
    assert "warning: rank 2 on node002: Node rank 1 is approximate" in capsys.readouterr().err


# --- exec ---------------------------------------------------------------------------------------------------------


class Executed(Exception):
    pass


@pytest.fixture
def fake_execvp(monkeypatch):
    calls = []

    def execvp(file, argv):
        calls.append((file, argv, {name: os.environ.get(name) for name in TORCH_VARIABLES}))
        raise Executed

    monkeypatch.setattr(cli.os, "execvp", execvp)
    return calls


def test_exec_exports_and_replaces_process(fake_execvp, environ):
    environ(OPEN_MPI_RANK_5)
    with pytest.raises(Executed):
        main(["exec", "--", "python", "train.py", "--lr", "0.1"])
    ((file, argv, exported),) = fake_execvp
    assert (file, argv) == ("python", ["python", "train.py", "--lr", "0.1"])
    assert exported == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "nodea",
        "MASTER_PORT": "29611",
    }


def test_exec_without_double_dash_keeps_command_options(fake_execvp, environ):
    with pytest.raises(Executed):
        main(["exec", "python", "--overwrite"])
    assert fake_execvp[0][1] == ["python", "--overwrite"]


def test_exec_refuses_conflicting_values(fake_execvp, capsys, environ):
    environ({**OPEN_MPI_RANK_5, "NODE_RANK": "0", "GROUP_RANK": "1"})
    assert main(["exec", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightning-mpi-env: error: Refusing to overwrite NODE_RANK='0' (resolved: '1')")
    assert "exec --overwrite" in err
    assert not fake_execvp


def test_exec_refuses_stale_rank(fake_execvp, capsys, environ):
    environ({**OPEN_MPI_RANK_5, "RANK": "0"})
    assert main(["exec", "--", "true"]) == 1
    assert "RANK='0' disagrees with Open MPI" in capsys.readouterr().err


def test_exec_overwrite_replaces_stale_values(fake_execvp, environ):
    environ({**OPEN_MPI_RANK_5, "RANK": "0", "LOCAL_WORLD_SIZE": "x", "NODE_RANK": "7"})
    with pytest.raises(Executed):
        main(["exec", "--overwrite", "--", "true"])
    exported = fake_execvp[0][2]
    assert (exported["RANK"], exported["LOCAL_WORLD_SIZE"], exported["NODE_RANK"]) == ("5", "4", "1")


def test_exec_overwrite_keeps_launcher_variables(fake_execvp, capsys, environ):
    # Under a bare PMIx launcher WORLD_SIZE is the launcher's own: --overwrite must not drop it.
    environ({"PMIX_RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(Executed):
        main(["exec", "--overwrite", "--", "true"])
    assert fake_execvp[0][2]["WORLD_SIZE"] == "2"


def test_exec_command_not_found(capsys, environ):
    assert main(["exec", "--", "no-such-command-lightning-mpi-env"]) == 127
    assert "command not found: 'no-such-command-lightning-mpi-env'" in capsys.readouterr().err


def test_exec_not_executable(tmp_path, capsys, environ):
    script = tmp_path / "script.sh"
    script.write_text("echo hi\n")
    assert main(["exec", "--", str(script)]) == 126
    assert "is not executable" in capsys.readouterr().err


# --- torchrun-args and doctor -------------------------------------------------------------------------------------


def test_torchrun_args(capsys, environ):
    environ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert main(["torchrun-args", "--nproc-per-node", "4"]) == 0
    assert capsys.readouterr().out == (
        "--nnodes=8 --node_rank=5 --nproc_per_node=4 --master_addr=nodea --master_port=29611\n"
    )


def test_torchrun_args_refuses_several_per_node(capsys, environ):
    environ(OPEN_MPI_RANK_5)
    assert main(["torchrun-args"]) == 1
    assert "torchrun-args needs exactly one per node" in capsys.readouterr().err


def test_doctor_single_process(capsys, environ):
    environ({"MASTER_PORT": str(_free_port())})
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[info] launcher: no launcher detected" in out
    assert "[ok] main port:" in out


def test_doctor_error_exit_1(capsys, environ):
    environ({**OPEN_MPI_RANK_5, "LOCAL_RANK": "0"})
    assert main(["doctor"]) == 1
    assert "rank 5 on" in capsys.readouterr().out


# --- through a subprocess -----------------------------------------------------------------------------------------


def _run(*argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "lightning_mpi_env", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_module_help_and_version():
    result = _run("--help")
    assert result.returncode == 0
    assert "simulate" in result.stdout
    assert _run("--version").stdout.strip() == "lightning-mpi-env 0.1.0"


def test_module_simulate_json():
    result = _run("simulate", "--nodes", "2", "--ppn", "2", "--json")
    assert result.returncode == 0
    assert [row["global_rank"] for row in json.loads(result.stdout)] == [0, 1, 2, 3]


def test_module_error_is_one_line_without_traceback():
    result = _run("show", env={"PATH": os.environ["PATH"], "PMI_RANK": "0", "MPI_LOCALRANKID": "0"})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "MPICH/Intel MPI (Hydra) variables are only partly set" in result.stderr
    assert "Traceback" not in result.stderr


def test_module_usage_error():
    result = _run("simulate", "--nodes", "x", "--ppn", "1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_console_script_exec_runs_command():
    env = {"PATH": os.environ["PATH"], **OPEN_MPI_RANK_5}
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "exec", "--", sys.executable, "-c", "import os; print(os.environ['GROUP_RANK'])"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "1\n")


# --- real mpirun on two simulated nodes ---------------------------------------------------------------------------


def _results(stdout):
    return sorted((json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")),
                  key=lambda result: result["rank"])  # fmt: skip


@pytest.mark.mpi
def test_mpirun_exec_plain_torch_ddp(tmp_path):
    cluster = SimulatedCluster(tmp_path)
    result = cluster.run(
        [str(CONSOLE_SCRIPT), "exec", "--", sys.executable, str(DDP_SCRIPT)],
        timeout=MPI_TIMEOUT,
        export=cluster.job_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = _results(result.stdout)
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in results] == [
        (0, 4, 0, 0),
        (1, 4, 1, 0),
        (2, 4, 0, 1),
        (3, 4, 1, 1),
    ]
    assert {r["all_reduce"] for r in results} == {6.0}
    assert {r["master"].split(":")[0] for r in results} == {"127.0.0.2"}
    # Ranks on one simulated node share its host name (each node has its own where the kernel allows it).
    assert results[0]["hostname"] == results[1]["hostname"]
    assert results[2]["hostname"] == results[3]["hostname"]


@pytest.mark.mpi
def test_mpirun_torchrun_args_one_process_per_node(tmp_path):
    cluster = SimulatedCluster(tmp_path)
    bin_dir = Path(sys.executable).parent
    command = f"{bin_dir}/torchrun $({CONSOLE_SCRIPT} torchrun-args --nproc-per-node 2) {DDP_SCRIPT}"
    result = cluster.run(
        ["sh", "-c", command],
        timeout=MPI_TIMEOUT,
        np=2,
        map_by="node",
        export={**cluster.job_environment(), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = _results(result.stdout)
    assert [(r["rank"], r["world_size"], r["local_rank"], r["node_rank"]) for r in results] == [
        (0, 4, 0, 0),
        (1, 4, 1, 0),
        (2, 4, 0, 1),
        (3, 4, 1, 1),
    ]
    assert {r["all_reduce"] for r in results} == {6.0}


@pytest.mark.mpi
def test_mpirun_show_json_one_line_per_rank(tmp_path):
    cluster = SimulatedCluster(tmp_path)
    result = cluster.run(
        [str(CONSOLE_SCRIPT), "show", "--json"], timeout=MPI_TIMEOUT, map_by="node", export=cluster.job_environment()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    shown = sorted((json.loads(line) for line in lines), key=lambda row: row["global_rank"])
    assert [(row["global_rank"], row["node_rank"], row["local_rank"]) for row in shown] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]
    assert {(row["launcher"], row["main_address"]) for row in shown} == {("openmpi", "127.0.0.2")}
    # Ranks 0 and 3 fit block and round-robin placement alike (same node); ranks 1 and 2 only round-robin.
    assert [row["placement"] for row in shown] == ["block", "round_robin", "round_robin", "block"]
    assert len({row["main_port"] for row in shown}) == 1
