"""Checks that run before a Trainer's (or a Fabric's) entry points, on that one instance.

Lightning offers no hook that reaches a Trainer before ``fit()`` looks at its arguments, so the entry points of the
Trainer (``fit``/``validate``/``test``/``predict``) or Fabric (``launch``/``setup``/``setup_module``) this package
meets while it is built get a :class:`CheckedEntryPoint` that runs the checks first. A check sees the instance, the
method's name and its bound arguments; it raises to stop, and may change the arguments (resuming from a
checkpoint). How the instance is found is in :mod:`lightning_mpi_env.lightning.compat`. Standard library only.

The mixed-import check (:func:`check_mixed_arguments`) runs on every guarded Trainer: Lightning refuses a model of
the other namespace with "`model` must be a `LightningModule` ..., got `M`", which does not say why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from lightning_mpi_env.imports.class_check import check_mixed_imports, check_roles
from lightning_mpi_env.imports.sites import Mode, both_namespaces_loaded, mode
from lightning_mpi_env.lightning.compat import (
    FABRIC_ENTRY_POINTS,
    TRAINER_ENTRY_POINTS,
    constructing_trainer,
    is_fabric,
    is_trainer,
    launching_trainer,
)

if TYPE_CHECKING:
    import inspect

Check = Callable[[object, str, "inspect.BoundArguments"], None]
"""``check(instance, method name, bound arguments)``: raises to stop the call; may change the arguments."""


class CheckedEntryPoint:
    """One entry point of one Trainer or Fabric, with the checks first.

    A class rather than a closure: ``ddp_spawn`` pickles the Trainer, and with it its instance attributes (and the
    checks, which are module functions or methods of picklable objects).
    """

    def __init__(self, owner: object, name: str) -> None:
        self._owner = owner
        self.__name__ = name
        self.__wrapped__ = getattr(type(owner), name)
        self.__doc__ = self.__wrapped__.__doc__
        self.checks: list[Check] = []

    def __call__(self, *args: object, **kwargs: object) -> object:
        """Run the checks, then the Trainer's or Fabric's own method (with the arguments the checks left)."""
        owner, entry = self._owner, self.__wrapped__
        if self.checks:
            import inspect  # Here, not at the top: the package's own import stays light.

            try:
                bound = inspect.signature(entry).bind(owner, *args, **kwargs)
            except TypeError:  # Lightning's own call reports wrong arguments better
                return entry(owner, *args, **kwargs)
            for check in self.checks:
                check(owner, self.__name__, bound)
            return entry(*bound.args, **bound.kwargs)
        return entry(owner, *args, **kwargs)


def attach(owner: object, check: Check) -> None:
    """Run ``check`` before the entry points of ``owner`` (a Trainer or a Fabric); once per check."""
    names = TRAINER_ENTRY_POINTS if is_trainer(owner) else FABRIC_ENTRY_POINTS if is_fabric(owner) else ()
    for name in names:
        current = owner.__dict__.get(name)
        if not isinstance(current, CheckedEntryPoint):
            current = CheckedEntryPoint(owner, name)
            setattr(owner, name, current)
        if check not in current.checks:
            current.checks.append(check)


def check_mixed_arguments(trainer: object, name: str, arguments: inspect.BoundArguments) -> None:
    """The mixed-import check on the arguments of a Trainer entry point and on what the Trainer holds.

    It costs nothing unless both namespaces are loaded, and honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore``.

    Raises:
        MixedImportError: Naming every object built on the other namespace, its file and the fix.
    """
    if mode() is Mode.IGNORE or not both_namespaces_loaded():
        return
    given = [(role, obj) for role, obj in list(arguments.arguments.items())[1:] if obj is not None]
    check_roles(trainer, given)


def guard_trainer(trainer: object) -> None:
    """Check ``fit``/``validate``/``test``/``predict`` arguments (model, datamodule, ...) before Lightning does.

    Args:
        trainer: A ``lightning.pytorch`` or ``pytorch_lightning`` Trainer; anything else is left alone.
    """
    if is_trainer(trainer):
        attach(trainer, check_mixed_arguments)


def guard_constructing_trainer() -> object | None:
    """:func:`guard_trainer` on the Trainer being built (when called from inside ``Trainer(...)``); it, or ``None``."""
    trainer = constructing_trainer(sys._getframe(1))
    if trainer is not None:
        guard_trainer(trainer)
    return trainer


def check_launching_trainer() -> None:
    """The automatic check at launch: the Trainer being launched, what it holds and the launched arguments.

    Honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore`` (skips). Does nothing when no Trainer is launching (Fabric).

    Raises:
        MixedImportError: As :func:`~lightning_mpi_env.imports.class_check.check_mixed_imports`.
    """
    if mode() is Mode.IGNORE:
        return
    trainer, arguments = launching_trainer(sys._getframe(1))
    if trainer is not None:
        check_mixed_imports(*arguments, trainer=trainer)


__all__ = [
    "Check",
    "CheckedEntryPoint",
    "attach",
    "check_launching_trainer",
    "check_mixed_arguments",
    "guard_constructing_trainer",
    "guard_trainer",
]
