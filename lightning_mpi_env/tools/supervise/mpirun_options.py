"""How each ``mpirun``/``mpiexec`` reads its options: one row per launcher family, with its option table.

Three families, each read the way its own parser reads a line:

- **Open MPI 5** (``mpirun``/``mpiexec``, PRRTE 3.0's ``ompi`` personality): the table is ``ompioptions[]`` of
  ``src/mca/schizo/ompi/schizo_ompi.c`` (openpmix/prrte v3.0.14, the PRRTE of Open MPI 5.0.11), parsed by
  ``getopt_long`` in openpmix's ``pmix_cmd_line_parse``. Before it: ``prte.c`` renames the exact words ``--map-by``,
  ``--rank-by``, ``--bind-to``, ``--runtime-options`` to ``--mapby`` ..., and ``schizo_ompi.c``'s ``parse_cli``
  turns every single-dash word longer than two characters into a double-dash one (``-np`` is ``--np``; so ``-n4``
  is the unknown ``--n4``: no clustered or attached short options) and takes any option ending in ``mca`` with the
  next two words (``--mca NAME VALUE``). Long options take ``=value`` or the next word, and any unambiguous prefix.
- **MPICH** (Hydra's ``mpiexec``): ``HYD_mpiexec_match_table`` of ``src/pm/hydra/mpiexec/options.c`` (MPICH 5.0),
  matched by ``match_arg`` in ``src/pm/hydra/lib/utils/args.c``: every leading dash is dropped, ``name=value`` is
  the option and its value, names are compared exactly but case aside (``strcasecmp``), no prefixes, no ``--``.
- **Intel MPI** (its own Hydra, ``i_hydra``; closed source): the "Global/Local Hydra Options" of the Intel MPI
  Library Developer Reference (2021); the same syntax as MPICH's, but case-sensitive (``-NP`` is refused).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Arity(enum.Enum):
    """How many words an option takes after its name."""

    NONE = "a flag"
    ONE = "one value: attached with '=', or the next word"
    OPTIONAL = "a value attached with '=' only"
    TWO = "two values, the next two words (Open MPI's --mca NAME VALUE, --prepend-env NAME VALUE)"
    PAIR = "NAME=VALUE in one word, or NAME VALUE in two (Hydra's -genv)"


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


@dataclass(frozen=True)
class Family:
    """One launcher family: how its parser reads a line, and how the relaunch names its hosts."""

    key: str
    """``openmpi``, ``mpich``, ``intelmpi``."""
    name: str
    """For messages: ``Open MPI 5``."""
    options: Mapping[str, Arity]
    """Every option, by its name as the parser matches it (no dashes)."""
    shorts: Mapping[str, str]
    """Open MPI's one-letter options and the long option each is; empty for Hydra, whose short names are options."""
    renamed: Mapping[str, str]
    """Whole words renamed before parsing (Open MPI's ``--map-by`` is ``--mapby``)."""
    roles: Mapping[str, Role]
    hydra: bool
    """Hydra's syntax (any dashes, ``name=value``, exact names) rather than Open MPI's (``getopt_long``)."""
    case_sensitive: bool
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


def _table(**arities: str) -> dict[str, Arity]:
    """``NONE="a b"`` -> ``{"a": Arity.NONE, "b": Arity.NONE}``."""
    return {name: Arity[arity] for arity, names in arities.items() for name in names.split()}


OPEN_MPI = Family(
    key="openmpi",
    name="Open MPI 5",
    options=MappingProxyType(
        _table(
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
    hydra=False,
    case_sensitive=True,
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

_HYDRA_COMMON = _table(
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

MPICH = Family(
    key="mpich",
    name="MPICH (Hydra)",
    options=MappingProxyType(
        _HYDRA_COMMON
        | _table(
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
    renamed=MappingProxyType({}),
    roles=MappingProxyType(
        _HYDRA_ROLES | {name: Role.HOSTS for name in ("machine", "machines", "machinelist")} | {"rankmap": Role.REFUSED}
    ),
    hydra=True,
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

INTEL_MPI = Family(
    key="intelmpi",
    name="Intel MPI (Hydra)",
    options=MappingProxyType(
        _HYDRA_COMMON
        | _table(
            # Intel MPI Library Developer Reference, Global and Local Hydra Options (2021).
            ONE=(
                "tune machine hosts-group genvexcl envexcl branch-count gwdir gpath path s tmpdir perhost grr "
                "bootstrap-exec-args cpu-bind"
            ),
            NONE="silent-abort nolocal noconf ordered-output cleanup V print-rank-map rr prot prepend-timestamp",
        )
    ),
    shorts=MappingProxyType({}),
    renamed=MappingProxyType({}),
    roles=MappingProxyType(
        _HYDRA_ROLES
        | {"f": Role.HOST_NAME_FILE, "hostfile": Role.HOST_NAME_FILE}
        | {"machine": Role.HOST_FILE, "hosts-group": Role.HOST_RANGES}
        | {"perhost": Role.PER_NODE, "grr": Role.PER_NODE, "rr": Role.ONE_PER_NODE}
    ),
    hydra=True,
    case_sensitive=True,
    # The Developer Reference: -hostfile "If a host name is repeated, this name is used only once"; -machinefile
    # "control process placement through a machine file" (host:N). MPICH's -machinefile is its -f.
    host_file_option="-machinefile",
    world_option="-n",
    host_list_option="-hosts",
    host_line="{name}:{slots}\n",
    set_variable=("-genv", "{name}", "{value}"),
    version_mark="Intel(R) MPI Library",
    refused_hint=MappingProxyType(_HYDRA_REFUSED),
)
"""Intel MPI's ``mpiexec``/``mpiexec.hydra``/``mpirun`` (2021)."""

FAMILIES: tuple[Family, ...] = (OPEN_MPI, MPICH, INTEL_MPI)
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
    """The family whose ``--version`` output ``text`` is, or ``None``.

    >>> family_of_version("mpirun (Open MPI) 5.0.11").key, family_of_version("HYDRA build details:").key
    ('openmpi', 'mpich')
    """
    for family in FAMILIES:
        if family.version_mark in text:
            return family
    return None


def open_mpi_major(text: str) -> int | None:
    """The major version in Open MPI's ``mpirun (Open MPI) 5.0.11``, or ``None``.

    >>> open_mpi_major("mpirun (Open MPI) 4.1.6"), open_mpi_major("mpirun (Open MPI)")
    (4, None)
    """
    _, mark, rest = text.partition(OPEN_MPI.version_mark)
    words = rest.split()
    major = words[0].split(".")[0] if mark and words else ""
    return int(major) if major.isascii() and major.isdigit() and len(major) < 4 else None


__all__ = [
    "FAMILIES",
    "INTEL_MPI",
    "LAUNCHER_NAMES",
    "MPICH",
    "OPEN_MPI",
    "Arity",
    "Family",
    "Role",
    "family_by_key",
    "family_of_version",
    "open_mpi_major",
]
