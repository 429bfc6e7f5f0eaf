"""How each ``mpirun``/``mpiexec`` reads its options: one row per family of the launcher grammar (:mod:`.options`).

Each row follows its launcher's own parser: Open MPI 5's ``ompioptions[]`` and ``parse_cli`` of PRRTE's
``src/mca/schizo/ompi/schizo_ompi.c`` (``-n4`` is the unknown ``--n4``), after ``prte.c``'s renames; MPICH's
``HYD_mpiexec_match_table`` of ``src/pm/hydra/mpiexec/options.c`` (``match_arg``); Intel MPI's Developer Reference,
"Global/Local Hydra Options".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.supervise.options import Grammar, Option, Problem, Syntax, arities


class Role(enum.Enum):
    """What an option means to the relaunch; options without a role are kept as they are."""

    HOSTS = "a list of hosts"
    HOST_FILE = "a file of hosts"
    HOST_NAME_FILE = "a file of host names whose counts the launcher ignores (Intel MPI's -f/-hostfile)"
    HOST_RANGES = "hosts in Slurm's range syntax (Intel MPI's -hosts-group)"
    WORLD = "the number of processes"
    PER_NODE = "processes per node"
    ONE_PER_NODE = "one process per node"
    MAP_BY = "Open MPI's mapping policy (ppr:N:node gives processes per node)"
    PPR = "Open MPI's deprecated --ppr N:node"
    REFUSED = "an option the relaunch cannot keep"


@dataclass(frozen=True, kw_only=True)
class Family(Grammar):
    """One ``mpirun`` family: its grammar's row, and how the relaunch names its hosts."""

    key: str
    """``openmpi``, ``mpich``, ``intelmpi``."""
    roles: Mapping[str, Role]
    host_file_option: str
    """The option the relaunch names its host file with."""
    world_option: str
    """The option the relaunch gives the number of processes with."""
    host_list_option: str
    """The option that names hosts on the line (the health probe's one host)."""
    host_line: str
    """One host of the relaunch's host file: ``{name}`` and ``{slots}``."""
    set_variable: tuple[str, ...]
    """The words that give every rank a variable: ``{name}`` and ``{value}`` (``-x NAME=VALUE``, ``-genv NAME
    VALUE``); the relaunch names rank 0's host with them (``MASTER_ADDR``)."""
    version_mark: str
    """What ``<launcher> --version`` prints for this family, and no other."""
    refused_hint: Mapping[str, str]
    """Why a :attr:`Role.REFUSED` option is refused, and what to do instead."""

    def refuse(self, option: Option) -> None:
        """Refuse an option that fixes where ranks run, or that makes the line several programs."""
        if self.roles.get(option.name) is Role.REFUSED:
            raise MpirunLineError(
                f"{self.name} option {option.spelled} cannot be relaunched on other hosts: "
                f"{self.refused_hint.get(option.name, 'it fixes where the ranks run')}.",
                "Take it out of the line, or run this step without the supervisor.",
                variable=option.spelled,
                launcher=self.name,
            )


_UNKNOWN = "so it cannot tell whether the next word is its value or the program."
_ATTACH = "Write it with its value attached (--name=VALUE), or report the option so that it joins the table."
_TEXTS = {
    Problem.NO_PROGRAM: (
        "The {name} line {line} names no program to run.",
        "End it with the program: mpirun [OPTIONS] python train.py.",
    ),
    Problem.SEVERAL: (
        "The {name} line runs several programs (separated by ':', MPMD), which the supervisor cannot relaunch.",
        "Run one program per line, or run this step without the supervisor.",
    ),
    Problem.UNKNOWN: (
        "{name} option {shown} is unknown to the supervisor (it is not in the table the supervisor reads {name} "
        f"lines by), {_UNKNOWN}",
        _ATTACH,
    ),
    Problem.UNKNOWN_SHORT: (
        f"{{name}} option {{whole}} is unknown to the supervisor ({{word}} is not one of Open MPI's one-letter "
        f"options), {_UNKNOWN}",
        _ATTACH,
    ),
    Problem.AMBIGUOUS: ("{name} option {shown} is ambiguous: it abbreviates {first}.", "Spell the option out."),
    Problem.NEEDS: (
        "{name} option {shown} needs {arity}, and the line ends there.",
        "Give it its value(s), then the program: {word} VALUE python train.py.",
    ),
    Problem.NO_VALUE: ("{name} option {shown} takes no value.", "Write --{option} alone."),
}
_HYDRA_TEXTS = _TEXTS | {
    Problem.NO_VALUE: (
        "{name} option {shown} takes no value: Hydra would run {value} as the program.",
        "Write -{option} alone.",
    ),
    Problem.NO_DASHES: (
        "{name} has no {shown} option (Hydra reads '--' as an unknown one).",
        "Leave it out: the program starts at the first word that is not an option.",
    ),
}

