from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_mpi_env import LayoutError, MPIClusterEnvironment
from lightning_mpi_env.core.errors import ApproximateNodeRankWarning, FabricWarning, LayoutWarning, SettingError
from lightning_mpi_env.core.launchers import OPEN_MPI, SRUN
from lightning_mpi_env.core.network import local_interfaces
from lightning_mpi_env.gpu.devices import DeviceBasis, DeviceChoice
from lightning_mpi_env.lightning import environment as environment_module
from lightning_mpi_env.lightning.compat import SRUN_NOT_USED
from lightning_mpi_env.lightning.roll_call import RollCallOutcome
from tests.layouts import launcher_env

ADDRESS = {"MASTER_ADDR": "nodea", "MASTER_PORT": "29611"}


def open_mpi(rank: int = 5, world_size: int = 8, local_size: int = 4, **extra: str) -> dict[str, str]:
    env = launcher_env(
        OPEN_MPI,
        rank=rank,
        world_size=world_size,
        local_rank=rank % local_size,
        local_size=local_size,
        node=rank // local_size,
        num_nodes=world_size // local_size,
    )
    return {**env, **ADDRESS, **extra}


def test_reports_the_launcher_s_layout():
    environment = MPIClusterEnvironment(open_mpi())
    assert environment.creates_processes_externally
    assert (environment.world_size(), environment.global_rank(), environment.local_rank()) == (8, 5, 1)
    assert environment.node_rank() == 1
    assert (environment.main_address, environment.main_port) == ("nodea", 29611)
    assert repr(environment) == (
        "MPIClusterEnvironment(RankLayout(rank=5/8, local=1/4, node=1~/2~, main=nodea:29611, from=Open MPI))"
    )


def test_bad_layout_fails_when_the_environment_is_made():
    with pytest.raises(LayoutError, match=r"OMPI_COMM_WORLD_RANK='x' \(Open MPI\)"):
        MPIClusterEnvironment(open_mpi(OMPI_COMM_WORLD_RANK="x"))


def test_set_global_rank_and_world_size_keep_the_launcher_s_values(caplog: pytest.LogCaptureFixture):
    environment = MPIClusterEnvironment(open_mpi())
    with caplog.at_level(logging.DEBUG, logger="lightning_mpi_env.lightning.environment"):
        environment.set_global_rank(1)  # what Lightning computes: node_rank * devices + local_rank
        environment.set_world_size(2)
    assert (environment.global_rank(), environment.world_size()) == (5, 8)
    assert "Keeping the launcher's global rank 5; Lightning proposed 1." in caplog.text
    assert "Keeping the launcher's world size 8; Lightning proposed 2." in caplog.text


def test_detect(monkeypatch: pytest.MonkeyPatch):
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MPI_LOCALRANKID", "SLURM_STEP_ID", "PMIX_RANK", "PALS_RANKID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MV2_COMM_WORLD_RANK", raising=False)
    assert not MPIClusterEnvironment.detect()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert MPIClusterEnvironment.detect()


def test_validate_settings_accepts_the_launched_world():
    MPIClusterEnvironment(open_mpi()).validate_settings(num_devices=4, num_nodes=2)


@pytest.mark.parametrize(
    ("devices", "num_nodes", "match"),
    [
        (
            8,
            1,
            r"Open MPI launched 8 ranks, 4 per node \(2 node\(s\);.*"
            r"but Trainer/Fabric\(devices=8, num_nodes=1\) expects",
        ),
        (4, 1, r"Trainer/Fabric\(devices=4, num_nodes=1\) expects 4 ranks, 4 per node"),
        # Open MPI exports no node count: the fix that holds for an uneven launch comes first.
        (2, 4, r"If every node runs 4: Trainer/Fabric\(devices=4, num_nodes=2\), or launch 8 ranks with 2 per node"),
    ],
)
def test_validate_settings_names_the_world_the_trainer_and_the_fix(devices, num_nodes, match):
    with pytest.raises(LayoutError, match=match):
        MPIClusterEnvironment(open_mpi()).validate_settings(num_devices=devices, num_nodes=num_nodes)


