import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lightning_mpi_env
from lightning_mpi_env.core.errors import (
    AddressError,
    ApproximateNodeRankWarning,
    DeviceIndexWarning,
    LayoutError,
    LayoutWarning,
    SettingError,
)
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE
from lightning_mpi_env.gpu.devices import visible_devices
from lightning_mpi_env.tools.interop import (
    TORCH_VARIABLES,
    device_warnings,
    jax_distributed_kwargs,
    torch_env,
    torchrun_args,
)
from lightning_mpi_env.tools.simulate import simulate
from lightning_mpi_env.tools.simulated_launch import HOST_FILE, LAUNCHER_KEYS, launch_environments
from tests.layouts import OPEN_MPI_RANK_5

# Most launchers here export no node index, so torch_env() says its NODE_RANK is assumed; the tests of that warning
# are test_torch_env_says_an_assumed_node_rank_*, the others check the values.
pytestmark = pytest.mark.filterwarnings("ignore::lightning_mpi_env.core.errors.ApproximateNodeRankWarning")

ONE_PER_NODE = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "99",
}


def test_torch_env_exports_torchrun_variables():
    assert torch_env(OPEN_MPI_RANK_5) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "nodea",
        "MASTER_PORT": "29611",
    }
    assert tuple(torch_env(OPEN_MPI_RANK_5)) == TORCH_VARIABLES


@pytest.mark.parametrize("launcher", LAUNCHER_KEYS)
def test_torch_env_agrees_with_simulated_layout(launcher, tmp_path):
    _, _, environments, files = launch_environments(launcher, 2, 3, map_by="node", scheduler="slurm")
    for path, text in files.items():  # the host files a launcher names (jsrun's rank file), on disk
        (tmp_path / Path(path).name).write_text(text)
    for row in simulate(launcher, nodes=2, ppn=3, map_by="node", scheduler="slurm").ranks:
        env = {name: value.replace(HOST_FILE, str(tmp_path)) for name, value in row.env.items()}
        exported = torch_env(env)
        assert (int(exported["RANK"]), int(exported["GROUP_RANK"]), int(exported["LOCAL_RANK"])) == (
            row.slot.rank,
            row.slot.node,
            row.slot.local_rank,
        )
        assert exported["MASTER_ADDR"] == "node001"


def test_torch_env_reads_os_environ_by_default(monkeypatch):
    for name in list(__import__("os").environ):
        monkeypatch.delenv(name)
    for name, value in OPEN_MPI_RANK_5.items():
        monkeypatch.setenv(name, value)
    assert torch_env()["RANK"] == "5"
    assert lightning_mpi_env.torch_env is torch_env


def test_torch_env_passes_a_resolved_environment_through():
    # Exporting into an environment that already holds the same values changes nothing.
    assert torch_env({**OPEN_MPI_RANK_5, **torch_env(OPEN_MPI_RANK_5)}) == torch_env(OPEN_MPI_RANK_5)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "five"}, "OMPI_COMM_WORLD_RANK='five' .* not a non-negative"),
        ({**OPEN_MPI_RANK_5, "RANK": "0"}, "RANK='0' disagrees with Open MPI"),
        ({**OPEN_MPI_RANK_5, "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a port number"),
    ],
)
def test_torch_env_refuses_bad_layouts(env, match):
    with pytest.raises(LayoutError, match=match):
        torch_env(env)


def test_approximate_node_rank_warns():
    # 3 nodes x 2 ranks: rank 2 (local 0) fits block (node 1) and round-robin (node 2) placement.
    env = {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "6",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
    with pytest.warns(LayoutWarning, match="Node rank 1 is approximate"):
        assert torch_env(env)["GROUP_RANK"] == "1"
    with pytest.warns(LayoutWarning, match="is approximate"):
        jax_distributed_kwargs(env)


def test_torchrun_args_one_process_per_node():
    assert torchrun_args(ONE_PER_NODE, nproc_per_node=2) == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=2",
        "--master_addr=gpu07",
        f"--master_port={torch_env(ONE_PER_NODE)['MASTER_PORT']}",
    ]
    assert "--nproc_per_node=gpu" in torchrun_args(ONE_PER_NODE, nproc_per_node="gpu")


def test_torchrun_args_single_process():
    assert torchrun_args({}) == [
        "--nnodes=1",
        "--node_rank=0",
        "--nproc_per_node=1",
        "--master_addr=127.0.0.1",
        "--master_port=29500",
    ]


def test_torchrun_args_refuses_several_processes_per_node():
    with pytest.raises(LayoutError, match=r"(?s)Open MPI started 4 processes on this node .*mpirun -npernode 1"):
        torchrun_args(OPEN_MPI_RANK_5)


