"""The device this package chooses reaches ``init_process_group`` as ``device_id``, on every path where it chooses one.

torch 2.15's ``nccl`` backend (``nccl2``, pytorch/pytorch#192281) binds each rank's communicator to the
``device_id`` given to ``init_process_group``, and without one to ``LOCAL_RANK % count`` or ``global rank % count``
(:mod:`lightning_mpi_env.gpu.nccl`): under per-task GPU binding, not the device the rank drives.

**How the argument is seen.** torch has no public hook on the arguments of ``init_process_group``, and no CUDA runs
here (no GPU), so no process group with a ``device_id`` can be opened (torch refuses a CUDA ``device_id`` in a build
without an accelerator). Each program therefore runs the real Trainer or Fabric, with the real ``"ddp_mpi"``
strategy, up to the call: it wraps torch's own ``torch.distributed.init_process_group`` (as
``tests/lightning/test_compat.py`` does), records the arguments Lightning's or our code passes, and stops there. The
accelerator is the one stand-in: Lightning's ``CUDAAccelerator`` whose devices are CUDA devices but which sets up
nothing (no ``torch.cuda`` call), because this machine has no GPU; everything from ``fit()``/``launch()`` down to
the call is Lightning's and ours. Each rank is the one process of a per-task binding the launcher made: local rank
1 of 2 with ``CUDA_VISIBLE_DEVICES=7`` (its own GPU, index 0), so the device it drives (``cuda:0``) is not
``cuda:<local rank>``, and a dropped ``device_id`` (``None``) or Lightning's own choice (``cuda:1``) fails.
The roll call is off (it would wait for rank 0, which this single process does not start).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from lightning_mpi_env.lightning import compat
from tests.clusters.lightning_versions import (  # noqa: F401  (oldest_lightning: a fixture, requested by name)
    INSTALLED,
    OLDEST,
    Lightning,
    in_each_namespace,
    oldest_lightning,
)

PACKAGES = ("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric")

PROGRAM = """
import importlib, json, os, sys
import torch
import torch.distributed as dist

PACKAGE, STRATEGY = sys.argv[1], sys.argv[2]
TRAINER = PACKAGE in ("lightning.pytorch", "pytorch_lightning")
pl = importlib.import_module(PACKAGE)
accelerators = importlib.import_module(PACKAGE + ".accelerators")
import lightning_mpi_env
from lightning_mpi_env.lightning import compat


class Reached(Exception):
    pass


calls = []
real_init = dist.init_process_group


def spy_init(*args, **kwargs):
    # torch's own function, as Lightning (or our strategy) calls it: record what it gets, then stop here.
    device = kwargs.get("device_id")
    calls.append({
        "backend": args[0] if args else kwargs.get("backend"), "device_id": None if device is None else str(device),
        "rank": kwargs.get("rank"), "world_size": kwargs.get("world_size"),
        "module": sys._getframe(1).f_globals["__name__"],
    })
    raise Reached()


dist.init_process_group = spy_init


class CUDAWithoutCUDA(accelerators.CUDAAccelerator):
    # The devices of the one GPU this task sees, set up by nobody: no GPU here (the test module's docstring).
    def setup_device(self, device):
        pass

    def setup(self, trainer):
        pass

    def teardown(self):
        pass

    @staticmethod
    def parse_devices(devices):
        return list(range(int(devices)))

    @staticmethod
    def get_parallel_devices(devices):
        return [torch.device("cuda", index) for index in devices]

    @staticmethod
    def auto_device_count():
        return len(os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(","))  # 7: one GPU; unset: the node's two

    @staticmethod
    def is_available():
        return True


strategy = STRATEGY
if STRATEGY == "plugin":
    strategy = "ddp"
plugins = [lightning_mpi_env.MPIClusterEnvironment()] if STRATEGY == "plugin" else []
devices = 2 if STRATEGY == "plugin" else "auto"  # Lightning's own strategies need devices = ranks per node
try:
    if TRAINER:
        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, index):
                return self.layer(batch).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

            def train_dataloader(self):
                return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

        trainer = pl.Trainer(
            strategy=strategy, accelerator=CUDAWithoutCUDA(), devices=devices, plugins=plugins, max_steps=1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )
        root = trainer.strategy.root_device
        trainer.fit(Model())
    else:
        fabric = pl.Fabric(strategy=strategy, accelerator=CUDAWithoutCUDA(), devices=devices, plugins=plugins)
        root = fabric.strategy.root_device
        fabric.launch()
