"""How an error of this package that nobody caught is shown: the cause on the first screen, not N tracebacks.

Under a launcher one line per rank, alone the user's frames only; other exceptions go to the previous hook, and
``LIGHTNING_MPI_ENV_DEBUG=1`` shows every traceback. The hook is installed only while needed, never by an import.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from lightning_mpi_env.core.errors import MpiEnvError, SettingError
from lightning_mpi_env.core.launchers import detect_launcher
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.core.values import as_count, shown, switch

if TYPE_CHECKING:
    import traceback


_PACKAGE = os.path.dirname(os.path.dirname(__file__)) + os.sep


def debugging(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``LIGHTNING_MPI_ENV_DEBUG`` asks for full tracebacks (read when an error is shown)."""
    env = os.environ if environ is None else environ
    try:
        return switch(env, VARIABLE["debug"], default=False)
    except SettingError:  # showing an error must not fail: any other value asks for the traceback
        return True


def rank_prefix(environ: Mapping[str, str] | None = None) -> str:
    """``"rank 3 on nodeb: "`` under a launcher, else ``""``: whose line it is, when all ranks share one output."""
    env = os.environ if environ is None else environ
    launcher = detect_launcher(env)  # started_by_launcher's answer, with the row that names the rank variable
    if launcher is None:
        return ""
    import socket  # Here, not at the top: only an error being shown needs it.

    value = env.get(launcher.rank)
    rank = "?" if value is None else value if as_count(value) is not None else shown(value)  # bounded, quoted
    return f"rank {rank} on {socket.gethostname()}: "


def render(error: MpiEnvError, environ: Mapping[str, str] | None = None) -> str | None:
    """The one line an uncaught error is shown with under a launcher, newline included; ``None`` outside one."""
    prefix = rank_prefix(environ)
    if not prefix:
        return None
    return f"{type(error).__name__}: {prefix}{error.one_line()}\n"


def _without_package_frames(exception: BaseException) -> str:
    """Python's traceback without the frames of this package: the user's frames, where the error came from."""
    import traceback  # Here, not at the top: only an error being shown needs it.

    formatted = traceback.TracebackException.from_exception(exception)
    for part in _chain(formatted):
        kept = [frame for frame in part.stack if not frame.filename.startswith((_PACKAGE, "<frozen importlib"))]
        part.stack = traceback.StackSummary.from_list(kept)
    return "".join(formatted.format())


def _chain(formatted: traceback.TracebackException) -> list[traceback.TracebackException]:
    parts, seen = [], set()
    current: traceback.TracebackException | None = formatted
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(current)
        current = current.__cause__ or current.__context__
    return parts


class _BriefHook:
    """``sys.excepthook`` for this package's errors; every other exception goes to the hook that was there before."""

    def __init__(self, previous: Callable[[type[BaseException], BaseException, TracebackType | None], object]) -> None:
        self.previous = previous
        self.every = False
        """Every error of ours (:func:`install_excepthook`), not only the pending ones."""
        self.pending: weakref.WeakSet[BaseException] = weakref.WeakSet()
        """Errors of ours that left the adapter's public methods (:func:`show_briefly`)."""

    def __call__(self, kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if isinstance(value, MpiEnvError) and (self.every or value in self.pending) and not debugging():
            # Under a launcher: one line per rank. Alone: the user's frames (where it was called) and the message.
            sys.stderr.write(render(value) or _without_package_frames(value))
            sys.stderr.flush()
            return
        self.previous(kind, value, trace)


def _hook() -> _BriefHook:
    """This package's hook, installed (chained to the current one) if it is not the current one."""
    if not isinstance(sys.excepthook, _BriefHook):
        sys.excepthook = _BriefHook(sys.excepthook)
    return sys.excepthook


def install_excepthook() -> None:
    """Show every uncaught error of this package briefly, from now on; idempotent."""
    _hook().every = True


def show_briefly(error: BaseException) -> None:
    """Have ``sys.excepthook`` show ``error`` briefly if nothing catches it (installing the hook, chained)."""
    if isinstance(error, MpiEnvError):
        _hook().pending.add(error)


def _in_flight() -> set[int]:
    """The exception being handled right now and its causes, by id: an error on its way out of an ``except``."""
    found: set[int] = set()
    current = sys.exc_info()[1]
    while current is not None and id(current) not in found:
        found.add(id(current))
        current = current.__cause__ or current.__context__
    return found


def restore_excepthook() -> None:
    """At the end of a run: put the previous ``sys.excepthook`` back, unless an error of ours is on its way out.

    Lightning tears a Trainer down while the error that ended ``fit()`` propagates: that error keeps the hook (as
    does every error after :func:`install_excepthook`).
    """
    hook = sys.excepthook
    if not isinstance(hook, _BriefHook):
        return  # not ours, or someone chained over ours: theirs to undo
    in_flight = _in_flight()
    for error in list(hook.pending):
        if id(error) not in in_flight:
            hook.pending.discard(error)
    if not hook.every and not hook.pending:
        sys.excepthook = hook.previous


P = ParamSpec("P")
R = TypeVar("R")


def shows_errors_briefly(function: Callable[P, R]) -> Callable[P, R]:
    """Decorate a public method: an error of this package leaving it is shown briefly if nothing catches it."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except MpiEnvError as error:
            show_briefly(error)
            raise

    return wrapper
