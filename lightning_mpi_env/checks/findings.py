"""What the node check found, as data: one record per finding, its form in the store, who stops, and the lines.

A folder that a node cannot write stops the job only where that node's ranks must write there: every rank under a
sharded checkpoint (FSDP, DeepSpeed), or rank 0's node, where rank 0 writes. Elsewhere (DDP, where rank 0 alone
writes) the job goes on, and rank 0 says what a relaunch that placed rank 0 there would risk. A rank on another GPU
than the launch gave it, or an all-reduce that gave a wrong answer, stops the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from lightning_mpi_env.checks.device import DEVICE_HINT
from lightning_mpi_env.core.errors import NodeCheckError, NodeCheckWarning
from lightning_mpi_env.core.state_files import FieldError, load_json, whole_number
from lightning_mpi_env.core.values import MAX_WORLD_SIZE

MAX_WIRE_BYTES = 16 * 1024
"""The longest findings record one rank leaves in the store; a longer one is refused, not parsed."""

MAX_TEXT = 4200
"""The longest text field of a record: a path's 4,096 bytes and some words."""

MAX_NAMED = 8
"""The most ranks whose findings a line names; the others are counted."""


class Kind(str, Enum):
    """What a finding is about; its flag is the bit it sets in the check's all-reduce."""

    FOLDER = "folder"
    SPACE = "space"
    DEVICE = "device"
    ALL_REDUCE = "all-reduce"

    @property
    def flag(self) -> int:
        """The bit of this kind in a rank's flags (the all-reduce's second half)."""
        return 1 << list(Kind).index(self)


FOLDER_KINDS = frozenset({Kind.FOLDER, Kind.SPACE})


class Writers(str, Enum):
    """Which ranks write a checkpoint, so which nodes must be able to."""

    RANK_ZERO = "rank 0 alone writes checkpoints"
    EVERY_RANK = "every rank writes its own shard of a checkpoint"


FOLDER_HINT = (
    "Make the folder writable, with room, from every node (a shared file system each node mounts read-write), or "
    "point Trainer(default_root_dir=...) and ModelCheckpoint(dirpath=...) at one that is."
)
ALL_REDUCE_HINT = (
    "A rank's data does not reach the others intact: check the network the backend uses between these hosts "
    "(LIGHTNING_MPI_ENV_IFNAME names it for gloo and NCCL), and the NCCL and driver versions on each node."
)
HINTS = {Kind.FOLDER: FOLDER_HINT, Kind.SPACE: FOLDER_HINT, Kind.DEVICE: DEVICE_HINT, Kind.ALL_REDUCE: ALL_REDUCE_HINT}


@dataclass(frozen=True)
class Finding:
    """One thing one rank found before the first step."""

    rank: int
    host: str
    node: int
    """The node's index, numbered as the roll call numbers them (rank 0's node is 0)."""
    kind: Kind
    clause: str
    """What is wrong, after the subject (``'/ckpt' cannot be written (Read-only file system)``)."""
    folder: str = ""


def flags(findings: Iterable[Finding]) -> int:
    """The bits of the kinds among ``findings``.

    >>> flags([Finding(2, "nodeb", 1, Kind.FOLDER, "...")])
    1
    """
    return sum({finding.kind.flag for finding in findings})


def must_stop(kinds: int, rank: int, writers: Writers) -> bool:
    """Whether rank ``rank``'s flags ``kinds`` stop the job: its GPU, or a folder that a writer on its node needs.

    The check's folder findings come from the lowest rank of each node, so rank 0's are those of rank 0's node.

    >>> must_stop(Kind.FOLDER.flag, 2, Writers.RANK_ZERO), must_stop(Kind.FOLDER.flag, 0, Writers.RANK_ZERO)
    (False, True)
    """
    if kinds & (Kind.DEVICE.flag | Kind.ALL_REDUCE.flag):
        return True
    folder = kinds & (Kind.FOLDER.flag | Kind.SPACE.flag)
    return bool(folder) and (writers is Writers.EVERY_RANK or rank == 0)


def to_wire(findings: Sequence[Finding]) -> str:
    """One rank's findings as it leaves them in the store: a JSON list of ``[kind, clause, folder]``, its place."""
    first = findings[0]
    entries = [[finding.kind.value, finding.clause, finding.folder] for finding in findings]
    return json.dumps({"rank": first.rank, "host": first.host, "node": first.node, "findings": entries})


