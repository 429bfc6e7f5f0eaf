"""``MPIDDPStrategy`` (``strategy="ddp_mpi"``): Lightning's DDP with ``MPIClusterEnvironment`` and its roll call.

``DDPStrategy`` is a different class in each Lightning package, so each gets its own ``MPIDDPStrategy``, made and
registered as ``"ddp_mpi"`` when its ``strategies`` module is imported. The modules :func:`public_module` names export
it typed, made on first use: importing them imports no Lightning.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_mpi_env.core.errors import SettingError, StrategyImportError
from lightning_mpi_env.core.namespaces import NAMESPACES, of_trainer_package
from lightning_mpi_env.core.report import shows_errors_briefly
from lightning_mpi_env.core.settings import DEFAULT_RENDEZVOUS_TIMEOUT
from lightning_mpi_env.core.values import seconds
from lightning_mpi_env.gpu.nccl import TORCH_DEVICE_ID_SINCE, installed_torch
from lightning_mpi_env.lightning.callbacks import attach, check_nodes
from lightning_mpi_env.lightning.compat import init_dist_connection, passes_device_id, strategy_registry
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.lightning.errors import nodes_against_launch
from lightning_mpi_env.recovery.restart import KEPT_CHECKPOINT
from lightning_mpi_env.recovery.trainer_state import kept_checkpoint
from lightning_mpi_env.rollcall.stall import BEFORE_THE_FIRST_STEP

if TYPE_CHECKING:
    from lightning_mpi_env.core.rank_layout import RankLayout

STRATEGY_NAME = "ddp_mpi"

PACKAGES: tuple[str, ...] = tuple(package for namespace in NAMESPACES for package in namespace.roots)

RECOMMENDED = (
    "Import the class for your package: `from lightning_mpi_env.pytorch import MPIDDPStrategy` (Trainer of "
    "lightning.pytorch; `lightning_mpi_env.fabric` for Fabric, `lightning_mpi_env.pytorch_lightning` and "
    "`lightning_mpi_env.lightning_fabric` for the standalone packages)"
)

_CLASSES: dict[str, type] = {}


def public_module(package: str) -> str:
    """The module of this package that exports ``package``'s ``MPIDDPStrategy``, typed for it."""
    return f"lightning_mpi_env.{package.removeprefix('lightning.')}"


def strategy_class(package: str) -> type:
    """The ``MPIDDPStrategy`` for ``package`` (``"lightning.fabric"``, ...), importing it; else a ``SettingError``."""
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
    """The Trainer ``MPIDDPStrategy`` of the one namespace imported so far; ``ImportError`` if neither or both are."""
    loaded = [namespace.trainer for namespace in NAMESPACES if namespace.trainer in _CLASSES]
    if len(loaded) == 1:
        return _CLASSES[loaded[0]]
    if not loaded:
        raise StrategyImportError(
            "lightning_mpi_env.MPIDDPStrategy subclasses the DDPStrategy of the Lightning namespace you use, but "
            "neither lightning.pytorch nor pytorch_lightning is imported yet.",
            f"{RECOMMENDED}; it imports Lightning itself.",
        )
    raise StrategyImportError(
        "lightning_mpi_env.MPIDDPStrategy is ambiguous: both lightning.pytorch and pytorch_lightning are imported, "
        "and each has its own DDPStrategy.",
        f"{RECOMMENDED}, which names the package.",
    )


def strategy_repr(package: str) -> str:
    """``package``'s ``MPIDDPStrategy`` as Lightning shows a strategy it refuses, with the import for the other API.

    >>> print(strategy_repr("lightning.fabric"))
    <MPIDDPStrategy of lightning_mpi_env.fabric, for Fabric; the Trainer takes lightning_mpi_env.pytorch.MPIDDPStrategy>
    """
    namespace = of_trainer_package(package)
    trainer_side = package == namespace.trainer
    other = namespace.fabric if trainer_side else namespace.trainer
    user, other_user = ("the Trainer", "Fabric") if trainer_side else ("Fabric", "the Trainer")
    return (
        f"<MPIDDPStrategy of {public_module(package)}, for {user}; {other_user} takes "
        f"{public_module(other)}.MPIDDPStrategy>"
    )


