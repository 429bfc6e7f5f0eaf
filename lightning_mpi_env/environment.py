"""``MPIClusterEnvironment``: the layout core as a Lightning ``ClusterEnvironment`` plugin, for either namespace.

The class inherits from neither ``lightning.fabric``'s nor ``lightning_fabric``'s ``ClusterEnvironment``: importing
one namespace just to subclass it would itself mix the two. Instead it is registered as a virtual subclass of
each namespace's ``ClusterEnvironment`` as soon as that namespace is imported, before or after this module, so
``Trainer(plugins=[MPIClusterEnvironment()])`` and ``Fabric(plugins=[...])`` accept it in both.
"""

from __future__ import annotations

import logging
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import ModuleType

from lightning_utilities.core.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_mpi_env._import_hooks import when_imported
from lightning_mpi_env.errors import LayoutWarning, layout_error
from lightning_mpi_env.launchers import detect_launcher
from lightning_mpi_env.layout import RankLayout, from_env
from lightning_mpi_env.mixed_imports import check_launching_trainer

log = logging.getLogger(__name__)

CLUSTER_ENVIRONMENT_MODULES = (
    "lightning.fabric.plugins.environments.cluster_environment",
    "lightning_fabric.plugins.environments.cluster_environment",
)
"""Where each Lightning namespace defines its ``ClusterEnvironment`` ABC."""


class ClusterEnvironmentInterface(ABC):
    """Lightning's ``ClusterEnvironment`` contract, stated here so no namespace is imported to state it."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether the launcher, not Lightning, starts the processes."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Host through which all processes meet."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port on the main address."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this environment applies to the current process."""

    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Lightning's proposal for the world size."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process in the job."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Lightning's proposal for the global rank."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Index of this process's node."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:  # noqa: B027 (optional, as in Lightning)
        """Check the Trainer's ``devices`` and ``num_nodes`` against the launched world."""

    def teardown(self) -> None:  # noqa: B027 (optional, as in Lightning)
        """Clean up after the run."""


