"""The callback Lightning adds to every Trainer through this package's ``callbacks_factory`` entry points.

Lightning loads the factories of the entry point groups ``lightning.pytorch.callbacks_factory`` and
``pytorch_lightning.callbacks_factory`` in every ``Trainer(...)`` of that namespace (its public way for an installed
package to add callbacks without touching the Trainer); ``pyproject.toml`` names :func:`unified_callbacks` and
:func:`standalone_callbacks`. They add the callback only where it has something to do (:func:`needed`):

- ``setup``: when both Lightning namespaces are loaded, it refuses a Trainer that holds a model, datamodule,
  callback, logger or plugin built on the other namespace (:func:`~lightning_mpi_env.check_mixed_imports`), before
  any of them is used.
- ``on_train_batch_end``: with an ``MPIClusterEnvironment`` whose job can requeue, it checkpoints and requeues at
  the step the ranks agreed on once any rank got the scheduler's warning signal
  (:mod:`lightning_mpi_env.lightning.requeue`; no collective per step: :mod:`lightning_mpi_env.rollcall.agreement`).
- the four hooks of a training step: progress marks for the stall watchdog
  (:mod:`lightning_mpi_env.rollcall.watchdog`).
- ``on_sanity_check_start``/``on_train_start``: ``SIGTERM`` only records the signal, with no collective in the
  handler, so ranks signalled a moment apart cannot hang in mismatched collectives
  (:func:`~lightning_mpi_env.lightning.compat.record_sigterm_without_collective`).
- ``on_exception``: a Trainer ended by ``SIGTERM`` (Lightning raises ``SIGTERMException``, a ``SystemExit`` with
  status 0) exits with status 143, as a process ended by ``SIGTERM`` does, so a job script's ``&&`` stops there.

Users of another Trainer, or of Fabric (which calls callbacks only where the program says), call
:func:`~lightning_mpi_env.check_mixed_imports` and ``MPIClusterEnvironment.requeue_requested()`` themselves.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from lightning_mpi_env.core.launchers import detect_launcher
from lightning_mpi_env.core.namespaces import STANDALONE, UNIFIED
from lightning_mpi_env.core.settings import MixedImportMode, Settings
from lightning_mpi_env.imports.class_check import check_roles
from lightning_mpi_env.imports.sites import both_namespaces_loaded, mode
from lightning_mpi_env.lightning.compat import record_sigterm_without_collective
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.lightning.requeue import Requeue, checkpoint_and_requeue

_CLASSES: dict[str, type] = {}

SIGTERM_STATUS = 128 + 15
"""The exit status of a Trainer ended by ``SIGTERM`` (the shell's status for a process the signal ended)."""


def callback_class(package: str) -> type:
    """``MPIEnvCallback`` for the Trainer package ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``)."""
    cls = _CLASSES.get(package)
    if cls is not None:
        return cls
    base: Any = importlib.import_module(f"{package}.callbacks").Callback

    sigterm_exception: type[BaseException] = importlib.import_module(f"{package}.utilities.exceptions").SIGTERMException

    class MPIEnvCallback(base):  # type: ignore[misc]
        """Checks the Trainer at ``setup``, marks progress, checkpoints and requeues, and gives SIGTERM status 143."""

        def __init__(self) -> None:
            super().__init__()
            self._finished = 0  # training batches finished: a count every rank shares, for the requeue agreement

        def __reduce__(self) -> tuple[Any, tuple[str]]:
            # The class is made per namespace: ddp_spawn pickles the Trainer, and it, by the namespace's name.
            return _new_callback, (package,)

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """Refuse objects of the other Lightning namespace before the Trainer uses them."""
            if mode() is not MixedImportMode.IGNORE and both_namespaces_loaded():
                check_roles(trainer, [("model", pl_module)])

        def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
            """``SIGTERM`` records the signal, without a collective (Lightning registered its handlers by now)."""
            _record_sigterm_quietly(trainer)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            """``SIGTERM`` records the signal, without a collective (when no sanity check ran before)."""
            _record_sigterm_quietly(trainer)

        def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: the step started."""
            _mark(trainer, 1)

        def on_before_backward(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: backward (and its collectives) next."""
            _mark(trainer, 2)

        def on_after_backward(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: past backward."""
            _mark(trainer, 3)

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """After each training step: progress; checkpoint and requeue when any rank got the requeue signal."""
            _mark(trainer, 0)
            self._finished += 1
            environment = _environment(trainer)
            if environment is None or environment.requeue is None:
                return
            if environment.requeue_due(self._finished, trainer.strategy.reduce_boolean_decision):
                checkpoint_and_requeue(trainer, environment.requeue, environment.settings.max_requeues)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            """A ``SIGTERM`` ends the job with status 143, not 0: the job did not finish."""
            if (
                _environment(trainer) is not None
                and isinstance(exception, sigterm_exception)
                and isinstance(exception, SystemExit)
                and not exception.code
            ):
                exception.code = SIGTERM_STATUS

    MPIEnvCallback.__module__ = __name__
    MPIEnvCallback.__qualname__ = "MPIEnvCallback"
    _CLASSES[package] = MPIEnvCallback
    return MPIEnvCallback


def _environment(trainer: Any) -> MPIClusterEnvironment | None:
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return environment if isinstance(environment, MPIClusterEnvironment) else None


def _record_sigterm_quietly(trainer: Any) -> None:
    if _environment(trainer) is not None:
        record_sigterm_without_collective(trainer)


def _mark(trainer: Any, phase: int) -> None:
    environment = _environment(trainer)
    if environment is not None:
        environment.mark_progress(trainer.global_step, phase)


def _new_callback(package: str) -> Any:
    return callback_class(package)()


def needed(env: Mapping[str, str]) -> bool:
    """Whether a Trainer made now may have anything for the callback to do.

    That is: a mixed import, a launcher (the stall watchdog's progress marks, a ``SIGTERM``'s exit status), or a job
    that can requeue. Otherwise the factories add nothing (and Lightning logs nothing), so a Trainer outside a
    launcher and a scheduler, with one namespace, is exactly as Lightning builds it.
    """
    if both_namespaces_loaded() or detect_launcher(env) is not None:
        return True
    settings = Settings.from_env(env)
    return Requeue.plan(env, enabled=settings.requeue, requeue_signal=None, command=None) is not None


def unified_callbacks() -> list[Any]:
    """The ``lightning.pytorch.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(UNIFIED.trainer)()] if needed(os.environ) else []


def standalone_callbacks() -> list[Any]:
    """The ``pytorch_lightning.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(STANDALONE.trainer)()] if needed(os.environ) else []


__all__ = ["SIGTERM_STATUS", "callback_class", "needed", "standalone_callbacks", "unified_callbacks"]
