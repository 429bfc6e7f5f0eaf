"""Whether this node can write a checkpoint folder: a probe file made and removed there, and the free space left.

Where the folder does not exist yet, its deepest existing ancestor is probed: Lightning makes the folder at its first
save. The probe never follows a link at its own name, never overwrites (``O_EXCL``) and is removed at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from dataclasses import dataclass
from enum import Enum

MIN_FREE_BYTES = 1 << 30
"""The free space below which a checkpoint folder is named: 1 GiB, a floor for a full disk, not a checkpoint's size."""

SHOWN_PATH_CHARACTERS = 200
"""The longest path a message repeats whole."""

PROBE_PREFIX = ".lightning-mpi-env-probe-"
"""The start of the probe file's name (then the process id and random hex): a name no checkpoint takes."""


class FolderFault(str, Enum):
    """What keeps a node from saving in a folder."""

    NOT_A_FOLDER = "is not a folder"
    NOT_WRITABLE = "cannot be written"
    LOW_SPACE = "has little free space"


@dataclass(frozen=True)
class FolderCheck:
    """One folder as this node sees it: ``fault`` ``None`` where a save can go there."""

    folder: str
    """The folder as given, made absolute."""
    probed: str
    """The folder probed: :attr:`folder`, or its deepest existing ancestor when it does not exist yet."""
    fault: FolderFault | None = None
    detail: str = ""
    """The system's reason (``Read-only file system``), or the free space found."""
    free: int | None = None
    """Free bytes for this user at :attr:`probed`, where known."""

    def sentence(self) -> str:
        """What is wrong, as a clause: ``'/ckpt' cannot be written (Read-only file system)``."""
        where = shown_path(self.folder)
        if self.probed != self.folder:
            where += f" (not made yet; its folder {shown_path(self.probed)})"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{where} {self.fault.value if self.fault else 'can be written'}{detail}"


def shown_path(path: str) -> str:
    r"""A path as a message repeats it: quoted, what is not printable escaped, cut after 200 characters.

    >>> shown_path("/ckpt"), shown_path("/a\nb")
    ("'/ckpt'", "'/a\\nb'")
    """
    if len(path) <= SHOWN_PATH_CHARACTERS:
        return repr(path)
    return f"{path[:SHOWN_PATH_CHARACTERS]!r}... ({len(path)} characters)"


def is_local(folder: str) -> bool:
    """Whether ``folder`` is a path on this machine, not a URL Lightning hands to fsspec (``s3://bucket/runs``).

    >>> is_local("/scratch/runs"), is_local("s3://bucket/runs"), is_local("file:///tmp")
    (True, False, False)
    """
    return "://" not in folder


def check_folder(folder: str, *, min_free: int = MIN_FREE_BYTES) -> FolderCheck:
    """Probe ``folder`` (or its deepest existing ancestor) from this node: can a file be made there, and is there room.

    A path with a NUL character, one under a file, or a folder this node cannot write is a fault; so is less than
    ``min_free`` bytes free. Never raises ``OSError``: the system's reason goes into :attr:`FolderCheck.detail`.
    """
    if "\x00" in folder:  # no system call takes it (os.path.lexists says False: the walk up would pass it)
        return FolderCheck(folder, folder, FolderFault.NOT_WRITABLE, "the path holds a NUL character")
    try:
        absolute = os.path.abspath(folder)
        probed = _deepest_existing(absolute)
    except OSError as error:  # the working folder is gone
        return FolderCheck(folder, folder, FolderFault.NOT_WRITABLE, _reason(error))
    if not os.path.isdir(probed):
        return FolderCheck(absolute, probed, FolderFault.NOT_A_FOLDER, _kind(probed))
    try:
        _make_and_remove_probe(probed)
    except OSError as error:
        return FolderCheck(absolute, probed, FolderFault.NOT_WRITABLE, _reason(error))
    try:
        free = shutil.disk_usage(probed).free
    except OSError as error:
        return FolderCheck(absolute, probed, FolderFault.NOT_WRITABLE, _reason(error))
    if free < min_free:
        left = f"{free / (1 << 20):.0f} MiB free, under the {min_free / (1 << 20):.0f} MiB floor"
        return FolderCheck(absolute, probed, FolderFault.LOW_SPACE, left, free)
    return FolderCheck(absolute, probed, None, "", free)


def _deepest_existing(path: str) -> str:
    """``path``, or the nearest of its ancestors that exists (``/`` at worst); links are looked at, not followed."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _make_and_remove_probe(folder: str) -> None:
    """Make a new one-byte file in ``folder`` (never through a link, never over a file) and remove it."""
    path = os.path.join(folder, f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags, 0o600)
    try:
        try:
            os.write(descriptor, b"\n")  # a full disk or a quota shows at the first byte, not at the open
        finally:
            os.close(descriptor)
    finally:
        with contextlib.suppress(OSError):  # made by us: only ours to remove, and a failed removal changes nothing
            os.unlink(path)


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _kind(path: str) -> str:
    if os.path.islink(path):
        return "a link to no folder"
    return "a file is in its place" if os.path.exists(path) else "it cannot be looked at"
