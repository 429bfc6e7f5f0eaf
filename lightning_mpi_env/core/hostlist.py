"""Parsers for the formats schedulers list hosts in: Slurm node lists and task counts, host files, LSF pairs.

Which scheduler uses which format, and under which variable, is in :mod:`lightning_mpi_env.core.schedulers`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.values import MAX_DIGITS, SHOWN_CHARACTERS, as_count, is_count, parse_count, shown

if TYPE_CHECKING:
    import re


MAX_HOSTS = 1_000_000
"""The most hosts a node list or task-count list may expand to: more is a hostile value, not a job."""


class HostListForm(str, Enum):
    """How a scheduler writes a host list."""

    NODELIST = "Slurm node list (`gpu[07-08]`)"
    HOST_PER_LINE = "file, one host (or one slot) per line"
    PE_HOSTFILE = "file, one line per host: `host slots queue processors`"
    LSF_PAIRS = "`host slots` pairs"


class HostList(NamedTuple):
    """One variable through which a scheduler lists the job's hosts; the first host runs rank 0."""

    variable: str
    form: HostListForm
    note: str = ""
    """Where this list comes from, when not from every installation (``ABCI``)."""
    skip_lines: int = 0
    """Leading lines that name no host running ranks (``jsrun``'s launch node heads ``LSB_DJOB_RANKFILE``)."""


@cache
def _pattern(name: str) -> re.Pattern[str]:
    import re  # Here, not at the top: only parsing a Slurm list needs it.

    patterns = {
        "range": r"^([0-9]+)(?:-([0-9]+))?$",
        "task_count": r"^([0-9]+)(?:\(x([0-9]+)\))?$",
        "bracket_group": r"([^\[]*)(?:\[([^\]]*)\])?",
    }
    return re.compile(patterns[name])


