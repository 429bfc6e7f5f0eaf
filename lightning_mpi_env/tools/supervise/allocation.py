"""The hosts a job step may run on, and their slots: from the launcher line's own hosts, else the scheduler's.

A scheduler's host lists are the rows of :data:`~lightning_mpi_env.core.schedulers.SCHEDULERS`, in the forms of
:class:`~lightning_mpi_env.core.hostlist.HostListForm` (a file of one host per line names it once per slot); Slurm's
slots come from :data:`SLOTS_VARIABLE`. A malformed, unreadable or oversized source is one
:class:`~lightning_mpi_env.core.errors.LayoutError` naming the variable; a name that is not a host name or an address
never reaches a host file or a command line.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from lightning_mpi_env.core import hostfile
from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import HostListForm, expand_nodelist, expand_tasks_per_node
from lightning_mpi_env.core.ports import host_syntax_problem
from lightning_mpi_env.core.schedulers import SCHEDULERS
from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, SHOWN_CHARACTERS, parse_count, shown

MAX_ALLOCATION_HOSTS = 1 << 16
"""The most distinct hosts in one allocation: several times the largest machines' node counts."""

MAX_ALLOCATION_FILE_BYTES = 64 << 20
"""The most bytes read from an allocation's host file: room for a ``PBS_NODEFILE`` of 10,000 nodes x 128 slots.
A longer file is refused, not cut: a cut list would silently drop hosts."""


class Host(NamedTuple):
    """One host of an allocation."""

    name: str
    """As the scheduler or the line names it (``node07``, ``127.0.0.3``)."""
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

        >>> allocation = Allocation((Host("n1.c", 2), Host("n2.c", 2), Host("n3.c", 2)), "test")
        >>> left, unmatched = allocation.split(["n2", "n9"])
        >>> [host.name for host in left], unmatched
        (['n1.c', 'n3.c'], ('n9',))
        """
        names = list(dict.fromkeys(excluded))
        matched = {name: [host.name for host in self.hosts if same_host(host.name, name)] for name in names}
        gone = {host for hosts in matched.values() for host in hosts}
        left = tuple(host for host in self.hosts if host.name not in gone)
        return left, tuple(name for name in names if not matched[name])


def same_host(one: str, other: str) -> bool:
    """Whether two names name one host: equal, or (neither an IP address) equal first labels, case aside.

    >>> same_host("node2", "node2.cluster"), same_host("10.0.0.2", "10.0.0.3"), same_host("a.x", "b.x")
    (True, False, False)
    """
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
"""The variable with each host's slots, where a host list gives none (sbatch(1): SLURM_TASKS_PER_NODE "Number of
tasks to be initiated on each node ... compressed as in SLURM_JOB_CPUS_PER_NODE", ``2(x3),1``)."""
WITHOUT_SLOTS = frozenset({"SGE_JOB_HOSTLIST"})
"""Host lists of the scheduler table that name each host once, with no slots (ABCI's): the next one is read."""

ALLOCATION_SOURCES: tuple[AllocationSource, ...] = tuple(
    AllocationSource(source.variable, scheduler.name, source.form, SLOTS_VARIABLE.get(source.variable, ""))
    for scheduler in SCHEDULERS
    for source in scheduler.host_lists
    if source.variable not in WITHOUT_SLOTS
)
"""Where each scheduler lists the job's hosts, in the order consulted (the first one set wins)."""


def read_allocation_file(path: str) -> str:
    """The whole host file at ``path``, bounded (:data:`MAX_ALLOCATION_FILE_BYTES`, regular files only)."""
    return hostfile.read_whole_host_file(path, max_bytes=MAX_ALLOCATION_FILE_BYTES)