def test_validate_settings_under_per_task_gpus_points_at_ddp_mpi():
    # srun --gpus-per-task=1 (https://slurm.schedmd.com/srun.html): Trainer(strategy="ddp") with devices="auto" sees
    # one GPU per rank; Lightning's DDPStrategy would drive cuda:<local rank>, which this rank does not have. The
    # plugin has no public hook that chooses the device, so the error names the strategy that does.
    environment = MPIClusterEnvironment(open_mpi(CUDA_VISIBLE_DEVICES="3"))
    with pytest.raises(LayoutError, match=r"sees CUDA_VISIBLE_DEVICES='3', a subset .* use strategy=\"ddp_mpi\""):
        environment.validate_settings(num_devices=1, num_nodes=2)


def test_the_device_is_not_the_local_rank_under_per_task_gpus():
    environment = MPIClusterEnvironment(open_mpi(CUDA_VISIBLE_DEVICES="3"), roll_call=False)
    choice = environment.device_for("cuda")
    assert (environment.local_rank(), choice.index, choice.device_id, choice.exact) == (1, 0, "3", True)


SLURM_UNEVEN = {
    # srun -N3 -n11 (https://slurm.schedmd.com/srun.html, SLURM_STEP_TASKS_PER_NODE: "the number of tasks per node,
    # in the same order as SLURM_STEP_NODELIST", counts compressed as "2(x3),1"): 4 + 4 + 3; this is the third node.
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "8",
    "SLURM_NTASKS": "11",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "2",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2),3",
    **ADDRESS,
}


def test_validate_settings_refuses_uneven_ranks_per_node_naming_ddp_mpi():
    # The plugin with Lightning's own strategies (ddp, fsdp, deepspeed): devices x num_nodes cannot describe it.
    environment = MPIClusterEnvironment(SLURM_UNEVEN)
    assert environment.layout.launcher is SRUN
    with pytest.raises(LayoutError) as raised:
        environment.validate_settings(num_devices=4, num_nodes=3)
    text = str(raised.value)
    assert "Slurm srun placed ranks unevenly: this node runs SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]=3 of 11" in text
    assert 'HINT: Use strategy="ddp_mpi" with no devices/num_nodes' in text
    assert "(FSDP hybrid sharding, ModelParallel) need an even launch" in text
    # Fitting even launches on these 3 nodes, in srun's words: 4 per node (12 ranks) or 3 per node (9 ranks).
    assert "`srun --ntasks=12 --ntasks-per-node=4` or `srun --ntasks=9 --ntasks-per-node=3`" in text


def test_validate_settings_under_open_mpi_uneven_hint_has_no_wrong_count():
    # 3 + 1 slots with --map-by slot, seen from the node with 3: no node count is exported, so no number is made up
    # (the "-np 1" for a four-rank job).
    environment = MPIClusterEnvironment(open_mpi(rank=2, world_size=4, local_size=3))
    with pytest.raises(LayoutError) as raised:
        environment.validate_settings(num_devices=1, num_nodes=1)
    text = str(raised.value)
    assert "Open MPI placed ranks unevenly: this node runs OMPI_COMM_WORLD_LOCAL_SIZE=3 of 4 ranks" in text
    assert "`mpirun -np <nodes x N> --map-by ppr:N:node`" in text
    assert "-np 1 " not in text


def test_validate_settings_under_ddp_mpi_takes_uneven_launches():
    # "ddp_mpi" sets any_layout: its world, ranks, devices and sampler come from the launch.
    environment = MPIClusterEnvironment(SLURM_UNEVEN)
    environment.any_layout = True
    environment.validate_settings(num_devices=3, num_nodes=3)  # this node's count; Slurm's node count
    assert environment.num_nodes == 3
    lone = MPIClusterEnvironment(open_mpi(rank=3, world_size=4, local_size=1))  # 3 + 1: the node with 1
    lone.any_layout = True
    lone.validate_settings(num_devices=1, num_nodes=4)  # its own reckoning: the roll call counts the hosts
    lone.validate_settings(num_devices=1, num_nodes=2)  # given, and true: not refused on a guess


def test_validate_settings_under_ddp_mpi_refuses_what_the_launch_contradicts():
    environment = MPIClusterEnvironment(SLURM_UNEVEN, roll_call=False)
    environment.any_layout = True
    with pytest.raises(LayoutError, match=r"Trainer/Fabric\(devices=4\) was given, but Slurm srun started "):
        environment.validate_settings(num_devices=4, num_nodes=3)
    with pytest.raises(
        LayoutError,
        match=r"(?s)num_nodes=2\) was given, but the 11 ranks Slurm srun launched run on 3 node\(s\) "
        r"\(len\(SLURM_STEP_TASKS_PER_NODE\)\).*HINT: Leave num_nodes out",
    ):
        environment.validate_settings(num_devices=3, num_nodes=2)


