"""``MPIDDPStrategy`` (``strategy="ddp_mpi"``): Lightning's DDP with ``MPIClusterEnvironment`` and its roll call.

``DDPStrategy`` is a different class in ``lightning.pytorch``, ``pytorch_lightning``, ``lightning.fabric`` and
``lightning_fabric``, so there is one ``MPIDDPStrategy`` per package. Each is made, and registered as ``"ddp_mpi"``
in that package's strategy registry, right when the package's ``strategies`` module is imported (before or after
this module). Nothing is restated from Lightning's ``DDPStrategy``: the roll call runs in the cluster environment,
at the rank proposal every strategy makes right before ``init_process_group``.

Which class you get:

- ``Trainer(strategy="ddp_mpi")`` and ``Fabric(strategy="ddp_mpi")`` pick the right one by themselves.
- ``lightning_mpi_env.MPIDDPStrategy`` is the Trainer class of the one namespace your program has imported; it
  raises :class:`ImportError` when none or both are imported.
- :func:`strategy_class` (``strategy_class("pytorch_lightning")``, ``strategy_class("lightning.fabric")``) names
  the package explicitly, and imports it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from typing_extensions import override

from lightning_mpi_env.core.errors import SettingError, StrategyImportError
from lightning_mpi_env.core.launchers import SLURM, detect_launcher
from lightning_mpi_env.core.namespaces import NAMESPACES, of_trainer_package
from lightning_mpi_env.lightning.compat import arguments_given, silence_srun_not_used, strategy_registry
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.lightning.trainer_guard import guard_constructing_trainer
from lightning_mpi_env.rollcall.verdicts import resolve_timeout

STRATEGY_NAME = "ddp_mpi"
"""The name under which the strategy is registered in every namespace."""

PACKAGES: tuple[str, ...] = tuple(package for namespace in NAMESPACES for package in namespace.roots)
"""The packages with a ``DDPStrategy`` of their own: each gets its ``MPIDDPStrategy``."""

_CLASSES: dict[str, type] = {}


def strategy_class(package: str) -> type:
    """The ``MPIDDPStrategy`` for ``package`` (``"lightning.pytorch"``, ``"lightning.fabric"``, ...), importing it.

    Raises:
        SettingError: For any other name (a ``ValueError``).
    """
    if package not in PACKAGES:
        raise SettingError(
            f"namespace={package!r} is not a Lightning package with strategies.",
            f"Use one of {', '.join(PACKAGES)}.",
            variable="namespace",
            value=package,
        )
    importlib.import_module(f"{package}.strategies")  # runs register() through the import hook, if not yet run
    return _CLASSES[package]


def loaded_strategy_class() -> type:
    """The Trainer ``MPIDDPStrategy`` of the one Lightning namespace imported so far.

    Raises:
        ImportError: If neither or both trainer namespaces are imported.
    """
    loaded = [namespace.trainer for namespace in NAMESPACES if namespace.trainer in _CLASSES]
    if len(loaded) == 1:
        return _CLASSES[loaded[0]]
    if not loaded:
        raise StrategyImportError(
            "lightning_mpi_env.MPIDDPStrategy subclasses the DDPStrategy of the Lightning namespace you use, but "
            "neither lightning.pytorch nor pytorch_lightning is imported yet.",
            'Import your Lightning namespace first (`import lightning.pytorch as pl`), pass `strategy="ddp_mpi"` to '
            'the Trainer, or use `lightning_mpi_env.lightning.strategy.strategy_class("lightning.pytorch")`.',
        )
    raise StrategyImportError(
        "lightning_mpi_env.MPIDDPStrategy is ambiguous: both lightning.pytorch and pytorch_lightning are imported, "
        "and each has its own DDPStrategy.",
        'Use `strategy="ddp_mpi"`, or name the namespace: '
        '`lightning_mpi_env.lightning.strategy.strategy_class("pytorch_lightning")`.',
    )


def _build(package: str, strategies: ModuleType) -> type:
    """Subclass ``package``'s ``DDPStrategy``."""
    base: type = strategies.DDPStrategy
    trainer_side = of_trainer_package(package).trainer == package

    class MPIDDPStrategy(base):  # type: ignore[misc]
        """Lightning's ``DDPStrategy`` with ``MPIClusterEnvironment``: the roll call before ``init_process_group``.

        ``devices`` and ``num_nodes`` left out of ``Trainer(...)``/``Fabric(...)`` come from the launch: the ranks
        on each node and the number of nodes. Values given must match the launch, or the job stops saying so.
        (With Fabric, which keeps no record of its arguments, ``devices="auto"`` and ``num_nodes=1`` count as left
        out.)

        Args:
            rendezvous_timeout: Seconds to wait for every rank in the roll call; else
                ``LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT``, else 120. Separate from ``timeout``, the collective
                timeout of ``DDPStrategy``.
            cluster_environment: ``MPIClusterEnvironment()`` by default, read when the strategy is made. Another
                environment works too, without the roll call (it is ``MPIClusterEnvironment``'s).
            **kwargs: Passed to ``DDPStrategy`` (``timeout``, ``find_unused_parameters``,
                ``process_group_backend``, ...).
        """

        def __init__(
            self, *, rendezvous_timeout: float | None = None, cluster_environment: Any = None, **kwargs: Any
        ) -> None:
            if cluster_environment is None:
                cluster_environment = MPIClusterEnvironment(rendezvous_timeout=rendezvous_timeout)
            elif rendezvous_timeout is not None and isinstance(cluster_environment, MPIClusterEnvironment):
                cluster_environment.rendezvous_timeout = resolve_timeout(rendezvous_timeout, {})
            if isinstance(cluster_environment, MPIClusterEnvironment):
                # The roll call compares the backend this strategy will use, when it is given.
                cluster_environment.process_group_backend = kwargs.get("process_group_backend")
            super().__init__(cluster_environment=cluster_environment, **kwargs)

        # Lightning hands the strategy its devices (``parallel_devices``) and node count (``num_nodes``, which both
        # the Trainer and Fabric store in ``_num_nodes``) while it builds the Trainer or Fabric.

        @property
        def parallel_devices(self) -> Any:
            return self.__dict__.get("_lme_parallel_devices")

        @parallel_devices.setter
        def parallel_devices(self, devices: Any) -> None:
            self.__dict__["_lme_parallel_devices"] = self._devices_from_launch(devices)

        @property
        def _num_nodes(self) -> int:
            return int(self.__dict__.get("_lme_num_nodes", 1))

        @_num_nodes.setter
        def _num_nodes(self, num_nodes: int) -> None:
            shape = self._launch_shape("num_nodes")
            self.__dict__["_lme_num_nodes"] = shape[1] if shape is not None and shape[1] else num_nodes

        def _launch_shape(self, argument: str) -> tuple[int | None, int | None] | None:
            """The launch's ``(devices, num_nodes)`` when ``argument`` was left out of the Trainer/Fabric."""
            environment = self.__dict__.get("cluster_environment")
            if not isinstance(environment, MPIClusterEnvironment):
                return None
            given = arguments_given()
            if given is None or argument in given:
                return None
            return environment.launch_shape()

        def _devices_from_launch(self, devices: Any) -> Any:
            shape = self._launch_shape("devices")
            if devices is None or shape is None or shape[0] is None or len(devices) == shape[0]:
                return devices
            per_node = shape[0]
            if len(devices) == 1:  # one device visible (CPU, or a GPU bound to each rank): each rank drives it
                return list(devices) * per_node
            if len(devices) > per_node:  # all of the node's GPUs visible: local rank i drives the i-th
                return list(devices)[:per_node]
            return devices  # fewer GPUs than ranks on the node: the settings check says so

        @property
        def rendezvous_timeout(self) -> float | None:
            """Seconds the roll call waits for every rank (``None`` with another cluster environment)."""
            environment = self.cluster_environment
            return environment.rendezvous_timeout if isinstance(environment, MPIClusterEnvironment) else None

        if trainer_side:

            @override
            def set_world_ranks(self) -> None:
                # Called from inside Trainer(...) also when another cluster environment is given: the one moment
                # to reach the Trainer before fit() (see lightning_mpi_env.lightning.trainer_guard).
                guard_constructing_trainer()
                super().set_world_ranks()

    MPIDDPStrategy.__module__ = __name__
    MPIDDPStrategy.__qualname__ = "MPIDDPStrategy"
    return MPIDDPStrategy


def register(strategies: ModuleType) -> None:
    """Make and register ``MPIDDPStrategy`` as ``"ddp_mpi"`` in one package's strategy registry."""
    launcher = detect_launcher(os.environ)
    if launcher is not None and launcher is not SLURM:
        # Trainer(strategy="ddp_mpi") asks SLURMEnvironment.detect() before it builds the strategy: silence the
        # srun advice already, in a process another launcher started (see MPIClusterEnvironment for the rest).
        silence_srun_not_used()
    package = strategies.__name__.rpartition(".")[0]
    cls = _build(package, strategies)
    _CLASSES[package] = cls
    strategy_registry(strategies).register(
        STRATEGY_NAME,
        cls,
        description="DDP with a fail-fast roll call and exact node ranks under mpirun/srun (lightning-mpi-env)",
        override=True,
    )


def __getattr__(name: str) -> type:
    if name == "MPIDDPStrategy":
        return loaded_strategy_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PACKAGES", "STRATEGY_NAME", "loaded_strategy_class", "register", "strategy_class"]
