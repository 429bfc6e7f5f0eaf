"""Catch programs that mix ``pytorch_lightning``/``lightning_fabric`` with ``lightning.pytorch``/``lightning.fabric``.

The public face of five modules, one job each:

- :mod:`lightning_mpi_env.core.namespaces`: the two namespaces, as one table;
- :mod:`lightning_mpi_env.imports.sites`: where each namespace was imported, and :class:`MixedImportWarning` as soon
  as both are loaded;
- :mod:`lightning_mpi_env.imports.class_check`: :func:`check_mixed_imports`, naming every object built on the other
  namespace than the Trainer's;
- :mod:`lightning_mpi_env.lightning.trainer_guard`: that check on the arguments of ``fit``/``validate``/``test``/
  ``predict`` and at launch, for Trainers that use ``MPIClusterEnvironment`` or ``"ddp_mpi"``;
- :mod:`lightning_mpi_env.imports.unify`: :func:`unify_imports`, which aliases the old namespace to the new one.

``LIGHTNING_MPI_ENV_MIXED_IMPORTS``: ``warn`` (default) warns; ``error`` raises :class:`MixedImportError` instead of
warning; ``ignore`` silences the warning and skips the automatic launch-time check (an explicit call to
:func:`check_mixed_imports` always checks). Nothing here imports torch or Lightning.
"""

from __future__ import annotations

from lightning_mpi_env.core.errors import MixedImportError, MixedImportWarning
from lightning_mpi_env.core.namespaces import STANDALONE, UNIFIED, namespace_of, package_of
from lightning_mpi_env.imports.class_check import check_mixed_imports, held_by
from lightning_mpi_env.imports.sites import MODE_VARIABLE, ImportSite, Mode, mode
from lightning_mpi_env.imports.unify import unify_imports
from lightning_mpi_env.lightning.trainer_guard import guard_trainer

__all__ = [
    "MODE_VARIABLE",
    "STANDALONE",
    "UNIFIED",
    "ImportSite",
    "MixedImportError",
    "MixedImportWarning",
    "Mode",
    "check_mixed_imports",
    "guard_trainer",
    "held_by",
    "mode",
    "namespace_of",
    "package_of",
    "unify_imports",
]
