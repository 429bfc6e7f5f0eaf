"""Reading a scheduler's host file (``PBS_NODEFILE``, ``PE_HOSTFILE``, ``LSB_DJOB_HOSTFILE``, ...), bounded.

A host file's path comes from a variable anyone can set, so the file is trusted no more than the variable: only a
regular file is opened (a FIFO would block the read forever, ``/dev/zero`` never ends), without blocking on open,
and it is read line by line up to the lines that name the hosts needed or :data:`MAX_HOST_FILE_BYTES`.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable

from lightning_mpi_env.core.state_files import NotARegularFile, open_regular

MAX_HOST_FILE_BYTES = 1 << 20
"""The most bytes read from a host file before the host lines needed: 1 MiB, thousands of lines of comments."""

HOST_LINES_NEEDED = 2
"""The host lines read from the top of a host file: the first host, after the launch node that heads ``jsrun``'s
``LSB_DJOB_RANKFILE`` (the most any host list skips)."""


class HostFileError(OSError):
    """A host file that this package will not read: not a regular file, too long before its hosts, or not text."""


class _PastTheCap(HostFileError):
    """The byte cap came before the host lines wanted: an error only when no host was found before it."""


def names_a_host(line: str) -> bool:
    """Whether a host file's line names a host: not blank and not a ``#`` comment.

    >>> names_a_host("  g0002 slots=4"), names_a_host("# allocated"), names_a_host("   ")
    (True, False, False)
    """
    words = line.split(maxsplit=1)
    return bool(words) and not words[0].startswith("#")


def host_file_head(lines: Iterable[str], *, host_lines: int = HOST_LINES_NEEDED) -> str:
    r"""The leading lines of a host file's text, up to and including its ``host_lines``-th line naming a host.

    Used for host files held in memory (``simulate``), as :func:`read_host_file` does for files on disk.

    >>> host_file_head(iter("# job 7\nnode1\nnode1\nnode2\n".splitlines(keepends=True)))
    '# job 7\nnode1\nnode1\n'
    """
    head: list[str] = []
    found = 0
    try:
        for line in lines:
            head.append(line)
            found += names_a_host(line)
            if found >= host_lines:
                break
    except _PastTheCap:
        if not found:
            raise
    return "".join(head)


def read_host_file(path: str, *, host_lines: int = HOST_LINES_NEEDED, max_bytes: int = MAX_HOST_FILE_BYTES) -> str:
    """The head of the host file at ``path``: its leading lines, up to its ``host_lines``-th line naming a host.

    Args:
        path: The file, as a scheduler's variable names it.
        host_lines: How many lines naming a host to read (blank lines and ``#`` comments do not count).
        max_bytes: The most bytes to read before they are found.

    Returns:
        Those lines, as UTF-8 text; fewer when the file ends first, or when ``max_bytes`` comes after the first
        host line and before the others (the lines whole before it).

    Raises:
        HostFileError: The path is not a regular file, it names no host in its first ``max_bytes`` bytes, or a
            line is not UTF-8 (an ``OSError``, as from any file that cannot be read).
        OSError: The file cannot be opened or read.
    """
    lines = _lines(path, max_bytes)
    try:
        return host_file_head(lines, host_lines=host_lines)
    finally:
        lines.close()  # closes the file now, not when the generator is collected


def read_whole_host_file(path: str, *, max_bytes: int) -> str:
    """The whole host file at ``path``, as UTF-8 text: refused, not cut, when it is longer than ``max_bytes``.

    For a list of every host (the supervisor's allocation), where the head of the file would silently drop hosts.

    Raises:
        HostFileError: The path is not a regular file, it is longer than ``max_bytes``, or a line is not UTF-8.
        OSError: The file cannot be opened or read.
    """
    lines = _lines(path, max_bytes)
    try:
        return "".join(lines)
    except _PastTheCap as error:
        raise HostFileError(f"{path} is longer than {max_bytes} bytes") from error
    finally:
        lines.close()


def _lines(path: str, max_bytes: int) -> Generator[str, None, None]:
    try:
        descriptor = open_regular(path)
    except NotARegularFile as error:
        raise HostFileError(str(error)) from None
    with os.fdopen(descriptor, "rb") as file:
        left = max_bytes
        for number in range(1, max_bytes + 2):
            line = file.readline(left + 1)
            if not line:
                return
            left -= len(line)
            if left < 0:
                raise _PastTheCap(f"{path} names no host in its first {max_bytes} bytes")
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise HostFileError(f"{path} line {number} is not UTF-8 text ({error.reason})") from error


__all__ = [
    "HOST_LINES_NEEDED",
    "MAX_HOST_FILE_BYTES",
    "HostFileError",
    "host_file_head",
    "names_a_host",
    "read_host_file",
    "read_whole_host_file",
]