def from_wire(raw: bytes, rank: int, world_size: int) -> list[Finding]:
    """Rank ``rank``'s findings read back from the store, each field checked; a ``FieldError`` says what is wrong."""
    data = load_json(raw, MAX_WIRE_BYTES)
    if not isinstance(data, dict) or sorted(data) != ["findings", "host", "node", "rank"]:
        raise FieldError("it is not an object of rank, host, node and findings")
    if whole_number(data["rank"], "rank", MAX_WORLD_SIZE) != rank:
        raise FieldError(f"it is rank {data['rank']}'s, under rank {rank}'s key")
    node = whole_number(data["node"], "node", max(world_size - 1, 0))
    host, entries = _text(data["host"], "host"), data["findings"]
    if not isinstance(entries, list) or not entries:
        raise FieldError("findings is not a list of findings")
    found = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 3:
            raise FieldError("a finding is not [kind, clause, folder]")
        kind = _text(entry[0], "kind")
        if kind not in {member.value for member in Kind}:
            raise FieldError(f"kind {kind[:40]!r} is not one of {', '.join(member.value for member in Kind)}")
        folder = _text(entry[2], "folder", printable=False)  # a path as given; the lines show the clause's
        found.append(Finding(rank, host, node, Kind(kind), _text(entry[1], "clause"), folder))
    return found


def _text(value: object, name: str, printable: bool = True) -> str:
    """A text field; one that a line repeats must be printable (a line break in it would forge a line)."""
    if not isinstance(value, str) or len(value) > MAX_TEXT or (printable and not value.isprintable()):
        raise FieldError(f"{name} is not a printable text of at most {MAX_TEXT} characters")
    return value


def describe(finding: Finding, writers: Writers) -> str:
    """One finding as a sentence naming its node and rank, and why it matters there."""
    where = f"node {finding.node} (host {finding.host}, rank {finding.rank})"
    if finding.kind is Kind.DEVICE:
        return f"rank {finding.rank} on host {finding.host} {finding.clause}."
    if finding.kind is Kind.ALL_REDUCE:
        return f"{finding.clause} (seen by rank {finding.rank} on host {finding.host})."
    who = "every rank writes its shard there" if writers is Writers.EVERY_RANK else ""
    if not who and finding.rank == 0:
        who = "rank 0, which writes the checkpoints, runs there"
    because = f": {who}" if who else ""
    return f"on {where} the checkpoint folder {finding.clause}{because}."


def stop_error(findings: Sequence[Finding], unnamed: int, writers: Writers) -> NodeCheckError:
    """The error every rank raises before the first step, naming what stops the job and the fix for each kind."""
    stopping = [finding for finding in findings if must_stop(finding.kind.flag, finding.rank, writers)]
    lines = [describe(finding, writers) for finding in stopping[:MAX_NAMED]]
    more = len(stopping) - len(lines) + unnamed
    tail = f" And {more} more finding(s) on other ranks." if more > 0 else ""
    hints = dict.fromkeys(HINTS[finding.kind] for finding in stopping)
    return NodeCheckError(
        f"The node check before the first step stops the job: {' '.join(lines)}{tail}",
        " ".join(hints) or FOLDER_HINT,
    )


def go_on_warning(findings: Sequence[Finding], unnamed: int, writers: Writers) -> NodeCheckWarning:
    """Rank 0's line for folders that nodes without a writer cannot use: the run goes on, and what a relaunch risks."""
    named = [finding for finding in findings if finding.kind in FOLDER_KINDS][:MAX_NAMED]
    lines = " ".join(describe(finding, writers) for finding in named)
    hosts = ", ".join(dict.fromkeys(finding.host for finding in named))
    more = f" And {unnamed} more node(s)." if unnamed else ""
    return NodeCheckWarning(
        f"The node check before the first step found: {lines}{more} The run goes on, since {writers.value} and "
        f"rank 0's node can; a relaunch that puts rank 0 on {hosts} (a requeue, or `lightning-mpi-env run` "
        "relaunching on other hosts) would fail at its first save, losing the steps since the last checkpoint.",
        FOLDER_HINT,
    )
