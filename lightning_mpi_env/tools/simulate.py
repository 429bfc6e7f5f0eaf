"""Dry runs of a launch: every rank's environment as a launcher would export it, resolved like the plugin does.

:func:`launch_environments` builds, for ``nodes`` x ``ppn`` slots and a placement, the variables each launcher (one
row of :mod:`lightning_mpi_env.core.launchers`) and each scheduler export to every rank; :func:`simulate` resolves each
with :func:`~lightning_mpi_env.core.layout.from_env`, the same code path as
:class:`~lightning_mpi_env.MPIClusterEnvironment`, and checks the resulting rank table against the placement that
was simulated. Nothing here starts a process or touches ``os.environ``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core.errors import LayoutError, SettingError
from lightning_mpi_env.core.hostfile import host_file_head
from lightning_mpi_env.core.hostlist import compress_tasks_per_node
from lightning_mpi_env.core.launchers import FLAVOURS
from lightning_mpi_env.core.layout import DEALING, LOOPBACK_ADDRESS, Placement, RankLayout, from_env
from lightning_mpi_env.core.schedulers import SCHEDULERS_BY_KEY
from lightning_mpi_env.core.shape import STRATEGIES, UNEVEN_STRATEGY, even_launches, uneven_fix, uneven_strategy
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import SHOWN_CHARACTERS

JOB_ID = "12345"
"""The job id every simulated scheduler hands out."""

HOST_FILE = "/simulated"
"""Where simulated host files live (``/simulated/PBS_NODEFILE`` ...); served from memory, never written."""

MapBy = Enum("MapBy", {by.upper(): by for by, _ in DEALING.values()}, type=str)  # type: ignore[misc]
"""How ranks are dealt to nodes, by Open MPI's ``--map-by`` name: ``SLOT`` (block) or ``NODE`` (round-robin)."""

PLACEMENT_OF: Mapping[str, Placement] = MappingProxyType({by: placement for placement, (by, _) in DEALING.items()})
"""The :class:`~lightning_mpi_env.core.layout.Placement` each ``--map-by`` value deals ranks by."""

LAUNCHER_KEYS: tuple[str, ...] = tuple(FLAVOURS)
"""Launchers :func:`simulate` can play: every flavour of every launcher row (``intelmpi`` plays the Hydra row)."""

SCHEDULERS: tuple[str, ...] = ("none", *SCHEDULERS_BY_KEY)
"""Schedulers whose host list and job id :func:`simulate` can add; ``none`` exports ``MASTER_ADDR`` by hand."""

DEFAULT_SCHEDULER: Mapping[str, str] = MappingProxyType(
    {flavour: launcher.scheduler for flavour, launcher in FLAVOURS.items() if launcher.scheduler}
)
"""The scheduler a launcher runs under by default (its row's); others default to ``none`` (a plain job script)."""


@dataclass(frozen=True)
class Slot:
    """Where the simulated launch put one rank: the truth the resolved layout is checked against."""

    rank: int
    node: int
    local_rank: int
    local_size: int


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
            "warnings": list(layout.warnings) if layout else [],
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
    """What makes the launch wrong: refused environments, duplicate or wrong ranks, disagreement, and uneven nodes
    under a strategy that needs even ones."""
    warnings: tuple[str, ...] = field(default=())
    """What the plugin would warn about at run time (an approximate node rank, right or not: the roll call
    resolves node ranks by host names), when the table is still right."""
    strategy: str = UNEVEN_STRATEGY
    """The Lightning strategy asked about (:data:`~lightning_mpi_env.core.shape.STRATEGIES`)."""

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


def host_names(nodes: int) -> list[str]:
    """The simulated host names, ``node001`` ... (zero padded so a Slurm range keeps its width).

    >>> host_names(2)
    ['node001', 'node002']
    """
    width = max(3, len(str(nodes)))
    return [f"node{index + 1:0{width}d}" for index in range(nodes)]


