"""A Lightning Trainer with Lightning's own ``DeepSpeedStrategy`` and ``plugins=[MPIClusterEnvironment()]``.

Run by ``tests/lightning/test_deepspeed.py`` under real ``mpirun``, with the Python of the DeepSpeed test venv
(:mod:`tests.clusters.deepspeed`). Each rank prints one ``RESULT`` JSON line (its ranks as Lightning, torch and
DeepSpeed see them, the launcher's rank, its host, the samples it trained on and the weights after training), and one
``DEEPSPEED_INIT`` line when Lightning calls ``deepspeed.init_distributed``: the environment's stage then (``met``:
the roll call has run) and whether a process group existed already.

Lightning's ``DeepSpeedStrategy`` takes no accelerator but its ``CUDAAccelerator``, and this machine has no GPU: the
job passes ``Trainer(accelerator=CPUAsCUDA())`` (``cpu_as_cuda.py``). Everything from ``fit()`` to
``deepspeed.init_distributed`` and ``deepspeed.initialize`` is Lightning's and DeepSpeed's code; DeepSpeed runs on its
own CPU accelerator, whose collectives are gloo's.
"""

import argparse
import importlib
import json
import os
import socket
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from lightning_mpi_env import MPIClusterEnvironment

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "instrumented"))
from cpu_as_cuda import cpu_as_cuda  # noqa: E402  (this folder: the script's own path)
from tamper import start_gate  # noqa: E402  (the instrumented jobs' start gate)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", choices=["lightning.pytorch", "pytorch_lightning"], default="lightning.pytorch")
    parser.add_argument("--stage", type=int, choices=[0, 1, 2], default=2, help="DeepSpeed's ZeRO stage")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--root-dir", help="Trainer(default_root_dir=...): where the requeue's checkpoint would go")
    args = parser.parse_args()
    pl = importlib.import_module(args.namespace)

    CPUAsCUDA = cpu_as_cuda(args.namespace)

    class Indexed(Dataset):
        def __len__(self):
            return args.samples

        def __getitem__(self, index):
            x = torch.full((4,), float(index))
            return index, x, x.sum(dim=0, keepdim=True) * 0.5

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.seen = []

        def training_step(self, batch, batch_index):
            index, x, y = batch
            self.seen += index.tolist()
            return torch.nn.functional.mse_loss(self.layer(x) / 100, y / 100)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Indexed(), batch_size=4)

    environment = MPIClusterEnvironment()
    calls = []
    real_init_distributed = deepspeed.init_distributed

    def spy_init_distributed(*positional, **keywords):
        # Lightning calls deepspeed.init_distributed by name: note where the roll call stood, and let the call through.
        call = {"stage": environment.stage.value, "initialized": dist.is_initialized(), "rank": os.environ["RANK"]}
        calls.append(call)
        print(f"DEEPSPEED_INIT {json.dumps(call)}\n", end="", flush=True)
        return real_init_distributed(*positional, **keywords)

    deepspeed.init_distributed = spy_init_distributed
    trainer = pl.Trainer(
        accelerator=CPUAsCUDA(),
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=pl.strategies.DeepSpeedStrategy(stage=args.stage, process_group_backend="gloo"),
        plugins=[environment],
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=args.root_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    start_gate()  # a test of the rendezvous holds every rank here until the others have finished their imports
    trainer.fit(model)
    engine = trainer.strategy.model
    print(
        "RESULT "
        + json.dumps(
            {
                "launcher_rank": int(os.environ["OMPI_COMM_WORLD_RANK"]),
                "global_rank": trainer.global_rank,
                "local_rank": trainer.local_rank,
                "node_rank": trainer.node_rank,
                "world_size": trainer.world_size,
                "torch_rank": dist.get_rank(),
                "torch_world_size": dist.get_world_size(),
                "deepspeed_rank": deepspeed.comm.get_rank(),
                "backend": dist.get_backend(),
                "hostname": socket.gethostname(),
                "strategy": f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__qualname__}",
                "engine": type(engine).__name__,
                "zero_stage": engine.zero_optimization_stage(),
                "deepspeed": deepspeed.__version__,
                "accelerator": deepspeed.get_accelerator().device_name(),
                "calls": calls,
                "seen": model.seen,
                "weights": [round(value, 6) for value in model.layer.weight.flatten().tolist()],
            }
        )
        + "\n",
        end="",
        flush=True,
    )


if __name__ == "__main__":  # not when pytest imports it to look for doctests
    sys.exit(main())
