"""A short Trainer or Fabric run on each task of a job step, set up as users write it, for Lightning's srun advice.

Usage: python srun_advice.py --api trainer|fabric --setup instance|name|plugin|plain

``instance`` passes ``strategy=MPIDDPStrategy()``; ``name``, ``strategy="ddp_mpi"``; ``plugin``, Lightning's DDP with
``plugins=[MPIClusterEnvironment()]`` (one task a node); ``plain`` is Lightning alone (``devices=1``, each task
training by itself) and never imports this package. Lightning gives its advice ("The `srun` command is available on
your system but is not used...") on rank 0's standard error, where the tests look for it. Each task prints
``DONE rank=R setup=S`` once its run ended.
"""

import argparse
import importlib
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["trainer", "fabric"], required=True)
    parser.add_argument("--setup", choices=["instance", "name", "plugin", "plain"], required=True)
    args = parser.parse_args()
    if args.setup == "plain":
        arguments = {"devices": 1, "num_nodes": 1}
    elif args.setup == "instance":
        ours = importlib.import_module(f"lightning_mpi_env.{'pytorch' if args.api == 'trainer' else 'fabric'}")
        arguments = {"strategy": ours.MPIDDPStrategy()}
    elif args.setup == "name":
        importlib.import_module("lightning_mpi_env")  # registers "ddp_mpi"
        arguments = {"strategy": "ddp_mpi"}
    else:
        from lightning_mpi_env import MPIClusterEnvironment

        nodes = int(os.environ["SLURM_STEP_NUM_NODES"])  # one task a node
        arguments = {"strategy": "ddp", "plugins": [MPIClusterEnvironment()], "devices": 1, "num_nodes": nodes}
    data = torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)
    if args.api == "trainer":
        import lightning.pytorch as pl

        class Model(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
                return self.layer(batch).sum()

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=os.getcwd(),
            **arguments,
        )
        trainer.fit(Model(), train_dataloaders=data)
        rank = trainer.global_rank
    else:
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cpu", **arguments)
        fabric.launch()
        model = torch.nn.Linear(2, 1)
        model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for batch in fabric.setup_dataloaders(data):
            fabric.backward(model(batch).sum())
            optimizer.step()
            optimizer.zero_grad()
        environment = getattr(fabric.strategy, "cluster_environment", None)
        if environment is not None:
            environment.teardown()  # the end of a Fabric run: Fabric itself calls no teardown
        rank = fabric.global_rank
    print(f"DONE rank={rank} setup={args.setup}\n", end="", flush=True)


if __name__ == "__main__":
    main()
