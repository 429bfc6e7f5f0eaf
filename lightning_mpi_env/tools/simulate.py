"""Dry runs of a launch: every rank's environment as a launcher would export it, resolved like the plugin does.

Nothing here starts a process or touches ``os.environ``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import LOOPBACK_ADDRESS, from_env
from lightning_mpi_env.core.rank_layout import (
    STRATEGIES,
    UNEVEN_STRATEGY,
    RankLayout,
    even_launches,
    uneven_fix,
    uneven_strategy,
)
from lightning_mpi_env.core.state_files import host_file_head
from lightning_mpi_env.tools.cli_output import APPROXIMATE, explained, mark
from lightning_mpi_env.tools.simulated_launch import (
    DEFAULT_SCHEDULER,
    MapBy,
    Slot,
    launch_environments,
)


@dataclass(frozen=True)
class SimulatedRank:
    """One row of the rank table: what was launched and what :func:`from_env` made of it."""

    slot: Slot
    host: str
    env: Mapping[str, str]
    layout: RankLayout | None
    """``None`` when :func:`from_env` refused this rank's environment (see :attr:`error`)."""
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The row as JSON-ready values, with the resolved fields (``None`` where resolution failed)."""
        layout = self.layout
        return {
            "global_rank": layout.rank if layout else None,
            "node_rank": layout.node_rank if layout else None,
            "local_rank": layout.local_rank if layout else None,
            "world_size": layout.world_size if layout else None,
            "local_size": layout.local_size if layout else None,
            "num_nodes": layout.num_nodes if layout else None,
            "main_address": layout.main_address if layout else None,
            "main_port": layout.main_port if layout else None,
            "placement": layout.placement.name.lower() if layout else None,
            "host": self.host,
            "launched": {"rank": self.slot.rank, "node": self.slot.node, "local_rank": self.slot.local_rank},
            "node_rank_exact": layout.node_rank_is_exact if layout else None,
            "num_nodes_exact": layout.num_nodes_is_exact if layout else None,
            "warnings": [explained(warning) for warning in layout.warnings] if layout else [],
            "error": self.error,
        }


@dataclass(frozen=True)
class Simulation:
    """The rank table of one simulated launch and the problems found in it."""

    launcher: str
    scheduler: str
    nodes: int
    ppn: int
    np: int
    map_by: MapBy
    ranks: tuple[SimulatedRank, ...]
    problems: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    """What the plugin would warn about at run time (an approximate node rank, right or not: the roll call
    resolves node ranks by host names), when the table is still right."""
    strategy: str = UNEVEN_STRATEGY
    """The Lightning strategy asked about (:data:`~lightning_mpi_env.core.rank_layout.STRATEGIES`)."""

    @property
    def ranks_per_node(self) -> dict[str, int]:
        """How many ranks each host runs, as launched."""
        return dict(sorted(Counter(row.host for row in self.ranks).items()))

    @property
    def is_even(self) -> bool:
        """Whether every node runs the same number of ranks."""
        return len(set(self.ranks_per_node.values())) <= 1

    @property
    def ok(self) -> bool:
        """Whether every rank resolved and the table has no problems."""
        return not self.problems

    def as_dict(self) -> dict[str, object]:
        """``simulate --json``: the launch, every rank's row, the problems and the warnings."""
        return {
            "ok": self.ok,
            "launcher": self.launcher,
            "scheduler": self.scheduler,
            "nodes": self.nodes,
            "per_node": self.ppn,
            "np": self.np,
            "map_by": self.map_by.value,
            "strategy": self.strategy,
            "even": self.is_even,
            "ranks_per_node": self.ranks_per_node,
            "ranks": [row.as_dict() for row in self.ranks],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }

    def table(self) -> list[str]:
        """``simulate`` as text: the rank table, ``~`` on assumed node ranks, and the verdict."""
        lines = [
            f"# {self.launcher} under {self.scheduler}: {self.np} ranks on {self.nodes} node(s) x {self.ppn} "
            f"slots, --map-by {self.map_by.value}"
        ]
        header = ("host", "global_rank", "node_rank", "local_rank", "world_size", "local_size", "main", "placement")
        rows = [header]
        for simulated in self.ranks:
            layout = simulated.layout
            if layout is None:
                rows.append((simulated.host, str(simulated.slot.rank), "ERROR", "", "", "", "", ""))
                continue
            rows.append(
                (
                    simulated.host,
                    str(layout.rank),
                    mark(layout.node_rank, layout.node_rank_is_exact),
                    str(layout.local_rank),
                    str(layout.world_size),
                    str(layout.local_size),
                    f"{layout.main_address}:{layout.main_port}",
                    layout.placement.name.lower(),
                )
            )
        widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
        lines += [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        if any(row.layout is not None and not row.layout.node_rank_is_exact for row in self.ranks):
            lines.append(f"# {APPROXIMATE}")
        lines.append(f"# {'OK' if self.ok else f'{len(self.problems)} problem(s)'} for strategy={self.strategy!r}")
        if not self.is_even:
            # Said for every strategy; the fix only where every rank resolved (else no strategy trains it).
            resolved = all(row.layout is not None for row in self.ranks)
            lines.append(
                f"# uneven: {describe_spread(self.ranks_per_node)}."
                + (f" {uneven_fix(self.launcher)}." if resolved else "")
            )
        return lines


def simulate(
    launcher: str,
    nodes: int,
    ppn: int,
    *,
    np: int | None = None,
    map_by: MapBy | str = "slot",
    scheduler: str | None = None,
    strategy: str = UNEVEN_STRATEGY,
) -> Simulation:
    """Launch nothing, but resolve every rank's environment as the plugin would and check the rank table.

    The table has a problem when a rank's environment is refused, when global ranks repeat, when the resolved
    local rank, or a node rank the launcher exports, differs from where the launcher put the rank, when ranks
    disagree on the world size or the main address and port, when the main address is not rank 0's host, or when
    nodes run different numbers of ranks and ``strategy`` is one of Lightning's own (``ddp``, ``fsdp``,
    ``deepspeed``), which need the same on every node. Under ``"ddp_mpi"`` (the default) an uneven launch is fine.
    Run-time warnings of a still correct table are kept apart in :attr:`Simulation.warnings`. The arguments are
    :func:`~lightning_mpi_env.tools.simulated_launch.launch_environments`'s, and the strategy to check for.

    Raises:
        ValueError: On an unknown launcher, scheduler or strategy; impossible counts, or more than
            :data:`~lightning_mpi_env.tools.simulated_launch.MAX_SIMULATED_RANKS` slots, are a
            :class:`~lightning_mpi_env.core.errors.SettingError`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}.")
    map_by = MapBy(map_by)
    scheduler = scheduler or DEFAULT_SCHEDULER.get(launcher, "none")
    slots, hosts, environments, files = launch_environments(
        launcher, nodes, ppn, np=np, map_by=map_by, scheduler=scheduler
    )

    # Read as a host file on disk is read (its head only), and once, not once per rank.
    heads = {path: host_file_head(text.splitlines(keepends=True)) for path, text in files.items()}

    def read_text(path: str) -> str:
        if path not in heads:
            raise OSError(f"[Errno 2] No such file or directory: '{path}'")
        return heads[path]

    ranks: list[SimulatedRank] = []
    for slot, env in zip(slots, environments, strict=True):
        try:
            ranks.append(SimulatedRank(slot, hosts[slot.node], env, from_env(env, read_text=read_text)))
        except LayoutError as error:
            ranks.append(SimulatedRank(slot, hosts[slot.node], env, None, error.one_line()))
    problems, assumed = _check_table(ranks, strategy, launcher)
    return Simulation(
        launcher=launcher,
        scheduler=scheduler,
        nodes=nodes,
        ppn=ppn,
        np=len(slots),
        map_by=map_by,
        ranks=tuple(ranks),
        problems=tuple(problems),
        warnings=tuple(
            f"rank {row.slot.rank} on {row.host}: {warning}"
            for row in ranks
            if row.layout is not None
            for warning in row.layout.warnings
        )
        + tuple(assumed),
        strategy=strategy,
    )


def check_table(
    ranks: Sequence[SimulatedRank], strategy: str = UNEVEN_STRATEGY, launcher: str | None = None
) -> list[str]:
    """The problems in a rank table, one sentence each (empty when the table is sound for ``strategy``).

    ``launcher`` (one of :data:`~lightning_mpi_env.tools.simulated_launch.LAUNCHER_KEYS`) picks the advice for an
    uneven table: the strategy object under srun.
    """
    return _check_table(ranks, strategy, launcher)[0]


def _check_table(ranks: Sequence[SimulatedRank], strategy: str, launcher: str | None) -> tuple[list[str], list[str]]:
    """The problems in a rank table, and the assumed node ranks that are wrong (warnings).

    The roll call resolves node ranks by host names, so only a node rank the launcher exports must be right.
    """
    problems = [f"rank {row.slot.rank} on {row.host}: {row.error}" for row in ranks if row.error is not None]
    assumed: list[str] = []
    resolved = [(row, row.layout) for row in ranks if row.layout is not None]
    repeated = sorted(rank for rank, n in Counter(layout.rank for _, layout in resolved).items() if n > 1)
    if repeated:
        problems.append(f"global rank(s) {repeated} resolved on more than one process.")
    pairs = Counter((layout.node_rank, layout.local_rank) for _, layout in resolved)
    exact_pairs = {(layout.node_rank, layout.local_rank) for _, layout in resolved if layout.node_rank_is_exact}
    for (node, local), count in sorted(pairs.items()):
        if count > 1:
            said = f"{count} processes resolved to node {node}, local rank {local}."
            (problems if (node, local) in exact_pairs else assumed).append(said)
    # Nodes that run no rank are not part of the job: index the others in order.
    node_index = {node: index for index, node in enumerate(sorted({row.slot.node for row in ranks}))}
    for row, layout in resolved:
        wrong = [
            f"{name} {got} (launched as {want})"
            for name, got, want in (
                ("global rank", layout.rank, row.slot.rank),
                ("local rank", layout.local_rank, row.slot.local_rank),
            )
            if got != want
        ]
        if wrong:
            problems.append(f"rank {row.slot.rank} on {row.host} resolved to {', '.join(wrong)}.")
        if layout.node_rank != node_index[row.slot.node]:
            said = f"node rank {layout.node_rank} (launched on node {node_index[row.slot.node]})"
            if layout.node_rank_is_exact:
                problems.append(f"rank {row.slot.rank} on {row.host} resolved to {said}.")
            else:
                assumed.append(
                    f"rank {row.slot.rank} on {row.host}: {said} is assumed from {layout.sources.get('node_rank')}; "
                    "the roll call of ddp_mpi/MPIClusterEnvironment finds the true one by host names."
                )
    for name in ("world_size", "main_address", "main_port"):
        values = sorted({str(getattr(layout, name)) for _, layout in resolved})
        if len(values) > 1:
            problems.append(f"ranks disagree on {name}: {', '.join(values)}.")
    rank_zero = [row for row in ranks if row.slot.rank == 0]
    one_host = len({row.host for row in ranks}) == 1  # then the main address is loopback, which is rank 0's host
    main = rank_zero[0].layout.main_address if rank_zero and rank_zero[0].layout is not None else None
    if main is not None and main != rank_zero[0].host and not (one_host and main == LOOPBACK_ADDRESS):
        problems.append(f"the main address {main} is not {rank_zero[0].host}, the host of rank 0.")
    per_node = Counter(row.host for row in ranks)
    if len(set(per_node.values())) > 1 and strategy != UNEVEN_STRATEGY:
        problems.append(
            f"nodes run different numbers of ranks ({describe_spread(per_node)}); Lightning's own strategy "
            f'"{strategy}" needs the same on every node: use {uneven_strategy(launcher)}, which trains it.'
        )
    return problems, assumed


def describe_spread(per_node: Mapping[str, int]) -> str:
    """Each host's count of ranks, for messages: ``node001: 4, node002: 2``."""
    return ", ".join(f"{host}: {count}" for host, count in sorted(per_node.items()))


def require_ok(simulation: Simulation) -> None:
    """Raise a :class:`LayoutError` listing every problem when the simulated table has any (for a user's tests)."""
    if not simulation.ok:
        used = len(simulation.ranks_per_node)
        if simulation.is_even:
            hint = "Fix what each problem names; `lightning-mpi-env doctor` on a rank shows where its values came from."
        else:
            hint = (
                f"{uneven_fix(simulation.launcher)}. Or launch the same number on each of the {used} node(s): "
                f"{even_launches(simulation.np, used)}."
            )
        raise LayoutError(
            f"Simulated {simulation.launcher} launch of {simulation.np} ranks on {simulation.nodes} node(s) x "
            f"{simulation.ppn} (--map-by {simulation.map_by.value}, strategy={simulation.strategy!r}) has problems: "
            + " ".join(simulation.problems),
            hint,
            launcher=simulation.launcher,
        )