def test_validate_settings_catches_the_uneven_node_that_looks_even():
    # 1 + 1 + 2 ranks: the last node alone looks like half of an even 2 x 2 job, the others do not. What it says is
    # this node's reckoning, and the hint names the uneven case.
    lone = MPIClusterEnvironment(open_mpi(rank=0, world_size=4, local_size=1))
    with pytest.raises(LayoutError) as raised:
        lone.validate_settings(num_devices=2, num_nodes=2)
    text = str(raised.value)
    assert "launched 4 ranks, 1 per node" in text
    assert "Open MPI exports no node count: the node count assumes every node runs as many" in text
    assert 'an uneven launch), no devices/num_nodes fits: use strategy="ddp_mpi" and pass neither' in text


@pytest.mark.parametrize("any_layout", [False, True])
def test_the_guessed_node_count_leads_with_the_fix_that_holds_for_an_uneven_launch(any_layout):
    # mpirun --np 3 on 2 nodes: the node of one rank guesses 3 nodes of 1. Trainer(devices=1, num_nodes=3) would be
    # wrong for this 2 + 1 launch: passing neither (with "ddp_mpi") is right for both, so it comes first.
    lone = MPIClusterEnvironment(open_mpi(rank=2, world_size=3, local_size=1))
    lone.any_layout = any_layout
    with pytest.raises(LayoutError) as raised:
        lone.validate_settings(num_devices=2, num_nodes=2)
    assert raised.value.hint.startswith(
        'If nodes run different numbers of ranks (an uneven launch), no devices/num_nodes fits: use strategy="ddp_mpi"'
        " and pass neither. If every node runs 1: Trainer/Fabric(devices=1, num_nodes=3)"
    ), raised.value.hint


def test_approximate_node_rank_warns_once_at_construction_without_the_roll_call():
    env = launcher_env(OPEN_MPI, rank=2, world_size=6, local_rank=0, local_size=2, node=2, num_nodes=3)
    with pytest.warns(LayoutWarning, match=r"Node rank 1 is approximate.*strategy='ddp_mpi'"):
        MPIClusterEnvironment({**env, **ADDRESS}, roll_call=False)
    with pytest.warns(ApproximateNodeRankWarning):
        MPIClusterEnvironment({**env, **ADDRESS, "LIGHTNING_MPI_ENV_ROLL_CALL": "0"})


def test_with_the_roll_call_an_approximate_node_rank_is_not_worth_a_warning(recwarn: pytest.WarningsRecorder):
    # The roll call replaces the guess with the exact node rank before init_process_group, before any use.
    env = launcher_env(OPEN_MPI, rank=2, world_size=6, local_rank=0, local_size=2, node=2, num_nodes=3)
    environment = MPIClusterEnvironment({**env, **ADDRESS})
    assert environment.roll_call
    assert not [w for w in recwarn if issubclass(w.category, LayoutWarning)]


@pytest.mark.parametrize("value", ["maybe", "2", "-"])
def test_roll_call_variable_is_parsed_strictly(value):
    with pytest.raises(SettingError, match=rf"LIGHTNING_MPI_ENV_ROLL_CALL='{value}' is not one of 1, 0"):
        MPIClusterEnvironment({**open_mpi(), "LIGHTNING_MPI_ENV_ROLL_CALL": value})


def test_no_launcher_is_a_single_local_process():
    environment = MPIClusterEnvironment({})
    assert not environment.creates_processes_externally
    assert (environment.world_size(), environment.global_rank(), environment.main_address) == (1, 0, "127.0.0.1")


def test_never_writes_the_environment(monkeypatch: pytest.MonkeyPatch):
    import os

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    environment = MPIClusterEnvironment(open_mpi())
    _ = environment.main_address, environment.main_port, environment.node_rank()
    environment.teardown()
    assert dict(os.environ) == before


# --- in each Lightning namespace, in a fresh interpreter --------------------------------------------------------

