"""The user's ``mpirun``/``mpiexec`` line, read as its launcher reads it, and the same line on other hosts.

The relaunch replaces the line's host options and process count with one host file (Hydra's ``-machinefile`` of
``host:N``, as Intel MPI's ``-f``/``-hostfile`` ignore counts), one world size and ``MASTER_ADDR`` for every rank;
per-node options (``-N``, ``--map-by ppr:2:node``, ``-ppn``) stay.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.core.hostlist import expand_nodelist
from lightning_mpi_env.core.network import apply_host_template
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import MAX_WORLD_SIZE, SHOWN_CHARACTERS, parse_count, shown
from lightning_mpi_env.supervise.allocation import (
    Allocation,
    Host,
    allocation_from_env,
    merge,
    parse_slots,
    read_allocation_file,
)
from lightning_mpi_env.supervise.mpirun_options import LAUNCHER_NAMES, Family, Role
from lightning_mpi_env.supervise.options import Option, parse_options

_HOST_ROLES = frozenset({Role.HOSTS, Role.HOST_FILE, Role.HOST_NAME_FILE, Role.HOST_RANGES})
_REPLACED_ROLES = _HOST_ROLES | {Role.WORLD}
_PLACEMENT_ROLES = frozenset({Role.PER_NODE, Role.ONE_PER_NODE, Role.MAP_BY, Role.PPR})
PROBE_PROGRAM = ("sleep", "1")
"""What the health probe runs on a host: a process that lives a second, not ``true``: PRRTE's daemons can lose a
process that ends before they record its pid, and ``mpirun`` then never returns (openpmix/prrte#2713)."""


class TooFewHostsError(MpirunLineError):
    """Too few hosts are left in the allocation for the step as the line asks for it."""


@dataclass(frozen=True)
class StepShape:
    """How many processes the step runs, on how many hosts, how many on each."""

    world: int
    per_node: int | None
    """Processes on every host; ``None`` where the hosts' slots differ and the line gives no per-node count."""
    nodes: int


@dataclass(frozen=True)
class MpirunRelaunch:
    """The relaunched step: its command line, and the host file it names."""

    argv: tuple[str, ...]
    host_file_text: str
    """To write at the path given to :meth:`MpirunLine.relaunch` before running :attr:`argv`."""
    hosts: tuple[Host, ...]
    """The hosts of the host file, in order, each with the slots written for it."""
    world: int
    per_node: int | None
    unmatched: tuple[str, ...]
    """Excluded names that match no host of the allocation: nothing was excluded for them."""
    main_address: str
    """Rank 0's host, given every rank as ``MASTER_ADDR``: the host file's first (its fabric name where templated)."""


@dataclass(frozen=True)
class MpirunLine:
    """A parsed ``mpirun``/``mpiexec`` line of one family: its options, and where the program starts."""

    family: Family
    words: tuple[str, ...]
    options: tuple[Option, ...]
    program: int
    """Index of the program's first word."""

    @classmethod
    def parse(cls, words: Sequence[str], family: Family) -> MpirunLine:
        """Read ``words`` (``mpirun ... program args``) as ``family``'s launcher does.

        Raises:
            MpirunLineError: Not an ``mpirun``/``mpiexec`` line, an option unknown, ambiguous, missing its value or
                refused (a rank file, an application file), no program, or several programs (``:``).
        """
        first = words[0] if words else "nothing"
        if os.path.basename(first) not in LAUNCHER_NAMES:
            raise MpirunLineError(
                f"The command to run and relaunch is {shown(first)}, not mpirun or mpiexec.",
                "Give the job step as you would in the batch script: lightning-mpi-env run -- mpirun [OPTIONS] "
                "python train.py.",
                value=first[:SHOWN_CHARACTERS],
                launcher=family.name,
            )
        options, program = parse_options(words, family, check=family.refuse)
        return cls(family, tuple(words), tuple(options), program)

    def with_role(self, *roles: Role) -> list[Option]:
        """The options that have one of ``roles``, in order."""
        return [option for option in self.options if self.family.roles.get(option.name) in roles]

    def world(self) -> int | None:
        """The number of processes the line asks for (the last ``-np``/``-n``), or ``None``.

        Raises:
            LayoutError: A value that is not a count from 1 to 16,777,216.
        """
        given = self.with_role(Role.WORLD)
        if not given:
            return None
        return parse_count(
            given[-1].values[0],
            variable=given[-1].spelled,
            launcher=self.family.name,
            minimum=1,
            maximum=MAX_WORLD_SIZE,
            hint="Give the number of processes as a plain count: -np 8.",
        )

    def per_node(self) -> int | None:
        """Processes per host as the line asks for them (its last per-node option), or ``None``.

        Raises:
            LayoutError: A count that is not one.
        """
        for option in reversed(self.with_role(Role.PER_NODE, Role.ONE_PER_NODE, Role.MAP_BY, Role.PPR)):
            role = self.family.roles[option.name]
            if role is Role.ONE_PER_NODE:
                return 1
            value = option.values[0]
            if role in (Role.MAP_BY, Role.PPR):
                # Open MPI: --map-by ppr:N:node[:modifiers]; the deprecated --ppr N:node means --map-by ppr:N:node.
                parts = (value if role is Role.MAP_BY else f"ppr:{value}").split(":")
                if len(parts) < 3 or parts[0].lower() != "ppr" or parts[2].lower() != "node":
                    continue  # another policy (slot, node, ppr:N:socket): no per-node count from it
                value = parts[1]
            return parse_slots(value, where=option.spelled, launcher=self.family.name)
        return None

    def allocation(
        self, env: Mapping[str, str], *, read_text: Callable[[str], str] = read_allocation_file
    ) -> Allocation:
        """The hosts the step may run on: the line's own (``-H``, ``-hosts``, ``-f``, ...), else the scheduler's.

        Raises:
            MpirunLineError: Hosts given twice over (a list and a file), a host file that cannot be read or is not
                in the family's syntax, or no hosts at all.
            LayoutError: A scheduler variable, or a host or count, that is malformed.
        """
        given = self.with_role(*_HOST_ROLES)
        if given:
            return self._own_hosts(given, read_text)
        found = allocation_from_env(env, read_text=read_text)
        if found is None:
            raise MpirunLineError(
                f"The {self.family.name} line names no hosts, and no scheduler's allocation is set "
                "(SLURM_JOB_NODELIST, PBS_NODEFILE, PE_HOSTFILE, LSB_DJOB_HOSTFILE, LSB_MCPU_HOSTS): there is no other "
                "host to relaunch on.",
                "Run the supervisor inside the batch job, or name the hosts on the line "
                f"({self.family.host_file_option} FILE).",
                launcher=self.family.name,
            )
        return found

    def shape(self, allocation: Allocation) -> StepShape:
        """The step as the line runs it on ``allocation``: one process per slot unless it says otherwise.

        Raises:
            MpirunLineError: The world size cannot be told (no ``-np``, and hosts whose slots are not known).
        """
        per_node = self.per_node()
        slots = [host.slots or 0 for host in allocation.hosts]
        if per_node is None:
            if any(host.slots is None for host in allocation.hosts):
                raise self._unknown("per-node count", allocation)
            if len(set(slots)) == 1:
                per_node = slots[0]
        world = self.world()
        if world is None:
            world = per_node * len(slots) if per_node is not None else sum(slots)
        if per_node is not None:
            return StepShape(world, per_node, min(len(slots), -(-world // per_node)))
        return StepShape(world, None, len(_fill(allocation.hosts, world) or allocation.hosts))

    def spares(self, allocation: Allocation, excluded: Iterable[str]) -> int:
        """How many hosts of ``allocation`` without ``excluded`` the step as the line asks for it leaves unused.

        Raises:
            MpirunLineError: The world size cannot be told (no ``-np``, and hosts whose slots are not known).
        """
        shape = self.shape(allocation)
        left, _ = allocation.split(excluded)
        if shape.per_node is not None:
            return max(0, len(left) - shape.nodes)
        filled = _fill(left, shape.world)
        return 0 if filled is None else len(left) - len(filled)

    def relaunch(
        self,
        allocation: Allocation,
        excluded: Iterable[str],
        host_file: str,
        *,
        nodes: int | None = None,
        main_host: str = "",
    ) -> MpirunRelaunch:
        """The line on ``allocation`` without the ``excluded`` hosts, naming a host file at ``host_file``.

        ``nodes``: ``None`` keeps the world size on the hosts left; ``k`` runs ``k`` hosts at the same processes per
        host (a smaller world, for programs that take their size from the launch). ``main_host``: rank 0's host on
        the fabric (``LIGHTNING_MPI_ENV_MAIN_HOST``'s template, ``{host}-ib``); empty: the host's name.

        Raises:
            TooFewHostsError: Too few hosts are left (the message says to add a spare host).
            MpirunLineError: ``nodes`` without a per-node count, or a world size that cannot be told.
        """
        shape = self.shape(allocation)
        left, unmatched = allocation.split(excluded)
        if nodes is not None:
            if shape.per_node is None:
                raise self._unknown("per-node count", allocation)
            if not 1 <= nodes <= len(left):
                raise self._too_few(shape, nodes, left, allocation)
            hosts = tuple(Host(host.name, shape.per_node) for host in left[:nodes])
            world = nodes * shape.per_node
        elif shape.per_node is not None:
            if len(left) < shape.nodes:
                raise self._too_few(shape, shape.nodes, left, allocation)
            # More processes than per-node x hosts: the line oversubscribed, and the relaunch does as much.
            each = max(shape.per_node, -(-shape.world // shape.nodes))
            hosts = tuple(Host(host.name, each) for host in left[: shape.nodes])
            world = shape.world
        else:
            filled = _fill(left, shape.world)
            if filled is None:
                raise self._too_few(shape, shape.nodes, left, allocation)
            hosts, world = filled, shape.world
        line = self.family.host_line
        text = "".join(line.format(name=host.name, slots=host.slots) for host in hosts)
        family = self.family
        # Rank 0 runs on the host file's first host (both families fill hosts in order); the job's first host, which
        # a rank reads where nothing else names rank 0's, may be the one left out.
        main_address = apply_host_template(main_host, hosts[0].name)
        main = [word.format(name=TORCH.master_addr, value=main_address) for word in family.set_variable]
        return MpirunRelaunch(
            (self.words[0], family.host_file_option, host_file, family.world_option, str(world), *main, *self._kept()),
            text,
            hosts,
            world,
            shape.per_node,
            unmatched,
            main_address,
        )

    def probe_line(self, host: str) -> list[str]:
        """The health probe on ``host``: the line's launcher and options, on that host alone, one :data:`PROBE_PROGRAM`.

        The line's own options are kept (an agent, a session folder, MCA settings: what it takes to reach a host);
        its hosts, counts and placement are replaced.
        """
        dropped = {
            index
            for option in self.with_role(*_REPLACED_ROLES, *_PLACEMENT_ROLES)
            for index in range(option.start, option.stop)
        }
        options = [word for index, word in enumerate(self.words[1 : self.program], start=1) if index not in dropped]
        family = self.family
        return [self.words[0], *options, family.host_list_option, host, family.world_option, "1", *PROBE_PROGRAM]

    def _kept(self) -> list[str]:
        """The line's words after the launcher, without its host and world options."""
        dropped = {index for option in self.with_role(*_REPLACED_ROLES) for index in range(option.start, option.stop)}
        return [word for index, word in enumerate(self.words[1:], start=1) if index not in dropped]

    def _own_hosts(self, given: list[Option], read_text: Callable[[str], str]) -> Allocation:
        family = self.family
        kinds = {family.roles[option.name] for option in given}
        if len(given) > 1 and (family.hydra or kinds != {Role.HOSTS}):
            # Hydra refuses a second host option ("duplicate host file or host list setting"); Open MPI filters a
            # host file by --host, which the relaunch's one host file cannot keep.
            raise MpirunLineError(
                f"The {family.name} line names its hosts {len(given)} times "
                f"({', '.join(option.spelled for option in given)}).",
                f"Name them once: one {family.host_file_option} FILE, or one host list.",
                variable=given[1].spelled,
                launcher=family.name,
            )
        entries: list[tuple[str, int | None]] = []
        for option in given:
            role = family.roles[option.name]
            if role is Role.HOSTS:
                entries += [_host_and_slots(item, option.spelled, family) for item in option.values[0].split(",")]
            elif role is Role.HOST_RANGES:
                entries += [(host, None) for host in expand_nodelist(option.values[0], variable=option.spelled)]
            else:
                entries += _host_file(option, read_text, family)
        return merge(entries, source=f"{family.name} {given[0].spelled}", where=given[0].spelled, launcher=family.name)

    def _unknown(self, what: str, allocation: Allocation) -> MpirunLineError:
        per_node = "-N N or --map-by ppr:N:node" if not self.family.hydra else "-ppn N"
        return MpirunLineError(
            f"The {what} of the {self.family.name} step cannot be told: the line gives no count and the hosts of "
            f"{allocation.source} carry no slot counts.",
            f"Give the counts on the line: {self.family.world_option} N and {per_node}.",
            launcher=self.family.name,
        )

    def _too_few(self, shape: StepShape, needed: int, left: Sequence[Host], allocation: Allocation) -> TooFewHostsError:
        each = f"{shape.per_node} processes each" if shape.per_node is not None else f"{shape.world} processes"
        return TooFewHostsError(
            f"The step needs {needed} host(s) ({each}); {len(left)} of the {len(allocation.hosts)} hosts of "
            f"{allocation.source} are left once the failed ones are excluded.",
            f"Add a spare host to the allocation (one more node than the step uses), or, for a program that takes its "
            f"size from the launch (strategy='ddp_mpi'), relaunch on the {len(left)} host(s) left.",
            launcher=self.family.name,
        )


def _fill(hosts: Sequence[Host], world: int) -> tuple[Host, ...] | None:
    """The first hosts whose slots hold ``world`` processes (the last one with just what it needs), or ``None``."""
    taken: list[Host] = []
    left = world
    for host in hosts:
        if left <= 0:
            break
        slots = host.slots or 0  # known: shape() refuses hosts without slots where it needs them
        taken.append(Host(host.name, min(slots, left)))
        left -= slots
    return tuple(taken) if left <= 0 else None


def _host_and_slots(item: str, where: str, family: Family) -> tuple[str, int | None]:
    """``host`` or ``host:N`` of a host list: one slot when no count is given (both families)."""
    name, colon, count = item.strip().rpartition(":")
    if not colon:
        return item.strip(), 1
    return name, parse_slots(count, where=f"{where} {shown(item)}", launcher=family.name)


def _host_file(option: Option, read_text: Callable[[str], str], family: Family) -> list[tuple[str, int | None]]:
    path = option.values[0]
    try:
        text = read_text(path)
    except OSError as error:
        raise MpirunLineError(
            f"{family.name} {option.spelled} {shown(path)} cannot be read: {error}.",
            "Name a readable host file, or list the hosts on the line.",
            variable=option.spelled,
            value=path[:SHOWN_CHARACTERS],
            launcher=family.name,
        ) from error
    entries: list[tuple[str, int | None]] = []
    counted = family.roles[option.name] is not Role.HOST_NAME_FILE
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.partition("#")[0].split()
        if not words:
            continue
        where = f"{option.spelled} {path[:SHOWN_CHARACTERS]} line {number}"
        if family.hydra:
            if len(words) > 1:
                raise MpirunLineError(
                    f"{where} is {shown(raw.strip())}: more than 'host:N', which the relaunch's host file cannot "
                    "carry over.",
                    "Keep one 'host:N' per line.",
                    variable=option.spelled,
                    launcher=family.name,
                )
            name, count = _host_and_slots(words[0], where, family)
            entries.append((name, count if counted else None))
            continue
        slots: int | None = None  # Open MPI: a host without slots= gets its cores
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if not equals or key not in ("slots", "max_slots", "max-slots"):
                raise MpirunLineError(
                    f"{where} has {shown(word)}, which the relaunch's host file cannot carry over.",
                    "Keep 'host slots=N' (and max_slots=M) per line.",
                    variable=option.spelled,
                    launcher=family.name,
                )
            if key == "slots":
                slots = parse_slots(value, where=where, launcher=family.name)
        entries.append((words[0], slots))
    return entries
