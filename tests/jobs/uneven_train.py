"""Train one model on any launch, and say whether it is the model one process trains on the same global batches.

Run under a launcher (``mpirun``, ``srun``) with ``strategy="ddp_mpi"`` and no ``devices``/``num_nodes``, Trainer
or Fabric; with ``--recommended``, the recommended line instead of the name
(``from lightning_mpi_env.pytorch import MPIDDPStrategy`` and ``strategy=MPIDDPStrategy()``, each package's module).

In float64, ``DistributedSampler`` deals rank ``r`` of ``N`` the items ``r, r + N, ...`` of one order
(``shuffle=False``: the indices; Lightning's Trainer shuffles its training data, seeded: one permutation for every
rank), so the ranks' ``k``-th batches of ``b`` together are the ``k``-th batch of ``N x b`` of one process;
DDP averages the ranks' gradients, so after every step the weights equal those of one process (the reference,
computed here by rank 0 with a plain loop over ``DataLoader(batch_size=N x b)``).

The job asserts, on every rank, that the sampler deals ``N`` replicas with this rank's global rank and
``ceil(len / N)`` samples each; then prints one ``RESULT {json}`` line per rank: the ranks and counts the Trainer or
Fabric reports, the launcher's own rank, the host, the indices of each step, the weights, and (rank 0) the
reference's weights. ``--strategy plugin`` runs Lightning's own ``DDPStrategy`` with ``MPIClusterEnvironment``
instead (which refuses an uneven launch).
"""

import argparse
import importlib
import json
import math
import os
import socket

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

FEATURES = 3
LAUNCHER_RANK = ("OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK")
"""The launcher's own rank variable, for the test to compare with the rank Lightning reports."""


