"""The Trainer's state kept in memory under ``restartable``: what the next generation's ``fit`` resumes, no file.

The callback notes the fit loop's position when training starts and at each training batch's end, before any
collective of its own there: where Lightning's ``ModelCheckpoint`` saves mid-epoch. When the fit fails,
:func:`keep_at_failure` keeps Lightning's checkpoint dictionary, taken then, as the generation's state:

- the optimizer has not stepped since the last note (a peer was lost in the step's collectives, before the update):
  the weights and the optimizer are those of the noted batch's end, and so is the position kept (the checkpoint's own
  has its loader past the failed batch): the failed batch is done again;
- it has stepped (the failure came at the batch's end): the checkpoint as taken, Lightning's state at a batch's end;
- nothing was trained in this fit: what the generation resumed stays kept.

``"ddp_mpi"`` loads it for ``fit(ckpt_path=generation.ckpt_path)`` (:func:`kept_checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.lightning.compat import dump_checkpoint, fit_loop_state
from lightning_mpi_env.recovery.restart import KEPT_CHECKPOINT, Generation

NOT_RESUMED = ("hyper_parameters", "datamodule_hyper_parameters")
"""Checkpoint entries a ``fit`` resume does not read (``load_from_checkpoint`` does), left out of the kept state: they
hold any object the program saved (Lightning's ``AttributeDict`` at least), which the hand-over's
``weights_only=True`` load refuses."""


@dataclass(frozen=True)
class FitPosition:
    """Where the fit stood at a note: its optimizer steps, and the fit loop's state at a batch's end."""

    global_step: int
    loops: dict[str, Any] | None
    """``None``: noted as training started, before any batch ended."""


def note(trainer: Any, *, batch_ended: bool) -> FitPosition:
    """The fit's position now: at a training batch's end (``batch_ended``), or as training starts."""
    return FitPosition(int(trainer.global_step), fit_loop_state(trainer) if batch_ended else None)


def keep_at_failure(trainer: Any, generation: Generation, position: FitPosition | None) -> None:
    """Keep, as ``generation``'s state, the checkpoint the next generation resumes from (see the module's rules)."""
    if position is None or (position.loops is None and int(trainer.global_step) == position.global_step):
        return  # nothing trained in this fit: the state the generation resumed (or none) stays
    checkpoint = {key: value for key, value in dump_checkpoint(trainer).items() if key not in NOT_RESUMED}
    if int(trainer.global_step) == position.global_step:
        checkpoint["loops"]["fit_loop"] = position.loops
    generation.keep(checkpoint)


def kept_checkpoint(generation: Generation | None) -> dict[str, Any]:
    """The checkpoint rank 0 kept, as ``"ddp_mpi"`` loads it for ``ckpt_path=KEPT_CHECKPOINT``.

    Raises:
        RecoveryError: Outside ``restartable``, or with nothing kept (the path is then ``generation.ckpt_path``'s
            ``None``, not this one), or with a state that is no Trainer checkpoint (``main`` kept its own).
    """
    if generation is None:
        raise RecoveryError(
            f"ckpt_path={KEPT_CHECKPOINT!r} names the Trainer state that restartable keeps, and this Trainer was made"
            " outside restartable's main",
            "pass ckpt_path=generation.ckpt_path inside the function restartable calls: it is None in generation 1",
            variable="ckpt_path",
            value=KEPT_CHECKPOINT,
        )
    state = generation.resumed
    if not isinstance(state, dict) or "state_dict" not in state or "loops" not in state:
        raise RecoveryError(
            f"generation {generation.number} resumed no Trainer checkpoint from rank 0 (it kept"
            f" {type(state).__name__}), so ckpt_path={KEPT_CHECKPOINT!r} has nothing to load",
            'use strategy="ddp_mpi" and leave generation.keep() to it, or pass ckpt_path=None and load what you kept',
            variable="ckpt_path",
            value=KEPT_CHECKPOINT,
        )
    return state