def test_torchrun_args_refuses_address_that_would_split():
    # Refused where MASTER_ADDR is read (a host name has no blank), before any command line could split it.
    with pytest.raises(AddressError, match=r"MASTER_ADDR='node a; rm' .* is not a host name or an IP address"):
        torchrun_args({**ONE_PER_NODE, "MASTER_ADDR": "node a; rm"})


def test_jax_kwargs():
    assert jax_distributed_kwargs(OPEN_MPI_RANK_5) == {
        "coordinator_address": "nodea:29611",
        "num_processes": 8,
        "process_id": 5,
        "local_device_ids": [1],
    }


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ({}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "2"}, [0]),  # one GPU bound to this task by the launcher
        ({"CUDA_VISIBLE_DEVICES": ""}, [1]),
        ({"ROCR_VISIBLE_DEVICES": "5"}, [0]),
    ],
)
def test_jax_local_device_ids(visible, expected):
    assert jax_distributed_kwargs({**OPEN_MPI_RANK_5, **visible})["local_device_ids"] == expected


def test_jax_kwargs_refuse_too_few_devices():
    with pytest.raises(
        LayoutError, match=r"CUDA_VISIBLE_DEVICES=.0,1. lists 2 devices, but this process has local rank 3"
    ):
        jax_distributed_kwargs(
            {
                **OPEN_MPI_RANK_5,
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_RANK": "7",
                "CUDA_VISIBLE_DEVICES": "0,1",
            }
        )


def test_jax_refuses_a_subset_it_cannot_place_and_asks_for_the_roll_call():
    # srun --gpu-bind=closest (https://slurm.schedmd.com/srun.html): local rank 1 of 4 sees its socket's 2 GPUs;
    # which of them is its own depends on the other ranks' sets.
    with pytest.raises(LayoutError, match=r"lists 2 devices, but this process has local rank 1 of 4") as caught:
        jax_distributed_kwargs({**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "2,3"})
    assert 'strategy="ddp_mpi"' in caught.value.hint


def test_torch_env_warns_when_local_rank_is_not_the_device():
    # srun --gpus-per-task=1: LOCAL_RANK=1 but the task sees one GPU, its device 0
    with pytest.warns(
        DeviceIndexWarning, match=r"LOCAL_RANK=1 is not this rank's device: it sees CUDA_VISIBLE_DEVICES='5'"
    ):
        exported = torch_env({**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "5"})
    assert exported["LOCAL_RANK"] == "1"  # torchrun's meaning stays; only the device differs


def test_torch_env_says_how_to_pass_the_device_as_device_id():
    # A plain DDP script calls init_process_group itself: the hint gives the index and the device_id line
    # (torch 2.15's nccl2 binds LOCAL_RANK % visible devices without it: pytorch/pytorch#192281).
    with pytest.warns(DeviceIndexWarning) as said:
        torch_env({**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "5"})
    (warning,) = [record.message for record in said if isinstance(record.message, DeviceIndexWarning)]
    assert 'init_process_group("nccl", device_id=torch.device("cuda", 0))' in warning.hint
    assert "torch.cuda.set_device(0)" in warning.hint


@pytest.mark.parametrize(
    ("torch_version", "extra", "named"),
    [
        ((2, 15, 0), {}, True),  # nccl is nccl2: LOCAL_RANK 1 % 2 visible = cuda:1, which the roll call may not give
        ((2, 15, 0), {"TORCH_DIST_USE_NCCL2": "0"}, False),  # rolled back to the legacy ProcessGroupNCCL
        ((2, 13, 0), {}, False),  # the legacy ProcessGroupNCCL binds nothing at init
    ],
)
def test_device_warning_names_nccl2_s_guess_under_torch_2_15(torch_version, extra, named):
    # srun --gpu-bind=closest: local rank 1 of 4 sees its socket's two GPUs; its own is not known to it.
    env = {**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "2,3", **extra}
    (warning,) = device_warnings(from_env(env), env, torch_version)
    sentence = "torch 2.15.0's nccl backend (nccl2) binds cuda:1 (LOCAL_RANK % 2) unless init_process_group gets"
    assert (sentence in warning.problem) is named
    assert "device_id" in warning.hint


def test_torch_env_is_quiet_when_local_rank_is_the_device():
    assert torch_env({**OPEN_MPI_RANK_5, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})["LOCAL_RANK"] == "1"


def test_jax_coordinator_brackets_ipv6():
    assert jax_distributed_kwargs({**OPEN_MPI_RANK_5, "MASTER_ADDR": "fe80::1"})["coordinator_address"] == (
        "[fe80::1]:29611"
    )


