"""MPIClusterEnvironment's three ways to run: one launcher process per rank, per node, or no launcher at all."""

import os
import subprocess
import sys

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


def test_no_launcher_local_rank_follows_lightning_spawned_workers(monkeypatch):
    # ddp_spawn/ddp_fork set LOCAL_RANK in each worker after the environment was made in the parent.
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    environment = MPIClusterEnvironment({})
    assert environment.local_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert environment.local_rank() == 1
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(LayoutError, match="LOCAL_RANK='one'"):
        environment.local_rank()


def test_a_copy_in_a_process_lightning_started_under_a_launcher_is_refused(mocker):
    environment = MPIClusterEnvironment(_ompi(3, 4, 1, 2))
    environment.set_global_rank(3)  # in the process the launcher started: fine
    mocker.patch("lightning_mpi_env.lightning.environment.os.getpid", return_value=environment._made_in_pid + 1)
    with pytest.raises(LayoutError) as caught:
        environment.set_global_rank(3)
    message = str(caught.value)
    assert "Open MPI started this process as rank 3 of 4 (OMPI_COMM_WORLD_RANK=3)" in message
    assert "'ddp_spawn'" in message
    assert "HINT: Under a launcher, use strategy='ddp' or 'ddp_mpi'" in message
    managed = MPIClusterEnvironment({})
    managed.set_global_rank(1)  # without a launcher, Lightning's workers are expected
    assert managed.global_rank() == 1


SPAWN_JOB = """
import sys, warnings
warnings.simplefilter("ignore")
import lightning_mpi_env
import lightning.pytorch as L
import torch
import pytorch_lightning  # both namespaces: the Trainer's checked entry points must survive pickling
from lightning_mpi_env import MPIClusterEnvironment


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, index):
        print(f"STEP rank={self.global_rank} of {self.trainer.world_size}\\n", end="", flush=True)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)


if __name__ == "__main__":
    trainer = L.Trainer(
        strategy="ddp_spawn", plugins=[MPIClusterEnvironment()], accelerator="cpu", devices=2, num_nodes=1,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Model())
"""


# The refusal under a launcher, in process: test_a_copy_in_a_process_lightning_started_under_a_launcher_is_refused.
@pytest.mark.parametrize("launcher", [None, pytest.param("Open MPI", marks=pytest.mark.slow)])
def test_ddp_spawn_trains_without_a_launcher_and_is_refused_under_one(tmp_path, launcher):
    (tmp_path / "job.py").write_text(SPAWN_JOB)
    env = {"PATH": os.environ["PATH"]}
    if launcher:
        env.update(_ompi(0, 2, 0, 2))
    result = subprocess.run(
        [sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    if launcher is None:
        assert result.returncode == 0, result.stderr[-3000:]
        assert sorted(set(result.stdout.split("\n")) - {""}) == ["STEP rank=0 of 2", "STEP rank=1 of 2"]
    else:
        assert result.returncode != 0
        assert "STEP" not in result.stdout
        assert "LayoutError: Open MPI started this process as rank 0 of 2" in result.stderr, result.stderr[-3000:]


def test_no_launcher_and_many_nodes_is_refused_when_no_other_node_could_join():
    with pytest.raises(
        LayoutError, match=r"Trainer/Fabric\(devices=2, num_nodes=2\) asks for 4 ranks on 2 nodes"
    ) as raised:
        MPIClusterEnvironment({}).validate_settings(num_devices=2, num_nodes=2)
    assert raised.value.variable == "MASTER_ADDR"
    assert "MASTER_ADDR and MASTER_PORT unset" in raised.value.problem
    assert "`srun --nodes=2 --ntasks-per-node=2 python train.py`" in raised.value.hint
    with pytest.raises(LayoutError, match=r"\(MASTER_PORT unset\)"):
        MPIClusterEnvironment({"MASTER_ADDR": "nodea"}).validate_settings(num_devices=2, num_nodes=2)
    # Started by hand on each node, with the three variables Lightning documents: the other node can join.
    by_hand = {"MASTER_ADDR": "nodea", "MASTER_PORT": "29611", "NODE_RANK": "0"}
    MPIClusterEnvironment(by_hand).validate_settings(num_devices=2, num_nodes=2)
    MPIClusterEnvironment({}).validate_settings(num_devices=2, num_nodes=1)


MANY_NODES_JOB = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
if sys.argv[1] == "Trainer":
    from lightning.pytorch import LightningModule, Trainer
    from lightning_mpi_env.pytorch import MPIDDPStrategy

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, index):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = Trainer(strategy=MPIDDPStrategy(), devices=2, num_nodes=2, accelerator="cpu", max_steps=2,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2, num_workers=1))
else:
    from lightning.fabric import Fabric
    from lightning_mpi_env.fabric import MPIDDPStrategy

    fabric = Fabric(strategy=MPIDDPStrategy(), devices=2, num_nodes=2, accelerator="cpu")
    fabric.launch()
print("TRAINED")
"""


@pytest.mark.parametrize("api", ["Trainer", "Fabric"])
def test_plain_python_with_many_nodes_stops_at_once_naming_the_launcher(tmp_path, api):
    """``python train.py`` with num_nodes=2: one error before any worker starts, not a roll call that waits for 4."""
    (tmp_path / "train.py").write_text(MANY_NODES_JOB)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path))}
    # The limit only ends a hang: the roll call that waited for ranks that never come took 120 s and more.
    result = subprocess.run(
        [sys.executable, "train.py", api],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "TRAINED" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("lightning_mpi_env.core.errors.")]
    assert len(errors) == 1, result.stderr[-3000:]  # one process, one error: Lightning started no worker
    assert (
        f"No launcher started this process (no srun, mpirun, mpiexec, flux run or jsrun), and {api}(devices=2, "
        in errors[0]
    )
    assert "HINT: Start one process per device with the cluster's launcher" in result.stderr
    assert "roll call" not in result.stderr