OPEN_MPI_LINE = Family(
    key="openmpi",
    name="Open MPI 5",
    launcher="Open MPI 5",
    syntax=Syntax.PRRTE,
    error=MpirunLineError,
    texts=MappingProxyType(_TEXTS),
    options=MappingProxyType(
        arities(
            ONE=(
                "report-pid report-uri personality dvm tune launch-agent max-vm-size tmpdir prefix forward-signals "
                "xterm timeout spawn-timeout np n N app output stdin preload-files x unset-env "
                "wdir wd path pset hostfile machinefile default-hostfile host memory-alloc-kinds gpu-support "
                "app-pmix-prefix mapby rankby bindto display rtos max-restarts with-ft initial-errhandler arch file "
                "output-directory output-filename display-topo cpu-set cpu-list cpus-per-proc cpus-per-rank npernode "
                "npersocket ppr am rankfile stream-buffering"
            ),
            OPTIONAL="help fwd-environment output-proctable",
            NONE=(
                "version verbose parseable parsable debug-daemons debug-daemons-file leave-session-attached noprefix "
                "allow-run-as-root report-child-jobs-separately hetero-nodes stop-on-exec stop-in-init stop-in-app "
                "report-state-on-timeout get-stack-traces no-aggregate-help preload-binary show-progress "
                "no-app-prefix do-not-launch enable-recovery disable-recovery continuous display-comm "
                "display-comm-finalize soft xml tag-output timestamp-output merge-stderr-to-stdout display-devel-map "
                "report-bindings display-map display-allocation nolocal oversubscribe nooversubscribe "
                "use-hwthread-cpus bind-to-core bynode bycore byslot pernode debug"
            ),
            # --prepend-env and --append-env take two words too (pmix_cmd_line_parse: "there can be three entries").
            TWO="mca gmca omca gomca prtemca pmixmca amca prepend-env append-env",
        )
    ),
    shorts=MappingProxyType(
        {"h": "help", "V": "version", "v": "verbose", "p": "parseable", "n": "np", "c": "np", "N": "N"}
        | {"s": "preload-binary", "x": "x", "H": "host"}
    ),
    renamed=MappingProxyType(
        {"--map-by": "--mapby", "--rank-by": "--rankby", "--bind-to": "--bindto", "--runtime-options": "--rtos"}
    ),
    roles=MappingProxyType(
        {"host": Role.HOSTS, "hostfile": Role.HOST_FILE, "machinefile": Role.HOST_FILE}
        | {"default-hostfile": Role.HOST_FILE, "np": Role.WORLD, "n": Role.WORLD, "N": Role.PER_NODE}
        | {"npernode": Role.PER_NODE, "pernode": Role.ONE_PER_NODE, "mapby": Role.MAP_BY, "ppr": Role.PPR}
        | dict.fromkeys(("rankfile", "app", "dvm"), Role.REFUSED)
    ),
    host_file_option="--hostfile",
    world_option="-np",
    host_list_option="--host",
    host_line="{name} slots={slots}\n",
    set_variable=("-x", "{name}={value}"),
    version_mark="(Open MPI)",
    refused_hint=MappingProxyType(
        {
            "rankfile": "a rank file places each rank on a named host, which the relaunch cannot move: place ranks "
            "with --map-by ppr:N:node instead",
            "app": "an application context file is several programs in one job (MPMD), which the supervisor does "
            "not relaunch: run one program per line",
            "dvm": "a persistent DVM keeps its own hosts: launch the step with its own mpirun",
        }
    ),
)
"""Open MPI 5's ``mpirun``/``mpiexec`` (PRRTE 3.0.14, ``ompioptions[]``)."""

_HYDRA_COMMON = arities(
    ONE=(
        "genvlist f hostfile machinefile host hosts hostlist ppn prepend-pattern outfile-pattern errfile-pattern "
        "outfile errfile wdir configfile envlist n np launcher launcher-exec bootstrap bootstrap-exec rmk binding "
        "bind-to map-by membind demux iface localhost nameserver usize"
    ),
    NONE=(
        "help h genvnone genvall prepend-rank l envnone envall enable-x disable-x profile debug "
        "disable-auto-cleanup enable-auto-cleanup info print-all-exitcodes v verbose version"
    ),
    PAIR="genv env",
)
"""What MPICH's and Intel MPI's Hydra share (MPICH's options.c, and Intel MPI's Developer Reference)."""

