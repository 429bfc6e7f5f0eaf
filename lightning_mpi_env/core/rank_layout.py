"""Where one process sits in the job (:class:`RankLayout`), and the one answer to which ``Trainer`` arguments fit it."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core.errors import LayoutWarning
from lightning_mpi_env.core.hostlist import compress_tasks_per_node
from lightning_mpi_env.core.launchers import SRUN, Launcher
from lightning_mpi_env.core.placement import Placement, every_rank_here


class RankLayout(NamedTuple):
    """Where one process sits in the job, and which variable each answer came from (:attr:`sources`, not compared)."""

    world_size: int
    rank: int
    """Global rank; like :attr:`local_rank`, always the launcher's own."""
    local_rank: int
    local_size: int
    node_rank: int
    """Index of this node; approximate unless :attr:`node_rank_is_exact` (``~`` in the ``repr``)."""
    num_nodes: int | None
    """Number of nodes, or ``None`` when surely uneven; approximate unless :attr:`num_nodes_is_exact`."""
    main_address: str
    main_port: int
    """Port on :attr:`main_address`, identical on every rank."""
    launcher: Launcher | None
    placement: Placement
    sources: Mapping[str, str] = MappingProxyType({})
    """For each field above, the variable (or rule) it came from; not compared."""
    warnings: tuple[LayoutWarning, ...] = ()
    """Things the user should hear about that do not stop the job, such as an approximate node rank."""
    ranks_per_node: tuple[int, ...] = ()
    """Every node's number of ranks, where the launcher exports them all (``SLURM_STEP_TASKS_PER_NODE``); else ()."""
    end_step: tuple[str, ...] = ()
    """The command that ends this launch's step (:func:`~.launchers.end_step_command`); not compared."""

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
        """Whether every node runs :attr:`local_size` processes; certain only with :attr:`num_nodes_is_exact`."""
        if self.ranks_per_node:
            return len(set(self.ranks_per_node)) == 1
        return self.num_nodes is not None and self.num_nodes * self.local_size == self.world_size

    def describe_world(self) -> str:
        """The launched world in words, for messages: ``"8 ranks, 4 per node"``."""
        per_node = f"{self.local_size} on this node" if not self.is_even else f"{self.local_size} per node"
        return f"{self.world_size} rank{'s' if self.world_size != 1 else ''}, {per_node}"

    def trainer_kwargs(self) -> TrainerArguments:
        """The ``Trainer``/``Fabric`` ``devices`` and ``num_nodes`` that match this launch."""
        return trainer_arguments(self)

    def as_dict(self) -> dict[str, object]:
        """This layout as JSON-ready values, the matching Trainer arguments included (``show --json``)."""
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


class TrainerArguments(NamedTuple):
    """The ``Trainer``/``Fabric`` ``devices`` and ``num_nodes`` that match a launch, as far as one process knows."""

    devices: int | None
    """Ranks per node; ``None`` (as :attr:`num_nodes`) when no value fits (ranks spread unevenly)."""
    num_nodes: int | None
    exact: bool
    """Whether this process knows them for certain; otherwise :attr:`note` says what they assume."""
    note: str = ""

    def __str__(self) -> str:
        if self.devices is None or self.num_nodes is None:
            return f"Trainer: {self.note}"
        call = f"Trainer(devices={self.devices}, num_nodes={self.num_nodes})"
        return call if self.exact else f"{call} {self.note}"


UNEVEN_STRATEGY = "ddp_mpi"
"""The strategy that trains on any layout the launch proves: its world, ranks, devices and sampler come from it."""

STRATEGIES_NEEDING_EVEN_NODES: tuple[str, ...] = ("ddp", "fsdp", "deepspeed")
"""Lightning's own strategies that ``simulate --strategy`` takes: each needs the same number of ranks on every node."""

STRATEGIES: tuple[str, ...] = (UNEVEN_STRATEGY, *STRATEGIES_NEEDING_EVEN_NODES)

BY_NAME_UNDER_SRUN = (
    "the object, not the name: by name Lightning makes its own SLURMEnvironment first, and that refuses a step of "
    "srun --ntasks without --ntasks-per-node"
)
"""Why an uneven ``srun`` step takes ``MPIDDPStrategy()``: ``SLURMEnvironment._validate_srun_variables``."""


def uneven_strategy(launcher_key: str | None = None) -> str:
    """The Trainer argument that trains an uneven launch of ``launcher_key``: by name, but the object under ``srun``."""
    if launcher_key == SRUN.key:
        return f"Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) ({BY_NAME_UNDER_SRUN})"
    return f'Trainer(strategy="{UNEVEN_STRATEGY}")'


