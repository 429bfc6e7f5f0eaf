"""The ``lightning-mpi-env`` command line (also ``python -m lightning_mpi_env``).

Exit status 0 on success, 1 when the layout or a setting is wrong (one line on stderr, with a ``HINT:``; a traceback
only under ``--debug``), 2 on a usage error; under ``--json`` an error is one object too, with the same status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from lightning_mpi_env.core.errors import Explained, LayoutError, MpiEnvError
from lightning_mpi_env.core.launchers import detect_launcher
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.report import rank_prefix
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.supervise.loop import supervise
from lightning_mpi_env.supervise.policy import RestartPolicy
from lightning_mpi_env.tools.cli_output import error_object, layout_lines, layout_object, one_line_json
from lightning_mpi_env.tools.cli_parser import PROG, ArgumentsError, build_parser, wants_json
from lightning_mpi_env.tools.doctor import Level, diagnose, doctor_object
from lightning_mpi_env.tools.interop import (
    device_warnings,
    fabric_env,
    node_rank_warnings,
    torch_layout_env,
    torchrun_args,
)
from lightning_mpi_env.tools.simcluster import (
    MpirunNotFoundError,
    Signalled,
    SimulatedCluster,
    signals_raise,
)
from lightning_mpi_env.tools.simulate import simulate

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124  # as GNU `timeout` says it
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128  # a command ended by signal N exits with 128 + N, as in a shell
SHOWN_DETAIL = 500
"""How much of an unexpected exception's text its one line repeats."""


class UsageError(Explained):
    """A command line that parses but cannot be carried out (exit status 2)."""


class CommandError(MpiEnvError):
    """The command to run could not be started (exit status 126 or 127)."""


class InternalError(MpiEnvError):
    """An exception this command line did not expect: a bug, said in one line (``--debug`` shows the traceback)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv)
    try:
        args = build_parser(raise_errors=True).parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and --version (0)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    except ArgumentsError as error:
        # Said on stderr for people as argparse says it; under --json, also as data on stdout for programs.
        if as_json:
            _emit(one_line_json(error_object(UsageError(error.message, error.hint, variable=error.argument))))
        _emit(error.parser.format_usage().rstrip(), sys.stderr)
        _emit(f"{error.parser.prog}: error: {error.message}", sys.stderr)
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    command: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return command(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:
        if debug:
            raise
        status = EXIT_USAGE if isinstance(error, UsageError) else EXIT_PROBLEM
        if not isinstance(error, Explained):
            error = InternalError(
                f"{args.command} failed unexpectedly: {type(error).__name__}: {str(error)[:SHOWN_DETAIL]}",
                f"Run it again with --debug for the traceback, and report it to {PROG}'s issue tracker.",
            )
        if as_json:
            _emit(one_line_json(error_object(error)))
        if isinstance(error, UsageError):
            _emit(f"{PROG} {args.command}: error: {error.one_line()}", sys.stderr)
        else:
            _error(error)
        return status


def _emit(line: str, stream: TextIO | None = None) -> None:
    """Print one line, newline included, in one write: under ``mpirun`` the ranks share the output.

    ``print()`` writes the newline apart when Python runs unbuffered, so two ranks' lines could merge.
    """
    stream = stream or sys.stdout
    # Text the stream's encoding cannot hold (a variable's bytes that are not UTF-8) is escaped, never an error.
    encoding = getattr(stream, "encoding", None) or "utf-8"
    text = (line + "\n").encode(encoding, "backslashreplace").decode(encoding)
    print(text, end="", file=stream, flush=True)


def _error(error: Explained) -> None:
    _emit(f"{PROG}: error: {error.one_line()}", sys.stderr)


def _print_warnings(layout: RankLayout) -> None:
    for warning in layout.warnings:
        _emit(f"{PROG}: warning: {warning.one_line()}", sys.stderr)


def _show(args: argparse.Namespace) -> int:
    layout = from_env(os.environ)
    _print_warnings(layout)
    if args.json:
        _emit(one_line_json(layout_object(layout)))
        return EXIT_OK
    # Under mpirun the ranks share the output: each line says whose it is, and the block goes out in one write.
    prefix = rank_prefix(os.environ)
    _emit("\n".join(f"{prefix}{line}" for line in layout_lines(layout, socket.gethostname())))
    return EXIT_OK


def _simulate(args: argparse.Namespace) -> int:
    if args.np is not None and args.np > args.nodes * args.per_node:
        raise UsageError(
            f"--np {args.np} is more than --nodes {args.nodes} x --per-node {args.per_node} = "
            f"{args.nodes * args.per_node}.",
            "Give at most one rank per slot: raise --nodes or --per-node, or lower --np.",
            variable="--np",
            value=str(args.np),
        )
    result = simulate(
        args.launcher,
        args.nodes,
        args.per_node,
        np=args.np,
        map_by=args.map_by,
        scheduler=args.scheduler,
        strategy=args.strategy,
    )
    if args.json:
        _emit(one_line_json(result.as_dict()))
    else:
        _emit("\n".join(result.table()))
    _print_capped("warning", result.warnings, SHOWN_WARNINGS)
    _print_capped("problem", result.problems, SHOWN_PROBLEMS)
    return EXIT_OK if result.ok else EXIT_PROBLEM


SHOWN_WARNINGS = 5
SHOWN_PROBLEMS = 20


def _print_capped(kind: str, messages: Sequence[str], limit: int) -> None:
    """The first ``limit`` messages on stderr, then how many more there are (a large job repeats itself)."""
    for message in messages[:limit]:
        print(f"{PROG} simulate: {kind}: {message}", file=sys.stderr)
    if len(messages) > limit:
        print(f"{PROG} simulate: ... and {len(messages) - limit} more {kind}(s) like these.", file=sys.stderr)


def _command(args: argparse.Namespace, usage: str) -> list[str]:
    """The command after ``--`` (or after the options, without it)."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given.", f"Usage: {PROG} {args.command} {usage} -- CMD ARGS...")
    return command


