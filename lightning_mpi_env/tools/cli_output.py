"""What the ``lightning-mpi-env`` commands print: text for people, one JSON object on one line for programs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lightning_mpi_env.core.errors import Explained, MpiEnvError, escaped
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.values import shown

PROG = "lightning-mpi-env"

APPROXIMATE = (
    "~ = approximate: assumed from where the launcher usually places ranks, which its variables do not prove; "
    "the roll call of MPIDDPStrategy/MPIClusterEnvironment finds the true value from every rank's host name."
)
"""What ``~`` after a value means, said wherever one is shown."""


WIDTH = 120
"""The widest line of the command line's own text: its help, ``doctor``'s findings, ``simulate``'s notes."""

HIDDEN_ALIASES = frozenset({"--ppn"})
"""Option names taken but not shown in the help: ``--ppn``, the old name of ``--per-node`` in ``simulate``."""

_WHOLE_WORDS: dict[str, Any] = {"break_on_hyphens": False}


def wrapped(text: str, width: int = WIDTH, indent: str = "    ") -> list[str]:
    """``text`` (one line) as lines of at most ``width`` characters, the later ones indented by ``indent``.

    >>> wrapped("[ok] gpus: " + "word " * 30, width=40)[:2]
    ['[ok] gpus: word word word word word word', '    word word word word word word word']
    """
    return textwrap.wrap(text, max(width, len(indent) + 20), subsequent_indent=indent, **_WHOLE_WORDS) or [""]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help at most :data:`WIDTH` wide, usage too, never broken at a hyphen, no :data:`HIDDEN_ALIASES`."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ) -> None:
        columns = width if width is not None else shutil.get_terminal_size().columns - 2
        super().__init__(prog, indent_increment, max_help_position, min(columns, WIDTH))

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown_names = [name for name in action.option_strings if name not in HIDDEN_ALIASES]
        if len(shown_names) == len(action.option_strings):
            return super()._format_action_invocation(action)
        return super()._format_action_invocation(
            argparse.Action(shown_names, action.dest, action.nargs, metavar=action.metavar)
        )

    def _format_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None,
    ) -> str:
        if usage is None:
            return super()._format_usage(usage, actions, groups, prefix)
        lead = "usage: " if prefix is None else prefix
        indent = " " * (len(lead) + len(self._prog) + 1)
        lines = textwrap.wrap(usage, self._width, initial_indent=lead, subsequent_indent=indent, **_WHOLE_WORDS)
        return "\n".join(lines) + "\n\n"

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, **_WHOLE_WORDS)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent, **_WHOLE_WORDS
        )


SHOWN_DETAIL = 500
"""How much of an unexpected exception's text its one line repeats."""


class UsageError(Explained):
    """A command line that parses but cannot be carried out (exit status 2)."""


class CommandError(MpiEnvError):
    """The command to run could not be started (exit status 126 or 127)."""


class InternalError(MpiEnvError):
    """An exception this command line did not expect: a bug, said in one line (``--debug`` shows the traceback)."""


class SystemRefusal(MpiEnvError):
    """The operating system refused what a command asked of it (a path, a folder, a process): exit status 1."""


def explained_error(error: Exception, command: str) -> Explained:
    """``error`` as one of ours: an operating system's refusal names its path; anything else is a bug of ours.

    ``command`` is the subcommand that met it.
    """
    if isinstance(error, Explained):
        return error
    if isinstance(error, OSError):
        path = f" ({shown(str(error.filename))})" if error.filename is not None else ""
        return SystemRefusal(
            f"{command}: the system refused: {error.strerror or error}{path}.",
            "Check that the path exists, is of the kind asked for (a folder, a file, a program) and that you may "
            "use it.",
            value=None if error.filename is None else str(error.filename),
        )
    return InternalError(
        f"{command} failed unexpectedly: {type(error).__name__}: {str(error)[:SHOWN_DETAIL]}",
        f"Run it again with --debug for the traceback, and report it to {PROG}'s issue tracker.",
    )


class OutputError(MpiEnvError):
    """Standard output cannot be written (closed, a full disk, a file it may not write): exit status 1."""


