"""The callback Lightning adds to every Trainer through this package's ``callbacks_factory`` entry points.

Lightning loads the factories of the entry point groups ``lightning.pytorch.callbacks_factory`` and
``pytorch_lightning.callbacks_factory`` in every ``Trainer(...)`` of that namespace (its public way for an installed
package to add callbacks without touching the Trainer); ``pyproject.toml`` names :func:`unified_callbacks` and
:func:`standalone_callbacks`. They add the callback only where it has something to do (:func:`needed`):

- ``setup``: when both Lightning namespaces are loaded, it refuses a Trainer that holds a model, datamodule,
  callback, logger or plugin built on the other namespace (:func:`~lightning_mpi_env.check_mixed_imports`), before
  any of them is used.
- ``on_train_batch_end``: with an ``MPIClusterEnvironment`` whose job can requeue, it checkpoints and requeues once
  any rank got the scheduler's warning signal (:mod:`lightning_mpi_env.lightning.requeue`).

Users of another Trainer, or of Fabric (which calls callbacks only where the program says), call
:func:`~lightning_mpi_env.check_mixed_imports` and ``MPIClusterEnvironment.requeue_requested()`` themselves.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from lightning_mpi_env.core.namespaces import STANDALONE, UNIFIED
from lightning_mpi_env.core.settings import MixedImportMode, Settings
from lightning_mpi_env.imports.class_check import check_roles
from lightning_mpi_env.imports.sites import both_namespaces_loaded, mode
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.lightning.requeue import Requeue, checkpoint_and_requeue

_CLASSES: dict[str, type] = {}


def callback_class(package: str) -> type:
    """``MPIEnvCallback`` for the Trainer package ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``)."""
    cls = _CLASSES.get(package)
    if cls is not None:
        return cls
    base: Any = importlib.import_module(f"{package}.callbacks").Callback

    class MPIEnvCallback(base):  # type: ignore[misc]
        """Checks what the Trainer holds at ``setup``; checkpoints and requeues on the scheduler's signal."""

        def __reduce__(self) -> tuple[Any, tuple[str]]:
            # The class is made per namespace: ddp_spawn pickles the Trainer, and it, by the namespace's name.
            return _new_callback, (package,)

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """Refuse objects of the other Lightning namespace before the Trainer uses them."""
            if mode() is not MixedImportMode.IGNORE and both_namespaces_loaded():
                check_roles(trainer, [("model", pl_module)])

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """After each training step: checkpoint and requeue when any rank got the requeue signal."""
            environment = getattr(trainer.strategy, "cluster_environment", None)
            plan = environment.requeue if isinstance(environment, MPIClusterEnvironment) else None
            if plan is not None and plan.agree(trainer.strategy.reduce_boolean_decision):
                checkpoint_and_requeue(trainer, plan)

    MPIEnvCallback.__module__ = __name__
    MPIEnvCallback.__qualname__ = "MPIEnvCallback"
    _CLASSES[package] = MPIEnvCallback
    return MPIEnvCallback


def _new_callback(package: str) -> Any:
    return callback_class(package)()


def needed(env: Mapping[str, str]) -> bool:
    """Whether a Trainer made now has anything for the callback to do: a mixed import, or a job that can requeue.

    Otherwise the factories add nothing (and Lightning logs nothing), so a Trainer outside a scheduler with one
    namespace is exactly as Lightning builds it.
    """
    if both_namespaces_loaded():
        return True
    settings = Settings.from_env(env)
    return Requeue.plan(env, enabled=settings.requeue, requeue_signal=None, command=None) is not None


def unified_callbacks() -> list[Any]:
    """The ``lightning.pytorch.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(UNIFIED.trainer)()] if needed(os.environ) else []


def standalone_callbacks() -> list[Any]:
    """The ``pytorch_lightning.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(STANDALONE.trainer)()] if needed(os.environ) else []


__all__ = ["callback_class", "needed", "standalone_callbacks", "unified_callbacks"]
