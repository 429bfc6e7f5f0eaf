"""The callback's progress marks in a real one-process Trainer fit: which hooks mark, in what order, at what phase."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_mpi_env.lightning import callbacks
from lightning_mpi_env.lightning.callbacks import callback_class
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.rollcall.stall import BEFORE_THE_FIRST_STEP, PHASES

ONE_RANK = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


class RecordingEnvironment(MPIClusterEnvironment):
    """The environment the callback finds, recording each progress mark as ``(step, phase name)``."""

    def __init__(self) -> None:
        super().__init__(ONE_RANK, roll_call=False, auto_requeue=False)
        self.marks: list[tuple[int, str]] = []
        self.busy = 0

    def mark_progress(self, step: int, phase: int) -> None:
        self.marks.append((step, PHASES[phase]))

    def mark_busy(self) -> None:
        self.busy += 1


def _fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, sanity_steps: int) -> tuple[list[tuple[int, str]], int, int]:
    """Fit 2 steps on one CPU, the sanity check's ``sanity_steps`` batches first; a validation after the epoch.

    Returns the marks, how many validation steps ran, and how much work that is no mark was told.
    """
    validated: list[int] = []
    pl = pytest.importorskip("lightning.pytorch")
    import torch

    class Model(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.layer(batch).sum()

        def validation_step(self, batch: Any, index: int) -> None:
            validated.append(index)
            self.layer(batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

        def val_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.ones(6, 2), batch_size=2)

    environment = RecordingEnvironment()
    monkeypatch.setattr(callbacks, "_environment", lambda trainer: environment)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        num_sanity_val_steps=sanity_steps,
        callbacks=[callback_class("lightning.pytorch")()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Model())
    return environment.marks, len(validated), environment.busy


BEFORE = PHASES[BEFORE_THE_FIRST_STEP]
STEPS = [
    (0, "in its training step"),
    (0, "in backward"),
    (0, "past backward"),
    (1, "between steps"),
    (1, "in its training step"),
    (1, "in backward"),
    (1, "past backward"),
    (2, "between steps"),
    (2, "in validation"),
    (2, "past validation"),
]


def test_a_fit_marks_its_setup_and_each_sanity_check_batch_before_the_first_step(monkeypatch, tmp_path):
    # The fit's start (past DDP's first broadcast), each sanity check batch's start and end, the sanity check's end;
    # then the steps. The validation after the epoch marks its start and the end of its batches, which every rank
    # reaches as often; each of its batches is work that is no mark (ranks may have uneven validation batches).
    marks, validated, busy = _fit(monkeypatch, tmp_path, sanity_steps=2)
    assert validated == 2 + 3  # the sanity check's 2 batches, then the epoch's validation of 3
    assert marks == [(0, BEFORE)] * 6 + STEPS
    assert busy == 3


def test_a_fit_without_a_sanity_check_marks_its_start_then_its_steps(monkeypatch, tmp_path):
    marks, validated, busy = _fit(monkeypatch, tmp_path, sanity_steps=0)
    assert validated == 3
    assert marks == [(0, BEFORE), *STEPS]
    assert busy == 3
