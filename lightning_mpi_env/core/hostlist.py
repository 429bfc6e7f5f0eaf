"""The formats schedulers list hosts in (node lists, task counts, host files, LSF pairs), and their one reader."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from typing import NamedTuple

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.state_files import names_a_host
from lightning_mpi_env.core.values import (
    MAX_DIGITS,
    MAX_LOCAL_SIZE,
    SHOWN_CHARACTERS,
    as_count,
    is_count,
    parse_count,
    shown,
)

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


RANK_ZERO_FALLBACK = "set MASTER_ADDR to the host of rank 0"


def host_list_hint(owner: str, variable: str, fallback: str = RANK_ZERO_FALLBACK) -> str:
    """The one hint of every host-list error: run where the scheduler set the list, or ``fallback``."""
    return f"Run inside the {owner} job that set {variable}, or {fallback}."


_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_TASK_COUNT = re.compile(r"^([0-9]+)(?:\(x([0-9]+)\))?$")
_BRACKET_GROUP = re.compile(r"([^\[]*)(?:\[([^\]]*)\])?")


def expand_nodelist(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list such as ``gpu[07-08,10],r[1-2]n[01-02]``; malformed or huge: a :class:`LayoutError`."""
    return [host for item in _parse_nodelist(nodelist, variable) for host in _expand_item(item)]


