"""The user's ``srun`` line, read the way ``srun`` reads it (srun(1)), and the same line with failed hosts excluded.

The options end at the first word that is not an option (or at ``--``): ``python train.py -x 3`` keeps its ``-x``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.core.hostlist import expand_nodelist
from lightning_mpi_env.supervise.options import Arity, Grammar, Option, Problem, Syntax, arities, parse_options


class SrunLineError(MpiEnvError, ValueError):
    """The command after ``lightning-mpi-env run --`` is not an ``srun`` line this supervisor can relaunch."""


_REQUIRED_LONG = (
    "accel-bind account acctg-freq bb bbf bcast-exclude begin chdir cluster-constraint clusters comment constraint "
    "container core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
    "dependency distribution epilog error exclude export extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node "
    "gpus-per-socket gpus-per-task gres gres-flags het-group hint input job-name jobid licenses mail-type mail-user "
    "mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus mpi msg-timeout network nodefile nodelist nodes ntasks "
    "ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output partition power prefer "
    "priority profile prolog qos relative reservation signal slurmd-debug sockets-per-node switches task-epilog "
    "task-prolog thread-spec threads threads-per-core time time-min tmp uid wait wckey"
)
_OPTIONAL_LONG = "bcast compress exclusive immediate kill-on-bad-exit nice no-kill propagate resv-ports send-libs x11"
_FLAG_LONG = (
    "contiguous disable-status exact help hold label multi-prog no-allocate overcommit overlap oversubscribe "
    "preserve-env pty quiet quit-on-interrupt reboot spread-job test-only unbuffered usage use-min-nodes verbose "
    "version"
)

SRUN_OPTIONS: dict[str, Arity] = arities(ONE=_REQUIRED_LONG, OPTIONAL=_OPTIONAL_LONG, NONE=_FLAG_LONG)
"""Every long option of srun(1) (Slurm 22.05), with its arity."""

SHORT_OPTIONS: dict[str, str] = {
    "A": "account", "B": "extra-node-info", "C": "constraint", "D": "chdir", "E": "preserve-env", "F": "nodefile",
    "G": "gpus", "H": "hold", "I": "immediate", "J": "job-name", "K": "kill-on-bad-exit", "L": "licenses",
    "M": "clusters", "N": "nodes", "O": "overcommit", "Q": "quiet", "S": "core-spec", "T": "threads", "V": "version",
    "W": "wait", "X": "disable-status", "Z": "no-allocate", "b": "begin", "c": "cpus-per-task", "d": "dependency",
    "e": "error", "h": "help", "i": "input", "k": "no-kill", "l": "label", "m": "distribution", "n": "ntasks",
    "o": "output", "p": "partition", "q": "qos", "r": "relative", "s": "oversubscribe", "t": "time", "u": "unbuffered",
    "v": "verbose", "w": "nodelist", "x": "exclude",
}  # fmt: skip
"""Each short option of srun(1) and the long option it spells; its arity is the long one's."""


_KNOWN = "is not in srun(1) as the supervisor knows it (Slurm 22.05)"
SRUN_LINE = Grammar(
    name="srun",
    options=MappingProxyType(SRUN_OPTIONS),
    shorts=MappingProxyType(SHORT_OPTIONS),
    syntax=Syntax.GETOPT,
    error=SrunLineError,
    texts=MappingProxyType(
        {
            Problem.NO_PROGRAM: (
                "The srun line {whole} names no program to run.",
                "End it with the program: srun [OPTIONS] python train.py.",
            ),
            Problem.SEVERAL: (
                "The srun line is a heterogeneous step (components separated by ':'), which the supervisor cannot "
                "relaunch yet.",
                "Run one component per srun line, or run the heterogeneous step without the supervisor.",
            ),
            Problem.UNKNOWN: (
                f"srun option {{word}} {_KNOWN}, so it cannot tell whether the next word is its value or the program.",
                "Write it with its value attached: {word}=VALUE (or, for an option without a value, report it).",
            ),
            Problem.UNKNOWN_SHORT: (
                f"srun option {{word}} (in {{whole}}) {_KNOWN}.",
                "Use the option's long form with its value attached (--name=VALUE).",
            ),
            Problem.AMBIGUOUS: ("srun option {word} is ambiguous: it abbreviates {every}.", "Spell the option out."),
            Problem.NEEDS: (
                "srun option {word} needs a value, and the line ends there.",
                "Give it one: {word} VALUE, then the program.",
            ),
        }
    ),
)
"""srun's row of the launcher grammar (:mod:`.options`)."""


