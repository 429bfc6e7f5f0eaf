"""A Lightning job under ``lightning_mpi_env.restartable``, with the Trainer or Fabric and ``strategy="ddp_mpi"``,
shaped like a user's: a ``DataLoader`` with a worker, momentum SGD; the Trainer's with validation and a
``ModelCheckpoint`` too. One rank can SIGKILL or SIGSTOP itself before a step.

The data are those of ``restartable_job.py`` (each item a pure function of its index), so the test can compute the
weights the job must end with. The Trainer resumes ``ckpt_path=generation.ckpt_path`` (the state ``"ddp_mpi"`` kept in
memory) and feeds a plain ``DataLoader`` through Lightning's ``DistributedSampler`` (no shuffling); the Fabric program
keeps its own state with ``generation.keep`` and takes the next ``world_size * BATCH`` items each step.
With ``--fsdp`` the Trainer's strategy is Lightning's ``FSDPStrategy``, with ``--deepspeed`` its ``DeepSpeedStrategy``
(ZeRO stage 2; run with the DeepSpeed venv's Python: ``tests/clusters/deepspeed_venv.py``), both on the CPU
(``cpu_as_cuda.py``) with gloo. Both shard the state, so none is kept in memory: the job saves ``last.ckpt`` too (a
folder under DeepSpeed), and each start resumes ``generation.ckpt_path or "last"``.

Each process leaves ``started-<launch rank>-<pid>`` in ``--out`` as it starts; each rank writes ``rank-<launch
rank>.json`` there at the end: its process id, each generation it ran (number, rank, world size, the step it started
at, the checkpoint path it resumed), the world size of each step it finished, when it finished the first step after a
recovery, and its final weights; the rank that kills or stops itself writes when, to ``fault``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from cpu_as_cuda import cpu_as_cuda  # this folder: the script's own path
from restartable_job import (  # this folder: the script's own path
    BATCH,
    LR,
    MOMENTUM,
    Items,
    batches,
    fault_now,
    finish,
    item,
    model,
    parser,
    resume,
    this_launch_rank,
    weights,
)
from torch.utils.data import DataLoader, Dataset

from lightning_mpi_env import Generation, MPIClusterEnvironment, restartable

EPOCH_ITEMS = 192
"""One epoch's items: 12 batches a rank on 4 ranks, 16 on 3."""


