"""The demo's training job: the README's line, ``Trainer(strategy=MPIDDPStrategy())``, on every rank of a launch.

``lightning-mpi-env demo`` runs it on simulated nodes (``python -m lightning_mpi_env.demo_job``); it runs under any
launcher the same way, e.g. ``mpirun -np 4 python -m lightning_mpi_env.demo_job``. It trains a small model on the
CPU for one epoch, with no ``devices`` and no ``num_nodes``: they come from the launch. Each rank then prints one line,
``RESULT {json}``: its host, its ranks and world size, the samples it trained on and the model's weights, from which
the demo checks that the ranks are unique, the node ranks match the hosts, the data shards are disjoint and the
weights are the same on every rank.

torch and Lightning are imported when the job runs, not when the module is imported (pytest's doctest collection
imports it), so the model class is made in :func:`main`.
"""

from __future__ import annotations

import json
import socket
from typing import Any

SAMPLES = 64
"""Samples in the data set: each rank trains on its own quarter of them under 4 ranks."""
RESULT = "RESULT "
"""What begins each rank's result line."""


def main() -> None:
    """Train on every rank of the launch, then print this rank's ``RESULT`` line."""
    import torch
    from lightning.pytorch import LightningModule, Trainer

    from lightning_mpi_env.pytorch import MPIDDPStrategy

    class Model(LightningModule):
        """A linear layer learning ``y = sum(x) / 2``; it records the sample indices this rank trained on."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)  # the same start on every rank
            self.layer = torch.nn.Linear(4, 1)
            self.seen: list[int] = []

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            index, x = args[0]
            self.seen += index.tolist()
            return torch.nn.functional.mse_loss(self.layer(x) / 100, x.sum(dim=1, keepdim=True) / 200)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[int, torch.Tensor]]:
            data = [(index, torch.full((4,), float(index))) for index in range(SAMPLES)]
            return torch.utils.data.DataLoader(data, batch_size=4)  # type: ignore[arg-type]

    trainer = Trainer(
        strategy=MPIDDPStrategy(),  # the README's line: devices and num_nodes come from the launch
        accelerator="cpu",  # simulated nodes share this machine: the demo trains on its CPU
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    trainer.fit(model)
    weights = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    result = {
        "hostname": socket.gethostname(),
        "global_rank": trainer.global_rank,
        "node_rank": trainer.node_rank,
        "local_rank": trainer.local_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "seen": model.seen,
        "weights": [round(value, 6) for value in weights.tolist()],
    }
    print(RESULT + json.dumps(result) + "\n", end="", flush=True)  # one write per line: the ranks share the output


if __name__ == "__main__":
    main()
