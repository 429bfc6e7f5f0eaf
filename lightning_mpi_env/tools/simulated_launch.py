"""The launch a dry run plays: where each rank goes, and every variable its launcher and scheduler export to it.

Nothing here starts a process or touches ``os.environ``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.hostlist import compress_tasks_per_node
from lightning_mpi_env.core.launchers import FLAVOURS
from lightning_mpi_env.core.placement import DEALING, Placement
from lightning_mpi_env.core.schedulers import SCHEDULERS_BY_KEY
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
"""Launchers a simulation can play: every flavour of every launcher row (``intelmpi`` plays the Hydra row)."""

SCHEDULERS: tuple[str, ...] = ("none", *SCHEDULERS_BY_KEY)
"""Schedulers whose host list and job id :func:`~lightning_mpi_env.tools.simulate.simulate` can add; ``none`` exports
``MASTER_ADDR`` by hand."""

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


def host_names(nodes: int) -> list[str]:
    """The simulated host names, ``node001`` ... (zero padded so a Slurm range keeps its width)."""
    width = max(3, len(str(nodes)))
    return [f"node{index + 1:0{width}d}" for index in range(nodes)]


MAX_SIMULATED_RANKS = 1 << 16
"""The most slots (nodes x slots per node) a simulation lays out: each costs time and memory."""


def check_size(nodes: int, ppn: int, np: int) -> None:
    """Refuse sizes a simulation cannot lay out: not positive, more ranks than slots, or past the maximum.

    Raises:
        SettingError: Naming the argument, its value and the limit.
    """
    for name, value in (("--nodes", nodes), ("--per-node", ppn), ("--np", np)):
        if value < 1:
            raise SettingError(f"{name} {value} must be at least 1.", f"Give {name} a positive count.", variable=name)
    if nodes * ppn > MAX_SIMULATED_RANKS:
        raise SettingError(
            f"--nodes {nodes} x --per-node {ppn} is more than the {MAX_SIMULATED_RANKS} slots a simulation lays out.",
            "Simulate a smaller launch: the rules it checks are the same at any size.",
            variable="--nodes",
            value=str(nodes)[:SHOWN_CHARACTERS],
        )
    if np > nodes * ppn:
        raise SettingError(
            f"--np {np} is more than the {nodes * ppn} slots of --nodes {nodes} x --per-node {ppn}.",
            "Give at most as many ranks as there are slots.",
            variable="--np",
            value=str(np)[:SHOWN_CHARACTERS],
        )


def map_slots(nodes: int, ppn: int, np: int, map_by: MapBy) -> list[Slot]:
    """Deal ``np`` ranks to ``nodes`` nodes of ``ppn`` slots as the launcher would; nodes may end up empty.

    Raises:
        SettingError: If the arguments are not positive, exceed the slots or :data:`MAX_SIMULATED_RANKS` (a
            ``ValueError``).
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
    """Every rank's environment as ``launcher`` under ``scheduler`` would export it, for ``nodes`` x ``ppn`` slots.

    ``np`` ranks, every slot by default; ``scheduler`` by default :data:`DEFAULT_SCHEDULER`'s or ``none``.

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
    slots = map_slots(nodes, ppn, nodes * ppn if np is None else np, map_by)
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
    """A Slurm node list for consecutive hosts from :func:`host_names`: ``node[001-004]``."""
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
    """What every rank of the step shares, made once (per rank, ``simulate`` would be quadratic in the ranks)."""
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
