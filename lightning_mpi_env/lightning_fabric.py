"""``Fabric(strategy=MPIDDPStrategy())`` of ``lightning_fabric``: ``devices`` and ``num_nodes`` come from the launch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_mpi_env.lightning.strategy import strategy_class

if TYPE_CHECKING:
    from datetime import timedelta
    from typing import Any, Literal

    import torch
    from lightning_fabric.accelerators.accelerator import Accelerator
    from lightning_fabric.plugins.environments.cluster_environment import ClusterEnvironment
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning_fabric.plugins.precision.precision import Precision
    from lightning_fabric.strategies.ddp import DDPStrategy
    from torch.distributed.constants import default_pg_timeout

    from lightning_mpi_env.lightning import environment

    class MPIClusterEnvironment(environment.MPIClusterEnvironment, ClusterEnvironment):
        """:class:`lightning_mpi_env.MPIClusterEnvironment`, typed as a ``ClusterEnvironment`` of this namespace."""

    class MPIDDPStrategy(DDPStrategy):
        """``DDPStrategy`` with ``MPIClusterEnvironment`` and its roll call: ``strategy="ddp_mpi"`` as a class."""

        def __init__(
            self,
            *,
            rendezvous_timeout: float | None = None,
            cluster_environment: ClusterEnvironment | None = None,
            accelerator: Accelerator | None = None,
            parallel_devices: list[torch.device] | None = None,
            checkpoint_io: CheckpointIO | None = None,
            precision: Precision | None = None,
            process_group_backend: str | None = None,
            timeout: timedelta | None = default_pg_timeout,
            start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
            **kwargs: Any,
        ) -> None: ...

        @property
        def rendezvous_timeout(self) -> float | None:
            """Seconds the roll call waits for every rank (``None`` with another cluster environment)."""

        def open_process_group(self) -> None:
            """Open the process group on the roll call's store, as Lightning would; ``setup_environment`` calls it."""

        def bind_device(self) -> None:
            """Deprecated: :meth:`open_process_group`."""

else:
    from lightning_mpi_env.lightning.environment import MPIClusterEnvironment as MPIClusterEnvironment

    def __getattr__(name: str) -> type:
        if name == "MPIDDPStrategy":
            cls = globals()[name] = strategy_class("lightning_fabric")
            return cls
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MPIClusterEnvironment", "MPIDDPStrategy"]