class MPIClusterEnvironment(ClusterEnvironmentInterface):
    """Ranks from the launcher itself (``mpirun``/``mpiexec``/``srun``), with no ``mpi4py``.

    Use it as ``Trainer(plugins=[MPIClusterEnvironment()])`` (``lightning.pytorch`` or ``pytorch_lightning``) or
    ``Fabric(plugins=[MPIClusterEnvironment()])``. The environment is read once, when the object is made; a bad
    layout raises :class:`~lightning_mpi_env.LayoutError` right there.

    Variables read (see :mod:`lightning_mpi_env.launchers` for the table):

    - Open MPI: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
      ``OMPI_COMM_WORLD_LOCAL_SIZE``.
    - MVAPICH2: ``MV2_COMM_WORLD_RANK``, ``MV2_COMM_WORLD_SIZE``, ``MV2_COMM_WORLD_LOCAL_RANK``,
      ``MV2_COMM_WORLD_LOCAL_SIZE``.
    - Cray PALS: ``PALS_RANKID``, ``PMI_SIZE``, ``PALS_LOCAL_RANKID``, ``PMI_LOCAL_SIZE``, ``PALS_NODEID``.
    - MPICH/Intel MPI (Hydra): ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``.
    - Slurm ``srun``: ``SLURM_STEP_ID``, ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
      ``SLURM_STEP_TASKS_PER_NODE``.
    - PMIx alone: ``PMIX_RANK`` with ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``.
    - Main address: ``MASTER_ADDR``, else the first host of ``SGE_JOB_HOSTLIST``, ``PBS_NODEFILE``,
      ``LSB_DJOB_HOSTFILE``, ``LSB_MCPU_HOSTS``, ``SLURM_STEP_NODELIST`` or ``SLURM_JOB_NODELIST``.
    - Main port: ``MASTER_PORT``, else derived from ``PMIX_NAMESPACE``, ``PALS_APID``,
      ``SLURM_JOB_ID``+``SLURM_STEP_ID``, ``JOB_ID``, ``PBS_JOBID`` or ``LSB_JOBID``, else 29500.
    - Checked for agreement: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``.

    Args:
        environ: The environment to read; ``os.environ`` by default.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._layout = from_env(os.environ if environ is None else environ)
        for message in self._layout.warnings:
            warnings.warn(message, LayoutWarning, stacklevel=2)
        # Right from the start, so rank-zero-only logging is right before the Trainer sets ranks up.
        rank_zero_only.rank = self._layout.rank  # type: ignore[attr-defined]

    @property
    def layout(self) -> RankLayout:
        """The resolved layout of this process."""
        return self._layout

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return self._layout.launcher is not None

    @property
    @override
    def main_address(self) -> str:
        return self._layout.main_address

    @property
    @override
    def main_port(self) -> int:
        return self._layout.main_port

    @staticmethod
    @override
    def detect() -> bool:
        """Whether a supported launcher started this process."""
        return detect_launcher(os.environ) is not None

    @override
    def world_size(self) -> int:
        return self._layout.world_size

    @override
    def set_world_size(self, size: int) -> None:
        if size != self._layout.world_size:
            log.debug(f"Keeping the launcher's world size {self._layout.world_size}; Lightning proposed {size}.")

    @override
    def global_rank(self) -> int:
        return self._layout.rank

    @override
    def set_global_rank(self, rank: int) -> None:
        if rank != self._layout.rank:
            log.debug(f"Keeping the launcher's global rank {self._layout.rank}; Lightning proposed {rank}.")

    @override
    def local_rank(self) -> int:
        return self._layout.local_rank

    @override
    def node_rank(self) -> int:
        return self._layout.node_rank

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail at once when the Trainer's ``devices`` x ``num_nodes`` does not match the launched world.

        Raises:
            LayoutError: Naming the launched world, the Trainer's settings and the fix.
            MixedImportError: The Trainer holds a callback, logger, plugin or datamodule of the other namespace.
        """
        # Lightning's launcher calls this before the first step, with the Trainer on the stack.
        check_launching_trainer()
        layout = self._layout
        if layout.launcher is None:
            return
        trainer = f"Trainer(devices={num_devices}, num_nodes={num_nodes})"
        if not layout.is_even:
            raise layout_error(
                f"{layout.launcher.name} placed ranks unevenly: this node runs "
                f"{layout.sources['local_size']}={layout.local_size} of {layout.world_size} ranks, which is not the "
                f"same on every node. Lightning needs the same number of ranks on every node ({trainer}).",
                f"Launch exactly {num_devices} ranks per node, e.g. `mpirun -np {num_devices * num_nodes} "
                f"--map-by ppr:{num_devices}:node` (Open MPI) or `srun --ntasks-per-node={num_devices}`.",
            )
        if (num_devices, num_nodes) != (layout.local_size, layout.num_nodes):
            raise layout_error(
                f"{layout.launcher.name} launched {layout.describe_world()} ({layout.num_nodes} node(s); "
                f"{layout.sources['world_size']}={layout.world_size}, {layout.sources['local_size']}="
                f"{layout.local_size}), but {trainer} expects {num_devices * num_nodes} ranks, "
                f"{num_devices} per node.",
                f"Use Trainer(devices={layout.local_size}, num_nodes={layout.num_nodes}), or launch "
                f"{num_devices * num_nodes} ranks with {num_devices} per node "
                f"(`mpirun -np {num_devices * num_nodes} --map-by ppr:{num_devices}:node`).",
            )

    @override
    def teardown(self) -> None:
        """Nothing to undo: this environment never writes to ``os.environ``."""

    def __repr__(self) -> str:
        return f"MPIClusterEnvironment({self._layout!r})"


def _register_virtual_subclass(module: ModuleType) -> None:
    module.ClusterEnvironment.register(MPIClusterEnvironment)


for _module_name in CLUSTER_ENVIRONMENT_MODULES:
    when_imported(_module_name, _register_virtual_subclass)
