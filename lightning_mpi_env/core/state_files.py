"""Files a job's processes leave for each other (anyone may write there): read if regular, capped; written whole."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Generator, Iterable

from lightning_mpi_env.core.values import shown

FILE_TYPES = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}

MAX_STEP = (1 << 63) - 1
"""The largest training step a record is believed to carry."""


class NotARegularFile(OSError):
    """A path that is not a regular file where one was to be read; the message names what it is."""


class FieldError(ValueError):
    """One problem with a file's content or one of its fields, for the file's own module to name with the file."""


def open_regular(path: str, *, follow_links: bool = True) -> int:
    """A non-blocking read descriptor of ``path`` (a FIFO would block); :class:`NotARegularFile` unless regular."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        # A socket cannot be opened (ENXIO), nor a link under O_NOFOLLOW (ELOOP): say what the path is instead.
        try:
            kind = stat.S_IFMT((os.stat if follow_links else os.lstat)(path).st_mode)
        except OSError:
            raise error from None
        if kind == stat.S_IFREG:
            raise
        raise _not_regular(path, kind) from error
    kind = stat.S_IFMT(os.fstat(descriptor).st_mode)
    if kind != stat.S_IFREG:
        os.close(descriptor)
        raise _not_regular(path, kind)
    return descriptor


def _not_regular(path: str, kind: int) -> NotARegularFile:
    return NotARegularFile(f"{path} is {FILE_TYPES.get(kind, 'not a regular file')}, not a regular file")


def read_capped(path: str, max_bytes: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path`` (:func:`open_regular`): at most ``max_bytes`` + 1, to refuse more."""
    with os.fdopen(open_regular(path, follow_links=follow_links), "rb") as file:
        return file.read(max_bytes + 1)


def unreadable(error: OSError) -> str:
    """Why a file could not be read, as a clause for its module's error: ``it is not a regular file``, ...

    >>> unreadable(PermissionError(13, "Permission denied"))
    'it cannot be opened (Permission denied)'
    """
    if isinstance(error, NotARegularFile):
        return "it is not a regular file"
    return f"it cannot be opened ({error.strerror or error})"


def load_json(raw: bytes | str, max_bytes: int) -> object:
    """The JSON value in ``raw``; a :class:`FieldError` where it is longer than ``max_bytes``, not JSON, or NaN."""
    if len(raw) > max_bytes:
        raise FieldError(f"it is more than {max_bytes} bytes long")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except FieldError:
        raise
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FieldError(f"it is not JSON ({type(error).__name__})") from None


def _no_constant(name: str) -> object:
    raise FieldError(f"{name} is not a number")


def versioned_object(data: object, version: int) -> dict[str, object]:
    """``data``, where it is a JSON object whose ``format`` is ``version``; else a :class:`FieldError`."""
    if not isinstance(data, dict):
        raise FieldError(f"it holds {type(data).__name__}, not an object")
    if data.get("format") != version:
        raise FieldError(f"format={shown(str(data.get('format')))} is not {version}")
    return data


def exact_fields(data: dict[str, object], names: tuple[str, ...]) -> None:
    """Check that ``data`` has every field of ``names`` and no other; a :class:`FieldError` lists the others."""
    unknown = sorted(set(data) - set(names))
    missing = [name for name in names if name not in data]
    if unknown or missing:
        raise FieldError(f"fields {unknown or missing} are {'unknown' if unknown else 'missing'}")


def whole_number(value: object, name: str, high: int) -> int:
    """``value``, where it is a whole number from 0 to ``high`` (not a bool); else a :class:`FieldError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise FieldError(f"{name} holds {shown(str(value))}, not a whole number from 0 to {high}")
    return value


def seconds(value: object, name: str = "when") -> float:
    """``value`` as Unix time: a finite number, not negative (not a bool); else a :class:`FieldError`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FieldError(f"{name} holds {shown(str(value))}, not a time in seconds")
    return float(value)


def write_whole(folder: str, name: str, text: str) -> None:
    """Write ``text`` as ``folder/name``, creating ``folder``: a reader sees the old file or the new one, whole."""
    import tempfile  # here: only writers need it, and `import lightning_mpi_env` stays light

    os.makedirs(folder, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, os.path.join(folder, name))
    except BaseException:
        os.unlink(temporary)
        raise


LEAVE_OUT = "leave-out.json"
"""What ``run --leave-out-stragglers`` writes into a step's state folder: how many of the allocation's hosts the step
leaves spare, the most stragglers' hosts rank 0 leaves out at its next periodic checkpoint."""
MAX_SPARES = 1 << 20
_LEAVE_OUT_BYTES = 64


def ask_to_leave_out(folder: str, spares: int) -> str | None:
    """Write the request of ``spares`` hosts into ``folder``; ``None``, or why it could not be written (one line)."""
    try:
        write_whole(folder, LEAVE_OUT, json.dumps({"format": 1, "spares": spares}))
    except OSError as error:
        return f"could not write {os.path.join(folder, LEAVE_OUT)} ({error.strerror or error})"
    return None


def spares_given(folder: str) -> int:
    """How many stragglers' hosts the request in ``folder`` lets rank 0 leave out; ``0`` where there is none.

    Raises:
        FieldError: A request that is not a regular file, is too long, or holds anything but the request (the message
            names the file).
    """
    path = os.path.join(folder, LEAVE_OUT)
    try:
        raw = read_capped(path, _LEAVE_OUT_BYTES)
    except FileNotFoundError:
        return 0
    except OSError as error:
        raise FieldError(f"{path}: {unreadable(error)}") from None
    try:
        data = versioned_object(load_json(raw, _LEAVE_OUT_BYTES), 1)
        exact_fields(data, ("format", "spares"))
        return whole_number(data["spares"], "spares", MAX_SPARES)
    except FieldError as error:
        raise FieldError(f"{path}: {error}") from None


MAX_HOST_FILE_BYTES = 1 << 20
"""The most bytes read from a host file before the host lines needed: thousands of lines of comments."""

HOST_LINES_NEEDED = 2
"""The first host, after the launch node that heads ``jsrun``'s ``LSB_DJOB_RANKFILE`` (the most a list skips)."""


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
    """The leading lines of a host file's text, up to and including its ``host_lines``-th line naming a host."""
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
    """The head of the host file at ``path`` (:func:`host_file_head`), as UTF-8; cut at ``max_bytes`` after a host.

    A :class:`HostFileError` where it is not a regular file, names no host in ``max_bytes``, or is not UTF-8.
    """
    lines = _lines(path, max_bytes)
    try:
        return host_file_head(lines, host_lines=host_lines)
    finally:
        lines.close()  # closes the file now, not when the generator is collected


def read_whole_host_file(path: str, *, max_bytes: int) -> str:
    """The whole host file at ``path`` as UTF-8; a :class:`HostFileError` (no cut) past ``max_bytes`` or if not text."""
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