MAX_SIMULATED_RANKS = 1 << 16
"""The most slots (nodes x slots per node) :func:`simulate` lays out: every rank's environment is built and
resolved, in time and memory linear in the slots (``benchmarks/hostile_inputs.py`` measures them)."""


def check_size(nodes: int, ppn: int, np: int) -> None:
    """Refuse sizes :func:`simulate` cannot lay out: not positive, more ranks than slots, or past the maximum.

    Raises:
        SettingError: Naming the argument, its value and the limit.

    >>> check_size(10**18, 10**18, 1)
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.errors.SettingError: --nodes 1000000000000000000 x --ppn 1000000000000000000 is more than the 65536 slots a simulation lays out.
    HINT: Simulate a smaller launch: the rules it checks are the same at any size.
    """  # noqa: E501
    for name, value in (("--nodes", nodes), ("--ppn", ppn), ("--np", np)):
        if value < 1:
            raise SettingError(f"{name} {value} must be at least 1.", f"Give {name} a positive count.", variable=name)
    if nodes * ppn > MAX_SIMULATED_RANKS:
        raise SettingError(
            f"--nodes {nodes} x --ppn {ppn} is more than the {MAX_SIMULATED_RANKS} slots a simulation lays out.",
            "Simulate a smaller launch: the rules it checks are the same at any size.",
            variable="--nodes",
            value=str(nodes)[:SHOWN_CHARACTERS],
        )
    if np > nodes * ppn:
        raise SettingError(
            f"--np {np} is more than the {nodes * ppn} slots of --nodes {nodes} x --ppn {ppn}.",
            "Give at most as many ranks as there are slots.",
            variable="--np",
            value=str(np)[:SHOWN_CHARACTERS],
        )


def place(nodes: int, ppn: int, np: int, map_by: MapBy) -> list[Slot]:
    """Deal ``np`` ranks to ``nodes`` nodes of ``ppn`` slots as the launcher would; nodes may end up empty.

    Raises:
        SettingError: If the arguments are not positive, exceed the slots or :data:`MAX_SIMULATED_RANKS` (a
            ``ValueError``).

    >>> [(slot.node, slot.local_rank) for slot in place(2, 2, 3, MapBy.NODE)]
    [(0, 0), (1, 0), (0, 1)]
    """
    check_size(nodes, ppn, np)
    assignments: list[tuple[int, int]] = []  # (node, local rank) per rank
    filled = [0] * nodes
    for rank in range(np):
        if PLACEMENT_OF[map_by.value] is Placement.BLOCK:
            node = rank // ppn
        else:
            # Deal in turn, skipping nodes already full (only happens when np does not fill every slot evenly).
            node = rank % nodes
            while filled[node] >= ppn:
                node = (node + 1) % nodes
        assignments.append((node, filled[node]))
        filled[node] += 1
    return [Slot(rank, node, local, filled[node]) for rank, (node, local) in enumerate(assignments)]


def launch_environments(
    launcher: str,
    nodes: int,
    ppn: int,
    *,
    np: int | None = None,
    map_by: MapBy | str = "slot",
    scheduler: str | None = None,
) -> tuple[list[Slot], list[str], list[dict[str, str]], dict[str, str]]:
    """Every rank's environment as ``launcher`` under ``scheduler`` would export it.

    Args:
        launcher: One of :data:`LAUNCHER_KEYS`.
        nodes: Number of nodes.
        ppn: Slots per node.
        np: Number of ranks; every slot by default.
        map_by: Block (``slot``) or round-robin (``node``) placement.
        scheduler: One of :data:`SCHEDULERS`; by default :data:`DEFAULT_SCHEDULER` or ``none``.

    Returns:
        The placement, the host names, one environment per rank, and the host files (path -> text) that the
        environments name.

    Raises:
        ValueError: On an unknown launcher or scheduler; impossible counts, or more than
            :data:`MAX_SIMULATED_RANKS` slots, are a :class:`~lightning_mpi_env.core.errors.SettingError`.
    """
    if launcher not in LAUNCHER_KEYS:
        raise ValueError(f"launcher={launcher!r} is not one of {', '.join(LAUNCHER_KEYS)}.")
    scheduler = scheduler or DEFAULT_SCHEDULER.get(launcher, "none")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler={scheduler!r} is not one of {', '.join(SCHEDULERS)}.")
    map_by = MapBy(map_by)
    slots = place(nodes, ppn, nodes * ppn if np is None else np, map_by)
    hosts = host_names(nodes)
    job, files = _scheduler_environment(scheduler, hosts, ppn)
    step = _Step.of(slots, hosts, map_by)
    shared = _step_variables(step, files)
    return slots, hosts, [{**job, **_launcher_variables(launcher, slot, step, shared)} for slot in slots], files


