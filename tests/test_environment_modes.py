"""MPIClusterEnvironment's three ways to run: one launcher process per rank, per node, or no launcher at all."""

import pytest

from lightning_mpi_env import LayoutError, MPIClusterEnvironment


def _ompi(rank, size, local_rank, local_size, **extra):
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "MASTER_ADDR": "nodea",
        "MASTER_PORT": "29611",
    }
    env.update(extra)
    return env


def test_no_launcher_parent_lets_lightning_start_workers():
    environment = MPIClusterEnvironment({})
    assert not environment.creates_processes_externally
    assert (environment.world_size(), environment.global_rank(), environment.local_rank()) == (1, 0, 0)
    environment.set_world_size(4)
    environment.set_global_rank(0)
    assert environment.world_size() == 4
    # No MASTER_PORT and no job identity: a free port, the same every time it is asked.
    assert environment.main_port == environment.main_port
    assert environment.main_address == "127.0.0.1"


def test_no_launcher_worker_reads_lightning_variables():
    environment = MPIClusterEnvironment({"LOCAL_RANK": "1", "NODE_RANK": "0", "MASTER_PORT": "1234"})
    assert environment.creates_processes_externally
    assert (environment.local_rank(), environment.node_rank(), environment.main_port) == (1, 0, 1234)
    environment.set_global_rank(1)
    environment.set_world_size(2)
    assert (environment.global_rank(), environment.world_size()) == (1, 2)


def test_no_launcher_rejects_garbage_local_rank():
    with pytest.raises(LayoutError, match="LOCAL_RANK='x'"):
        MPIClusterEnvironment({"LOCAL_RANK": "x"})


def test_one_process_per_rank_keeps_launcher_ranks():
    environment = MPIClusterEnvironment(_ompi(3, 4, 1, 2))
    environment.validate_settings(num_devices=2, num_nodes=2)
    assert environment.creates_processes_externally
    environment.set_global_rank(0)
    environment.set_world_size(1)
    assert (environment.global_rank(), environment.world_size(), environment.node_rank()) == (3, 4, 1)


def test_one_process_per_node_parent():
    environment = MPIClusterEnvironment(_ompi(1, 2, 0, 1))
    assert environment.creates_processes_externally  # until Lightning says how many devices per node
    environment.validate_settings(num_devices=2, num_nodes=2)
    assert not environment.creates_processes_externally
    assert environment.managed_by_lightning
    assert (environment.node_rank(), environment.local_rank()) == (1, 0)
    environment.set_global_rank(2)
    environment.set_world_size(4)
    assert (environment.global_rank(), environment.world_size()) == (2, 4)


def test_one_process_per_node_with_one_device_is_one_process_per_rank():
    environment = MPIClusterEnvironment(_ompi(1, 2, 0, 1))
    environment.validate_settings(num_devices=1, num_nodes=2)
    assert environment.creates_processes_externally
    assert not environment.managed_by_lightning


def test_one_process_per_node_worker():
    spawned = _ompi(1, 2, 0, 1, LOCAL_RANK="1", NODE_RANK="1", WORLD_SIZE="4")
    environment = MPIClusterEnvironment(spawned)
    assert environment.creates_processes_externally
    assert environment.managed_by_lightning
    assert (environment.global_rank(), environment.world_size()) == (3, 4)
    assert (environment.node_rank(), environment.local_rank()) == (1, 1)
    environment.validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize(
    "stale",
    [
        # Launcher runs 2 ranks per node: LOCAL_RANK is not Lightning's own, it is stale.
        _ompi(0, 4, 0, 2, LOCAL_RANK="1", NODE_RANK="0", WORLD_SIZE="8"),
        # NODE_RANK is not this launcher rank's: left over from another launch.
        _ompi(1, 2, 0, 1, LOCAL_RANK="1", NODE_RANK="0", WORLD_SIZE="4"),
        # Only LOCAL_RANK exported by a job script.
        _ompi(1, 2, 0, 1, LOCAL_RANK="1"),
    ],
)
def test_stale_torch_variables_are_still_rejected(stale):
    with pytest.raises(LayoutError, match="(?s)disagrees with Open MPI.*HINT: Unset"):
        MPIClusterEnvironment(stale)


def test_assign_nodes_overrides_node_and_local_rank():
    environment = MPIClusterEnvironment(_ompi(2, 4, 1, 2))
    environment.assign_nodes(node_rank=0, local_rank=1, num_nodes=2)
    assert (environment.node_rank(), environment.local_rank(), environment.num_nodes) == (0, 1, 2)
    assert environment.global_rank() == 2