def first_nodelist_host(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a Slurm node list, the whole list checked as :func:`expand_nodelist` checks it."""
    return next(_expand_item(_parse_nodelist(nodelist, variable)[0]))


_Range = tuple[int, int, int]
"""``(low, high, width)``: the host numbers ``low`` to ``high``, zero padded to ``width`` digits."""
_Part = str | tuple[_Range, ...]


def _parse_nodelist(nodelist: str, variable: str, fallback: str = RANK_ZERO_FALLBACK) -> list[list[_Part]]:
    """Every item's parts, after checking the syntax and that all items together name at most MAX_HOSTS hosts."""
    try:
        items = [_parse_item(item, nodelist, variable) for item in _split_top_level(nodelist, variable)]
        if not items:
            raise _nodelist_error(nodelist, variable, "it names no host")
        _check_total(items, nodelist, variable)
    except LayoutError as error:
        if fallback == RANK_ZERO_FALLBACK:
            raise
        hint = host_list_hint("Slurm", variable, fallback)
        raise LayoutError(error.problem, hint, variable=variable, value=error.value, launcher="Slurm") from None
    return items


def _check_total(items: list[list[_Part]], nodelist: str, variable: str) -> None:
    total = 0
    for parts in items:
        total += _count(parts)
        if total > MAX_HOSTS:
            raise _nodelist_error(nodelist, variable, f"it lists more than {MAX_HOSTS} hosts")


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
    for text, brackets in _BRACKET_GROUP.findall(item):
        if text:
            parts.append(text)
        if brackets:
            parts.append(_parse_brackets(brackets, nodelist, variable))
    return parts


def _parse_brackets(brackets: str, nodelist: str, variable: str) -> tuple[_Range, ...]:
    ranges: list[_Range] = []
    for piece in brackets.split(","):
        match = _RANGE.match(piece.strip())
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


def _expand_item(parts: list[_Part]) -> Iterator[str]:
    """The names of one item, in order: the first made alone, before the pools of the rest."""
    yield "".join(part if isinstance(part, str) else str(part[0][0]).zfill(part[0][2]) for part in parts)
    pools = [
        [part] if isinstance(part, str) else [str(n).zfill(w) for low, high, w in part for n in range(low, high + 1)]
        for part in parts
    ]
    names = itertools.product(*pools)
    next(names)
    yield from ("".join(name) for name in names)


def nodelist_position(nodelist: str, host: str, *, variable: str = "SLURM_STEP_NODELIST") -> tuple[int | None, int]:
    """Where ``host`` is first in a Slurm node list (or ``None``) and how many hosts it names, checked, not expanded."""
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
    """How many names one item makes; past :data:`MAX_HOSTS` the product stops growing (a hostile list)."""
    count = 1
    for part in parts:
        count *= 1 if isinstance(part, str) else sum(high - low + 1 for low, high, _ in part)
        if count > MAX_HOSTS:
            break
    return count


def _nodelist_error(nodelist: str, variable: str, reason: str) -> LayoutError:
    return LayoutError(
        f"{variable}={shown(nodelist)} is not a valid Slurm node list: {reason}.",
        host_list_hint("Slurm", variable),
        variable=variable,
        value=nodelist[:SHOWN_CHARACTERS],
        launcher="Slurm",
    )


def expand_tasks_per_node(counts: str, *, variable: str = "SLURM_STEP_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed per-node task counts such as ``4(x2),3``; a :class:`LayoutError` if malformed."""
    expanded: list[int] = []
    for piece in counts.split(","):
        match = _TASK_COUNT.match(piece.strip())
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
    """Slurm's compressed per-node task counts, the inverse of :func:`expand_tasks_per_node`."""
    runs = ((count, sum(1 for _ in run)) for count, run in itertools.groupby(counts))
    return ",".join(f"{count}(x{length})" if length > 1 else str(count) for count, length in runs)


def read_hosts(
    value: str,
    source: HostList,
    owner: str,
    read_text: Callable[[str], str],
    *,
    slots: tuple[str, str] | None = None,
    fallback: str = RANK_ZERO_FALLBACK,
) -> Iterator[tuple[str, int | None]]:
    """Each ``(host, slots)`` of the host list ``value`` of ``source``, in order; the first host runs rank 0.

    A node list's slots come from ``slots`` (the task counts' ``(variable, value)``); a file of a line per slot gives
    1 a line. A :class:`LayoutError` where the list, its file or a line is malformed, unreadable or empty.
    """
    variable = source.variable

    def refused(problem: str, shown_value: str, at: str = variable) -> LayoutError:
        hint = host_list_hint(owner, variable, fallback)
        return LayoutError(problem, hint, variable=at, value=shown_value[:SHOWN_CHARACTERS], launcher=owner)

    def slot_count(text: str, where: str) -> int:
        hint = host_list_hint(owner, variable, fallback)
        return parse_count(text, variable=where, launcher=owner, minimum=1, maximum=MAX_LOCAL_SIZE, hint=hint)

    if source.form is HostListForm.NODELIST:
        items = _parse_nodelist(value, variable, fallback)
        names = (host for parts in items for host in _expand_item(parts))
        counts: Iterable[int | None] = itertools.repeat(None)
        if slots is not None:
            counts = expand_tasks_per_node(slots[1], variable=slots[0])
            total = sum(_count(parts) for parts in items)
            if len(counts) != total:
                problem = (
                    f"{slots[0]}={shown(slots[1])} gives {len(counts)} counts for the {total} hosts of {variable}."
                )
                raise refused(problem, slots[1], at=slots[0])
        yield from zip(names, counts, strict=False)
    elif source.form is HostListForm.LSF_PAIRS:
        words = value.split()
        if not words or len(words) % 2 or not all(is_count(word) for word in words[1::2]):
            raise refused(f"{variable}={shown(value)} ({owner}) is not a list of 'host slots' pairs.", value)
        yield from (
            (host, slot_count(count, f"{variable} (slots)"))
            for host, count in zip(words[::2], words[1::2], strict=True)
        )
    else:
        try:
            text = read_text(value)
        except (OSError, UnicodeDecodeError) as error:
            raise refused(
                f"{variable}={value!r} ({owner}) names a host file that cannot be read: {error}.", value
            ) from error
        named = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if names_a_host(line)]
        if len(named) <= source.skip_lines:
            raise refused(f"{variable}={value!r} ({owner}) names an empty host file.", value)
        for number, line in named[source.skip_lines :]:
            words = line.split()
            if source.form is not HostListForm.PE_HOSTFILE:
                yield words[0], 1
            elif len(words) < 2:
                where = f"{variable} line {number} ({shown(line.strip())}, {owner})"
                raise refused(f"{where} is not 'host slots queue processors'.", line)
            else:
                yield words[0], slot_count(words[1], f"{variable} line {number} (slots)")
