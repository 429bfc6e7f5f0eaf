"""Where a relaunched ``srun`` step runs: the allocation's hosts less those left out, at the node count it allows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightning_mpi_env.supervise.allocation import Allocation, Host, allocation_from_env
from lightning_mpi_env.supervise.srun_line import SrunLine


@dataclass(frozen=True)
class Relaunch:
    """A relaunch: the line to run, and the hosts it may use."""

    argv: list[str]
    hosts: tuple[str, ...] | None
    """The allocation's hosts it may use; ``None`` where the allocation is unknown."""
    nodes: int | None
    """The node count it was changed to, where it runs on fewer nodes than the line asked; else ``None``."""
    unmatched: tuple[str, ...] = ()
    """Hosts to leave out that name no host of the allocation: nothing was left out for them."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the relaunch's launcher runs with, over the supervisor's (``MASTER_ADDR``: rank 0's host)."""


@dataclass(frozen=True)
class Shortfall:
    """No relaunch fits in what is left of the allocation."""

    message: str
    hint: str


def allocation_hosts(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The allocation's hosts, in order, as its scheduler lists them; ``None`` outside a scheduler's job.

    Raises:
        LayoutError: A host list that is malformed or past its bounds.
    """
    found = allocation_from_env(env)
    return tuple(found.names()) if found is not None else None


def place(
    line: SrunLine, hosts: Sequence[str] | None, excluded: Sequence[str], *, overlap: bool = False
) -> Relaunch | Shortfall:
    """The relaunch of ``line`` in an allocation of ``hosts`` without ``excluded``, or why none fits.

    The line's node count where enough hosts are left (a spare takes the failed one's place), else the nodes left,
    down to ``MIN`` of ``--nodes=MIN-MAX``: srun's own range is how the user says that the program takes its size
    from the launch, so nothing else is guessed. ``hosts`` ``None`` (outside an allocation): srun says whether it
    fits. ``overlap``: the last step was abandoned (see :meth:`SrunLine.relaunched`).

    Raises:
        SrunLineError: The line must shrink and cannot (``--ntasks`` without ``--ntasks-per-node``), or it lists
            hosts in a file.
    """
    wanted = line.nodes()
    if hosts is None:
        return Relaunch(line.relaunched(excluded, overlap=overlap), None, None)
    gone = list(dict.fromkeys([*line.excluded(), *excluded]))
    # A record names a host as the rank saw it (node2); the scheduler may spell it in full (node2.cluster), and srun
    # takes only its own spelling (it refuses a name it does not know): the allocation's names are excluded.
    whole, left = _left(line, hosts, excluded)
    still, unmatched = whole.split(excluded)
    spelled = [host for host in hosts if host not in {host.name for host in still}]
    low, high = wanted if wanted is not None else (1, 1)
    if len(left) >= high:
        return Relaunch(line.relaunched(spelled, overlap=overlap), left, None, unmatched)
    if len(left) >= low:
        return Relaunch(line.relaunched(spelled, len(left), overlap=overlap), left, len(left), unmatched)
    asked = f"{low} to {high} nodes (srun --nodes={low}-{high})" if low != high else f"{low} node(s)"
    if wanted is not None and low == high:
        asked += f" (srun --nodes={low})"
    has = f"only {', '.join(left)} left" if left else "none left"
    return Shortfall(
        f"The step needs {asked}, and the allocation {','.join(hosts)} has {has}: {', '.join(sorted(gone))} "
        "failed or were excluded.",
        f"Add a spare node to the allocation (#SBATCH --nodes={len(hosts) + high - len(left)} for a step of "
        f'{high}); or, where the program takes its size from the launch (Trainer(strategy="ddp_mpi") '
        f"without devices and num_nodes), let the step run on fewer nodes: srun --nodes=1-{high}.",
    )


def spares(line: SrunLine, hosts: Sequence[str] | None, excluded: Sequence[str]) -> int:
    """How many of the allocation's ``hosts`` without ``excluded`` a step of ``line`` leaves unused.

    ``0`` where the allocation is unknown, or the line gives no ``--nodes``: srun then takes the allocation's node
    count (``SLURM_NNODES``), every host.
    """
    wanted = line.nodes()
    if hosts is None or wanted is None:
        return 0
    return max(0, len(_left(line, hosts, excluded)[1]) - wanted[1])


def _left(line: SrunLine, hosts: Sequence[str], excluded: Sequence[str]) -> tuple[Allocation, tuple[str, ...]]:
    """The allocation of ``hosts``, and the names of its hosts left without the line's exclusions and ``excluded``."""
    whole = Allocation(tuple(Host(host, None) for host in hosts), "allocation")
    kept, _ = whole.split([*line.excluded(), *excluded])
    return whole, tuple(host.name for host in kept)
