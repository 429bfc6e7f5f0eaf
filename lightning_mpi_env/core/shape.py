"""The ``Trainer``/``Fabric`` arguments and the plain dictionary of a ``RankLayout``.

One answer for every user of it: ``RankLayout.trainer_kwargs()`` (``show``, the ``"ddp_mpi"`` strategy's zero-config
``devices``/``num_nodes``, the errors) and ``RankLayout.as_dict()`` (``show --json``). Standard library only.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from lightning_mpi_env.core.hostlist import compress_tasks_per_node
from lightning_mpi_env.core.launchers import SLURM

if TYPE_CHECKING:
    from lightning_mpi_env.core.layout import RankLayout


class TrainerArguments(NamedTuple):
    """The ``Trainer``/``Fabric`` ``devices`` and ``num_nodes`` that match a launch, as far as one process knows."""

    devices: int | None
    """Ranks per node, or ``None`` when no value fits (ranks spread unevenly)."""
    num_nodes: int | None
    """Number of nodes, or ``None`` when no value fits."""
    exact: bool
    """Whether this process knows them for certain; otherwise :attr:`note` says what they assume."""
    note: str = ""
    """Why they are not exact, or why there are none; empty when exact."""

    def __str__(self) -> str:
        if self.devices is None or self.num_nodes is None:
            return f"Trainer: {self.note}"
        call = f"Trainer(devices={self.devices}, num_nodes={self.num_nodes})"
        return call if self.exact else f"{call} {self.note}"


UNEVEN_STRATEGY = "ddp_mpi"
"""The strategy that trains on any layout the launch proves: its world, ranks, devices and sampler come from it."""

STRATEGIES_NEEDING_EVEN_NODES: tuple[str, ...] = ("ddp", "fsdp", "deepspeed")
"""Lightning's own strategies that ``simulate --strategy`` can ask about: each needs the same number of ranks on
every node (``world_size = num_nodes * num_processes``, ``global_rank = node_rank * num_processes + local_rank``)."""

STRATEGIES: tuple[str, ...] = (UNEVEN_STRATEGY, *STRATEGIES_NEEDING_EVEN_NODES)
"""Every strategy name ``simulate --strategy`` takes, the default first."""

BY_NAME_UNDER_SRUN = (
    "the object, not the name: by name Lightning makes its own SLURMEnvironment first, and that refuses a step of "
    "srun --ntasks without --ntasks-per-node"
)
"""Why ``"ddp_mpi"`` goes in as ``MPIDDPStrategy()`` on an uneven ``srun`` step: by name, Lightning makes a
``SLURMEnvironment`` first, which refuses ``SLURM_NTASKS`` > 1 without ``SLURM_NTASKS_PER_NODE``
(``SLURMEnvironment._validate_srun_variables``); a strategy object brings its own environment."""


def uneven_strategy(launcher_key: str | None = None) -> str:
    """The Trainer argument that trains an uneven launch of ``launcher_key``: by name, but the object under ``srun``.

    >>> uneven_strategy("openmpi")
    'Trainer(strategy="ddp_mpi")'
    >>> uneven_strategy("slurm").startswith("Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) (the object")
    True
    """
    if launcher_key == SLURM.key:
        return f"Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) ({BY_NAME_UNDER_SRUN})"
    return f'Trainer(strategy="{UNEVEN_STRATEGY}")'


def uneven_fix(launcher_key: str | None = None) -> str:
    """What trains an uneven launch and what does not, said wherever one is found (``show``, ``doctor``, ``simulate``).

    >>> uneven_fix("slurm").startswith("Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) (the object")
    True
    """
    return (
        f"{uneven_strategy(launcher_key)} trains it as launched, with no devices or num_nodes; Lightning's own "
        f"{', '.join(STRATEGIES_NEEDING_EVEN_NODES)} need the same number on every node"
    )


UNEVEN_FIX = uneven_fix()
"""What works on an uneven launch under any launcher but ``srun`` (:func:`uneven_fix`)."""


def trainer_arguments(layout: RankLayout) -> TrainerArguments:
    """The ``Trainer(devices=..., num_nodes=...)`` (or ``Fabric``) that matches the launch ``layout`` comes from.

    Exact when the launcher exports every node's count (``srun``) or there is one node; under launchers that export
    only this node's count (Open MPI, Hydra, ...) or only the node count (Flux) the numbers assume every node runs
    as many ranks as this one. An uneven launch has none: ``strategy="ddp_mpi"`` needs neither, and Lightning's own
    strategies cannot train it (:data:`UNEVEN_FIX`).

    >>> from lightning_mpi_env.core.layout import from_env
    >>> trainer_arguments(from_env({"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
    ...     "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "a"}))
    TrainerArguments(devices=4, num_nodes=2, exact=True, note='')
    """
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
"""How many runs of equal counts a message shows (:func:`describe_counts`); a hostile list has a million."""


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


__all__ = [
    "STRATEGIES",
    "STRATEGIES_NEEDING_EVEN_NODES",
    "UNEVEN_FIX",
    "uneven_fix",
    "uneven_strategy",
    "UNEVEN_STRATEGY",
    "TrainerArguments",
    "describe_counts",
    "even_launches",
    "layout_as_dict",
    "trainer_arguments",
]
