"""ddp_mpi takes devices and num_nodes from the launch when they are left out (Trainer and Fabric, both namespaces)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROGRAM = """
import json, os
os.environ.update({env})
import lightning_mpi_env
import {namespace} as L
runner = L.{entry}(strategy="ddp_mpi", accelerator="cpu"{arguments}{logger})
strategy = runner.strategy
print(json.dumps({{"devices": len(strategy.parallel_devices), "num_nodes": strategy.num_nodes,
                   "world_size": strategy.world_size, "global_rank": strategy.global_rank}}))
"""


def open_mpi(rank, world_size, local_size):
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "MASTER_ADDR": "nodea",
        "MASTER_PORT": "29611",
    }


def built(namespace, entry, arguments, env):
    code = PROGRAM.format(
        env=repr(env), namespace=namespace, entry=entry, arguments=f", {arguments}" if arguments else "",
        logger=", logger=False" if entry == "Trainer" else "",
    )  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("namespace", "entry"),
    [
        ("lightning.pytorch", "Trainer"),
        ("pytorch_lightning", "Trainer"),
        ("lightning.fabric", "Fabric"),
        ("lightning_fabric", "Fabric"),
    ],
)
@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("", {"devices": 3, "num_nodes": 2}),  # both from the launch: 6 ranks, 3 per node
        ("devices=3", {"devices": 3, "num_nodes": 2}),  # num_nodes from the launch
        ("num_nodes=2", {"devices": 3, "num_nodes": 2}),  # devices from the launch
    ],
)
def test_left_out_values_come_from_the_launch(namespace, entry, arguments, expected):
    shape = built(namespace, entry, arguments, open_mpi(rank=4, world_size=6, local_size=3))
    assert shape == {**expected, "world_size": 6, "global_rank": 4}


def test_given_values_stay_and_the_launch_check_still_refuses_them():
    # Given and wrong: kept as given, so that validate_settings names the mismatch at launch (as before).
    shape = built(
        "lightning.pytorch", "Trainer", "devices=6, num_nodes=1", open_mpi(rank=4, world_size=6, local_size=3)
    )
    assert (shape["devices"], shape["num_nodes"]) == (6, 1)
    shape = built("lightning.pytorch", "Trainer", "num_nodes=1", open_mpi(rank=4, world_size=6, local_size=3))
    assert (shape["devices"], shape["num_nodes"]) == (3, 1)  # num_nodes=1 typed out is given, for the Trainer


def test_without_a_launcher_lightning_decides_as_usual():
    shape = built("lightning.pytorch", "Trainer", "", {})
    assert (shape["devices"], shape["num_nodes"], shape["world_size"]) == (1, 1, 1)


def test_one_launcher_process_per_node_keeps_lightning_s_devices():
    # 2 nodes, one launcher process each: devices says how many workers Lightning starts on each node.
    shape = built("lightning.pytorch", "Trainer", "devices=2", open_mpi(rank=1, world_size=2, local_size=1))
    assert (shape["devices"], shape["num_nodes"]) == (2, 2)
