"""``MPIDDPStrategy`` (``strategy="ddp_mpi"``): Lightning's DDP with a fail-fast rendezvous and exact node ranks.

``DDPStrategy`` is a different class in ``lightning.pytorch`` and in ``pytorch_lightning``, so there is one
``MPIDDPStrategy`` per namespace. Each is made, and registered as ``"ddp_mpi"`` in that namespace's
``StrategyRegistry``, right when the namespace's ``strategies`` package is imported (before or after this module).
Importing this module imports neither namespace, nor torch.

Which class you get:

- ``Trainer(strategy="ddp_mpi")`` picks the right one by itself, in either namespace.
- ``lightning_mpi_env.MPIDDPStrategy`` is the class of the one namespace your program has imported; it raises
  :class:`ImportError` when none or both are imported.
- :func:`strategy_class` (``strategy_class("pytorch_lightning")``) names the namespace explicitly, and imports it.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from datetime import timedelta
from types import ModuleType
from typing import Any

from typing_extensions import override

from lightning_mpi_env._import_hooks import when_imported
from lightning_mpi_env.environment import MPIClusterEnvironment
from lightning_mpi_env.errors import LayoutWarning
from lightning_mpi_env.layout import Placement
from lightning_mpi_env.mixed_imports import guard_constructing_trainer

log = logging.getLogger(__name__)

STRATEGY_NAME = "ddp_mpi"
"""The name under which the strategy is registered in both namespaces."""

NAMESPACES: dict[str, str] = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}
"""Each Lightning trainer namespace, with the fabric namespace it is built on."""

_CLASSES: dict[str, type] = {}


def strategy_class(namespace: str) -> type:
    """The ``MPIDDPStrategy`` for ``namespace`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``), importing it.

    Raises:
        ValueError: For any other namespace.
    """
    if namespace not in NAMESPACES:
        raise ValueError(
            f"namespace={namespace!r} is not a Lightning trainer namespace.\nHINT: Use one of {sorted(NAMESPACES)}."
        )
    importlib.import_module(f"{namespace}.strategies")  # runs _register through the import hook, if not yet run
    return _CLASSES[namespace]


def loaded_strategy_class() -> type:
    """The ``MPIDDPStrategy`` of the one Lightning namespace imported so far (``lightning_mpi_env.MPIDDPStrategy``).

    Raises:
        ImportError: If neither or both namespaces are imported.
    """
    loaded = [namespace for namespace in NAMESPACES if namespace in _CLASSES]
    if len(loaded) == 1:
        return _CLASSES[loaded[0]]
    if not loaded:
        raise ImportError(
            "lightning_mpi_env.MPIDDPStrategy subclasses the DDPStrategy of the Lightning namespace you use, but "
            "neither lightning.pytorch nor pytorch_lightning is imported yet.\nHINT: Import your Lightning "
            'namespace first (`import lightning.pytorch as pl`), pass `strategy="ddp_mpi"` to the Trainer, or '
            'use `lightning_mpi_env.strategy.strategy_class("lightning.pytorch")`.'
        )
    raise ImportError(
        "lightning_mpi_env.MPIDDPStrategy is ambiguous: both lightning.pytorch and pytorch_lightning are imported, "
        'and each has its own DDPStrategy.\nHINT: Use `strategy="ddp_mpi"`, or name the namespace: '
        '`lightning_mpi_env.strategy.strategy_class("pytorch_lightning")`.'
    )


def _build(namespace: str, strategies: ModuleType) -> type:
    """Subclass ``namespace``'s ``DDPStrategy``; only modules that namespace has already imported are used."""
    fabric = NAMESPACES[namespace]
    seed = importlib.import_module(f"{fabric}.utilities.seed")
    distributed = importlib.import_module(f"{fabric}.utilities.distributed")
    rank_zero = importlib.import_module(f"{namespace}.utilities.rank_zero")
    base: type = strategies.DDPStrategy

    class MPIDDPStrategy(base):  # type: ignore[misc]
        """Lightning's ``DDPStrategy`` started through a fail-fast rendezvous, with ``MPIClusterEnvironment``.

        Before ``init_process_group``, every process registers its rank, host, local rank and process id in one
        ``TCPStore`` on the main address and port; duplicate ranks, disagreeing world sizes or ports, ranks that
        never arrive and uneven ranks per host stop every process with a named
        :class:`~lightning_mpi_env.rendezvous.RendezvousError`. Node and local ranks then come from the exchanged
        host names, exact under any placement. The same store is handed to ``init_process_group``.

        Args:
            rendezvous_timeout: Seconds to wait for every rank to arrive; else
                ``LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT``, else 120. Separate from ``timeout``, the collective
                timeout of ``DDPStrategy``.
            cluster_environment: ``MPIClusterEnvironment()`` by default, read when the strategy is made.
            **kwargs: Passed to ``DDPStrategy`` (``timeout``, ``find_unused_parameters``,
                ``process_group_backend``, ...).
        """

        def __init__(
            self, *, rendezvous_timeout: float | None = None, cluster_environment: Any = None, **kwargs: Any
        ) -> None:
            from lightning_mpi_env.rendezvous import resolve_timeout

            if cluster_environment is None:
                with warnings.catch_warnings():
                    # The rendezvous resolves node ranks exactly: the core's "approximate node rank" warning
                    # (which recommends this very strategy) does not apply here.
                    warnings.filterwarnings("ignore", message=r"Node rank \d+ is approximate", category=LayoutWarning)
                    cluster_environment = MPIClusterEnvironment()
            super().__init__(cluster_environment=cluster_environment, **kwargs)
            self.rendezvous_timeout = resolve_timeout(rendezvous_timeout, os.environ)

        @override
        def set_world_ranks(self) -> None:
            # Called from inside Trainer(...) also when a custom cluster environment is given: see
            # MPIClusterEnvironment.set_global_rank.
            guard_constructing_trainer()
            super().set_world_ranks()

        @override
        def setup_distributed(self) -> None:
            log.debug(f"{type(self).__name__}: setting up distributed...")
            seed.reset_seed()
            self.set_world_ranks()
            self._process_group_backend = self._get_process_group_backend()
            import torch.distributed

            if torch.distributed.is_initialized():
                log.debug("torch.distributed is already initialized: no rendezvous.")
                return
            _init_process_group(self, distributed, rank_zero)

    MPIDDPStrategy.__module__ = __name__
    MPIDDPStrategy.__qualname__ = "MPIDDPStrategy"
    return MPIDDPStrategy


def _init_process_group(strategy: Any, distributed: ModuleType, rank_zero: ModuleType) -> None:
    """Rendezvous, check the hosts against the Trainer, then ``init_process_group`` on the same store."""
    import torch.distributed

    from lightning_mpi_env.rendezvous import Claim, rendezvous, rendezvous_error

    environment = strategy.cluster_environment
    claim = Claim.here(
        rank=environment.global_rank(),
        world_size=environment.world_size(),
        local_rank=environment.local_rank(),
        main_address=environment.main_address,
        main_port=environment.main_port,
    )
    result = rendezvous(claim, timeout=strategy.rendezvous_timeout, expected_node=_expected_node(strategy))
    nodes = result.nodes
    if (nodes.num_nodes, nodes.local_size) != (strategy.num_nodes, strategy.num_processes):
        result.store.set_timeout(timedelta(seconds=1))
        raise rendezvous_error(
            f"The host names of the {claim.world_size} ranks name {nodes.num_nodes} host(s) with "
            f"{nodes.local_size} rank(s) each, but Trainer(devices={strategy.num_processes}, "
            f"num_nodes={strategy.num_nodes}) expects {strategy.num_nodes} node(s) with {strategy.num_processes} "
            f"each. Hosts by rank: {', '.join(result.hosts)}.",
            "Make Trainer(devices=..., num_nodes=...) match the launch; if different nodes report the same host "
            "name (containers), give each node its own host name.",
        )
    if isinstance(environment, MPIClusterEnvironment):
        environment.assign_nodes(nodes.node_rank, nodes.local_rank, nodes.num_nodes)
    timeout = strategy._timeout
    if timeout is not None:
        result.store.set_timeout(timeout)
    backend = strategy._process_group_backend
    device = strategy.root_device
    torch.distributed.init_process_group(
        backend,
        store=result.store,
        rank=claim.rank,
        world_size=claim.world_size,
        timeout=timeout,
        device_id=device if device.type != "cpu" else None,
    )
    if backend == "nccl":
        import atexit

        atexit.register(distributed._destroy_dist_connection)
    rank_zero.rank_zero_info(
        f"{'-' * 100}\ndistributed_backend={backend}\nAll {claim.world_size} processes met in the ddp_mpi "
        f"rendezvous on {nodes.num_nodes} node(s) ({', '.join(dict.fromkeys(result.hosts))}).\n{'-' * 100}\n"
    )


def _expected_node(strategy: Any) -> Any:
    """Where the launcher put each rank, to say where missing ranks were expected; ``None`` when unknown."""
    environment = strategy.cluster_environment
    per_node = strategy.num_processes
    if isinstance(environment, MPIClusterEnvironment) and not environment.managed_by_lightning:
        layout = environment.layout
        if layout.placement is Placement.BLOCK:
            return lambda rank: rank // layout.local_size
        if layout.placement is Placement.ROUND_ROBIN and layout.num_nodes:
            num_nodes = layout.num_nodes
            return lambda rank: rank % num_nodes
        return None
    return lambda rank: rank // per_node


def _register(strategies: ModuleType) -> None:
    namespace = strategies.__name__.rpartition(".")[0]
    cls = _build(namespace, strategies)
    _CLASSES[namespace] = cls
    strategies.StrategyRegistry.register(
        STRATEGY_NAME,
        cls,
        description="DDP with a fail-fast rendezvous and exact node ranks under mpirun/srun (lightning-mpi-env)",
        override=True,
    )


for _namespace in NAMESPACES:
    when_imported(f"{_namespace}.strategies", _register)


def __getattr__(name: str) -> type:
    if name == "MPIDDPStrategy":
        return loaded_strategy_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAMESPACES", "STRATEGY_NAME", "loaded_strategy_class", "strategy_class"]
