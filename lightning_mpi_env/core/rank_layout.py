"""The record of where one process sits in the job: :class:`RankLayout`, frozen, with where each value came from.

:func:`lightning_mpi_env.core.layout.from_env` builds it; this module only holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from lightning_mpi_env.core.errors import LayoutWarning
from lightning_mpi_env.core.launchers import Launcher
from lightning_mpi_env.core.placement import Placement, every_rank_here

if TYPE_CHECKING:
    from lightning_mpi_env.core.shape import TrainerArguments


class RankLayout(NamedTuple):
    """Where one process sits in the job, and which variable each answer came from.

    Immutable; two layouts are equal when every field but :attr:`sources` is.
    """

    world_size: int
    """Number of processes in the job."""
    rank: int
    """Global rank of this process, always the launcher's own."""
    local_rank: int
    """Rank of this process on its node, always the launcher's own."""
    local_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node; approximate unless :attr:`node_rank_is_exact` (``~`` in the ``repr``)."""
    num_nodes: int | None
    """Number of nodes, or ``None`` when surely uneven; approximate unless :attr:`num_nodes_is_exact`."""
    main_address: str
    """Host of rank 0, where every process meets."""
    main_port: int
    """Port on :attr:`main_address`, identical on every rank."""
    launcher: Launcher | None
    """The launcher that started this process, or ``None`` outside any launcher."""
    placement: Placement
    """How :attr:`node_rank` was found."""
    sources: Mapping[str, str] = MappingProxyType({})
    """For each field above, the variable (or rule) it came from; not compared."""
    warnings: tuple[LayoutWarning, ...] = ()
    """Things the user should hear about that do not stop the job, such as an approximate node rank."""
    ranks_per_node: tuple[int, ...] = ()
    """Every node's number of ranks, in the order of the launcher's host list (``SLURM_STEP_NODELIST``), where the
    launcher exports them all (``SLURM_STEP_TASKS_PER_NODE``); else empty."""
    end_step: tuple[str, ...] = ()
    """The command that ends this launch's step (:func:`~lightning_mpi_env.core.launchers.end_step_command`); not
    compared: it follows from the launch, like :attr:`sources`."""

    @property
    def launcher_name(self) -> str:
        """The launcher's name, or ``"no launcher"``."""
        return self.launcher.name if self.launcher is not None else "no launcher"

    @property
    def node_rank_is_exact(self) -> bool:
        """Whether :attr:`node_rank` is known for certain: exported by the launcher, or every rank is on this node."""
        if self.placement in (Placement.SINGLE, Placement.LAUNCHER):
            return True
        return every_rank_here(self.world_size, self.local_size)

    @property
    def num_nodes_is_exact(self) -> bool:
        """Whether :attr:`num_nodes` is known for certain: exported by the launcher, or every rank is on this node."""
        launcher = self.launcher
        if launcher is None or launcher.tasks_per_node is not None or launcher.num_nodes is not None:
            return True
        return every_rank_here(self.world_size, self.local_size)

    @property
    def is_even(self) -> bool:
        """Whether, as far as this process can tell, every node runs :attr:`local_size` processes.

        Certain only with :attr:`num_nodes_is_exact`; otherwise it means "consistent with an even launch".
        """
        if self.ranks_per_node:
            return len(set(self.ranks_per_node)) == 1
        return self.num_nodes is not None and self.num_nodes * self.local_size == self.world_size

    def describe_world(self) -> str:
        """The launched world in words, for messages: ``"8 ranks, 4 per node"``."""
        per_node = f"{self.local_size} on this node" if not self.is_even else f"{self.local_size} per node"
        return f"{self.world_size} rank{'s' if self.world_size != 1 else ''}, {per_node}"

    def trainer_kwargs(self) -> TrainerArguments:
        """The ``Trainer``/``Fabric`` ``devices`` and ``num_nodes`` that match this launch (see :mod:`.shape`)."""
        from lightning_mpi_env.core.shape import trainer_arguments

        return trainer_arguments(self)

    def as_dict(self) -> dict[str, object]:
        """This layout as JSON-ready values, the matching Trainer arguments included (``show --json``)."""
        from lightning_mpi_env.core.shape import layout_as_dict

        return layout_as_dict(self)

    def _compared(self) -> tuple[object, ...]:
        # The warnings are exceptions, which compare by identity: compare what they say.
        said = tuple((type(warning), str(warning)) for warning in self.warnings)
        return (*self[:10], said, self.ranks_per_node)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankLayout):
            return NotImplemented
        return self._compared() == other._compared()

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self._compared())

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # The read-only view of the sources does not pickle (spawned workers get the environment pickled).
        return (
            _rebuild_layout,
            (tuple(self[:10]), dict(self.sources), self.warnings, self.ranks_per_node, self.end_step),
        )

    def __repr__(self) -> str:
        nodes = "?" if self.num_nodes is None else f"{self.num_nodes}{'' if self.num_nodes_is_exact else '~'}"
        node = f"{self.node_rank}{'' if self.node_rank_is_exact else '~'}/{nodes}"
        return (
            f"RankLayout(rank={self.rank}/{self.world_size}, local={self.local_rank}/{self.local_size}, "
            f"node={node}, main={self.main_address}:{self.main_port}, from={self.launcher_name})"
        )


def _rebuild_layout(
    fields: tuple[object, ...],
    sources: dict[str, str],
    warnings: tuple[LayoutWarning, ...],
    ranks_per_node: tuple[int, ...] = (),
    end_step: tuple[str, ...] = (),
) -> RankLayout:
    return RankLayout._make((*fields, MappingProxyType(sources), warnings, ranks_per_node, end_step))


__all__ = ["RankLayout"]
