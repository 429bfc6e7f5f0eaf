"""``MPIClusterEnvironment``: the layout core as a Lightning ``ClusterEnvironment`` plugin, for either namespace.

The class inherits from neither ``lightning.fabric``'s nor ``lightning_fabric``'s ``ClusterEnvironment``: importing
one namespace just to subclass it would itself mix the two. Instead it is registered as a virtual subclass of
each namespace's ``ClusterEnvironment`` as soon as that namespace is imported, before or after this module, so
``Trainer(plugins=[MPIClusterEnvironment()])`` and ``Fabric(plugins=[...])`` accept it in both.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import ModuleType

from lightning_utilities.core.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_mpi_env._import_hooks import when_imported
from lightning_mpi_env.errors import LayoutError, LayoutWarning, layout_error
from lightning_mpi_env.launchers import detect_launcher
from lightning_mpi_env.layout import RankLayout, from_env, parse_count
from lightning_mpi_env.mixed_imports import check_launching_trainer, guard_constructing_trainer

log = logging.getLogger(__name__)

LIGHTNING_SPAWN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
"""What Lightning's subprocess launcher exports to the local workers it starts (``_call_children_scripts``)."""

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

    Three ways to run:

    - **One launcher process per rank** (``mpirun -np 8`` with ``Trainer(devices=4, num_nodes=2)``): the launcher's
      ranks are the truth; Lightning's proposals (``set_global_rank``/``set_world_size``) are ignored.
    - **One launcher process per node** (``mpirun -npernode 1`` with ``Trainer(devices=N, num_nodes=M)``, M = the
      launcher's world size): Lightning starts the N local workers itself; node rank = the launcher's rank, world =
      M x N. The workers are recognised by the launcher's variables with a local size of 1 plus Lightning's own
      ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK`` (= the launcher's rank), ``LOCAL_RANK`` and ``WORLD_SIZE``
      (a multiple of the launcher's world size); a ``LOCAL_RANK``/``WORLD_SIZE`` that fits no such pattern is still
      rejected as stale. Not available with Slurm, which exports no local size.
    - **No launcher** (``python train.py``): one node, Lightning starts the local workers and sets ``LOCAL_RANK``
      and ``NODE_RANK`` (read here), like Lightning's own ``LightningEnvironment``; a free port is picked when
      ``MASTER_PORT`` and every job identity are unset.

    Args:
        environ: The environment to read; ``os.environ`` by default.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        spawned = _is_lightning_worker_under_launcher(env)
        # Lightning's own variables in its workers are not stale: keep them out of the core's stale check.
        own = ("LOCAL_RANK", "WORLD_SIZE")
        self._layout = from_env({k: v for k, v in env.items() if k not in own} if spawned else env)
        for message in self._layout.warnings:
            warnings.warn(message, LayoutWarning, stacklevel=2)
        layout = self._layout
        # Lightning, not the launcher, decides global ranks when it starts the local workers itself.
        self._per_node = spawned
        self._managed_local_rank: int | None = None
        self._managed_node_rank = 0
        self._assigned: tuple[int, int, int] | None = None  # (node rank, local rank, num nodes) from the rendezvous
        self._free_port: int | None = None
        self._made_in_pid = os.getpid()  # a copy in another process was forked or pickled there by Lightning
        if spawned:
            self._managed_local_rank = parse_count(env["LOCAL_RANK"], variable="LOCAL_RANK", launcher=None)
            self._managed_node_rank = layout.rank
            self._world_size = parse_count(env["WORLD_SIZE"], variable="WORLD_SIZE", launcher=None, minimum=1)
            per_node = self._world_size // layout.world_size
            self._global_rank = layout.rank * per_node + self._managed_local_rank
        elif layout.launcher is None:
            if "LOCAL_RANK" in env:
                self._managed_local_rank = parse_count(env["LOCAL_RANK"], variable="LOCAL_RANK", launcher=None)
            node = env.get("NODE_RANK") or env.get("GROUP_RANK")
            self._managed_node_rank = 0 if node is None else parse_count(node, variable="NODE_RANK", launcher=None)
            self._world_size, self._global_rank = 1, 0
        else:
            self._world_size, self._global_rank = layout.world_size, layout.rank
        # Right from the start, so rank-zero-only logging is right before the Trainer sets ranks up.
        rank_zero_only.rank = self._global_rank  # type: ignore[attr-defined]

    @property
    def layout(self) -> RankLayout:
        """The resolved layout of this process."""
        return self._layout

    @property
    def managed_by_lightning(self) -> bool:
        """Whether Lightning starts the local workers and sets global ranks (one process per node, no launcher)."""
        return self._per_node or self._layout.launcher is None

    @property
    @override
    def creates_processes_externally(self) -> bool:
        if self.managed_by_lightning:
            # Lightning's workers carry LOCAL_RANK; the process that starts them does not.
            return self._managed_local_rank is not None
        return True

    @property
    @override
    def main_address(self) -> str:
        return self._layout.main_address

    @property
    @override
    def main_port(self) -> int:
        if self._layout.launcher is None and self._layout.sources.get("main_port") == "default":
            # On a workstation several jobs may run at once: like LightningEnvironment, take a free port. The
            # workers Lightning starts inherit it as MASTER_PORT.
            if self._free_port is None:
                self._free_port = _find_free_port()
            return self._free_port
        return self._layout.main_port

    @staticmethod
    @override
    def detect() -> bool:
        """Whether a supported launcher started this process."""
        return detect_launcher(os.environ) is not None

    @override
    def world_size(self) -> int:
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        if self.managed_by_lightning:
            self._world_size = size
        elif size != self._world_size:
            log.debug(f"Keeping the launcher's world size {self._world_size}; Lightning proposed {size}.")

    @override
    def global_rank(self) -> int:
        return self._global_rank

    @override
    def set_global_rank(self, rank: int) -> None:
        # Lightning calls this from inside Trainer(...): the one moment to reach the Trainer before fit() rejects a
        # model of the other namespace with a message that does not say so.
        guard_constructing_trainer()
        if self.managed_by_lightning:
            self._global_rank = rank
            rank_zero_only.rank = rank  # type: ignore[attr-defined]
            return
        if os.getpid() != self._made_in_pid:
            raise self._started_by_lightning_under_launcher()
        if rank != self._global_rank:
            log.debug(f"Keeping the launcher's global rank {self._global_rank}; Lightning proposed {rank}.")

    def _started_by_lightning_under_launcher(self) -> LayoutError:
        layout = self._layout
        return layout_error(
            f"{layout.launcher_name} started this process as rank {layout.rank} of {layout.world_size} "
            f"({layout.sources['rank']}={layout.rank}), and Lightning started worker processes from it again "
            f"(pid {self._made_in_pid} made this environment, pid {os.getpid()} uses it): a strategy with the "
            "start method spawn or fork ('ddp_spawn', 'ddp_fork', 'ddp_notebook'). Every such worker would "
            f"claim rank {layout.rank}.",
            "Under a launcher, use strategy='ddp' or 'ddp_mpi' (Lightning then starts no processes when the "
            "launcher started one per device). To let Lightning start the workers on each node, launch one process "
            "per node (`mpirun --map-by ppr:1:node`) with strategy='ddp' or 'ddp_mpi'.",
        )

    @override
    def local_rank(self) -> int:
        if self._assigned is not None:
            return self._assigned[1]
        if self._managed_local_rank is not None:
            return self._managed_local_rank
        if self.managed_by_lightning:
            # ddp_spawn/ddp_fork/ddp_notebook set LOCAL_RANK in each worker after this object was made (and copied
            # into the worker), as Lightning's own LightningEnvironment expects.
            value = os.environ.get("LOCAL_RANK")
            return 0 if value is None else parse_count(value, variable="LOCAL_RANK", launcher=None)
        return self._layout.local_rank

    @override
    def node_rank(self) -> int:
        if self._assigned is not None:
            return self._assigned[0]
        return self._managed_node_rank if self.managed_by_lightning else self._layout.node_rank

    @property
    def num_nodes(self) -> int | None:
        """Number of nodes: from the rendezvous once it ran, else from the launcher (``None`` when uneven)."""
        if self._assigned is not None:
            return self._assigned[2]
        return self._layout.num_nodes

    def assign_nodes(self, node_rank: int, local_rank: int, num_nodes: int) -> None:
        """Take the node and local rank found by exchanging host names (``MPIDDPStrategy``'s rendezvous).

        They are exact under every placement, where the launcher's variables alone may only allow a guess.
        """
        if (node_rank, local_rank) != (self.node_rank(), self.local_rank()):
            log.debug(
                f"Host names place rank {self._global_rank} on node {node_rank} as local rank {local_rank}; the "
                f"environment alone said node {self.node_rank()}, local rank {self.local_rank()}."
            )
        self._assigned = (node_rank, local_rank, num_nodes)

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
        if layout.launcher is None or self._per_node:
            return
        if layout.local_size == 1 and num_devices > 1 and num_nodes == layout.world_size:
            # One launcher process per node: Lightning starts the `num_devices` workers on each node itself.
            self._per_node = True
            self._managed_node_rank = layout.rank
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


def _is_lightning_worker_under_launcher(env: Mapping[str, str]) -> bool:
    """Whether Lightning started this process as a local worker of a one-process-per-node launch."""
    launcher = detect_launcher(env)
    if launcher is None or launcher.local_size is None or not all(name in env for name in LIGHTNING_SPAWN_VARIABLES):
        return False
    world, node, local = env.get(launcher.world_size, ""), env["NODE_RANK"], env["LOCAL_RANK"]
    size = env["WORLD_SIZE"]
    if not all(value.isascii() and value.isdigit() for value in (world, node, local, size)) or int(world) == 0:
        return False
    per_node, remainder = divmod(int(size), int(world))
    return (
        env.get(launcher.local_size) == "1"
        and node == env.get(launcher.rank)
        and remainder == 0
        and per_node > 1
        and int(local) < per_node
    )


def _find_free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port


def _register_virtual_subclass(module: ModuleType) -> None:
    module.ClusterEnvironment.register(MPIClusterEnvironment)


for _module_name in CLUSTER_ENVIRONMENT_MODULES:
    when_imported(_module_name, _register_virtual_subclass)