class Points(Dataset):
    """``(index, x, y)`` in float64; ``y`` a fixed linear function of ``x``, so training moves the weights."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        x = torch.tensor([math.sin(index * 0.7), math.cos(index * 1.3), (index % 7) / 7.0], dtype=torch.float64)
        y = (x * torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)).sum(dim=0, keepdim=True) + 0.25
        return index, x, y


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)  # one start on every rank and in the reference (DDP broadcasts rank 0's weights anyway)
    return torch.nn.Linear(FEATURES, 1).double()


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def flat(model: torch.nn.Module) -> list[float]:
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()]).tolist()


def reference(world_size: int, args: argparse.Namespace, sampler: dict) -> tuple[list[float], list[list[int]]]:
    """One process, the same samples in the same order, batches of ``world_size x batch``: weights and batches.

    The order is the ranks' sampler's with one replica: the same permutation (Lightning's Trainer shuffles the
    training data it deals, seeded; Fabric keeps ``shuffle=False``), padded only past the steps taken here.
    """
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = Points(args.length)
    order = DistributedSampler(data, num_replicas=1, rank=0, shuffle=sampler["shuffle"], seed=sampler["seed"])
    loader = DataLoader(data, batch_size=world_size * args.batch, sampler=order)
    batches = []
    for step, (index, x, y) in enumerate(loader):
        if step == args.steps:
            break
        batches.append(index.tolist())
        optimizer.zero_grad()
        loss_of(model, x, y).backward()
        optimizer.step()
    return flat(model), batches


RECOMMENDED = {
    "lightning.pytorch": "lightning_mpi_env.pytorch",
    "lightning.fabric": "lightning_mpi_env.fabric",
    "pytorch_lightning": "lightning_mpi_env.pytorch_lightning",
    "lightning_fabric": "lightning_mpi_env.lightning_fabric",
}
"""The recommended import for each package: ``from lightning_mpi_env.pytorch import MPIDDPStrategy``, ..."""


def ddp_mpi(args: argparse.Namespace) -> object:
    """``"ddp_mpi"`` by name, or (``--recommended``) the recommended line: ``MPIDDPStrategy()`` of the package's module.

    By name, Lightning first makes the cluster environment it detects, and its ``SLURMEnvironment`` refuses an
    ``srun --ntasks`` without ``--ntasks-per-node`` while it is made (before any strategy is): the object, which
    brings its own environment, avoids it.
    """
    if not args.recommended:
        return "ddp_mpi"
    return importlib.import_module(RECOMMENDED[args.namespace]).MPIDDPStrategy()


def check_sampler(sampler: object, world_size: int, global_rank: int, length: int) -> dict:
    """The sampler deals every rank an equal share: asserted here, in the job, and reported."""
    assert isinstance(sampler, DistributedSampler), type(sampler)
    share = len(sampler)
    assert (sampler.num_replicas, sampler.rank) == (world_size, global_rank), (sampler.num_replicas, sampler.rank)
    assert share == math.ceil(length / world_size), (share, length, world_size)
    assert sampler.epoch == 0, sampler.epoch  # one epoch's steps: the reference takes epoch 0's order
    return {
        "num_replicas": sampler.num_replicas,
        "rank": sampler.rank,
        "share": share,
        "shuffle": sampler.shuffle,
        "seed": sampler.seed,
    }


def run_trainer(args: argparse.Namespace) -> dict:
    pl = importlib.import_module(args.namespace)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = fresh_model()
            self.steps: list[list[int]] = []

        def training_step(self, batch, batch_index):
            index, x, y = batch
            self.steps.append(index.tolist())
            return loss_of(self.layer, x, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=args.lr)

        def train_dataloader(self):
            return DataLoader(Points(args.length), batch_size=args.batch, shuffle=False)

    if args.strategy == "ddp_mpi":
        strategy, plugins = ddp_mpi(args), []
    else:
        from lightning_mpi_env import MPIClusterEnvironment

        strategy, plugins = pl.strategies.DDPStrategy(process_group_backend="gloo"), [MPIClusterEnvironment()]
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy=strategy,
        plugins=plugins,
        precision="64-true",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    trainer.fit(model)
    sampler = check_sampler(trainer.train_dataloader.sampler, trainer.world_size, trainer.global_rank, args.length)
    return {
        "strategy_object": trainer.strategy,
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "num_devices": trainer.num_devices,
        "sampler": sampler,
        "steps": model.steps,
        "weights": flat(model.layer),
    }


def run_fabric(args: argparse.Namespace) -> dict:
    fabric_module = importlib.import_module(args.namespace)
    if args.strategy == "ddp_mpi":
        strategy, plugins = ddp_mpi(args), []
    else:
        from lightning_mpi_env import MPIClusterEnvironment

        strategy = fabric_module.strategies.DDPStrategy(process_group_backend="gloo")
        plugins = [MPIClusterEnvironment()]
    fabric = fabric_module.Fabric(accelerator="cpu", strategy=strategy, plugins=plugins, precision="64-true")
    fabric.launch()
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(Points(args.length), batch_size=args.batch, shuffle=False))
    steps: list[list[int]] = []
    for step, (index, x, y) in enumerate(loader):
        if step == args.steps:
            break
        steps.append(index.tolist())
        optimizer.zero_grad()
        fabric.backward(loss_of(model, x, y))
        optimizer.step()
    strategy = fabric.strategy
    sampler = check_sampler(loader.sampler, fabric.world_size, fabric.global_rank, args.length)
    strategy.cluster_environment.teardown()  # the end of the run (Fabric calls no teardown)
    return {
        "strategy_object": strategy,
        "global_rank": fabric.global_rank,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "world_size": fabric.world_size,
        "num_nodes": strategy.num_nodes,
        "num_devices": len(strategy.parallel_devices),
        "sampler": sampler,
        "steps": steps,
        "weights": flat(model.module if hasattr(model, "module") else model),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--namespace",
        choices=["lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric"],
        default="lightning.pytorch",
    )
    parser.add_argument("--strategy", choices=["ddp_mpi", "plugin"], default="ddp_mpi")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=2, help="samples per rank and step")
    parser.add_argument("--length", type=int, default=163, help="samples: not a multiple of the world size")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument(
        "--recommended", action="store_true", help="the recommended line, MPIDDPStrategy() of the package's module"
    )
    args = parser.parse_args()
    # float64 throughout: Fabric's "64-true" converts a module's output to the default dtype (float32 otherwise),
    # which would put float32 rounding (~1e-9 here) between the job and the reference.
    torch.set_default_dtype(torch.float64)
    import lightning_mpi_env  # noqa: F401  (registers "ddp_mpi")

    fabric = args.namespace in ("lightning.fabric", "lightning_fabric")
    result = run_fabric(args) if fabric else run_trainer(args)
    if result["global_rank"] == 0:
        result["reference"], result["reference_batches"] = reference(result["world_size"], args, result["sampler"])
        result["initial"] = flat(fresh_model())
    result["hostname"] = socket.gethostname()
    result["launcher_rank"] = next((int(os.environ[name]) for name in LAUNCHER_RANK if name in os.environ), None)
    result["api"] = "Fabric" if fabric else "Trainer"
    strategy_class = type(result.pop("strategy_object"))
    result["strategy"] = f"{strategy_class.__module__}.{strategy_class.__qualname__}"
    print("RESULT " + json.dumps(result) + "\n", end="", flush=True)  # one write: lines of ranks never merge


if __name__ == "__main__":
    main()
