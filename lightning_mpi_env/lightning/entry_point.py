"""Whether a Trainer needs the package's callback, and whether Lightning finds its ``callbacks_factory`` entry point."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from importlib.metadata import entry_points

from lightning_mpi_env.core.errors import Explained, MpiEnvError
from lightning_mpi_env.core.launchers import started_by_launcher
from lightning_mpi_env.core.namespaces import NAMESPACES
from lightning_mpi_env.imports.sites import both_namespaces_loaded
from lightning_mpi_env.lightning.requeue import Requeue

ENTRY_MODULE = "_lightning_mpi_env_entry"
"""The top-level module the entry points name (``pyproject.toml``)."""


class CallbackWarning(Explained, UserWarning):
    """A Trainer with the plugin gets no callback: the package is used from a source tree, not installed."""

    separator = " "


_warned = False


def needed(env: Mapping[str, str]) -> bool:
    """Whether a Trainer made now may have work for the callback; never raises, and reads no ``LIGHTNING_MPI_ENV_*``."""
    if both_namespaces_loaded():
        return True
    try:
        if started_by_launcher(env):
            return True
        return Requeue.plan(env, enabled=True, requeue_signal=None, command=None) is not None
    except MpiEnvError:
        return True


def installed(trainer_package: str) -> bool:
    """Whether Lightning's Trainer of ``trainer_package`` finds this package's ``callbacks_factory`` entry point."""
    points = entry_points(group=f"{trainer_package}.callbacks_factory")
    return any(point.value.partition(":")[0] == ENTRY_MODULE for point in points)


def warn_without_callback(env: Mapping[str, str] | None = None) -> None:
    """Once per process, where a Trainer may hold the plugin and no entry point adds the callback: say so."""
    global _warned
    if _warned:
        return
    env = os.environ if env is None else env
    trainers = [namespace.trainer for namespace in NAMESPACES if namespace.trainer in sys.modules]
    if not trainers or all(installed(package) for package in trainers) or not needed(env):
        return
    _warned = True
    warnings.warn(
        CallbackWarning(
            "lightning_mpi_env is imported from a source tree, not installed: Lightning finds no callbacks_factory "
            "entry point of it, so a Trainer with plugins=[MPIClusterEnvironment()] and Lightning's own strategy "
            "runs without its callback (no checkpoint and requeue on the scheduler's signal, no progress marks for "
            "the stall watchdog, no mixed-import check, status 0 after SIGTERM). A Fabric program is not affected.",
            "Install the package (`pip install -e <checkout>`), or use its strategy, which adds the callback itself: "
            "`from lightning_mpi_env.pytorch import MPIDDPStrategy` and Trainer(strategy=MPIDDPStrategy()).",
        ),
        stacklevel=2,
    )
