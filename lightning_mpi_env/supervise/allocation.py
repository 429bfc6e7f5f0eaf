"""The hosts a job step may run on, and their slots: from the launcher line's own hosts, else the scheduler's."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import HostList, HostListForm, read_hosts
from lightning_mpi_env.core.ports import host_syntax_problem
from lightning_mpi_env.core.schedulers import SCHEDULERS
from lightning_mpi_env.core.state_files import read_whole_host_file
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, SHOWN_CHARACTERS, parse_count, shown

MAX_ALLOCATION_HOSTS = 1 << 16
"""The most distinct hosts in one allocation: several times the largest machines' node counts."""

MAX_ALLOCATION_FILE_BYTES = 64 << 20
"""The most bytes read from an allocation's host file: room for a ``PBS_NODEFILE`` of 10,000 nodes x 128 slots.
A longer file is refused, not cut: a cut list would silently drop hosts."""


class Host(NamedTuple):
    """One host of an allocation."""

    name: str
    slots: int | None
    """Processes it takes; ``None`` where the source does not say (Open MPI then counts the host's cores)."""


@dataclass(frozen=True)
class Allocation:
    """The hosts a step may run on, in order, each once, and where they were read."""

    hosts: tuple[Host, ...]
    source: str
    """``mpirun --host``, ``PBS_NODEFILE``, ...: for messages."""

    def names(self) -> list[str]:
        """The host names, in order."""
        return [host.name for host in self.hosts]

    def split(self, excluded: Iterable[str]) -> tuple[tuple[Host, ...], tuple[str, ...]]:
        """The hosts left once ``excluded`` are taken out, and the excluded names that match no host.

        A name matches a host when it is the same, or when neither is an IP address and their first labels are
        (``node2`` and ``node2.cluster``): ranks report their own host name, which the scheduler may spell in full.
        """
        names = list(dict.fromkeys(excluded))
        matched = {name: [host.name for host in self.hosts if same_host(host.name, name)] for name in names}
        gone = {host for hosts in matched.values() for host in hosts}
        left = tuple(host for host in self.hosts if host.name not in gone)
        return left, tuple(name for name in names if not matched[name])


def same_host(one: str, other: str) -> bool:
    """Whether two names name one host: equal, or (neither an IP address) equal first labels, case aside."""
    if one.lower() == other.lower():
        return True
    if _is_address(one) or _is_address(other):
        return False
    return one.split(".", 1)[0].lower() == other.split(".", 1)[0].lower()


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    return True


class AllocationSource(NamedTuple):
    """One variable through which a scheduler lists the job's hosts."""

    variable: str
    scheduler: str
    form: HostListForm
    slots: str = ""
    """The variable holding the slots per host, where the list itself does not (Slurm)."""


SLOTS_VARIABLE = {"SLURM_JOB_NODELIST": "SLURM_TASKS_PER_NODE"}
"""The variable with each host's slots, where a host list gives none (sbatch(1): compressed, ``2(x3),1``)."""
WITHOUT_SLOTS = frozenset({"SGE_JOB_HOSTLIST"})
"""Host lists of the scheduler table that name each host once, with no slots (ABCI's): the next one is read."""

ON_THE_LINE = "name the hosts on the launcher line (--host / -hosts)"
"""What the supervisor can do instead of reading the scheduler's host list: the end of its hints."""

ALLOCATION_SOURCES: tuple[AllocationSource, ...] = tuple(
    AllocationSource(source.variable, scheduler.name, source.form, SLOTS_VARIABLE.get(source.variable, ""))
    for scheduler in SCHEDULERS
    for source in scheduler.host_lists
    if source.variable not in WITHOUT_SLOTS
)
"""Where each scheduler lists the job's hosts, in the order consulted (the first one set wins)."""


def read_allocation_file(path: str) -> str:
    """The whole host file at ``path``, bounded (:data:`MAX_ALLOCATION_FILE_BYTES`, regular files only)."""
    return read_whole_host_file(path, max_bytes=MAX_ALLOCATION_FILE_BYTES)


def allocation_from_env(
    env: Mapping[str, str], *, read_text: Callable[[str], str] = read_allocation_file
) -> Allocation | None:
    """The job's hosts as its scheduler lists them (:data:`ALLOCATION_SOURCES`), or ``None`` outside a scheduler.

    Raises:
        LayoutError: The variable, its file or a line of it is malformed, unreadable or too long.
    """
    for source in ALLOCATION_SOURCES:
        value = env.get(source.variable)
        if not value:
            continue
        host_list = HostList(source.variable, source.form)
        slots = (source.slots, env[source.slots]) if env.get(source.slots) else None
        hosts = read_hosts(value, host_list, source.scheduler, read_text, slots=slots, fallback=ON_THE_LINE)
        return merge(hosts, source=source.variable, where=source.variable, launcher=source.scheduler)
    return None


def merge(
    entries: Iterable[tuple[str, int | None]], *, source: str, where: str, launcher: str | None = None
) -> Allocation:
    """An allocation of ``(host, slots)`` entries, each host once (a host listed again adds its slots).

    Raises:
        LayoutError: A host name that is not one, no host, or more than :data:`MAX_ALLOCATION_HOSTS` hosts.
    """
    slots: dict[str, int | None] = {}
    for name, count in entries:
        problem = host_syntax_problem(name)
        if problem is not None:
            raise LayoutError(
                f"{where} names the host {shown(name)}, which is not a host name or an IP address: {problem}.",
                "Name hosts by their host names or addresses.",
                variable=where,
                value=name[:SHOWN_CHARACTERS],
                launcher=launcher,
            )
        if name not in slots and len(slots) >= MAX_ALLOCATION_HOSTS:
            raise LayoutError(
                f"{where} lists more than {MAX_ALLOCATION_HOSTS} hosts.",
                "Check that the variable is the scheduler's own.",
                variable=where,
                launcher=launcher,
            )
        before = slots.get(name, 0)
        slots[name] = None if before is None or count is None else before + count
    if not slots:
        raise LayoutError(
            f"{where} names no host.",
            "Run inside the job that set it, or name the hosts on the launcher line.",
            variable=where,
            launcher=launcher,
        )
    return Allocation(tuple(Host(name, count) for name, count in slots.items()), source)


def parse_slots(text: str, *, where: str, launcher: str | None = None) -> int:
    """A slot count: a plain count from 1 to :data:`~lightning_mpi_env.core.values.MAX_LOCAL_SIZE`."""
    return parse_count(
        text,
        variable=where,
        launcher=launcher,
        minimum=1,
        maximum=MAX_LOCAL_SIZE,
        hint="Give each host a whole number of slots (processes), at least 1.",
    )