TRAINER_PROGRAM = """
import json, os, sys
os.environ.update({env})
{first}
{second}
environment = MPIClusterEnvironment()
from {namespace} import {entry}
if "{entry}" == "Trainer":
    runner = {entry}(accelerator="cpu", devices=4, num_nodes=2, strategy="ddp", plugins=[environment], logger=False)
else:
    runner = {entry}(accelerator="cpu", devices=4, num_nodes=2, strategy="ddp", plugins=[environment])
print(json.dumps({{
    "same_object": runner.strategy.cluster_environment is environment,
    "global_rank": runner.global_rank, "local_rank": runner.local_rank, "node_rank": runner.node_rank,
    "world_size": runner.world_size, "mpi4py_loaded": "mpi4py" in sys.modules,
    "other_namespace_loaded": "{other}" in sys.modules,
}}))
"""


@pytest.mark.parametrize(
    ("namespace", "entry", "other"),
    [
        ("lightning.pytorch", "Trainer", "pytorch_lightning"),
        ("pytorch_lightning", "Trainer", "lightning"),
        ("lightning.fabric", "Fabric", "lightning_fabric"),
        ("lightning_fabric", "Fabric", "lightning"),
    ],
)
@pytest.mark.parametrize(
    "ours_first",
    # Lightning first is the guard's other path (test_mixed_imports.py meets both): in the whole suite only.
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["ours-first", "lightning-first"],
)
def test_one_class_works_in_every_namespace(tmp_path: Path, namespace, entry, other, ours_first):
    ours = "from lightning_mpi_env import MPIClusterEnvironment"
    theirs = f"import {namespace}"
    program = TRAINER_PROGRAM.format(
        env=repr(open_mpi(rank=6)),
        first=ours if ours_first else theirs,
        second=theirs if ours_first else ours,
        namespace=namespace,
        entry=entry,
        other=other,
    )
    result = run_python(program, tmp_path)
    assert result == {
        "same_object": True,
        "global_rank": 6,
        "local_rank": 2,
        "node_rank": 1,
        "world_size": 8,
        "mpi4py_loaded": False,
        "other_namespace_loaded": False,
    }


def test_behaves_the_same_with_a_broken_mpi4py_installed(tmp_path: Path):
    # An mpi4py whose import would hang or fail must never be touched.
    fake = tmp_path / "fake" / "mpi4py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise SystemExit('mpi4py was imported')\n")
    program = TRAINER_PROGRAM.format(
        env=repr(open_mpi(rank=6)),
        first="from lightning_mpi_env import MPIClusterEnvironment",
        second="",
        namespace="lightning.pytorch",
        entry="Trainer",
        other="pytorch_lightning",
    )
    result = run_python(program, tmp_path, pythonpath=tmp_path / "fake")
    assert (result["global_rank"], result["mpi4py_loaded"]) == (6, False)


def run_python(program: str, cwd: Path, pythonpath: Path | None = None) -> dict[str, object]:
    import os

    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMPI_", "PMI", "SLURM_"))}
    root = str(Path(__file__).parents[2])
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in (pythonpath, root) if path)
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --- no rank trains alone: every route that involves this environment, under a launcher of 4 ranks -------------------

LONE = """
import json, os, sys
os.environ.update({env})
import torch
import {namespace} as L
from lightning_mpi_env import MPIClusterEnvironment, LayoutError

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, index):
        print("TRAINED ALONE", flush=True)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)

try:
    trainer = L.Trainer({arguments}, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    print("STRATEGY", type(trainer.strategy).__name__, flush=True)
    trainer.fit(Model())
except LayoutError as error:
    print("REFUSED", error.one_line(), flush=True)
"""

LONE_FABRIC = """
import os
os.environ.update({env})
import torch
import {namespace} as F
from lightning_mpi_env import MPIClusterEnvironment, LayoutError

try:
    fabric = F.Fabric({arguments})
    print("STRATEGY", type(fabric.strategy).__name__, flush=True)
    fabric.launch()
    model = fabric.setup_module(torch.nn.Linear(2, 1))
    print("TRAINED ALONE", flush=True)
except LayoutError as error:
    print("REFUSED", error.one_line(), flush=True)
"""


ALTERNATIVE = """
import os
os.environ.update({env})
import {namespace} as L
import lightning_mpi_env  # noqa: F401 (registers "ddp_mpi")

built = L.{api}({arguments})
print("STRATEGY", type(built.strategy).__name__, built.world_size, built.strategy.num_nodes, flush=True)
"""


