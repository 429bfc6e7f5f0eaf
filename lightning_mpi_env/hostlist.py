"""Schedulers' host lists: Slurm node lists, SGE/PBS/LSF host files, and Slurm's compressed task counts."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_mpi_env.errors import LayoutError, layout_error

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASK_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_nodelist(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm node list such as ``gpu[07-08,10],login1`` into host names, in order.

    Ranges keep their zero padding, and several bracket groups in one name expand as a product.

    Args:
        nodelist: The compressed list.
        variable: The variable it came from, for messages.

    Returns:
        The host names.

    Raises:
        LayoutError: If the list is malformed.

    >>> expand_nodelist("gpu[07-08,10],cpu1")
    ['gpu07', 'gpu08', 'gpu10', 'cpu1']
    >>> expand_nodelist("r[1-2]n[01-02]")
    ['r1n01', 'r1n02', 'r2n01', 'r2n02']
    """
    hosts = [host for item in _split_top_level(nodelist, variable) for host in _expand_one(item, nodelist, variable)]
    if not hosts:
        raise _nodelist_error(nodelist, variable, "it names no host")
    return hosts


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


def _expand_one(item: str, nodelist: str, variable: str) -> list[str]:
    # "r[1-2]n[01-02]" -> ["r", ["1", "2"], "n", ["01", "02"], ""] -> product
    parts: list[list[str]] = []
    for text, brackets in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        if text:
            parts.append([text])
        if brackets:
            parts.append(_expand_brackets(brackets, nodelist, variable))
    return ["".join(combination) for combination in itertools.product(*parts)]


def _expand_brackets(brackets: str, nodelist: str, variable: str) -> list[str]:
    names: list[str] = []
    for piece in brackets.split(","):
        match = _RANGE.match(piece.strip())
        if match is None:
            raise _nodelist_error(nodelist, variable, f"'{piece}' is not a number or a range like 07-10")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise _nodelist_error(nodelist, variable, f"the range '{piece}' runs backwards")
        names.extend(str(number).zfill(len(first)) for number in range(int(first), int(last) + 1))
    return names


def _nodelist_error(nodelist: str, variable: str, reason: str) -> LayoutError:
    return layout_error(
        f"{variable}='{nodelist}' is not a valid Slurm node list: {reason}.",
        "Use the value Slurm set, or set MASTER_ADDR to the host of rank 0.",
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
        match = _TASK_COUNT.match(piece.strip())
        if match is None or int(match.group(1)) == 0 or match.group(2) == "0":
            raise layout_error(
                f"{variable}='{counts}' (Slurm srun) is not a list of task counts like '4(x2),3'.",
                "Use the value srun set; do not export your own.",
            )
        expanded.extend([int(match.group(1))] * int(match.group(2) or 1))
    return expanded


@dataclass(frozen=True)
class HostListSource:
    """One scheduler's list of the job's hosts."""

    variable: str
    scheduler: str
    kind: str
    """``file`` (path to a file, one host per line or per slot), ``slurm`` (node list) or ``lsf_pairs``."""


HOST_LIST_SOURCES: tuple[HostListSource, ...] = (
    HostListSource("SGE_JOB_HOSTLIST", "SGE", "file"),
    HostListSource("PBS_NODEFILE", "PBS", "file"),
    HostListSource("LSB_DJOB_HOSTFILE", "LSF", "file"),
    HostListSource("LSB_MCPU_HOSTS", "LSF", "lsf_pairs"),
    HostListSource("SLURM_STEP_NODELIST", "Slurm", "slurm"),
    HostListSource("SLURM_JOB_NODELIST", "Slurm", "slurm"),
)
"""Where schedulers list a job's hosts, in the order we consult them; the first host runs rank 0."""


def first_host(
    env: Mapping[str, str], read_text: Callable[[str], str] = lambda path: Path(path).read_text()
) -> tuple[str, str] | None:
    """The first host of the first scheduler host list present, with the variable it came from.

    Args:
        env: The process environment.
        read_text: Reads a host file; replaced in tests.

    Returns:
        ``(host, variable)``, or ``None`` when no scheduler lists the job's hosts.

    Raises:
        LayoutError: If a host list is present but unreadable, empty or malformed.
    """
    for source in HOST_LIST_SOURCES:
        value = env.get(source.variable)
        if value is None:
            continue
        if source.kind == "slurm":
            return expand_nodelist(value, variable=source.variable)[0], source.variable
        if source.kind == "lsf_pairs":
            # "hostA 4 hostB 4": host names alternate with slot counts.
            words = value.split()
            if len(words) < 2 or len(words) % 2 or not all(word.isdigit() for word in words[1::2]):
                raise layout_error(
                    f"{source.variable}='{value}' ({source.scheduler}) is not a list of 'host slots' pairs.",
                    "Use the value LSF set, or set MASTER_ADDR to the host of rank 0.",
                )
            return words[0], source.variable
        return _first_host_in_file(value, source, read_text), source.variable
    return None


def _first_host_in_file(path: str, source: HostListSource, read_text: Callable[[str], str]) -> str:
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        raise layout_error(
            f"{source.variable}='{path}' ({source.scheduler}) names a host file that cannot be read: {error}.",
            f"Run inside the {source.scheduler} job that created the file, or set MASTER_ADDR to the host of rank 0.",
        ) from error
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            return words[0]
    raise layout_error(
        f"{source.variable}='{path}' ({source.scheduler}) names an empty host file.",
        "Set MASTER_ADDR to the host of rank 0.",
    )
