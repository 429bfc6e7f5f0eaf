"""The mixed-import check on a Trainer: on the arguments of ``fit``/``validate``/``test``/``predict``, and at launch.

Lightning checks the model's class first thing in ``fit()`` and refuses a model of the other namespace with
"`model` must be a `LightningModule` ..., got `M`", which does not say why. :func:`guard_trainer` puts the
check of :mod:`lightning_mpi_env.class_check` in front of those methods on one Trainer instance, so the error
names the class, its namespace, its file and the fix. Lightning offers no hook that reaches the Trainer before
``fit()``; how the Trainer is found is in :mod:`lightning_mpi_env.compat`. Standard library only.
"""

from __future__ import annotations

import sys

from lightning_mpi_env.class_check import check_mixed_imports, check_roles
from lightning_mpi_env.compat import TRAINER_ENTRY_POINTS, constructing_trainer, is_trainer, launching_trainer
from lightning_mpi_env.import_sites import Mode, both_namespaces_loaded, mode

_GUARDED = "_lightning_mpi_env_guarded"


class CheckedEntryPoint:
    """``fit``/``validate``/``test``/``predict`` of one Trainer, with the mixed-import check first.

    A class rather than a closure: ``ddp_spawn`` pickles the Trainer, and with it its instance attributes.
    """

    def __init__(self, trainer: object, name: str) -> None:
        self._trainer = trainer
        self.__name__ = name
        self.__wrapped__ = getattr(type(trainer), name)
        self.__doc__ = self.__wrapped__.__doc__

    def __call__(self, *args: object, **kwargs: object) -> object:
        """Check the arguments and what the Trainer holds, then call the Trainer's own method."""
        trainer, entry = self._trainer, self.__wrapped__
        if mode() is not Mode.IGNORE and both_namespaces_loaded():
            import inspect  # Here, not at the top: the package's own import stays light.

            try:
                given = inspect.signature(entry).bind_partial(trainer, *args, **kwargs).arguments
            except TypeError:  # Lightning's own call reports wrong arguments better
                given = {}
            check_roles(trainer, [(role, obj) for role, obj in list(given.items())[1:] if obj is not None])
        return entry(trainer, *args, **kwargs)


def guard_trainer(trainer: object) -> None:
    """Check ``fit``/``validate``/``test``/``predict`` arguments (model, datamodule, ...) before Lightning does.

    The guard, set on this one Trainer instance, runs the check on the arguments and on what the Trainer holds first.
    It costs nothing unless both namespaces are loaded, and honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore``.

    Args:
        trainer: A ``lightning.pytorch`` or ``pytorch_lightning`` Trainer; anything else is left alone.
    """
    if not is_trainer(trainer) or getattr(trainer, _GUARDED, False):
        return
    for name in TRAINER_ENTRY_POINTS:
        setattr(trainer, name, CheckedEntryPoint(trainer, name))
    setattr(trainer, _GUARDED, True)


def guard_constructing_trainer() -> None:
    """:func:`guard_trainer` on the Trainer being built (when called from inside ``Trainer(...)``), else nothing."""
    trainer = constructing_trainer(sys._getframe(1))
    if trainer is not None:
        guard_trainer(trainer)


def check_launching_trainer() -> None:
    """The automatic check at launch: the Trainer being launched, what it holds and the launched arguments.

    Honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore`` (skips). Does nothing when no Trainer is launching (Fabric).

    Raises:
        MixedImportError: As :func:`~lightning_mpi_env.class_check.check_mixed_imports`.
    """
    if mode() is Mode.IGNORE:
        return
    trainer, arguments = launching_trainer(sys._getframe(1))
    if trainer is not None:
        check_mixed_imports(*arguments, trainer=trainer)


__all__ = ["CheckedEntryPoint", "check_launching_trainer", "guard_constructing_trainer", "guard_trainer"]