@pytest.mark.parametrize(
    ("namespace", "api", "arguments"),
    [
        ("lightning.pytorch", "Trainer", "accelerator='cpu', strategy='ddp_mpi'"),
        ("pytorch_lightning", "Trainer", "accelerator='cpu', devices=1, strategy='ddp_mpi'"),
        ("lightning.fabric", "Fabric", "accelerator='cpu', strategy='ddp_mpi'"),
        ("lightning_fabric", "Fabric", "accelerator='cpu', devices=1, strategy='ddp_mpi'"),
    ],
)
def test_ddp_mpi_never_lets_a_rank_train_alone(tmp_path, namespace, api, arguments):
    # With the plugin alone, one device makes Lightning pick a single-device strategy that never calls the
    # environment (docs/lightning.md): the documented alternative, "ddp_mpi", takes the launch's 4 ranks instead.
    env = {**open_mpi(rank=1, world_size=4, local_size=2), "LIGHTNING_MPI_ENV_ROLL_CALL": "0"}
    code = ALTERNATIVE.format(env=repr(env), namespace=namespace, api=api, arguments=arguments)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert "STRATEGY MPIDDPStrategy 4 2" in result.stdout, result.stdout + result.stderr[-2000:]


def test_a_single_process_may_train_on_one_device(tmp_path):
    # Without a launcher (or with one rank) a single-device strategy is right: nothing to refuse.
    code = LONE.format(env=repr({}), namespace="lightning.pytorch", arguments="accelerator='cpu', "
                       "plugins=[MPIClusterEnvironment()]")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert "TRAINED ALONE" in result.stdout, result.stderr[-2000:]
    assert "REFUSED" not in result.stdout