def test_visible_devices_order():
    assert visible_devices({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0, 3"}) == (
        "CUDA_VISIBLE_DEVICES",
        ["0", "3"],
    )
    assert visible_devices({}) is None


def test_interop_imports_neither_jax_nor_torch():
    code = (
        "import json, sys, lightning_mpi_env as m\n"
        "kwargs = m.jax_distributed_kwargs({'PMI_RANK': '1', 'PMI_SIZE': '2', 'MPI_LOCALRANKID': '1',"
        " 'MPI_LOCALNRANKS': '2'})\n"
        "imported = sorted(name for name in ('jax', 'torch', 'mpi4py') if name in sys.modules)\n"
        "print(json.dumps([kwargs, m.torch_env({}), imported]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    kwargs, exported, imported = json.loads(result.stdout)
    assert kwargs == {
        "coordinator_address": "127.0.0.1:29500",
        "num_processes": 2,
        "process_id": 1,
        "local_device_ids": [1],
    }
    assert exported["WORLD_SIZE"] == "1"
    assert imported == []


# https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables
TORCHRUN_WORKER = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "job-42",
    "MASTER_ADDR": "g0001",
    "MASTER_PORT": "29400",
}


def test_torch_env_under_torchrun_keeps_torchrun_s_values():
    exported = torch_env(TORCHRUN_WORKER)
    assert {name: exported[name] for name in TORCHRUN_WORKER if name in exported} == {
        name: value for name, value in TORCHRUN_WORKER.items() if name in TORCH_VARIABLES
    }
    assert exported["NODE_RANK"] == "1"


def test_torch_env_refuses_torch_variables_without_torchrun():
    with pytest.raises(LayoutError, match=r"RANK='3', WORLD_SIZE='4' are set, as torchrun sets them"):
        torch_env({"RANK": "3", "WORLD_SIZE": "4"})


def test_torch_env_adds_the_fabric_interface_for_gloo_and_nccl():
    # lo is on every Linux host; GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME are the variables gloo and NCCL read.
    exported = torch_env({**OPEN_MPI_RANK_5, "LIGHTNING_MPI_ENV_IFNAME": "lo"})
    assert (exported["GLOO_SOCKET_IFNAME"], exported["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    assert tuple(exported)[: len(TORCH_VARIABLES)] == TORCH_VARIABLES


def test_torch_env_refuses_a_fabric_interface_that_contradicts_nccl_s():
    env = {**OPEN_MPI_RANK_5, "LIGHTNING_MPI_ENV_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "ib0"}
    with pytest.raises(SettingError, match=r"LIGHTNING_MPI_ENV_IFNAME='lo'.*NCCL_SOCKET_IFNAME='ib0'"):
        torch_env(env)


def test_torch_env_says_an_assumed_node_rank_with_the_value_and_the_fix():
    # `mpirun -n 6 --host a:4,b:4`, rank 4 on node b (local rank 0 of 2): the block rule says node 2 of 3; it is
    # node 1 of 2. Open MPI exports no node index (docs.open-mpi.org, mpirun(1), "Exported Environment Variables":
    # OMPI_COMM_WORLD_LOCAL_RANK/LOCAL_SIZE, no node's).
    env = {
        "OMPI_COMM_WORLD_RANK": "4",
        "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "nodea",
    }
    with pytest.warns(ApproximateNodeRankWarning) as said:
        assert torch_env(env)["NODE_RANK"] == "2"
    [warning] = [record.message for record in said if isinstance(record.message, ApproximateNodeRankWarning)]
    assert (warning.variable, warning.value, warning.launcher) == ("NODE_RANK", "2", "Open MPI")
    assert "is assumed from the block placement rule" in str(warning)
    assert "--map-by ppr:N:node" in warning.hint


def test_torch_env_says_no_assumed_node_rank_where_it_is_proven():
    # Every rank on this node (world size = local size), and no launcher: both exact, nothing said.
    one_node = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", ApproximateNodeRankWarning)
        assert torch_env(one_node)["NODE_RANK"] == "0"
        assert torch_env({})["NODE_RANK"] == "0"


# --- issue 23: no device list in proportion to the local size --------------------------------------------------------


def test_the_largest_local_size_needs_no_device_list():
    last = MAX_LOCAL_SIZE - 1
    env = {"OMPI_COMM_WORLD_RANK": str(last), "OMPI_COMM_WORLD_SIZE": str(MAX_LOCAL_SIZE)}
    env |= {"OMPI_COMM_WORLD_LOCAL_RANK": str(last), "OMPI_COMM_WORLD_LOCAL_SIZE": str(MAX_LOCAL_SIZE)}
    assert jax_distributed_kwargs(env)["local_device_ids"] == [last]
    assert torch_env(env)["LOCAL_RANK"] == str(last)
    with pytest.raises(LayoutError, match=r"OMPI_COMM_WORLD_LOCAL_SIZE='100000000000000000' .* ranks on one node"):
        jax_distributed_kwargs({**env, "OMPI_COMM_WORLD_SIZE": str(10**7), "OMPI_COMM_WORLD_LOCAL_SIZE": str(10**17)})
