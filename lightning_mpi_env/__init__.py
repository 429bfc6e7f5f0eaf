"""Start PyTorch Lightning, plain PyTorch DDP, torchrun and JAX correctly under MPI, or fail fast saying why.

Importing it needs the standard library only; its one process-wide change is an import finder, which registers the
Lightning parts with each Lightning namespace when that is imported, and notices a second namespace.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_mpi_env.core.errors import LayoutError as LayoutError
from lightning_mpi_env.core.errors import MixedImportError as MixedImportError
from lightning_mpi_env.core.errors import MixedImportWarning as MixedImportWarning
from lightning_mpi_env.core.errors import MpiEnvError as MpiEnvError
from lightning_mpi_env.core.errors import RecoveryError as RecoveryError
from lightning_mpi_env.core.errors import RendezvousError as RendezvousError
from lightning_mpi_env.core.layout import from_env as from_env
from lightning_mpi_env.core.placement import Placement as Placement
from lightning_mpi_env.core.rank_layout import RankLayout as RankLayout
from lightning_mpi_env.imports import sites as import_sites
from lightning_mpi_env.lightning import registration as _registration

if TYPE_CHECKING:
    from lightning_mpi_env.imports.class_check import check_mixed_imports as check_mixed_imports
    from lightning_mpi_env.imports.unify import unify_imports as unify_imports
    from lightning_mpi_env.lightning.environment import MPIClusterEnvironment as MPIClusterEnvironment
    from lightning_mpi_env.lightning.requeue import hpc_checkpoint as hpc_checkpoint
    from lightning_mpi_env.lightning.strategy import strategy_class as strategy_class
    from lightning_mpi_env.recovery.restart import Generation as Generation
    from lightning_mpi_env.recovery.restart import restartable as restartable
    from lightning_mpi_env.tools.interop import jax_distributed_kwargs as jax_distributed_kwargs
    from lightning_mpi_env.tools.interop import torch_env as torch_env

__version__ = "1.0.0"

_LAZY = {
    "MPIClusterEnvironment": "lightning_mpi_env.lightning.environment",
    "strategy_class": "lightning_mpi_env.lightning.strategy",
    "check_mixed_imports": "lightning_mpi_env.imports.class_check",
    "jax_distributed_kwargs": "lightning_mpi_env.tools.interop",
    "torch_env": "lightning_mpi_env.tools.interop",
    "unify_imports": "lightning_mpi_env.imports.unify",
    "hpc_checkpoint": "lightning_mpi_env.lightning.requeue",
    "restartable": "lightning_mpi_env.recovery.restart",
    "Generation": "lightning_mpi_env.recovery.restart",
}
"""Public names whose modules load on first use (PEP 562): the Lightning-facing ones, and the rarely used."""

__all__ = [
    "Generation",
    "LayoutError",
    "MPIClusterEnvironment",
    "MixedImportError",
    "MixedImportWarning",
    "MpiEnvError",
    "Placement",
    "RankLayout",
    "RecoveryError",
    "RendezvousError",
    "__version__",
    "check_mixed_imports",
    "from_env",
    "hpc_checkpoint",
    "jax_distributed_kwargs",
    "restartable",
    "strategy_class",
    "torch_env",
    "unify_imports",
]


def __getattr__(name: str) -> Any:
    """The lazily loaded public names, and the untyped ``MPIDDPStrategy`` kept for existing programs."""
    if name == "MPIDDPStrategy":
        return importlib.import_module("lightning_mpi_env.lightning.strategy").loaded_strategy_class()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "MPIDDPStrategy"})


import_sites.watch_imports()
_registration.watch_lightning()