@dataclass(frozen=True)
class _Step:
    """One simulated launch: where every rank went, and what follows from it for every rank alike (made once)."""

    slots: Sequence[Slot]
    hosts: Sequence[str]
    map_by: MapBy
    used_nodes: list[int]
    """The nodes that run a rank, in order."""
    node_index: Mapping[int, int]
    """Each used node's index among :attr:`used_nodes` (launchers number only the nodes the step uses)."""
    counts: list[int]
    """Ranks on each used node."""

    @classmethod
    def of(cls, slots: Sequence[Slot], hosts: Sequence[str], map_by: MapBy) -> _Step:
        per_node = Counter(slot.node for slot in slots)
        used_nodes = sorted(per_node)
        return cls(
            slots,
            hosts,
            map_by,
            used_nodes,
            {node: i for i, node in enumerate(used_nodes)},
            [per_node[n] for n in used_nodes],
        )


def _file(files: dict[str, str], variable: str, text: str) -> str:
    path = f"{HOST_FILE}/{variable}"
    files[path] = text
    return path


def _fill(
    templates: Mapping[str, str], fields: Mapping[str, object], files: dict[str, str], contents: Mapping[str, str]
) -> dict[str, str]:
    """Expand a row's templates: ``{name}`` fields, and ``{file:kind}`` for a host file of that kind."""
    env = {}
    for variable, template in templates.items():
        if template.startswith("{file:"):
            env[variable] = _file(files, variable, contents[template[len("{file:") : -1]])
        else:
            env[variable] = template.format(**fields)
    return env


def _scheduler_environment(scheduler: str, hosts: Sequence[str], ppn: int) -> tuple[dict[str, str], dict[str, str]]:
    """What the job script hands every rank: the scheduler row's host lists and job id (or ``MASTER_ADDR``)."""
    if scheduler == "none":
        # A plain job script: `export MASTER_ADDR=<first host>` and `mpirun -x MASTER_ADDR`.
        return {TORCH.master_addr: hosts[0]}, {}
    files: dict[str, str] = {}
    fields = {
        "job": JOB_ID,
        "nodelist": compress_nodelist(hosts),
        "num_nodes": len(hosts),
        "lsf_pairs": " ".join(f"{host} {ppn}" for host in hosts),
        "first_host": hosts[0],
    }
    return _fill(SCHEDULERS_BY_KEY[scheduler].simulated, fields, files, _host_files(hosts, ppn)), files


def _host_files(hosts: Sequence[str], ppn: int) -> dict[str, str]:
    """The host files schedulers write, by the kind a template names."""
    return {
        "hosts": "".join(f"{host}\n" for host in hosts),
        "slots": "".join(f"{host}\n" for host in hosts for _ in range(ppn)),
        "pe": "".join(f"{host} {ppn} all.q@{host} UNDEFINED\n" for host in hosts),
        "launch_slots": "batch1\n" + "".join(f"{host}\n" for host in hosts for _ in range(ppn)),
    }


def compress_nodelist(hosts: Sequence[str]) -> str:
    """A Slurm node list for consecutive hosts from :func:`host_names`: ``node[001-004]``.

    >>> compress_nodelist(["node001", "node002"])
    'node[001-002]'
    """
    if len(hosts) == 1:
        return hosts[0]
    return f"node[{hosts[0][4:]}-{hosts[-1][4:]}]"