except Reached:
    pass
print("PROBE " + json.dumps({
    "calls": calls, "root_device": str(root), "passes": compat.passes_device_id(PACKAGE),
    "version": list(compat.package_version(PACKAGE)),
}))
"""

BOUND_TASK = {
    # Open MPI's variables for local rank 1 of 2 (rank 1 of 2), bound to one GPU of its own by the launcher.
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",  # never opened: the program stops at init_process_group
    "CUDA_VISIBLE_DEVICES": "7",
    "LIGHTNING_MPI_ENV_ROLL_CALL": "0",
    "LIGHTNING_MPI_ENV_STALL_TIMEOUT": "0",
}


@pytest.fixture(
    params=["installed", pytest.param("oldest", marks=pytest.mark.slow)],
    ids=[f"lightning-{INSTALLED.version}", f"lightning-{OLDEST}"],
)
def lightning(request: pytest.FixtureRequest) -> Lightning:
    """The installed Lightning, and the oldest supported one (an overlay, installed on first use)."""
    if request.param == "installed":
        return INSTALLED
    oldest: Lightning = request.getfixturevalue("oldest_lightning")
    return oldest


def _run(lightning: Lightning, package: str, strategy: str, task: dict[str, str] = BOUND_TASK) -> dict:
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **task}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM), package, strategy],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=lightning.environ(base),
    )
    output = f"{lightning}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    probes = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    assert result.returncode == 0, output
    assert probes, output
    found: dict = json.loads(probes[-1].split(" ", 1)[1])
    found["stderr"] = result.stderr
    return found


@pytest.mark.parametrize(("lightning", "package"), in_each_namespace(PACKAGES), indirect=["lightning"])
def test_ddp_mpi_passes_its_device_as_device_id(lightning, package):
    found = _run(lightning, package, "ddp_mpi")
    # The device ddp_mpi chose: index 0 of the one GPU this task sees, not cuda:<local rank>.
    assert found["root_device"] == "cuda:0", found
    (call,) = found["calls"]
    assert call["device_id"] == "cuda:0", found
    assert (call["backend"], call["rank"], call["world_size"]) == ("nccl", 1, 2), found
    # Lightning 2.5.5+ passes it itself; before, ddp_mpi opens the process group through Lightning's own call.
    assert found["passes"] == (tuple(found["version"]) >= compat.DEVICE_ID_SINCE), found
    assert found["passes"] == (lightning is INSTALLED), "2.6.6 passes device_id, 2.1.4 does not"
    fabric = package.replace("pytorch_lightning", "lightning_fabric").replace("lightning.pytorch", "lightning.fabric")
    assert call["module"] == f"{fabric}.utilities.distributed", found  # compat.init_dist_connection: Lightning's


@pytest.mark.parametrize(("lightning", "package"), in_each_namespace(PACKAGES), indirect=["lightning"])
def test_the_plugin_with_lightnings_ddp_passes_lightnings_device_from_2_5_5_only(lightning, package):
    # Lightning's own DDP decides what init_process_group gets: its root device (cuda:<local rank>) from 2.5.5 on,
    # nothing before. The one path where no device_id can be passed: the plugin warns there under torch 2.15
    # (test_unbound_device_is_named_with_its_fix). Every GPU of the node visible, as Lightning's strategies need.
    whole_node = {name: value for name, value in BOUND_TASK.items() if name != "CUDA_VISIBLE_DEVICES"}
    found = _run(lightning, package, "plugin", whole_node)
    (call,) = found["calls"]
    assert found["root_device"] == "cuda:1", found
    assert call["device_id"] == ("cuda:1" if lightning is INSTALLED else None), found
    assert found["passes"] == (lightning is INSTALLED), found


NODE_OF_FOUR = {"lightning": (2, 1, 4), "torch_version": (2, 15, 0), "device_count": 4}


@pytest.mark.parametrize(
    ("case", "env", "global_rank", "local_rank", "bound"),
    [
        # Two ranks on each 4-GPU node, no LOCAL_RANK (mpirun, srun): nccl2 takes global rank % 4 on node 1.
        ("fewer ranks than GPUs", {}, 2, 0, 2),
        ("fewer ranks than GPUs", {}, 3, 1, 3),
        # LOCAL_RANK that is not the launcher's local rank (a stale one from the job script).
        ("stale LOCAL_RANK", {"LOCAL_RANK": "3"}, 1, 1, 3),
        # A LOCAL_RANK that is no count counts as unset; the message shows no part of it.
        ("LOCAL_RANK no count", {"LOCAL_RANK": "7" * 5000}, 2, 0, 2),
    ],
)
def test_unbound_device_is_named_with_its_fix(case, env, global_rank, local_rank, bound):
    from lightning_mpi_env.core.errors import DeviceIdWarning
    from lightning_mpi_env.lightning.device_id import FIX, unbound_device

    warning = unbound_device(**NODE_OF_FOUR, env=env, global_rank=global_rank, local_rank=local_rank)
    assert isinstance(warning, DeviceIdWarning), case
    assert f"to cuda:{bound} (" in warning.problem
    assert f"not to cuda:{local_rank}, the device Lightning sets up" in warning.problem
    assert "Lightning 2.1.4 calls init_process_group without device_id" in warning.problem
    assert warning.hint == FIX
    assert len(warning.problem) < 600, warning.problem
    assert 'strategy="ddp_mpi"' in FIX
    assert "TORCH_DIST_USE_NCCL2=0" in FIX
    assert 'process_group_backend="nccl-legacy"' in FIX


@pytest.mark.parametrize(
    ("change", "value"),
    [
        ("lightning", compat.DEVICE_ID_SINCE),  # Lightning passes device_id itself
        ("torch_version", (2, 14, 1)),  # nccl is the legacy ProcessGroupNCCL
        ("env", {"TORCH_DIST_USE_NCCL2": "0"}),  # rolled back
        ("device_count", 0),  # no GPU
        ("global_rank", 1),  # nccl2's guess is the device Lightning sets up: 1 % 4 == local rank 1
    ],
)
def test_no_warning_where_nccl2_binds_the_right_device(change, value):
    from lightning_mpi_env.lightning.device_id import unbound_device

    arguments = {**NODE_OF_FOUR, "env": {}, "global_rank": 6, "local_rank": 1}
    assert unbound_device(**arguments) is not None  # the baseline warns: 6 % 4 == 2 is not local rank 1
    arguments[change] = value
    assert unbound_device(**arguments) is None


OPEN_FIRST = """
import importlib, json, socket, sys
from datetime import timedelta