def allocation_from_env(
    env: Mapping[str, str], *, read_text: Callable[[str], str] = read_allocation_file
) -> Allocation | None:
    """The job's hosts as its scheduler lists them (:data:`ALLOCATION_SOURCES`), or ``None`` outside a scheduler.

    Args:
        env: The supervisor's environment (the batch script's).
        read_text: Reads a host file named by a variable; the file system, bounded, by default.

    Raises:
        LayoutError: The variable, its file or a line of it is malformed, unreadable or too long.

    >>> allocation_from_env({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"})
    Allocation(hosts=(Host(name='n1', slots=4), Host(name='n2', slots=4)), source='SLURM_JOB_NODELIST')
    """
    for source in ALLOCATION_SOURCES:
        value = env.get(source.variable)
        if not value:
            continue
        if source.form is HostListForm.NODELIST:
            return _slurm(source, value, env.get(source.slots, ""))
        if source.form is HostListForm.LSF_PAIRS:
            return _lsf_pairs(source, value)
        try:
            text = read_text(value)
        except OSError as error:  # HostFileError too: not a regular file, too long, not UTF-8
            raise LayoutError(
                f"{source.variable}={shown(value)} ({source.scheduler}) cannot be read: {error}.",
                f"Run the supervisor inside the {source.scheduler} job that wrote the file, or name the hosts on "
                "the launcher line (--host / -hosts).",
                variable=source.variable,
                value=value[:SHOWN_CHARACTERS],
                launcher=source.scheduler,
            ) from error
        if source.form is HostListForm.PE_HOSTFILE:
            return _pe_hostfile(source, text)
        return _one_line_per_slot(source, text)
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


def _slurm(source: AllocationSource, nodelist: str, tasks: str) -> Allocation:
    hosts = expand_nodelist(nodelist, variable=source.variable)
    counts: list[int | None] = [None] * len(hosts)
    if tasks:
        counts = list(expand_tasks_per_node(tasks, variable=source.slots))
        if len(counts) != len(hosts):
            raise LayoutError(
                f"{source.slots}={shown(tasks)} gives {len(counts)} counts for the {len(hosts)} hosts of "
                f"{source.variable}.",
                "Run the supervisor in the batch script itself, where Slurm sets both for the job.",
                variable=source.slots,
                value=tasks[:SHOWN_CHARACTERS],
                launcher=source.scheduler,
            )
    return merge(
        zip(hosts, counts, strict=True), source=source.variable, where=source.variable, launcher=source.scheduler
    )


def _one_line_per_slot(source: AllocationSource, text: str) -> Allocation:
    entries = ((line.split()[0], 1) for line in text.splitlines() if hostfile.names_a_host(line))
    return merge(entries, source=source.variable, where=source.variable, launcher=source.scheduler)


def _pe_hostfile(source: AllocationSource, text: str) -> Allocation:
    entries: list[tuple[str, int | None]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not hostfile.names_a_host(line):
            continue
        words = line.split()
        where = f"{source.variable} line {number}"
        if len(words) < 2:
            raise LayoutError(
                f"{where} ({shown(line.strip())}, {source.scheduler}) is not 'host slots queue processors'.",
                "Run the supervisor inside the Grid Engine job that wrote the file.",
                variable=source.variable,
                value=line[:SHOWN_CHARACTERS],
                launcher=source.scheduler,
            )
        entries.append((words[0], parse_slots(words[1], where=f"{where} (slots)", launcher=source.scheduler)))
    return merge(entries, source=source.variable, where=source.variable, launcher=source.scheduler)


def _lsf_pairs(source: AllocationSource, value: str) -> Allocation:
    words = value.split()
    if len(words) % 2:
        raise LayoutError(
            f"{source.variable}={shown(value)} ({source.scheduler}) is not a list of 'host slots' pairs.",
            "Run the supervisor inside the LSF job that set it.",
            variable=source.variable,
            value=value[:SHOWN_CHARACTERS],
            launcher=source.scheduler,
        )
    where = f"{source.variable} (slots)"
    entries = [
        (host, parse_slots(slots, where=where, launcher=source.scheduler))
        for host, slots in zip(words[::2], words[1::2], strict=True)
    ]
    return merge(entries, source=source.variable, where=source.variable, launcher=source.scheduler)


__all__ = [
    "ALLOCATION_SOURCES",
    "MAX_ALLOCATION_FILE_BYTES",
    "MAX_ALLOCATION_HOSTS",
    "Allocation",
    "AllocationSource",
    "Host",
    "allocation_from_env",
    "merge",
    "parse_slots",
    "read_allocation_file",
    "same_host",
]