class Epoch(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    def __len__(self) -> int:
        return EPOCH_ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return (*item(index), index)


def trainer_main(args: argparse.Namespace, launch_rank: int, record: dict) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Net(pl.LightningModule):
        def __init__(self, lr: float) -> None:
            super().__init__()
            self.save_hyperparameters()  # as most modules do: an AttributeDict in every checkpoint
            self.layer = model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y, indices = batch
            record["items"].append(indices.tolist())
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y, _ = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_model(self) -> None:
            if args.fsdp:  # wrapped here, on the CPU: Lightning's own wrapping gives FSDP an accelerator's device
                from torch.distributed.fsdp import FullyShardedDataParallel

                self.layer = FullyShardedDataParallel(self.layer, device_id=torch.device("cpu"))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=MOMENTUM)

    class Record(pl.Callback):
        def __init__(self, generation: Generation) -> None:
            self.generation = generation

        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            g = self.generation
            record["generations"].append([g.number, g.rank, g.world_size, trainer.global_step, trainer.ckpt_path])
            record.setdefault("reconfigured", []).append(g.reconfigured)

        def on_train_batch_start(self, trainer: pl.Trainer, *rest: Any) -> None:
            fault_now(args, launch_rank, trainer.global_step)

        def on_train_batch_end(self, trainer: pl.Trainer, *rest: Any) -> None:
            record["worlds"].append(trainer.world_size)
            if self.generation.number > 1 and "recovered_at" not in record:
                record["recovered_at"] = time.time()

    sharded = args.fsdp or args.deepspeed

    def strategy() -> Any:
        if args.deepspeed:
            from lightning.pytorch.strategies import DeepSpeedStrategy

            return DeepSpeedStrategy(stage=2, cluster_environment=MPIClusterEnvironment(), process_group_backend="gloo")
        if not args.fsdp:
            return "ddp_mpi"
        from lightning.pytorch.strategies import FSDPStrategy

        return FSDPStrategy(
            cluster_environment=MPIClusterEnvironment(), process_group_backend="gloo", state_dict_type="sharded"
        )

    def train(generation: Generation) -> None:
        net = Net(LR)
        trainer = pl.Trainer(
            accelerator=cpu_as_cuda("lightning.pytorch")() if sharded else "cpu",
            **({"devices": 2, "num_nodes": 2} if sharded else {}),  # "ddp_mpi" takes them from the generation
            strategy=strategy(),
            max_steps=args.steps,
            val_check_interval=4,
            limit_val_batches=2,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=args.out,
            callbacks=[
                Record(generation),
                ModelCheckpoint(
                    dirpath=args.out / "checkpoints", every_n_train_steps=4, save_top_k=-1, save_last=sharded
                ),
            ],
        )
        if args.stateful:  # its position is in Lightning's checkpoint, the kept one too
            from torchdata.stateful_dataloader import StatefulDataLoader

            loader = StatefulDataLoader(Epoch(), batch_size=BATCH, num_workers=1)
        else:
            loader = DataLoader(Epoch(), batch_size=BATCH, num_workers=1)
        val = DataLoader(Epoch(), batch_size=BATCH, num_workers=1)
        resume = generation.ckpt_path or ("last" if sharded else None)  # sharded: no state kept, the last file
        trainer.fit(net, train_dataloaders=loader, val_dataloaders=val, ckpt_path=resume)
        record["weights"] = weights(net)

    restartable(train, shrink=args.shrink)


def fabric_main(args: argparse.Namespace, launch_rank: int, record: dict) -> None:
    from lightning.fabric import Fabric

    def train(generation: Generation) -> None:
        fabric = Fabric(accelerator="cpu", strategy="ddp_mpi")
        fabric.launch()
        net, optimizer, step, position = resume(generation)
        record["generations"].append([generation.number, fabric.global_rank, fabric.world_size, step, None])
        record.setdefault("reconfigured", []).append(generation.reconfigured)
        ddp, optimizer = fabric.setup(net, optimizer)
        size, rank = fabric.world_size, fabric.global_rank
        sampler = batches(position, size, rank, args.steps - step)
        loader = fabric.setup_dataloaders(
            DataLoader(Items(), batch_sampler=sampler, num_workers=1), use_distributed_sampler=False
        )
        for x, y in loader:
            fault_now(args, launch_rank, step)
            optimizer.zero_grad()
            fabric.backward(torch.nn.functional.mse_loss(ddp(x), y))
            optimizer.step()
            step, position = step + 1, position + size * BATCH
            record["worlds"].append(size)
            if generation.number > 1 and "recovered_at" not in record:
                record["recovered_at"] = time.time()
            generation.keep(
                {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "position": position}
            )
        record["weights"] = weights(net)

    restartable(train, shrink=args.shrink)


if __name__ == "__main__":
    arguments = parser()
    arguments.add_argument("--api", choices=["trainer", "fabric"], required=True)
    arguments.add_argument("--stateful", action="store_true", help="the Trainer's loader: StatefulDataLoader")
    arguments.add_argument("--fsdp", action="store_true", help="the Trainer's strategy: Lightning's FSDPStrategy")
    arguments.add_argument("--deepspeed", action="store_true", help="the Trainer's strategy: its DeepSpeedStrategy")
    arguments = arguments.parse_args()
    launch_rank = this_launch_rank()
    (arguments.out / f"started-{launch_rank}-{os.getpid()}").touch()  # one file per process that ever started
    record: dict = {"generations": [], "worlds": [], "items": []}
    (trainer_main if arguments.api == "trainer" else fabric_main)(arguments, launch_rank, record)
    finish(arguments, launch_rank, record)
