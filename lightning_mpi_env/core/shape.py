"""The ``Trainer``/``Fabric`` arguments and the plain dictionary of a ``RankLayout``.

One answer for every user of it: ``RankLayout.trainer_kwargs()`` (``show``, the ``"ddp_mpi"`` strategy's zero-config
``devices``/``num_nodes``, the errors) and ``RankLayout.as_dict()`` (``show --json``). Standard library only.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, NamedTuple

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


def trainer_arguments(layout: RankLayout) -> TrainerArguments:
    """The ``Trainer(devices=..., num_nodes=...)`` (or ``Fabric``) that matches the launch ``layout`` comes from.

    Exact when the launcher exports the number of nodes (``srun``, Flux) or there is none; under launchers that
    export only this node's count (Open MPI, Hydra, ...) the numbers assume every node runs as many ranks as this one.

    >>> from lightning_mpi_env.core.layout import from_env
    >>> trainer_arguments(from_env({"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
    ...     "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "a"}))
    TrainerArguments(devices=4, num_nodes=2, exact=True, note='')
    """
    launcher = layout.launcher
    if launcher is None:
        return TrainerArguments(1, 1, exact=True)
    if layout.num_nodes is None or not layout.is_even:
        return TrainerArguments(
            None,
            None,
            exact=True,
            note=f"no devices/num_nodes fits: {launcher.name} launched {layout.describe_world()}, not the same "
            "number on every node, and Lightning needs the same",
        )
    # Only a launcher that exports the node count (or every node's ranks) lets one process know the whole layout.
    counts_nodes = launcher.tasks_per_node is not None or launcher.num_nodes is not None
    if counts_nodes:
        return TrainerArguments(layout.local_size, layout.num_nodes, exact=True)
    return TrainerArguments(
        layout.local_size,
        layout.num_nodes,
        exact=False,
        note=f"if every node runs {layout.local_size} rank{'s' if layout.local_size != 1 else ''} like this one "
        f"({launcher.name} exports no node count)",
    )


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


__all__ = ["TrainerArguments", "layout_as_dict", "trainer_arguments"]