def _exec(args: argparse.Namespace) -> int:
    command = _command(args, "[--overwrite]")
    environ = dict(os.environ)
    if args.overwrite:
        # Values we are told to replace must not stop the layout from resolving (stale RANK from a job script).
        launcher = detect_launcher(environ)
        owned = launcher.variables if launcher is not None else ()
        for name in (TORCH.rank, TORCH.world_size, TORCH.local_rank, TORCH.local_world_size):
            if name not in owned:
                environ.pop(name, None)
    layout = from_env(environ)
    _print_warnings(layout)
    # NODE_RANK assumed from a placement rule (said once per node, by its local rank 0); LOCAL_RANK is not the device
    # under per-task binding (said by each rank).
    assumed = node_rank_warnings(layout) if layout.local_rank == 0 else []
    for warning in [*assumed, *device_warnings(layout, environ)]:
        _emit(f"{PROG}: warning: {warning.one_line()}", sys.stderr)
    exported = {**torch_layout_env(layout), **fabric_env(environ)}
    conflicts = {name: value for name, value in exported.items() if os.environ.get(name, value) != value}
    if conflicts and not args.overwrite:
        listed = ", ".join(f"{name}={os.environ[name]!r} (resolved: {value!r})" for name, value in conflicts.items())
        resolver = layout.launcher.name if layout.launcher is not None else "the single-process layout (no launcher)"
        raise LayoutError(
            f"Refusing to overwrite {listed}, already set in the environment and different from what {resolver} gives.",
            f"Unset {' '.join(conflicts)} in the job script, or pass `exec --overwrite` to replace them.",
            variable=next(iter(conflicts)),
            value=os.environ[next(iter(conflicts))],
        )
    os.environ.update(exported)
    return _execvp(command[0], command)


def _execvp(file: str, argv: list[str]) -> int:
    """Replace this process with ``argv`` (no shell); returns only when that fails, with the shell's status."""
    try:
        os.execvp(file, argv)
    except FileNotFoundError:
        _error(CommandError(f"exec: command not found: {file!r}.", "Check the command's name and PATH on every node."))
        return EXIT_NOT_FOUND
    except PermissionError:
        _error(CommandError(f"exec: {file!r} is not executable.", "chmod +x it, or run it through its interpreter."))
        return EXIT_NOT_EXECUTABLE
    except OSError as error:
        _error(CommandError(f"exec: cannot run {file!r}: {error}.", "Check the command and its interpreter line."))
        return EXIT_NOT_EXECUTABLE
    return EXIT_OK  # not reached: execvp does not return


