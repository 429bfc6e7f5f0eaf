"""Which ranks make up each generation of a job, and what a generation after a loss is: a pure table of rules.

A generation is one process group over one set of processes. Generation 1 is the launch; after a rank is lost the
survivors either go on alone, renumbered (``shrink``), or with a new process on a spare node in each lost rank's
place (the world keeps its ranks), or the job is started again (a :class:`Relaunch`, today's recovery). Every
generation keeps its keys in rank 0's store under :func:`prefix`, so a late request of an older generation lands
where no rank of a newer one reads.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from lightning_mpi_env.core.errors import RecoveryError

KEY = "lightning_mpi_env/gen/"
"""Where each generation's keys live in the job's store."""

MAX_GENERATIONS = 1000
"""Past this many generations a job is started again instead: a loss at every step is no longer a lost rank."""


FOREIGN_WRITE = (
    "something other than this job's ranks wrote to its store (the main port is open to the network):"
    " start the job again on a port of its own (MASTER_PORT)"
)
"""The hint of every value of the recovery's keys that does not read back as its ranks write it."""


def prefix(number: int) -> str:
    """The keys of generation ``number``: ``lightning_mpi_env/gen/<number>/``."""
    return f"{KEY}{number}/"


@dataclass(frozen=True)
class World:
    """One generation: its number, and the rank each of its members had in the launch (its index is its rank now)."""

    number: int
    launch_ranks: tuple[int, ...]
    lost: tuple[int, ...] = ()
    """The ranks of the generation before that were lost on the way to this one (their numbers there)."""

    @property
    def world_size(self) -> int:
        """How many ranks the generation has."""
        return len(self.launch_ranks)

    def rank_of(self, launch_rank: int) -> int | None:
        """This generation's rank of the process the launch gave ``launch_rank``; ``None`` if it is not a member."""
        try:
            return self.launch_ranks.index(launch_rank)
        except ValueError:
            return None


def first(world_size: int) -> World:
    """Generation 1: the launch's ranks as they are."""
    return World(1, tuple(range(world_size)))


@dataclass(frozen=True)
class Relaunch:
    """No generation can follow in these processes; why, for the line that ends them."""

    reason: str


def successor(current: World, lost: Collection[int], *, shrink: bool, spares: int = 0) -> World | Relaunch:
    """The generation after ``current`` once its ranks ``lost`` (numbered in ``current``) are gone.

    ``shrink``: the survivors go on alone, renumbered in their order (rank 0 stays rank 0). Else, with a spare
    node for each lost rank (``spares``), the world keeps its ranks, a new process taking each lost one's place;
    without, the job is started again.
    """
    gone = sorted(set(lost))
    if not gone:
        raise ValueError("a successor is for a generation that lost a rank")
    if gone[0] < 0 or gone[-1] >= current.world_size:
        raise ValueError(f"lost ranks {gone} are not ranks of a world of {current.world_size}")
    if gone[0] == 0:
        return Relaunch("rank 0 is lost, and the job's store was in its process")
    if not shrink and spares < len(gone):
        return Relaunch(
            f"the allocation has {spares} spare node(s) for {len(gone)} lost rank(s), and shrinking was not chosen"
        )
    if current.number >= MAX_GENERATIONS:
        return Relaunch(f"this job has had {MAX_GENERATIONS} generations")
    if not shrink:
        return World(current.number + 1, current.launch_ranks, tuple(gone))
    survivors = tuple(rank for number, rank in enumerate(current.launch_ranks) if number not in gone)
    return World(current.number + 1, survivors, tuple(gone))


def lost_text(lost: Collection[int]) -> str:
    """The list of lost ranks as it is written to the store: ``"2,5"``."""
    return ",".join(str(rank) for rank in sorted(set(lost)))


def read_lost(raw: bytes, world_size: int, key: str) -> tuple[int, ...]:
    """The lost ranks read back from ``key``: distinct ranks below ``world_size`` but rank 0 (who writes them), or none.

    Raises:
        RecoveryError: Anything else (the store is anyone's on the network), naming the key and the value.
    """
    if not raw:
        return ()
    text = raw[: 8 * world_size + 8].decode("ascii", "replace")
    numbers = text.split(",")
    if (
        len(raw) <= 8 * world_size
        and all(number.isdigit() and len(number) <= 7 for number in numbers)
        and len({int(number) for number in numbers}) == len(numbers)
        and all(0 < int(number) < world_size for number in numbers)
    ):
        return tuple(sorted(int(number) for number in numbers))
    raise RecoveryError(
        f"the list of lost ranks under {key} in the job's store is {text!r}, not distinct ranks 1 to"
        f" {world_size - 1} separated by commas",
        FOREIGN_WRITE,
        variable=key,
        value=text,
    )