@dataclass(frozen=True)
class SrunLine:
    """A parsed ``srun`` line: its options, and where the program starts."""

    words: tuple[str, ...]
    options: tuple[Option, ...]
    program: int
    """Index of the program's first word (after ``--`` where the line has one)."""

    @classmethod
    def parse(cls, words: Sequence[str]) -> SrunLine:
        """Read ``words`` (``srun ... program args``) as srun does.

        Raises:
            SrunLineError: The line is not ``srun`` with a program, an option is unknown or ambiguous, or the line
                is a heterogeneous step (``:`` between components).
        """
        if not words or os.path.basename(words[0]) != "srun":
            first = words[0] if words else "nothing"
            raise SrunLineError(
                f"The command to run and relaunch is {first!r}, not srun, mpirun or mpiexec.",
                "Give the job step as you would in the batch script: lightning-mpi-env run -- srun [OPTIONS] "
                "python train.py.",
                value=first,
            )
        options, index = parse_options(words, SRUN_LINE)
        return cls(tuple(words), tuple(options), index)

    def values(self, name: str) -> list[str]:
        """The values of every occurrence of the long option ``name`` (``exclude``), in order."""
        return [option.value for option in self.options if option.name == name and option.value is not None]

    def excluded(self) -> list[str]:
        """The hosts the line excludes already (every ``-x``/``--exclude``, expanded), each once.

        Raises:
            SrunLineError: An exclusion given as a file (srun(1): a value with a ``/`` is a file name).
            LayoutError: A host list that is not in Slurm's syntax.
        """
        return self._hosts("exclude")

    def chosen(self) -> list[str]:
        """The hosts the line asks for by name (every ``-w``/``--nodelist``, expanded), each once.

        Raises:
            SrunLineError: A node list given as a file.
            LayoutError: A host list that is not in Slurm's syntax.
        """
        return self._hosts("nodelist")

    def _hosts(self, name: str) -> list[str]:
        hosts: list[str] = []
        for value in self.values(name):
            if "/" in value:
                raise SrunLineError(
                    f"srun --{name}={value} names a file of hosts (srun(1): a value with '/' is a file name); the "
                    "supervisor merges host lists, not files.",
                    f"Put the hosts on the line: --{name}=node[3-4].",
                    variable=f"srun --{name}",
                    value=value,
                )
            hosts.extend(expand_nodelist(value, variable=f"srun --{name}"))
        return list(dict.fromkeys(hosts))

    def with_excluded(self, hosts: Iterable[str]) -> list[str]:
        """The line with ``hosts`` excluded too: one ``--exclude=`` right after ``srun``, holding the line's own."""
        return self.relaunched(hosts)

    def relaunched(self, hosts: Iterable[str], nodes: int | None = None, *, overlap: bool = False) -> list[str]:
        """The line for a relaunch: ``hosts`` excluded too, and on ``nodes`` nodes where that is given.

        The options it sets go right after ``srun``, and every occurrence of them is taken out of the rest of the
        line, so none later overrides them: ``--exclude=`` with the line's own hosts and ``hosts``; ``--nodelist=``
        without ``hosts`` (dropped when none is left: srun refuses a host both chosen and excluded); with
        ``nodes``, ``--nodes=<nodes>`` and ``--ntasks=<nodes x the line's --ntasks-per-node>``; with ``overlap``,
        ``--overlap``, as Slurm counts the CPUs of an abandoned step until it declares its hung node down.

        Raises:
            SrunLineError: ``nodes`` is given, and the line has no ``--ntasks-per-node``: its ranks per node on
                fewer nodes are unknown.

        >>> SrunLine.parse(["srun", "-w", "n[1-2]", "a"]).relaunched(["n2"])
        ['srun', '--exclude=n2', '--nodelist=n1', 'a']
        """
        excluded = list(dict.fromkeys([*self.excluded(), *hosts]))
        chosen = [host for host in self.chosen() if host not in excluded]
        changed: list[str] = [f"--exclude={','.join(excluded)}"] if excluded else []
        changed += [f"--nodelist={','.join(chosen)}"] if chosen else []
        names = {"exclude", "nodelist"}
        if nodes is not None:
            # Inside an allocation srun takes --ntasks from SLURM_NTASKS (the allocation's) when the line has none,
            # so the count is always given: the line's ranks per node, times the nodes.
            per_node = self.values("ntasks-per-node")
            if not per_node or not (per_node[-1].isascii() and per_node[-1].isdigit()):
                raise SrunLineError(
                    f"The step must run on {nodes} node(s), and its srun line gives no number of tasks per node, so "
                    "the supervisor cannot tell how many ranks fewer nodes hold.",
                    "Give the ranks per node on the line: srun --nodes=1-2 --ntasks-per-node=4 ...",
                    variable="srun --ntasks-per-node",
                    value=per_node[-1] if per_node else None,
                )
            changed += [f"--nodes={nodes}", f"--ntasks={nodes * int(per_node[-1])}"]
            names |= {"nodes", "ntasks"}
        if overlap and not any(option.name == "overlap" for option in self.options):
            changed.append("--overlap")
        taken = {option.start: option for option in self.options if option.name in names}
        kept: list[str] = []
        index = 0
        while index < len(self.words):
            option = taken.get(index)
            if option is None:
                kept.append(self.words[index])
                index += 1
                continue
            kept.extend([option.flags] if option.flags else [])
            index = option.stop
        return [kept[0], *changed, *kept[1:]]

    def nodes(self) -> tuple[int, int] | None:
        """The node count the line asks for (srun(1): ``-N, --nodes=<minnodes>[-maxnodes]``), the last one given.

        Raises:
            SrunLineError: A value that is not a count or a range of counts.
        """
        given = self.values("nodes")
        if not given:
            return None
        low, _, high = given[-1].partition("-")
        if not (low.isascii() and low.isdigit() and (not high or (high.isascii() and high.isdigit()))):
            raise SrunLineError(
                f"srun --nodes={given[-1]} is not a node count or a range of them as the supervisor reads it.",
                "Give the step's node count as --nodes=N or --nodes=MIN-MAX.",
                variable="srun --nodes",
                value=given[-1],
            )
        return int(low), int(high or low)