def _torchrun_args(args: argparse.Namespace) -> int:
    arguments = torchrun_args(os.environ, nproc_per_node=args.nproc_per_node)
    _emit(one_line_json({"ok": True, "args": arguments}) if args.json else " ".join(arguments))
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    findings = diagnose(os.environ)
    if args.json:
        try:
            rank: int | None = from_env(os.environ).rank
        except MpiEnvError:
            rank = None  # a finding says why
        _emit(one_line_json(doctor_object(findings, socket.gethostname(), rank)))
    else:
        prefix = rank_prefix(os.environ)  # under mpirun every rank prints: say whose line it is
        _emit("\n".join(f"{prefix}{finding}" for finding in findings))
    return EXIT_PROBLEM if any(finding.level is Level.ERROR for finding in findings) else EXIT_OK


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals on which ``simcluster`` ends its job before it exits: mpirun runs in a session of its own, so they reach
it only through us (``timeout`` sends SIGTERM to us alone; a closed terminal, SIGHUP)."""


def _simcluster(args: argparse.Namespace) -> int:
    command = _command(args, "[--nodes N] [--per-node P] [-x NAME=VALUE ...]")
    slots = args.nodes * args.per_node
    if args.np is not None and args.np > slots:
        raise UsageError(
            f"--np {args.np} is more than --nodes {args.nodes} x --per-node {args.per_node} = {slots}.",
            "Give at most one rank per slot: raise --nodes or --per-node, or lower --np.",
            variable="--np",
            value=str(args.np),
        )
    with tempfile.TemporaryDirectory(prefix="simcluster-") as workdir:
        cluster = SimulatedCluster.of(Path(workdir), nodes=args.nodes, per_node=args.per_node)
        # What a job script exports; the user's -x comes last and wins.
        export = {TORCH.master_addr: cluster.hosts[0], **dict(args.export)}
        try:
            with signals_raise(STOP_SIGNALS):
                completed = cluster.run(
                    command, timeout=args.timeout, np=args.np, map_by=args.map_by, export=export, capture=False
                )
        except Signalled as stop:  # the job was stopped before we got here
            _emit(f"{PROG} simcluster: stopped by {stop.name}; the job was ended.", sys.stderr)
            return EXIT_SIGNAL_BASE + stop.signum
        except MpirunNotFoundError as error:
            if args.debug:
                raise
            _error(error)
            return EXIT_NOT_FOUND  # as a shell says it of a missing command
        except subprocess.TimeoutExpired:
            _error(
                CommandError(
                    f"simcluster: the job ran past --timeout {args.timeout:g} s and was stopped.",
                    "Give it more time, or find where it waits (a rank that never arrives?).",
                    variable="--timeout",
                    value=f"{args.timeout:g}",
                )
            )
            return EXIT_TIMEOUT
        except KeyboardInterrupt:
            return EXIT_SIGNAL_BASE + signal.SIGINT  # the job was stopped before we got here
    status = completed.returncode
    return status if status >= 0 else EXIT_SIGNAL_BASE - status


def _supervise(args: argparse.Namespace) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError(
            "no job step given.",
            f"Give it after --: {PROG} run -- srun [OPTIONS] python train.py (or mpirun, mpiexec).",
        )
    policy = RestartPolicy(args.restarts, backoff=args.backoff)
    return supervise(
        command,
        policy,
        env=os.environ,
        state=args.state_dir,
        probe_timeout=args.probe_timeout,
        grace=args.grace,
        min_nodes=args.min_nodes,
    )


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "show": _show,
    "simulate": _simulate,
    "exec": _exec,
    "torchrun-args": _torchrun_args,
    "doctor": _doctor,
    "simcluster": _simcluster,
    "run": _supervise,
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
