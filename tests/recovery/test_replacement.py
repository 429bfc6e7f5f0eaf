"""A replacement's place: the variable rank 0 sets read back checked, the spare nodes found on a real ``TCPStore``
from the ranks' task records and the allocation's node list (``SLURM_JOB_NODELIST``, sbatch(1)), and the spares
rank 0 publishes read back checked; the survivors' wait for a replacement to reach the store, with real processes
standing for its step."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.settings import REPLACES
from lightning_mpi_env.recovery.ending import KEY as TASK_KEY
from lightning_mpi_env.recovery.replacement import (
    Joining,
    arrive,
    await_replacements,
    node_index,
    publish_spares,
    read_joining,
    read_spares,
    spare_nodes,
)
from lightning_mpi_env.recovery.worlds import World

# srun's variables for rank 0 of a 4-rank step on node1 and node2 of a 3-node allocation (srun(1), sbatch(1)).
SLURM = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "node[1-3]",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURMD_NODENAME": "node1",
    "MASTER_PORT": "29500",
}


@pytest.fixture
def store() -> dist.TCPStore:
    # The timeout bounds the server's own client's connection too: only a hang may reach it on a busy machine.
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


def post(store: dist.TCPStore, nodes: list[str]) -> None:
    for rank, node in enumerate(nodes):
        store.set(f"{TASK_KEY}{rank}", f"{node} {1000 + rank} {5000 + rank}")


def test_no_variable_is_no_replacement():
    assert read_joining({}) is None


@given(
    st.builds(
        Joining,
        st.integers(2, 1000),
        st.just(1),
        st.integers(2, 4096),
        st.just(0),
        st.just(1),
        st.sampled_from(["node1", "10.0.0.1", "n-1.cluster"]),
        st.integers(1, 65535),
    )
)
def test_what_rank_0_writes_reads_back(joining):
    assert read_joining({REPLACES: joining.text()}) == joining


@pytest.mark.parametrize(
    "value",
    [
        "",
        "2 1 4 0 2 node1",  # no port
        "1 1 4 0 2 node1 29500",  # generation 1 is the launch: no replacement joins it
        "2 0 4 0 2 node1 29500",  # rank 0 is never replaced (its process serves the store)
        "2 4 4 0 2 node1 29500",  # past the world
        "2 1 4 2 2 node1 29500",  # node index past the nodes
        "2 1 4 0 2 -node1 29500",  # an option, not a host
        "2 1 4 0 2 node1 0",
        "2 1 4 0 2 node1 65536",
        "2 1 4 0 2 node1 29500 1",
        "2 1 4 0 2 node\x1b[2K 29500",
        "2 1 99999999 0 2 node1 29500",
        "2 1 4 0 2 " + "a" * 300 + " 29500",
    ],
)
def test_any_other_value_is_one_named_error(value):
    with pytest.raises(RecoveryError) as caught:
        read_joining({REPLACES: value})
    assert caught.value.variable == REPLACES
    assert "unset it" in caught.value.hint


def test_the_spare_is_the_allocations_node_no_rank_runs_on(store):
    post(store, ["node1", "node1", "node2", "node2"])
    assert spare_nodes(store, from_env(SLURM), SLURM, 4) == ["node3"]
    assert node_index(store, 4, 2) == (1, 2)
    assert node_index(store, 4, 1) == (0, 2)


def test_a_full_allocation_has_no_spare(store):
    post(store, ["node1", "node2", "node3", "node3"])
    assert spare_nodes(store, from_env(SLURM), SLURM, 4) == []


def test_a_rank_that_did_not_say_where_it_runs_leaves_no_spare(store):
    # Its node is unknown: node3 might be it.
    post(store, ["node1", "node1", "node2"])
    assert spare_nodes(store, from_env(SLURM), SLURM, 4) == []


def test_a_forged_record_leaves_no_spare(store):
    post(store, ["node1", "node1", "node2", "node2"])
    store.set(f"{TASK_KEY}3", "-rf 1 2")
    assert spare_nodes(store, from_env(SLURM), SLURM, 4) == []


def test_without_srun_there_is_no_spare(store):
    # mpirun runs no command beside its job on a node: no replacement is started.
    post(store, ["node1", "node1", "node2", "node2"])
    env = {key: value for key, value in SLURM.items() if not key.startswith("SLURM_STEP") and key != "SLURM_PROCID"}
    env |= {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "node1"}
    assert spare_nodes(store, from_env(env), env, 4) == []


@pytest.mark.parametrize("spares", [(), ("node3",), ("node3", "node4")])
def test_the_published_spares_read_back(store, spares):
    publish_spares(store, 2, spares)
    assert read_spares(store, 2, len(spares) or 1) == spares


@pytest.mark.parametrize("forged", ["node3,node4", "-x", "node\x1b[2K", "a" * 2001])
def test_forged_spares_are_one_named_error(store, forged):
    store.set("lightning_mpi_env/gen/2/end/spare", forged)
    with pytest.raises(RecoveryError) as caught:
        read_spares(store, 2, 1)
    assert caught.value.variable == "lightning_mpi_env/gen/2/end/spare"
    assert "\x1b" not in str(caught.value)


# Generation 2 of 4 ranks after rank 2 of generation 1 was lost, with a replacement on node3.
REPLACED = World(2, (0, 1, 2, 3), lost=(2,))
JOINING = Joining(2, 2, 4, 1, 2, "node1", 29500)


def test_the_survivors_go_on_once_the_replacement_arrived(store):
    # Rank 0 waits with the step it started (still running: the replacement is up); rank 1 waits on the store alone.
    step = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    rank_1 = threading.Thread(target=await_replacements, args=(store, REPLACED, ["node3"], 60))
    rank_1.start()
    arrive(store, JOINING)
    await_replacements(store, REPLACED, ["node3"], 60, [step])
    rank_1.join(60)
    assert not rank_1.is_alive()
    assert step.poll() is None  # a replacement that arrived is left running
    step.communicate(b"")


def test_a_replacement_step_that_ends_first_ends_every_survivors_wait(store):
    step = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    step.wait()
    with pytest.raises(RecoveryError) as at_rank_0:
        await_replacements(store, REPLACED, ["node3"], 60, [step])
    with pytest.raises(RecoveryError) as at_rank_1:  # told by rank 0, through the store
        await_replacements(store, REPLACED, ["node3"], 60)
    for caught in (at_rank_0, at_rank_1):
        assert "the replacement for rank 2 on node3 ended (exit status 3) before it reached the job's store" in str(
            caught.value
        )
        assert caught.value.value == "node3"


def test_a_replacement_slower_than_the_roll_calls_timeout_is_ended_and_named(store):
    step = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with pytest.raises(RecoveryError) as caught:
        await_replacements(store, REPLACED, ["node3"], 0.3, [step])
    assert "the replacement for rank 2 on node3 did not reach the job's store within 0.3 s" in str(caught.value)
    assert caught.value.variable == "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT"
    assert "raise LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT" in caught.value.hint
    assert step.wait(60) < 0  # rank 0 ended it


@pytest.mark.parametrize("forged", ["1 3", "2", "2 3 4", "2 99999", "\x1b[2K 3", "2 " + "3" * 50])
def test_a_forged_word_of_an_ended_replacement_is_one_named_error(store, forged):
    store.set("lightning_mpi_env/gen/2/end/replacement-ended", forged)
    with pytest.raises(RecoveryError) as caught:
        await_replacements(store, REPLACED, ["node3"], 60)
    assert caught.value.variable == "lightning_mpi_env/gen/2/end/replacement-ended"
    assert "\x1b" not in str(caught.value)