def uneven_fix(launcher_key: str | None = None) -> str:
    """What trains an uneven launch and what does not, wherever one is found (``show``, ``doctor``, ``simulate``)."""
    return (
        f"{uneven_strategy(launcher_key)} trains it as launched, with no devices or num_nodes; Lightning's own "
        f"{', '.join(STRATEGIES_NEEDING_EVEN_NODES)} need the same number on every node"
    )


UNEVEN_FIX = uneven_fix()
"""What works on an uneven launch under any launcher but ``srun`` (:func:`uneven_fix`)."""


def trainer_arguments(layout: RankLayout) -> TrainerArguments:
    """The ``Trainer``/``Fabric`` ``devices`` and ``num_nodes`` of ``layout``: exact with srun's counts or one node."""
    launcher = layout.launcher
    if launcher is None:
        return TrainerArguments(1, 1, exact=True)
    if layout.num_nodes is None or not layout.is_even:
        counts = f" ({describe_counts(layout.ranks_per_node)} per node)" if layout.ranks_per_node else ""
        return TrainerArguments(
            None,
            None,
            exact=True,
            note=f"no devices/num_nodes fits: {launcher.name} launched {layout.describe_world()}{counts}, not the "
            f"same number on every node. {uneven_fix(launcher.key)}.",
        )
    # Only every node's count (srun's), or one node, lets one process know the whole layout.
    if launcher.tasks_per_node is not None or layout.world_size == layout.local_size:
        return TrainerArguments(layout.local_size, layout.num_nodes, exact=True)
    plural = "s" if layout.local_size != 1 else ""
    exports = "no node count" if launcher.num_nodes is None else "no ranks per node"
    return TrainerArguments(
        layout.local_size,
        layout.num_nodes,
        exact=False,
        note=f"if every node runs {layout.local_size} rank{plural} like this one ({launcher.name} exports {exports}; "
        f'strategy="{UNEVEN_STRATEGY}" needs neither)',
    )


def even_launches(world_size: int, nodes: int) -> str:
    """The even launches nearest to ``world_size`` ranks on ``nodes`` nodes, as ``mpirun``/``srun`` options.

    >>> even_launches(6, 2)
    '`mpirun -np 6 --map-by ppr:3:node` (Open MPI) or `srun -N 2 --ntasks-per-node=3`'
    >>> even_launches(4, 3)
    '`mpirun -np 3 --map-by ppr:1:node` or `-np 6 --map-by ppr:2:node` (Open MPI), or `srun -N 3 --ntasks-per-node=1` or `=2`'
    """  # noqa: E501
    share, rest = divmod(world_size, nodes)
    if not rest:
        return (
            f"`mpirun -np {world_size} --map-by ppr:{share}:node` (Open MPI) or `srun -N {nodes} "
            f"--ntasks-per-node={share}`"
        )
    low, high = max(1, share), share + 1
    return (
        f"`mpirun -np {low * nodes} --map-by ppr:{low}:node` or `-np {high * nodes} --map-by ppr:{high}:node` "
        f"(Open MPI), or `srun -N {nodes} --ntasks-per-node={low}` or `={high}`"
    )


SHOWN_COUNTS = 6


def describe_counts(counts: Sequence[int]) -> str:
    """Every node's count of ranks for a message, in Slurm's compressed form, cut after :data:`SHOWN_COUNTS` runs.

    >>> describe_counts([4, 4, 4, 1]), describe_counts([1, 2] * 500)
    ('4(x3),1', '1,2,1,2,1,2,... (1000 nodes)')
    """
    pieces = compress_tasks_per_node(counts).split(",")
    if len(pieces) <= SHOWN_COUNTS:
        return ",".join(pieces)
    return f"{','.join(pieces[:SHOWN_COUNTS])},... ({len(counts)} nodes)"


def layout_as_dict(layout: RankLayout) -> dict[str, object]:
    """The layout as JSON-ready values: ``global_rank`` as in ``simulate --json``, ``trainer_*`` as shown."""
    trainer = trainer_arguments(layout)
    return {
        "global_rank": layout.rank,
        "world_size": layout.world_size,
        "local_rank": layout.local_rank,
        "local_size": layout.local_size,
        "node_rank": layout.node_rank,
        "num_nodes": layout.num_nodes,
        "main_address": layout.main_address,
        "main_port": layout.main_port,
        "launcher": layout.launcher.key if layout.launcher else None,
        "launcher_name": layout.launcher_name,
        "placement": layout.placement.name.lower(),
        "host": socket.gethostname(),
        "trainer_devices": trainer.devices,
        "trainer_num_nodes": trainer.num_nodes,
        "trainer_exact": trainer.exact,
        "trainer_note": trainer.note,
        "sources": dict(layout.sources),
        "warnings": [warning.one_line() for warning in layout.warnings],
    }
