"""Register ``MPIClusterEnvironment`` and ``"ddp_mpi"`` with each Lightning namespace as it is imported."""

from __future__ import annotations

import importlib
from types import ModuleType

from lightning_mpi_env.core.namespaces import NAMESPACES
from lightning_mpi_env.imports.hooks import when_imported


def _register_cluster_environment(module: ModuleType) -> None:
    environment = importlib.import_module("lightning_mpi_env.lightning.environment")
    module.ClusterEnvironment.register(environment.MPIClusterEnvironment)


def _register_strategy(module: ModuleType) -> None:
    importlib.import_module("lightning_mpi_env.lightning.strategy").register(module)


def watch_lightning() -> None:
    """Register with every Lightning namespace now imported, and with each one imported later."""
    for namespace in NAMESPACES:
        when_imported(namespace.cluster_environment_module, _register_cluster_environment)
        for package in namespace.strategy_packages:
            when_imported(package, _register_strategy)