def _build(package: str, strategies: ModuleType) -> type:
    """Subclass ``package``'s ``DDPStrategy``."""
    base: Any = strategies.DDPStrategy
    namespace = of_trainer_package(package)
    trainer_side = namespace.trainer == package

    class MPIDDPStrategy(base):  # type: ignore[misc]
        """Lightning's ``DDPStrategy`` with ``MPIClusterEnvironment``: the roll call before ``init_process_group``.

        ``devices`` and ``num_nodes`` left out, or equal to their defaults (Lightning's setters keep no record of what
        was typed), come from the launch; other values must match it. Nodes may run different numbers of ranks.

        Args:
            rendezvous_timeout: Seconds to wait for every rank in the roll call (not ``timeout``, the collectives').
            cluster_environment: ``MPIClusterEnvironment()`` by default; another one works, without the roll call.
            **kwargs: Passed to ``DDPStrategy``.
        """

        @shows_errors_briefly
        def __init__(
            self, *, rendezvous_timeout: float | None = None, cluster_environment: Any = None, **kwargs: Any
        ) -> None:
            if cluster_environment is None:
                cluster_environment = MPIClusterEnvironment(rendezvous_timeout=rendezvous_timeout)
            elif rendezvous_timeout is not None and isinstance(cluster_environment, MPIClusterEnvironment):
                seconds(rendezvous_timeout, {}, "rendezvous_timeout", DEFAULT_RENDEZVOUS_TIMEOUT)  # refuse bad values
                settings = cluster_environment.settings.with_arguments(rendezvous_timeout=rendezvous_timeout)
                cluster_environment.settings = settings
            if isinstance(cluster_environment, MPIClusterEnvironment):
                # The roll call compares the backend given; the messages name the right class.
                cluster_environment.process_group_backend = kwargs.get("process_group_backend")
                cluster_environment.api = "Trainer" if trainer_side else "Fabric"
                cluster_environment.any_layout = True
            self._backend_given: str | None = kwargs.get("process_group_backend")
            self._collective_timeout = kwargs.get("timeout")
            super().__init__(cluster_environment=cluster_environment, **kwargs)

        def __repr__(self) -> str:
            # Given to the other of Trainer and Fabric, Lightning's own error shows this: it names the right import.
            return strategy_repr(package)

        @override
        @shows_errors_briefly
        def setup_environment(self) -> None:
            """The callback where none was added (Trainer), the roll call, then Lightning's ``setup_environment``."""
            if trainer_side and self.lightning_module is not None:
                attach(self.lightning_module.trainer, package)  # the callback, where no entry point added it
            environment = self.cluster_environment
            if isinstance(environment, MPIClusterEnvironment):
                if environment.managed_by_lightning:
                    environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
                    environment.set_world_size(self.num_nodes * self.num_processes)
                else:
                    environment.set_global_rank(environment.global_rank())
                    environment.set_world_size(environment.world_size())
                environment.meet_now()
                self._check_nodes_met(environment)
                self.open_process_group()
                trainer = self.lightning_module.trainer if trainer_side and self.lightning_module is not None else None
                check_nodes(self, package, trainer)  # before Lightning's first barrier, and the model
                environment.watch_after_init()  # on a client of its own: init's pending requests never hold it up
            super().setup_environment()

        def open_process_group(self) -> None:
            """Open the process group on the roll call's store, as Lightning would; its own call then finds it open.

            It passes what Lightning passes, and ``device_id`` where Lightning passes none: one connection a rank to
            rank 0's server through the start. Without the roll call's store (it is off, or another environment), it
            opens the group only where ``nccl2`` would bind another device
            (:mod:`~lightning_mpi_env.lightning.device_id`); else Lightning opens it as always.
            """
            import torch.distributed
            from torch.distributed.constants import default_pg_timeout  # Lightning's default, public in torch

            environment = self.cluster_environment
            met = environment.met if isinstance(environment, MPIClusterEnvironment) else None
            store = None if met is None else met.store
            device = self.root_device
            bound = device.type == "cuda" and device.index is not None and installed_torch() >= TORCH_DEVICE_ID_SINCE
            if store is None and (passes_device_id(package) or not bound):
                return
            timeout = self._collective_timeout if self._collective_timeout is not None else default_pg_timeout
            arguments: dict[str, Any] = {"timeout": timeout}
            if bound or (passes_device_id(package) and device.type != "cpu"):
                arguments["device_id"] = device
            if store is not None:
                store.set_timeout(timeout)  # what init_process_group sets on a store it opens: a collective's wait
                arguments["store"] = store
            default = torch.distributed.Backend.default_device_backend_map.get(device.type, "gloo")
            init_dist_connection(namespace.fabric, environment, self._backend_given or default, **arguments)

        if trainer_side:

            @override
            def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
                """Lightning's, and for ``ckpt_path=generation.ckpt_path`` the state ``restartable`` handed over."""
                if str(checkpoint_path) == KEPT_CHECKPOINT:
                    environment = self.cluster_environment
                    generation = environment.generation if isinstance(environment, MPIClusterEnvironment) else None
                    return kept_checkpoint(generation)
                return super().load_checkpoint(checkpoint_path, *args, **kwargs)

        def bind_device(self) -> None:
            """Deprecated: :meth:`open_process_group`, which ``setup_environment`` calls."""
            import warnings

            warnings.warn(
                "MPIDDPStrategy.bind_device() is deprecated: setup_environment() opens the process group "
                "(open_process_group()).",
                DeprecationWarning,
                stacklevel=2,
            )
            self.open_process_group()

        def _check_nodes_met(self, environment: MPIClusterEnvironment) -> None:
            """A ``num_nodes`` given must be the number of hosts the roll call met (one launch, one rank per slot)."""
            given = int(base.num_nodes.fget(self))
            met = environment.num_nodes
            if environment.managed_by_lightning or not environment.roll_call or given == 1 or met is None:
                return
            if given != met:
                raise nodes_against_launch(environment.layout, environment.api, given, met, "the roll call's hosts")

        @property
        @override
        def distributed_sampler_kwargs(self) -> Any:
            """Shares of every rank the launch started, not of ``num_nodes x`` devices: that differs on uneven nodes."""
            if not isinstance(self.cluster_environment, MPIClusterEnvironment):
                return base.distributed_sampler_kwargs.fget(self)
            return {"num_replicas": self.world_size, "rank": self.global_rank}

        @property
        @override
        def parallel_devices(self) -> Any:
            return base.parallel_devices.fget(self)

        @parallel_devices.setter
        def parallel_devices(self, devices: Any) -> None:
            devices = self._devices_from_launch(devices)
            base.parallel_devices.fset(self, devices)
            environment = self.__dict__.get("cluster_environment")
            if isinstance(environment, MPIClusterEnvironment) and devices:
                # The roll call then finds each rank's device, also where Lightning 2.1 sets it up after init.
                environment.accelerator = devices[0].type

        @property
        @override
        def num_nodes(self) -> int:
            # Read, not set: Fabric stores it without the setter. Left at 1, it is the launch's (1 while unknown).
            num_nodes = int(base.num_nodes.fget(self))
            environment = self.__dict__.get("cluster_environment")
            if num_nodes == 1 and isinstance(environment, MPIClusterEnvironment) and environment.layout.launcher:
                return environment.num_nodes or num_nodes
            return num_nodes

        @num_nodes.setter
        def num_nodes(self, num_nodes: int) -> None:
            base.num_nodes.fset(self, num_nodes)

        def _launch_layout(self) -> RankLayout | None:
            """The launch's layout, with this strategy's own environment under a launcher; else ``None``."""
            environment = self.__dict__.get("cluster_environment")
            if not isinstance(environment, MPIClusterEnvironment) or environment.layout.launcher is None:
                return None
            return environment.layout

        def _devices_from_launch(self, devices: Any) -> Any:
            layout = self._launch_layout()
            if devices is None or layout is None:
                return devices
            per_node = layout.local_size  # this node's ranks: every launcher says, whatever the other nodes run
            if len(devices) == per_node:
                return devices
            if per_node == 1 and layout.is_even:  # one launcher process per node: Lightning starts the workers
                return devices
            if not self._as_if_auto(devices):
                return devices  # given, and not the launch: the settings check names both
            if len(devices) == 1:  # one device visible (CPU, or a GPU bound to each rank): each rank drives it
                return list(devices) * per_node
            if len(devices) > per_node:  # all of the node's GPUs visible: local rank i drives the i-th
                return list(devices)[:per_node]
            if self._bound_per_task():
                # Each task sees a subset of the node's GPUs (`--gpu-bind=closest`): root_device picks its own.
                return [devices[index % len(devices)] for index in range(per_node)]
            return devices  # fewer GPUs than ranks on the node: the settings check says so

        def _bound_per_task(self) -> bool:
            """Whether the launcher bound a subset of the node's devices to this rank (a list of its own)."""
            environment = self.__dict__.get("cluster_environment")
            if not isinstance(environment, MPIClusterEnvironment) or environment.managed_by_lightning:
                return False
            return environment.visible is not None

        @property
        @override
        def root_device(self) -> Any:
            """This rank's device: under per-task binding its index among the devices it sees, not its local rank."""
            environment = self.cluster_environment
            devices = self.parallel_devices
            # CUDA_VISIBLE_DEVICES and ROCm's variables govern "cuda" devices (ROCm's too); others keep Lightning's.
            if not isinstance(environment, MPIClusterEnvironment) or not devices or devices[0].type != "cuda":
                return base.root_device.fget(self)
            choice = environment.device_for(devices[0].type)
            if choice.index is None:
                return base.root_device.fget(self)
            return type(devices[0])(devices[0].type, choice.index)

        def _as_if_auto(self, devices: Any) -> bool:
            """Whether ``devices`` is what ``devices="auto"`` gives (every device the accelerator sees): left out."""
            accelerator = getattr(self, "accelerator", None)
            count = accelerator.auto_device_count() if accelerator is not None else 1
            return len(devices) == count

        if not trainer_side:

            @override
            def setup_module(self, module: Any) -> Any:
                # Progress before the first step, then DDP's first broadcast of the weights: a rank stuck before
                # fabric.setup() (its data, its model) is behind the others, which wait for it in that broadcast.
                environment = self.cluster_environment
                if isinstance(environment, MPIClusterEnvironment):
                    environment.mark_progress(getattr(self, "_backward_calls", 0), BEFORE_THE_FIRST_STEP)
                return super().setup_module(module)

            @override
            def backward(self, tensor: Any, module: Any, *args: Any, **kwargs: Any) -> None:
                # Fabric has no training loop of its own: each fabric.backward() is progress for the watchdog, and
                # the step at which every rank stops after a SIGTERM to any of them, before its collectives.
                environment = self.cluster_environment
                if not isinstance(environment, MPIClusterEnvironment):
                    return super().backward(tensor, module, *args, **kwargs)  # type: ignore[no-any-return]
                environment.exit_on_sigterm()
                self._backward_calls = getattr(self, "_backward_calls", 0) + 1
                environment.mark_progress(self._backward_calls, 2)
                super().backward(tensor, module, *args, **kwargs)
                environment.mark_progress(self._backward_calls, 3)
                return None

        @property
        def rendezvous_timeout(self) -> float | None:
            """Seconds the roll call waits for every rank (``None`` with another cluster environment)."""
            environment = self.cluster_environment
            return environment.rendezvous_timeout if isinstance(environment, MPIClusterEnvironment) else None

    MPIDDPStrategy.__module__ = public_module(package)  # where it is imported from, and pickled by reference
    MPIDDPStrategy.__qualname__ = "MPIDDPStrategy"
    return MPIDDPStrategy


def register(strategies: ModuleType) -> None:
    """Make and register ``MPIDDPStrategy`` as ``"ddp_mpi"`` in one package's strategy registry."""
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