def test_the_fabric_interface_is_exported_right_before_init_and_put_back_at_teardown(monkeypatch: pytest.MonkeyPatch):
    # gloo and NCCL read GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME from os.environ only; lo is on every Linux host.
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")  # the user's own value stays as it was
    environment = MPIClusterEnvironment({**open_mpi(), "LIGHTNING_MPI_ENV_IFNAME": "lo"}, roll_call=False)
    assert "GLOO_SOCKET_IFNAME" not in os.environ  # nothing on construction
    environment.set_world_size(8)  # Lightning's two proposals, then its read of the address: init comes next
    environment.set_world_size(8)
    assert environment.main_address == "nodea"
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    environment.teardown()
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_roll_call_run_early_for_the_device_exports_the_fabric_interface_first(monkeypatch: pytest.MonkeyPatch):
    # "ddp_mpi" asks for its device before Lightning's address read when only the roll call can say it (4 ranks
    # here, each seeing 2 of the socket's GPUs: srun --gpu-bind=closest). That earlier roll call is the one before
    # init_process_group, so the fabric's exports must be in place by then too. The roll call itself is recorded, not
    # run: tests/rollcall/test_rendezvous.py meets real ranks for the device.
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    env = {**open_mpi(rank=1, world_size=4), "CUDA_VISIBLE_DEVICES": "0,1", "LIGHTNING_MPI_ENV_IFNAME": "lo"}
    environment = MPIClusterEnvironment(env)
    seen = {}

    def run_roll_call(*args, **claim):
        seen["gloo"], seen["nccl"] = os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME")
        nodes = SimpleNamespace(node_rank=0, num_nodes=1)
        device = DeviceChoice(1, DeviceBasis.ROLL_CALL, ("0", "1"), "CUDA_VISIBLE_DEVICES")
        return RollCallOutcome(SimpleNamespace(nodes=nodes), device, None)

    monkeypatch.setattr(environment_module, "run_roll_call", run_roll_call)
    assert environment.device_for("cuda").index == 1
    assert seen == {"gloo": "lo", "nccl": "lo"}
    environment.teardown()
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_a_fabric_interface_that_contradicts_gloo_s_fails_when_the_environment_is_made():
    env = {**open_mpi(), "LIGHTNING_MPI_ENV_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "eth9"}
    with pytest.raises(SettingError, match=r"LIGHTNING_MPI_ENV_IFNAME='lo'.*GLOO_SOCKET_IFNAME='eth9'"):
        MPIClusterEnvironment(env)


def test_rank_zero_warns_when_the_main_host_is_off_the_fabric_interface():
    # A real interface of this host other than lo, and its address as the main address: rank 0's node then resolves
    # the main host to that interface's network, not to the fabric's (lo here).
    others = [i for i in local_interfaces() if i.name != "lo" and any("." in a for a in i.addresses)]
    if not others:
        pytest.skip("this host has no IPv4 interface besides lo")
    address = next(a for a in others[0].addresses if "." in a).split("/")[0]
    env = {**open_mpi(rank=0), "MASTER_ADDR": address, "LIGHTNING_MPI_ENV_IFNAME": "lo"}
    environment = MPIClusterEnvironment(env, roll_call=False)
    environment.set_world_size(8)
    environment.set_world_size(8)
    try:
        with pytest.warns(FabricWarning, match=rf"resolves to {re.escape(address)} \({others[0].name}\), not to an"):
            assert environment.main_address == address
    finally:
        environment.teardown()


# --- Lightning's srun advice under srun in an allocation named as salloc names it ------------------------------------

SRUN_JOB = Path(__file__).parents[1] / "jobs" / "srun_advice.py"


def interactive_srun_task(fake_srun: Path, port: int) -> dict[str, str]:
    """Task 0 of a one-task `srun` step in an allocation named ``interactive``, with ``srun`` on ``PATH``.

    ``SLURMEnvironment.detect()`` takes such a step for an interactive session (its job name), so Lightning advises
    prepending `srun` to a program that srun started.
    """
    env = launcher_env(SRUN, rank=0, world_size=1, local_rank=0, local_size=1, node=0, num_nodes=1)
    return {
        **env,
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "interactive",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PATH": f"{fake_srun}{os.pathsep}{os.environ['PATH']}",
    }


@pytest.fixture
def fake_srun(tmp_path: Path) -> Path:
    """A directory holding an executable ``srun`` (never run: Lightning only looks for it on ``PATH``)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    (directory / "srun").write_text("#!/bin/sh\nexit 1\n")
    (directory / "srun").chmod(0o755)
    return directory


ADVICE_PROGRAM = """
import warnings
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning_mpi_env import MPIClusterEnvironment
from lightning_mpi_env.lightning.compat import SRUN_NOT_USED

def advice(caught):
    seen = len(caught)
    SLURMEnvironment.detect()  # what fit() and hpc_checkpoint() call
    return sum(str(warning.message).startswith(SRUN_NOT_USED) for warning in caught[seen:])

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # every time, not once: the package's filter goes in front of this one
    alone = advice(caught)  # a program that does not use the package: Lightning's own warning
    environment = MPIClusterEnvironment()
    during = advice(caught)
    environment.teardown()  # the end of the run
    after = advice(caught)
print("ADVICE", alone, during, after)
"""


def test_the_srun_advice_is_lightning_s_until_an_environment_is_made_and_again_after_its_run(fake_srun: Path):
    # In a fresh interpreter: an environment made and never ended elsewhere (another test) holds the shared filter.
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMPI_", "PMI", "SLURM_"))}
    env.update(interactive_srun_task(fake_srun, 29500))
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    done = subprocess.run(
        [sys.executable, "-c", ADVICE_PROGRAM], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ADVICE 1 0 1" in done.stdout, done.stdout + done.stderr[-3000:]


@pytest.mark.parametrize(
    ("api", "setup"),
    [("trainer", "instance"), ("fabric", "instance"), pytest.param("trainer", "plugin", marks=pytest.mark.slow)],
)
def test_a_run_under_srun_in_an_interactive_allocation_gets_no_srun_advice(
    tmp_path: Path, fake_srun: Path, api: str, setup: str
):
    # The Trainer's fit() asks SLURMEnvironment.detect() before any hook of a run: the environment, made with the
    # strategy or as the plugin before the Trainer, silences it from then on. No other warning of Lightning is hidden.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMPI_", "PMI", "SLURM_"))}
    env.update(interactive_srun_task(fake_srun, port))
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    done = subprocess.run(
        [sys.executable, str(SRUN_JOB), "--api", api, "--setup", setup],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"DONE rank=0 setup={setup}" in done.stdout, done.stdout[-2000:]
    assert SRUN_NOT_USED not in done.stderr, done.stderr[-3000:]
