"""The ``lightning-mpi-env`` command line (also ``python -m lightning_mpi_env``).

Exit status 0 on success, 1 when the layout, a setting or the system refuses (one line on stderr,
``lightning-mpi-env: error: ... HINT: ...``; a traceback only under ``--debug``), 2 on a usage error of any command;
under ``--json`` an error is one object too, with the same status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lightning_mpi_env.core.errors import Explained, LayoutError, MpiEnvError, SettingError
from lightning_mpi_env.core.launchers import detect_launcher
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.report import rank_prefix
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import shown
from lightning_mpi_env.supervise.loop import supervise
from lightning_mpi_env.supervise.mpirun_options import LAUNCHER_NAMES
from lightning_mpi_env.supervise.policy import RestartPolicy
from lightning_mpi_env.tools.cli_output import (
    WIDTH,
    CommandError,
    OutputError,
    SystemRefusal,
    UsageError,
    emit,
    error_object,
    explained_error,
    layout_lines,
    layout_object,
    one_line_json,
    quiet_stdout,
    wrapped,
)
from lightning_mpi_env.tools.cli_parser import (
    JSON_COMMANDS,
    PROG,
    ArgumentsError,
    build_parser,
    make_state_dir,
    wants_json,
)
from lightning_mpi_env.tools.doctor import Level, diagnose, doctor_object
from lightning_mpi_env.tools.interop import (
    device_warnings,
    fabric_env,
    node_rank_warnings,
    started_with,
    torch_layout_env,
    torchrun_args,
)
from lightning_mpi_env.tools.simcluster import (
    MAX_SLOTS,
    MpirunNotFoundError,
    Signalled,
    SimulatedCluster,
    signals_raise,
)
from lightning_mpi_env.tools.simulate import simulate
from lightning_mpi_env.tools.simulated_launch import check_size

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124  # as GNU `timeout` says it
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128  # a command ended by signal N exits with 128 + N, as in a shell


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv)
    try:
        nul = next((word for word in argv if "\0" in word), None)
        if nul is not None:  # no process gets one from a shell; main() called from Python may
            raise ArgumentsError(build_parser(), f"the argument {shown(nul)} holds a NUL character")
        args = build_parser(raise_errors=True).parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and --version (0)
        try:
            if sys.stdout is not None:
                sys.stdout.flush()
        except OSError as error:
            return _no_help(error)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    except OSError as error:  # the help could not be written
        return _no_help(error)
    except ArgumentsError as error:
        # Said on stderr for people as argparse says it; under --json, also as data on stdout for programs.
        usage = UsageError(error.message, error.hint, variable=error.argument)
        return _failed(usage, as_json, usage=error.parser.format_usage().rstrip())
    debug = bool(getattr(args, "debug", False))
    try:
        if args.json and args.command not in JSON_COMMANDS:
            raise UsageError(
                f"--json is for {', '.join(JSON_COMMANDS)}; {args.command} prints no result of its own.",
                f"Leave --json out of the {args.command} command line.",
                variable="--json",
            )
        return _COMMANDS[args.command](args)
    except BrokenPipeError:
        quiet_stdout()  # the reader went away (`| head`): stop quietly, and keep Python from complaining at exit
        return EXIT_OK
    except Exception as error:
        if debug:
            raise
        return _failed(explained_error(error, args.command), as_json)


def _no_help(error: OSError) -> int:
    quiet_stdout()
    return _failed(
        OutputError(
            f"cannot write the help to standard output: {error.strerror or error}.",
            "Send it where it can be written: a file on a disk with room, a pipe, or the terminal.",
            variable="stdout",
        )
    )


def _failed(error: Explained, as_json: bool = False, usage: str | None = None) -> int:
    """Say ``error`` (on stdout as JSON too, where asked for and possible); its exit status, 2 for a usage error."""
    if as_json and not isinstance(error, OutputError):
        try:
            emit(one_line_json(error_object(error)))
        except OutputError as unwritable:
            error = unwritable
        except BrokenPipeError:
            quiet_stdout()
    if usage is not None:
        emit(usage, stderr=True)
    _error(error)
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_PROBLEM


def _error(error: Explained) -> None:
    emit(f"{PROG}: error: {error.one_line()}", stderr=True)


def _print_warnings(layout: RankLayout) -> None:
    for warning in layout.warnings:
        emit(f"{PROG}: warning: {warning.one_line()}", stderr=True)


def _show(args: argparse.Namespace) -> int:
    layout = from_env(os.environ)
    _print_warnings(layout)
    if args.json:
        emit(one_line_json(layout_object(layout)))
        return EXIT_OK
    # Under mpirun the ranks share the output: each line says whose it is, and the block goes out in one write.
    prefix = rank_prefix(os.environ)
    emit([f"{prefix}{line}" for line in layout_lines(layout, socket.gethostname(), WIDTH - len(prefix))])
    return EXIT_OK


def _simulate(args: argparse.Namespace) -> int:
    try:
        check_size(args.nodes, args.per_node, args.nodes * args.per_node if args.np is None else args.np)
    except SettingError as error:
        raise UsageError(error.problem, error.hint, variable=error.variable, value=error.value) from None
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
        emit(one_line_json(result.as_dict()))
    else:  # the table's rows as they are; its notes (# ...) wrapped
        emit([part for line in result.table() for part in (wrapped(line, indent="#   ") if line[0] == "#" else [line])])
    _print_capped("warning", result.warnings, SHOWN_WARNINGS)
    _print_capped("problem", result.problems, SHOWN_PROBLEMS)
    return EXIT_OK if result.ok else EXIT_PROBLEM


SHOWN_WARNINGS = 5
SHOWN_PROBLEMS = 20


def _print_capped(kind: str, messages: Sequence[str], limit: int) -> None:
    """The first ``limit`` messages on stderr, then how many more there are (a large job repeats itself)."""
    lines = [part for message in messages[:limit] for part in wrapped(f"{PROG}: {kind}: {message}")]
    if len(messages) > limit:
        lines.append(f"{PROG}: ... and {len(messages) - limit} more {kind}(s) like these.")
    if lines:
        emit(lines, stderr=True)


def _command(args: argparse.Namespace, usage: str) -> list[str]:
    """The command after ``--`` (or after the options, without it)."""
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given.", f"Usage: {PROG} {args.command} {usage} -- CMD ARGS...")
    if not command[0].strip():
        raise UsageError(
            f"the command to run is {shown(command[0])}: an empty name.",
            f"Give a program after --: {PROG} {args.command} {usage} -- CMD ARGS...",
            value=command[0],
        )
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
        emit(f"{PROG}: warning: {warning.one_line()}", stderr=True)
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
    return _execvp(command[0], command, {**started_with(os.environ), **exported})


def _execvp(file: str, argv: list[str], env: Mapping[str, str]) -> int:
    """Replace this process with ``argv`` in ``env`` (no shell); returns only on failure, with the shell's status."""
    try:
        os.execvpe(file, argv, env)
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
    emit(one_line_json({"ok": True, "args": arguments}) if args.json else " ".join(arguments))
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    findings = diagnose(os.environ)
    if args.json:
        try:
            rank: int | None = from_env(os.environ).rank
        except MpiEnvError:
            rank = None  # a finding says why
        emit(one_line_json(doctor_object(findings, socket.gethostname(), rank)))
    else:
        prefix = rank_prefix(os.environ)  # under mpirun every rank prints: say whose line it is
        emit([f"{prefix}{line}" for finding in findings for line in wrapped(str(finding), WIDTH - len(prefix))])
    return EXIT_PROBLEM if any(finding.level is Level.ERROR for finding in findings) else EXIT_OK


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals on which ``simcluster`` ends its job before it exits: mpirun runs in a session of its own, so they reach
it only through us (``timeout`` sends SIGTERM to us alone; a closed terminal, SIGHUP)."""


def _simcluster(args: argparse.Namespace) -> int:
    command = _command(args, "[--nodes N] [--per-node P] [-x NAME=VALUE ...]")
    slots = args.nodes * args.per_node
    if slots > MAX_SLOTS:
        raise UsageError(
            f"--nodes {args.nodes} x --per-node {args.per_node} is more than the {MAX_SLOTS} slots (ranks) a "
            "simulated cluster runs on this machine.",
            f"Ask for at most {MAX_SLOTS} slots in all; `{PROG} simulate` checks larger launches without starting any.",
            variable="--per-node",
            value=str(args.per_node),
        )
    if args.np is not None and args.np > slots:
        raise UsageError(
            f"--np {args.np} is more than --nodes {args.nodes} x --per-node {args.per_node} = {slots}.",
            "Give at most one rank per slot: raise --nodes or --per-node, or lower --np.",
            variable="--np",
            value=str(args.np),
        )
    try:
        folder = tempfile.TemporaryDirectory(prefix="simcluster-")
    except OSError as error:
        raise SystemRefusal(
            f"simcluster cannot make its work folder in the temporary directory: {error.strerror or error}.",
            "Point TMPDIR at a folder you may write.",
            variable="TMPDIR",
            value=os.environ.get("TMPDIR"),
        ) from None
    with folder as workdir:
        cluster = SimulatedCluster.of(Path(workdir), nodes=args.nodes, per_node=args.per_node)
        # What a job script exports; the user's -x comes last and wins.
        export = {TORCH.master_addr: cluster.hosts[0], **dict(args.export)}
        try:
            with signals_raise(STOP_SIGNALS):
                completed = cluster.run(
                    command, timeout=args.timeout, np=args.np, map_by=args.map_by, export=export, capture=False
                )
        except Signalled as stop:  # the job was stopped before we got here
            emit(f"{PROG}: simcluster: stopped by {stop.name}; the job was ended.", stderr=True)
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
    step = f"Give it after --: {PROG} run -- srun [OPTIONS] python train.py (or mpirun, mpiexec)."
    if not command:
        raise UsageError("no job step given.", step)
    launcher = os.path.basename(command[0])
    if launcher not in {"srun", *LAUNCHER_NAMES}:
        raise UsageError(f"the job step starts with {shown(command[0])}, not srun, mpirun or mpiexec.", step)
    if launcher == "srun" and args.min_nodes is not None:
        raise UsageError(
            "--min-nodes is for mpirun lines; an srun line says its own range of nodes.",
            f"Write it on the srun line: srun --nodes={args.min_nodes}-N ...",
            variable="--min-nodes",
            value=str(args.min_nodes),
        )
    make_state_dir(args.state_dir)
    return supervise(
        command,
        RestartPolicy(args.restarts, backoff=args.backoff),
        env=os.environ,
        state=args.state_dir,
        probe_timeout=args.probe_timeout,
        grace=args.grace,
        min_nodes=args.min_nodes,
        leave_out_stragglers=args.leave_out_stragglers,
        say=lambda line: emit(line, stderr=True),  # the step's words echoed escaped
    )


def _demo(args: argparse.Namespace) -> int:
    from lightning_mpi_env.tools import demo  # on first use: it needs the [demo] extra's packages only when run

    return demo.main(args.args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "show": _show,
    "simulate": _simulate,
    "exec": _exec,
    "torchrun-args": _torchrun_args,
    "doctor": _doctor,
    "simcluster": _simcluster,
    "run": _supervise,
    "demo": _demo,
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