_HYDRA_ROLES = (
    {name: Role.HOSTS for name in ("host", "hosts", "hostlist")}
    | {name: Role.HOST_FILE for name in ("f", "hostfile", "machinefile")}
    | {"n": Role.WORLD, "np": Role.WORLD, "ppn": Role.PER_NODE, "configfile": Role.REFUSED}
)

_HYDRA_REFUSED = {
    "configfile": "a configuration file holds the whole command line, often several programs (MPMD): put the "
    "options on the line",
    "rankmap": "a rank map places each rank on a named host, which the relaunch cannot move: use -ppn instead",
}

MPICH_LINE = Family(
    key="mpich",
    name="MPICH (Hydra)",
    launcher="MPICH (Hydra)",
    syntax=Syntax.HYDRA,
    error=MpirunLineError,
    texts=MappingProxyType(_HYDRA_TEXTS),
    options=MappingProxyType(
        _HYDRA_COMMON
        | arities(
            ONE=(
                "machine machines machinelist rankmap output-from memory-alloc-kinds topolib g gpus-per-proc "
                "gpu-subdevs-per-proc order-nodes"
            ),
            NONE=(
                "report-bindings disable-hostname-propagation enable-hostname-propagation hybrid-hosts pmi-port "
                "skip-launch-node"
            ),
        )
    ),
    shorts=MappingProxyType({}),
    roles=MappingProxyType(
        _HYDRA_ROLES | {name: Role.HOSTS for name in ("machine", "machines", "machinelist")} | {"rankmap": Role.REFUSED}
    ),
    case_sensitive=False,
    host_file_option="-machinefile",
    world_option="-n",
    host_list_option="-hosts",
    host_line="{name}:{slots}\n",
    set_variable=("-genv", "{name}", "{value}"),
    version_mark="HYDRA build details",
    refused_hint=MappingProxyType(_HYDRA_REFUSED),
)
"""MPICH's ``mpiexec`` (Hydra, ``HYD_mpiexec_match_table`` of MPICH 5.0; MVAPICH's is the same Hydra)."""

INTEL_MPI_LINE = replace(
    MPICH_LINE,
    key="intelmpi",
    name="Intel MPI (Hydra)",
    launcher="Intel MPI (Hydra)",
    options=MappingProxyType(
        _HYDRA_COMMON
        | arities(
            ONE=(
                "tune machine hosts-group genvexcl envexcl branch-count gwdir gpath path s tmpdir perhost grr "
                "bootstrap-exec-args cpu-bind"
            ),
            NONE="silent-abort nolocal noconf ordered-output cleanup V print-rank-map rr prot prepend-timestamp",
        )
    ),
    # The Developer Reference: -hostfile "If a host name is repeated, this name is used only once"; -machinefile
    # "control process placement through a machine file" (host:N), the relaunch's host file.
    roles=MappingProxyType(
        _HYDRA_ROLES
        | {"f": Role.HOST_NAME_FILE, "hostfile": Role.HOST_NAME_FILE}
        | {"machine": Role.HOST_FILE, "hosts-group": Role.HOST_RANGES}
        | {"perhost": Role.PER_NODE, "grr": Role.PER_NODE, "rr": Role.ONE_PER_NODE}
    ),
    case_sensitive=True,
    version_mark="Intel(R) MPI Library",
)
"""Intel MPI's ``mpiexec``/``mpiexec.hydra``/``mpirun`` (2021)."""

FAMILIES: tuple[Family, ...] = (OPEN_MPI_LINE, MPICH_LINE, INTEL_MPI_LINE)
"""Every family the supervisor relaunches, in the order :func:`family_of_version` tries them."""

LAUNCHER_NAMES = frozenset({"mpirun", "mpiexec", "mpiexec.hydra"})
"""The program names of the lines read here (``prterun`` is PRRTE's own personality, not read here)."""


def family_by_key(key: str) -> Family:
    """The family ``openmpi``, ``mpich`` or ``intelmpi``.

    Raises:
        KeyError: Another key.
    """
    for family in FAMILIES:
        if family.key == key:
            return family
    raise KeyError(key)


def family_of_version(text: str) -> Family | None:
    """The family whose ``--version`` output ``text`` is, or ``None``."""
    for family in FAMILIES:
        if family.version_mark in text:
            return family
    return None


def open_mpi_major(text: str) -> int | None:
    """The major version in Open MPI's ``mpirun (Open MPI) 5.0.11``, or ``None``."""
    _, mark, rest = text.partition(OPEN_MPI_LINE.version_mark)
    words = rest.split()
    major = words[0].split(".")[0] if mark and words else ""
    return int(major) if major.isascii() and major.isdigit() and len(major) < 4 else None