class _Shared(NamedTuple):
    """What every rank of one step shares: the row's sizes, and the flavour's fields and host files."""

    world_size: int
    num_nodes: int
    tasks_per_node: str
    fields: dict[str, object]
    files: dict[str, str]
    contents: dict[str, str]


def _step_variables(step: _Step, files: dict[str, str]) -> _Shared:
    """What every rank of the step shares, made once: building it per rank made ``simulate`` quadratic."""
    world_size = len(step.slots)
    step_hosts = [step.hosts[node] for node in step.used_nodes]
    return _Shared(
        world_size=world_size,
        num_nodes=len(step.used_nodes),
        tasks_per_node=compress_tasks_per_node(step.counts),
        fields={
            "world_size": world_size,
            "job": JOB_ID,
            "uuid": f"{int(JOB_ID):08x}-0000-0000-0000-000000000001",
            "first_host": step.hosts[0],
            "step_nodelist": compress_nodelist(step_hosts),  # a prefix of the hosts: one range
            "step_num_nodes": len(step_hosts),
            "distribution": DEALING[PLACEMENT_OF[step.map_by.value]][1],
        },
        files=files,
        contents=_host_files(step_hosts, max(step.counts)),
    )


def _launcher_variables(key: str, slot: Slot, step: _Step, shared: _Shared) -> dict[str, str]:
    """The variables one launcher's row names, plus what that flavour of the launcher also exports."""
    row = FLAVOURS[key]
    node_index = step.node_index[slot.node] if len(step.used_nodes) < len(step.hosts) else slot.node
    values: dict[str | None, object] = {
        row.rank: slot.rank,
        row.world_size: shared.world_size,
        row.local_rank: slot.local_rank,
        row.local_size: slot.local_size,
        row.node_rank: node_index,
        row.num_nodes: shared.num_nodes,
        row.tasks_per_node: shared.tasks_per_node,
    }
    env = {name: str(value) for name, value in values.items() if name is not None}
    fields = {
        **shared.fields,
        "rank": slot.rank,
        "local_rank": slot.local_rank,
        "node": node_index,
        "host": step.hosts[slot.node],
    }
    env.update(_fill(row.flavours[key], fields, shared.files, shared.contents))
    return env


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
    Run-time warnings of a still correct table are kept apart in :attr:`Simulation.warnings`: an approximate node
    rank, right or wrong (the roll call resolves node ranks by host names).

    Args:
        launcher: One of :data:`LAUNCHER_KEYS`.
        nodes: Number of nodes.
        ppn: Slots per node.
        np: Number of ranks; every slot by default.
        map_by: Block (``slot``) or round-robin (``node``) placement.
        scheduler: One of :data:`SCHEDULERS`.
        strategy: The Lightning strategy to check the launch for, one of
            :data:`~lightning_mpi_env.core.shape.STRATEGIES`.

    Returns:
        The rank table and its problems.

    Raises:
        ValueError: On an unknown launcher, scheduler or strategy; impossible counts, or more than
            :data:`MAX_SIMULATED_RANKS` slots, are a :class:`~lightning_mpi_env.core.errors.SettingError`.

    >>> simulate("openmpi", nodes=2, ppn=2, map_by="node").ok
    True
    >>> simulate("slurm", nodes=2, ppn=4, np=6).ok, simulate("slurm", nodes=2, ppn=4, np=6, strategy="ddp").ok
    (True, False)
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

    ``launcher`` (one of :data:`LAUNCHER_KEYS`) picks the advice for an uneven table: the strategy object under srun.
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
    """Each host's count of ranks, for messages.

    >>> describe_spread({"node002": 2, "node001": 4})
    'node001: 4, node002: 2'
    """
    return ", ".join(f"{host}: {count}" for host, count in sorted(per_node.items()))


def require_ok(simulation: Simulation) -> None:
    """Raise when the simulated table has problems, for use in a user's own tests.

    Raises:
        LayoutError: Listing every problem.
    """
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
