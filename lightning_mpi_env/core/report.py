"""How an error of this package that nobody caught is shown: the cause on the first screen, not N tracebacks.

Under ``mpirun -np 64`` every rank that stops prints its own traceback, and the one line that matters is buried
under hundreds. :func:`install_excepthook` (installed when ``lightning_mpi_env`` is imported) shows an uncaught
:class:`~lightning_mpi_env.core.errors.MpiEnvError` under a launcher as one line per rank, prefixed with its rank and
host: ``ClassName: rank 3 on nodeb: problem HINT: fix``. In a single process it keeps the frames of the user's code
(where the error came from) and drops this package's. Other exceptions keep Python's traceback, without the frames
of this package's wrappers around ``Trainer.fit``. ``LIGHTNING_MPI_ENV_DEBUG=1`` shows every
traceback in full. The exception itself is unchanged: catch it as usual.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.core.launchers import detect_launcher

if TYPE_CHECKING:
    import traceback

DEBUG_VARIABLE = "LIGHTNING_MPI_ENV_DEBUG"
"""Set to ``1`` to see the full traceback of this package's errors."""

_PACKAGE = os.path.dirname(os.path.dirname(__file__)) + os.sep
_WRAPPER_FILES = frozenset({os.path.join(os.path.dirname(os.path.dirname(__file__)), "lightning", "trainer_guard.py")})
"""Modules whose frames stand between the user's call and Lightning: left out of tracebacks."""


def debugging(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``LIGHTNING_MPI_ENV_DEBUG`` asks for full tracebacks (any value but empty, ``0``, ``false``, ``no``)."""
    value = (os.environ if environ is None else environ).get(DEBUG_VARIABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def rank_prefix(environ: Mapping[str, str] | None = None) -> str:
    """``"rank 3 on nodeb: "`` under a launcher, else ``""``: whose line it is, when all ranks share one output."""
    env = os.environ if environ is None else environ
    launcher = detect_launcher(env)
    if launcher is None:
        return ""
    import socket  # Here, not at the top: only an error being shown needs it.

    return f"rank {env.get(launcher.rank, '?')} on {socket.gethostname()}: "


def render(error: MpiEnvError, environ: Mapping[str, str] | None = None) -> str | None:
    """The one line an uncaught error is shown with under a launcher, newline included; ``None`` outside one.

    Under a launcher every rank prints, so N ranks failing for one reason add N lines, not N tracebacks.

    >>> from lightning_mpi_env.core.errors import LayoutError
    >>> render(LayoutError("PMI_RANK='x' is wrong.", "Use mpiexec."), {}) is None
    True
    >>> print(render(LayoutError("PMI_RANK='x' is wrong.", "Use mpiexec."), {"OMPI_COMM_WORLD_RANK": "3"})[:22])
    LayoutError: rank 3 on
    """
    prefix = rank_prefix(environ)
    if not prefix:
        return None
    return f"{type(error).__name__}: {prefix}{error.one_line()}\n"


def _without_frames(exception: BaseException, *, of_this_package: bool) -> str:
    """Python's traceback, without the frames of this package's wrappers (or of all its modules)."""
    import traceback  # Here, not at the top: only an error being shown needs it.

    def shown(filename: str) -> bool:
        if of_this_package:
            return not filename.startswith((_PACKAGE, "<frozen importlib"))
        return filename not in _WRAPPER_FILES

    formatted = traceback.TracebackException.from_exception(exception)
    for part in _chain(formatted):
        part.stack = traceback.StackSummary.from_list([frame for frame in part.stack if shown(frame.filename)])
    return "".join(formatted.format())


def _chain(formatted: traceback.TracebackException) -> list[traceback.TracebackException]:
    parts, seen = [], set()
    current: traceback.TracebackException | None = formatted
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(current)
        current = current.__cause__ or current.__context__
    return parts


def _excepthook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
    if debugging():
        _previous(kind, value, trace)
        return
    if isinstance(value, MpiEnvError):
        # Under a launcher: one line per rank. Alone: the user's frames (where it was called) and the message.
        shown = render(value) or _without_frames(value, of_this_package=True)
    elif _previous is sys.__excepthook__:
        shown = _without_frames(value, of_this_package=False)
    else:  # someone else formats exceptions here (IPython, rich): leave it to them
        _previous(kind, value, trace)
        return
    sys.stderr.write(shown)
    sys.stderr.flush()


_previous = sys.excepthook


def install_excepthook() -> None:
    """Show this package's uncaught errors without a traceback (see the module docstring); idempotent."""
    global _previous
    if sys.excepthook is not _excepthook:
        _previous = sys.excepthook
        sys.excepthook = _excepthook


__all__ = ["DEBUG_VARIABLE", "debugging", "install_excepthook", "rank_prefix", "render"]