import torch
import torch.distributed as dist

FABRIC = sys.argv[1]
import lightning_mpi_env
from lightning_mpi_env.lightning import compat

calls = []
real_init = dist.init_process_group


def spy_init(*args, **kwargs):
    calls.append(sorted(kwargs))
    return real_init(*args, **kwargs)


dist.init_process_group = spy_init
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
environment = lightning_mpi_env.MPIClusterEnvironment({
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
}, roll_call=False, stall_timeout=0)
# What open_process_group does, here with gloo: Lightning's own call, with an argument Lightning does not pass.
compat.init_dist_connection(FABRIC, environment, "gloo", timeout=timedelta(seconds=60), group_name="")
opened = dist.is_initialized()
fabric = importlib.import_module(FABRIC).Fabric(strategy="ddp", accelerator="cpu", devices=1, plugins=[environment])
fabric.launch()  # Lightning's own _init_dist_connection: finds the group open
total = fabric.all_reduce(torch.ones(1), reduce_op="sum")
print("PROBE " + json.dumps({"calls": calls, "opened": opened, "total": total.item()}))
"""


@pytest.mark.parametrize("fabric", ["lightning.fabric", "lightning_fabric"])
def test_lightning_s_own_call_finds_the_group_already_open(lightning, fabric):
    # compat.init_dist_connection: Lightning's _init_dist_connection passes its keyword arguments to
    # init_process_group (2.1 to 2.6), and the strategy's own call after it returns at once: one process group.
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OPEN_FIRST), fabric],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=lightning.environ(base),
    )
    probes = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    assert result.returncode == 0, f"{lightning}: {result.stderr[-4000:]}"
    found = json.loads(probes[-1].split(" ", 1)[1])
    assert found["opened"] is True
    assert found["calls"] == [["group_name", "rank", "timeout", "world_size"]]  # ours only: Lightning's returned
    assert found["total"] == 1.0
