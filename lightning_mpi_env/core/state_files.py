"""Files that the processes of a job leave for each other: written whole, read bounded, their JSON checked.

The failure records (:mod:`~lightning_mpi_env.core.failures`), the progress records
(:mod:`~lightning_mpi_env.core.progress`), the requeue records (:mod:`~lightning_mpi_env.lightning.checkpoints`)
and the scheduler's host files (:mod:`~lightning_mpi_env.core.hostfile`) all lie in folders that other processes,
possibly of another version, and anyone with access to the folder can write into. This module is the one home of
how such a file is opened, read, parsed and written; a problem with its content is a :class:`FieldError`, which each
record's module names with the file, in its own error.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile

from lightning_mpi_env.core.values import shown

FILE_TYPES = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}
"""What a path that is not a regular file is, in words."""

MAX_STEP = (1 << 63) - 1
"""The largest training step a record is believed to carry."""


class NotARegularFile(OSError):
    """A path that is not a regular file where one was to be read; the message names what it is."""


class FieldError(ValueError):
    """One problem with a file's content or one of its fields, for the file's own module to name with the file."""


def open_regular(path: str, *, follow_links: bool = True) -> int:
    """A descriptor of the regular file at ``path``, opened for reading without blocking.

    A FIFO put in a record's place would block the open forever, and ``/dev/zero`` never ends.

    Args:
        path: The file.
        follow_links: Whether a symbolic link is followed (``False``: the link itself is refused).

    Raises:
        NotARegularFile: ``path`` is a FIFO, a device, a socket, a folder, or (``follow_links=False``) a link.
        OSError: It cannot be opened.
    """
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
    """The bytes of the regular file at ``path``: at most ``max_bytes`` plus one, so a longer file can be refused.

    Raises:
        NotARegularFile: See :func:`open_regular`.
        OSError: The file cannot be opened or read.
    """
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
    """The JSON value in ``raw``, refused where it is longer than ``max_bytes`` or holds ``NaN`` or ``Infinity``.

    Raises:
        FieldError: Saying what is wrong, as a clause (``it is not JSON (JSONDecodeError)``).

    >>> load_json('{"step": 3}', 64)
    {'step': 3}
    >>> load_json('{"when": NaN}', 64)
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.state_files.FieldError: NaN is not a number
    """
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
    """``data``, where it is a JSON object whose ``format`` is ``version``.

    Raises:
        FieldError: It is another kind of value, or of another format.
    """
    if not isinstance(data, dict):
        raise FieldError(f"it holds {type(data).__name__}, not an object")
    if data.get("format") != version:
        raise FieldError(f"format={shown(str(data.get('format')))} is not {version}")
    return data


def exact_fields(data: dict[str, object], names: tuple[str, ...]) -> None:
    """Check that ``data`` has every field of ``names`` and no other.

    Raises:
        FieldError: Listing the unknown fields, or else the missing ones.
    """
    unknown = sorted(set(data) - set(names))
    missing = [name for name in names if name not in data]
    if unknown or missing:
        raise FieldError(f"fields {unknown or missing} are {'unknown' if unknown else 'missing'}")


def whole_number(value: object, name: str, high: int) -> int:
    """``value``, where it is a whole number from 0 to ``high`` (not a bool).

    Raises:
        FieldError: Naming the field and its value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise FieldError(f"{name} holds {shown(str(value))}, not a whole number from 0 to {high}")
    return value


def seconds(value: object, name: str = "when") -> float:
    """``value`` as Unix time: a finite number, not negative (not a bool).

    Raises:
        FieldError: Naming the field and its value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FieldError(f"{name} holds {shown(str(value))}, not a time in seconds")
    return float(value)


def write_whole(folder: str, name: str, text: str) -> None:
    """Write ``text`` as ``folder/name``, creating ``folder``: a reader sees the old file or the new one, whole.

    A temporary file beside it (``mkstemp``), flushed to disk, then ``os.replace``: a node that crashes mid-write
    leaves the old file, never half of the new one.

    Raises:
        OSError: The folder or the file cannot be written (the temporary file is removed).
    """
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


__all__ = [
    "FILE_TYPES",
    "MAX_STEP",
    "FieldError",
    "NotARegularFile",
    "load_json",
    "open_regular",
    "read_capped",
    "seconds",
    "whole_number",
    "exact_fields",
    "versioned_object",
    "write_whole",
]