def emit(lines: str | Sequence[str], *, stderr: bool = False) -> None:
    """Print ``lines`` (one line, or several), each with its characters that are not printable escaped, in one write.

    One write: under ``mpirun`` the ranks share the output, and ``print()`` writes the newline apart when Python runs
    unbuffered, so two ranks' lines could merge. Escaped: a name or value echoed with a line break or a terminal
    escape must not forge or overwrite another line. Text the stream's encoding cannot hold (a variable's bytes that
    are not UTF-8) is escaped too, never an error.

    Raises:
        OutputError: Standard output is closed or cannot be written (a failing standard error is let be: there is
            nowhere left to say so). A reader gone away (``| head``) stays a ``BrokenPipeError``.
    """
    stream = sys.stderr if stderr else sys.stdout
    text = "\n".join(escaped(line) for line in ([lines] if isinstance(lines, str) else lines)) + "\n"
    if stream is None:  # started with the descriptor closed (`>&-`)
        if stderr:
            return
        raise OutputError(
            "standard output is closed: the result has nowhere to go.",
            "Run it with its output open (a terminal, a pipe or a file): drop the `>&-`.",
            variable="stdout",
        )
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        print(text.encode(encoding, "backslashreplace").decode(encoding), end="", file=stream, flush=True)
    except BrokenPipeError:
        if not stderr:
            raise
    except OSError as error:
        if not stderr:
            quiet_stdout()
            raise OutputError(
                f"cannot write the output to standard output: {error.strerror or error}.",
                "Send it where it can be written: a file on a disk with room, a pipe, or the terminal.",
                variable="stdout",
            ) from error


def quiet_stdout() -> None:
    """Point standard output at ``/dev/null``: what is left in its buffer must not fail again when Python exits."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing to do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def one_line_json(data: Mapping[str, object]) -> str:
    """``data`` as one line of JSON: under ``mpirun`` every rank writes one object to the shared output."""
    return json.dumps(data, separators=(", ", ": "), default=str)


def explained(item: Explained) -> dict[str, object]:
    """An error or a warning as data: its class, the problem, the fix, and the variable, value and launcher."""
    return {
        "kind": type(item).__name__,
        "problem": item.problem,
        "hint": item.hint,
        "variable": item.variable,
        "value": item.value,
        "launcher": item.launcher,
    }


def error_object(item: Explained) -> dict[str, object]:
    """The JSON object of a command that failed with ``item``."""
    return {"ok": False, "error": explained(item)}


def mark(value: object, exact: bool) -> str:
    """A value as text, with ``~`` when it is approximate; ``?`` when unknown.

    >>> mark(2, True), mark(2, False), mark(None, False)
    ('2', '2~', '?')
    """
    if value is None:
        return "?"
    return f"{value}{'' if exact else '~'}"


SHOWN_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ranks", ("rank", "world_size", "local_rank", "local_size")),
    ("nodes", ("node_rank", "num_nodes")),
    ("rendezvous", ("main_address", "main_port")),
)
"""The layout's fields under their headings, as ``show`` prints them."""


def layout_object(layout: RankLayout) -> dict[str, object]:
    """``show --json``: the layout, the Trainer arguments, whether the node rank and count are exact, the warnings."""
    return {
        "ok": True,
        **layout.as_dict(),
        "node_rank_exact": layout.node_rank_is_exact,
        "num_nodes_exact": layout.num_nodes_is_exact,
        "warnings": [explained(warning) for warning in layout.warnings],
    }


def layout_lines(layout: RankLayout, host: str, width: int = WIDTH) -> list[str]:
    """``show`` as text: a heading per topic, then ``name=value (source)``, one a line; ``~`` explained; ``width``."""
    exact = {"node_rank": layout.node_rank_is_exact, "num_nodes": layout.num_nodes_is_exact}
    lines = [f"launch: {layout.launcher_name}, {layout.placement.value}, on host {host}"]
    for heading, names in SHOWN_GROUPS:
        lines.append(f"{heading}:")
        lines.extend(
            f"  {name}={mark(getattr(layout, name), exact.get(name, True))} ({layout.sources.get(name, '?')})"
            for name in names
        )
    lines += ["trainer:", *wrapped(f"  {layout.trainer_kwargs()}", width, indent="    ")]
    if not all(exact.values()):
        lines += wrapped(APPROXIMATE, width, indent="  ")
    return lines


def layout_summary(layout: RankLayout) -> str:
    """The layout in one line for ``doctor``: its ``repr``, and what ``~`` means when it shows one."""
    text = repr(layout)
    return f"{text}; {APPROXIMATE}" if "~" in text else text