def expand_nodelist(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list such as ``gpu[07-08,10],login1`` into host names, in order.

    Ranges keep their zero padding, and several bracket groups in one name expand as a product. The whole list is
    checked, and counted without expanding it, before any name is made: more than :data:`MAX_HOSTS` hosts in all
    is refused, however they are split into items.

    Args:
        nodelist: The compressed list.
        variable: The variable it came from, for messages.

    Returns:
        The host names.

    Raises:
        LayoutError: If the list is malformed, or names more than :data:`MAX_HOSTS` hosts.

    >>> expand_nodelist("gpu[07-08,10],cpu1")
    ['gpu07', 'gpu08', 'gpu10', 'cpu1']
    >>> expand_nodelist("r[1-2]n[01-02]")
    ['r1n01', 'r1n02', 'r2n01', 'r2n02']
    """
    return [host for item in _parse_nodelist(nodelist, variable) for host in _expand_item(item)]


def first_nodelist_host(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a Slurm node list (where rank 0 runs), without expanding the rest.

    The whole list is checked as :func:`expand_nodelist` checks it, in time linear in its length.

    Raises:
        LayoutError: If the list is malformed, or names more than :data:`MAX_HOSTS` hosts.

    >>> first_nodelist_host("gpu[007-999999],cpu1")
    'gpu007'
    """
    first = _parse_nodelist(nodelist, variable)[0]
    return "".join(part if isinstance(part, str) else _number(*part[0]) for part in first)


_Range = tuple[int, int, int]
"""``(low, high, width)``: the host numbers ``low`` to ``high``, zero padded to ``width`` digits."""
_Part = str | tuple[_Range, ...]
"""A piece of one item: literal text, or a bracket group's ranges."""


def _parse_nodelist(nodelist: str, variable: str) -> list[list[_Part]]:
    """Every item's parts, after checking the syntax and that all items together name at most MAX_HOSTS hosts."""
    items = [_parse_item(item, nodelist, variable) for item in _split_top_level(nodelist, variable)]
    if not items:
        raise _nodelist_error(nodelist, variable, "it names no host")
    total = 0
    for parts in items:
        count = 1
        for part in parts:
            count *= 1 if isinstance(part, str) else sum(high - low + 1 for low, high, _ in part)
            if count > MAX_HOSTS:  # before the product grows: it stays below MAX_HOSTS**2
                break
        total += count
        if total > MAX_HOSTS:
            raise _nodelist_error(nodelist, variable, f"it lists more than {MAX_HOSTS} hosts")
    return items


def _split_top_level(nodelist: str, variable: str) -> list[str]:
    items, depth, start = [], 0, 0
    for index, char in enumerate(nodelist):
        if char == "[":
            depth += 1
            if depth > 1:
                raise _nodelist_error(nodelist, variable, "brackets are nested")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _nodelist_error(nodelist, variable, "a ']' has no '['")
        elif char == "," and depth == 0:
            items.append(nodelist[start:index])
            start = index + 1
    if depth:
        raise _nodelist_error(nodelist, variable, "a '[' is never closed")
    items.append(nodelist[start:])
    return [item.strip() for item in items if item.strip()]


def _parse_item(item: str, nodelist: str, variable: str) -> list[_Part]:
    # "r[1-2]n[01-02]" -> ["r", ((1, 2, 1),), "n", ((1, 2, 2),)]
    parts: list[_Part] = []
    for text, brackets in _pattern("bracket_group").findall(item):
        if text:
            parts.append(text)
        if brackets:
            parts.append(_parse_brackets(brackets, nodelist, variable))
    return parts


def _parse_brackets(brackets: str, nodelist: str, variable: str) -> tuple[_Range, ...]:
    ranges: list[_Range] = []
    for piece in brackets.split(","):
        match = _pattern("range").match(piece.strip())
        if match is None:
            raise _nodelist_error(nodelist, variable, f"'{piece}' is not a number or a range like 07-10")
        first, last = match.group(1), match.group(2) or match.group(1)
        low, high = as_count(first), as_count(last)
        if low is None or high is None:
            raise _nodelist_error(nodelist, variable, f"a host number has more than {MAX_DIGITS} digits")
        if high < low:
            raise _nodelist_error(nodelist, variable, f"the range '{piece}' runs backwards")
        ranges.append((low, high, len(first)))
    return tuple(ranges)


def _number(low: int, _high: int, width: int) -> str:
    return str(low).zfill(width)


def _expand_item(parts: list[_Part]) -> Iterator[str]:
    pools = [
        [part]
        if isinstance(part, str)
        else [str(n).zfill(width) for low, high, width in part for n in range(low, high + 1)]
        for part in parts
    ]
    return ("".join(combination) for combination in itertools.product(*pools))


def nodelist_position(nodelist: str, host: str, *, variable: str = "SLURM_STEP_NODELIST") -> tuple[int | None, int]:
    """Where ``host`` is first in a Slurm node list, and how many hosts the list names, without expanding it.

    The list is checked as :func:`expand_nodelist` checks it; each item is matched by arithmetic on its ranges, in
    time linear in the list's text (an item whose number groups touch other digits is expanded, up to
    :data:`MAX_HOSTS` names).

    Raises:
        LayoutError: If the list is malformed, or names more than :data:`MAX_HOSTS` hosts.

    >>> nodelist_position("gpu[07-08,10],cpu1", "gpu10"), nodelist_position("a[1-3]", "b")
    ((2, 4), (None, 3))
    """
    items = _parse_nodelist(nodelist, variable)
    total = sum(_count(parts) for parts in items)
    offset = 0
    for parts in items:
        index = _item_index(parts, host)
        if index is not None:
            return offset + index, total
        offset += _count(parts)
    return None, total


def _item_index(parts: list[_Part], host: str) -> int | None:
    """``host``'s first index among the names of one item, or ``None`` when the item does not name it."""
    import re  # as in _pattern: only parsing a Slurm list needs it

    groups = [part for part in parts if not isinstance(part, str)]
    texts = [*parts[1:], ""]
    if any(
        not isinstance(part, str) and (not isinstance(after, str) or after[:1].isdigit())
        for part, after in zip(parts, texts, strict=True)
    ):
        # A number group next to another or to a digit: its digits do not split one way; count the names instead.
        return next((index for index, name in enumerate(_expand_item(parts)) if name == host), None)
    pattern = "".join(re.escape(part) if isinstance(part, str) else "([0-9]+)" for part in parts)
    match = re.fullmatch(pattern, host)
    if match is None:
        return None
    index = 0
    for digits, ranges in zip(match.groups(), groups, strict=True):
        position = _range_position(digits, ranges)
        if position is None:
            return None
        index = index * sum(high - low + 1 for low, high, _ in ranges) + position
    return index


def _range_position(digits: str, ranges: tuple[_Range, ...]) -> int | None:
    number = as_count(digits)
    before = 0
    for low, high, width in ranges:
        if number is not None and low <= number <= high and str(number).zfill(width) == digits:
            return before + number - low
        before += high - low + 1
    return None


def _count(parts: list[_Part]) -> int:
    count = 1
    for part in parts:
        count *= 1 if isinstance(part, str) else sum(high - low + 1 for low, high, _ in part)
    return count


def _nodelist_error(nodelist: str, variable: str, reason: str) -> LayoutError:
    return LayoutError(
        f"{variable}={shown(nodelist)} is not a valid Slurm node list: {reason}.",
        "Use the value Slurm set, or set MASTER_ADDR to the host of rank 0.",
        variable=variable,
        value=nodelist[:SHOWN_CHARACTERS],
        launcher="Slurm",
    )


def expand_tasks_per_node(counts: str, *, variable: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed per-node task counts such as ``4(x2),3`` into one count per node.

    Raises:
        LayoutError: If the value is malformed.

    >>> expand_tasks_per_node("4(x2),3")
    [4, 4, 3]
    """
    expanded: list[int] = []
    for piece in counts.split(","):
        match = _pattern("task_count").match(piece.strip())
        count = as_count(match.group(1)) if match is not None else None
        repeat = as_count(match.group(2) or "1") if match is not None else None
        if not count or not repeat or len(expanded) + repeat > MAX_HOSTS:
            raise LayoutError(
                f"{variable}={shown(counts)} (Slurm srun) is not a list of task counts like '4(x2),3'"
                + (f" for at most {MAX_HOSTS} nodes." if count and repeat else "."),
                "Use the value srun set; do not export your own.",
                variable=variable,
                value=counts[:SHOWN_CHARACTERS],
                launcher="Slurm srun",
            )
        expanded.extend([count] * repeat)
    return expanded


def compress_tasks_per_node(counts: Sequence[int]) -> str:
    """Slurm's compressed per-node task counts, the inverse of :func:`expand_tasks_per_node`.

    >>> compress_tasks_per_node([4, 4, 3])
    '4(x2),3'
    """
    pieces: list[str] = []
    index = 0
    while index < len(counts):
        run = 1
        while index + run < len(counts) and counts[index + run] == counts[index]:
            run += 1
        pieces.append(f"{counts[index]}(x{run})" if run > 1 else str(counts[index]))
        index += run
    return ",".join(pieces)


def first_word_host(text: str) -> str | None:
    r"""The first host of a host file with one host (or one slot) per line: ``PBS_NODEFILE``, ``SGE_JOB_HOSTLIST``.

    Blank lines and ``#`` comments are skipped; anything after the host name (``slots=4``) is ignored.

    >>> first_word_host("# allocated\n\n  g0002 slots=4\n")
    'g0002'
    """
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            return words[0]
    return None


def pe_hostfile_host(text: str, *, variable: str = "PE_HOSTFILE", scheduler: str = "SGE") -> str | None:
    r"""The first host of a Grid Engine ``$PE_HOSTFILE``: one line per host, ``host slots queue processors``.

    Raises:
        LayoutError: If a line is not ``host slots ...`` with a whole number of slots.

    >>> pe_hostfile_host("node07.cluster 4 all.q@node07.cluster UNDEFINED\nnode08.cluster 4 all.q@node08 <NULL>\n")
    'node07.cluster'
    """
    first = None
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 2:
            raise LayoutError(
                f"{variable} line {number} ({shown(line.strip())}, {scheduler}) is not 'host slots queue processors'.",
                "Run inside the Grid Engine job that wrote the file, or set MASTER_ADDR to the host of rank 0.",
                variable=variable,
                value=line[:SHOWN_CHARACTERS],
                launcher=scheduler,
            )
        parse_count(
            words[1],
            variable=f"{variable} line {number} (slots)",
            launcher=scheduler,
            minimum=1,
            hint="Run inside the Grid Engine job that wrote the file, or set MASTER_ADDR to the host of rank 0.",
        )
        first = first or words[0]
    return first


def lsf_pairs_host(value: str, *, variable: str = "LSB_MCPU_HOSTS", scheduler: str = "LSF") -> str:
    """The first host of LSF's ``"hostA 4 hostB 4"`` (host names alternating with slot counts).

    Raises:
        LayoutError: If the value is not such pairs.

    >>> lsf_pairs_host("batch1 1 hostA 4 hostB 4")
    'batch1'
    """
    words = value.split()
    if len(words) < 2 or len(words) % 2 or not all(is_count(word) for word in words[1::2]):
        raise LayoutError(
            f"{variable}={shown(value)} ({scheduler}) is not a list of 'host slots' pairs.",
            "Use the value LSF set, or set MASTER_ADDR to the host of rank 0.",
            variable=variable,
            value=value[:SHOWN_CHARACTERS],
            launcher=scheduler,
        )
    return words[0]


__all__ = [
    "MAX_HOSTS",
    "HostList",
    "HostListForm",
    "compress_tasks_per_node",
    "expand_nodelist",
    "expand_tasks_per_node",
    "first_nodelist_host",
    "nodelist_position",
    "first_word_host",
    "lsf_pairs_host",
    "pe_hostfile_host",
]
