"""The pure core: an environment read once into a frozen :class:`RankLayout`; no torch, no network, no writes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from lightning_mpi_env.core.errors import LayoutError, LayoutWarning
from lightning_mpi_env.core.launchers import (
    TORCHRUN,
    Launcher,
    detect_launcher,
    end_step_command,
    stray_rank_variables,
)
from lightning_mpi_env.core.network import apply_host_template
from lightning_mpi_env.core.placement import (
    ASSUMED_EVEN,
    Placement,
    every_rank_here,
    flux_local_size,
    guess_node,
    het_step_needs_main_address,
    launch_conflict,
    num_nodes_source,
    slurm_node_counts,
)
from lightning_mpi_env.core.ports import (
    check_host,
    given_main_address,
    main_port,
)
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.schedulers import SCHEDULERS, first_host
from lightning_mpi_env.core.settings import VARIABLE, host_template
from lightning_mpi_env.core.state_files import read_host_file
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import (
    MAX_LOCAL_SIZE,
    MAX_WORLD_SIZE,
    SHOWN_CHARACTERS,
    as_count,
    parse_count,
    shown,
)

STALE_TORCH_VARIABLES: tuple[tuple[str, str], ...] = (
    (TORCH.rank, "rank"),
    (TORCH.world_size, "world_size"),
    (TORCH.local_rank, "local_rank"),
    (TORCH.local_world_size, "local_size"),
)
"""torchrun-style variables that must agree with the launcher when both are present."""

LOOPBACK_ADDRESS = "127.0.0.1"


def from_env(
    env: Mapping[str, str],
    *,
    read_text: Callable[[str], str] | None = None,
) -> RankLayout:
    """Resolve this process's layout from its environment, in one pass (``read_text`` reads host files).

    Raises:
        LayoutError: If a variable is malformed, missing, contradictory or stale, or only part of a launch's is set.
    """
    launcher = detect_launcher(env)
    if launcher is None:
        _refuse_torch_variables_without_torchrun(env)
        _refuse_stray_rank_variables(env)
        return _single_process(env)
    return _LayoutParser(env, launcher, read_text or read_host_file).parse()


SINGLE_PROCESS_TORCH_VALUES: Mapping[str, str] = MappingProxyType(
    {TORCH.rank: "0", TORCH.world_size: "1", TORCH.local_rank: "0", TORCH.local_world_size: "1"}
)
"""torchrun's variables as a single process would have them: set alone, they agree with rank 0 of 1."""


def _refuse_torch_variables_without_torchrun(env: Mapping[str, str]) -> None:
    # RANK is the sign of a torchrun-style launch: Lightning's own workers set LOCAL_RANK and WORLD_SIZE, never RANK.
    if TORCH.rank not in env:
        return
    disagreeing = [name for name, single in SINGLE_PROCESS_TORCH_VALUES.items() if env.get(name, single) != single]
    if not disagreeing:
        return
    names = [name for name in SINGLE_PROCESS_TORCH_VALUES if name in env]
    present = ", ".join(f"{name}={shown(env[name])}" for name in names)
    raise LayoutError(
        f"{present} {'are' if len(names) > 1 else 'is'} set, as torchrun sets them, but {TORCHRUN.marker} is not "
        f"(torchrun's own variable) and no MPI launcher or `srun` started this process. As a single process it "
        f"would be rank 0 of 1 and train alone, and `torch_env()`/`exec` would overwrite them.",
        f"{TORCHRUN.launch_hint} Under `mpirun`/`srun`, let them set the ranks and do not export "
        f"{'/'.join(disagreeing)} in the job script (`unset {' '.join(disagreeing)}`).",
        variable=disagreeing[0],
        value=env[disagreeing[0]][:SHOWN_CHARACTERS],
        launcher=TORCHRUN.name,
    )


def _refuse_stray_rank_variables(env: Mapping[str, str]) -> None:
    stray = stray_rank_variables(env)
    if not stray:
        return
    variable, row = stray[0]
    present = [f"{name}={shown(env[name])}" for name in row.variables if name in env]
    missing = [name for name in row.variables if name not in env]
    raise LayoutError(
        f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} set, as {row.name} or another PMI-1 launcher "
        f"(Flux, `srun --mpi=pmi2`) sets {variable}, but {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not, and no launcher this package knows started the process. "
        f"Running it as a single process would make every rank train alone.",
        f"{row.launch_hint} Under Flux or Slurm, start the ranks with `flux run` or `srun`, whose own variables "
        f"(FLUX_TASK_*, SLURM_*) are read; do not copy {variable} by hand.",
        variable=variable,
        value=env[variable][:SHOWN_CHARACTERS],
        launcher=row.name,
    )


def _single_process(env: Mapping[str, str]) -> RankLayout:
    port, port_source = main_port(env, None)
    given = given_main_address(env, None)
    address = given or LOOPBACK_ADDRESS
    sources = dict.fromkeys(("world_size", "rank", "local_rank", "local_size", "node_rank", "num_nodes"), "no launcher")
    sources["main_address"] = TORCH.master_addr if given else "single node: loopback"
    sources["main_port"] = port_source
    return RankLayout(
        world_size=1,
        rank=0,
        local_rank=0,
        local_size=1,
        node_rank=0,
        num_nodes=1,
        main_address=address,
        main_port=port,
        launcher=None,
        placement=Placement.SINGLE,
        sources=MappingProxyType(sources),
    )


class _LayoutParser:
    """One pass over one launcher's row; each method adds to ``sources`` the variables it used."""

    def __init__(self, env: Mapping[str, str], launcher: Launcher, read_text: Callable[[str], str]) -> None:
        self.env = env
        self.launcher = launcher
        self.read_text = read_text
        self.sources: dict[str, str] = {}
        self.warnings: list[LayoutWarning] = []
        self.ranks_per_node: tuple[int, ...] = ()

    def parse(self) -> RankLayout:
        row = self.launcher
        self._require_complete_row()
        rank = self._integer(row.rank, "rank")
        self._check_rank_twin(rank)
        world_size = self._integer(row.world_size, "world_size", minimum=1, maximum=MAX_WORLD_SIZE)
        local_rank = self._integer(row.local_rank, "local_rank")
        local_size = self._local_size(world_size)
        self._check_bounds(row.rank, rank, row.world_size, world_size)
        self._check_bounds(row.local_rank, local_rank, self.sources["local_size"], local_size)
        if local_size > world_size:
            raise launch_conflict(
                self.launcher,
                f"{self.sources['local_size']}={local_size} ranks on this node is more than "
                f"{row.world_size}={world_size} ranks in the whole job.",
                self.sources["local_size"],
                str(local_size),
            )
        node_rank, num_nodes, placement = self._node(rank, world_size, local_rank, local_size)
        self._check_stale_torch_variables(
            {"rank": rank, "world_size": world_size, "local_rank": local_rank, "local_size": local_size}
        )
        address = self._main_address(num_nodes, world_size, local_size)
        port, self.sources["main_port"] = main_port(self.env, row)
        return RankLayout(
            world_size=world_size,
            rank=rank,
            local_rank=local_rank,
            local_size=local_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            main_address=address,
            main_port=port,
            launcher=row,
            placement=placement,
            sources=MappingProxyType(dict(self.sources)),
            warnings=tuple(self.warnings),
            ranks_per_node=self.ranks_per_node,
            end_step=end_step_command(row, self.env) or (),  # the step's identity, read with the rest of the launch
        )

    def _require_complete_row(self) -> None:
        row = self.launcher
        missing = [name for name in row.variables if name not in self.env]
        if missing:
            given = [f"{name}={shown(self.env[name])}" for name in row.variables if name in self.env]
            given = given or [f"{row.marker}={shown(self.env[row.marker])}"]
            # A known launch mode that omits them gets its own fix; else the rank variables were copied or cleared.
            modes = [fix for name, fix in row.partial_modes.items() if name in self.env]
            raise LayoutError(
                f"{row.name} variables are only partly set: {', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                f"set, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing.",
                modes[0] if modes else f"{row.launch_hint} Do not set {row.marker} by hand or copy it between jobs.",
                variable=missing[0],
                launcher=row.name,
            )

    def _integer(self, variable: str, field_name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
        self.sources[field_name] = variable
        row = self.launcher
        number = parse_count(
            self.env[variable], variable=variable, launcher=row.name, minimum=minimum, hint=row.launch_hint
        )
        if maximum is not None and number > maximum:
            # A sane maximum, so that nothing sized by this number (a device list, a roll call) can blow up.
            raise LayoutError(
                f"{variable}={shown(self.env[variable])} ({row.name}) is more than the {maximum} "
                f"{'ranks of one job' if field_name == 'world_size' else 'ranks on one node'} this package accepts.",
                f"Check what set {variable}: no launcher starts that many. {row.launch_hint}",
                variable=variable,
                value=self.env[variable][:SHOWN_CHARACTERS],
                launcher=row.name,
            )
        return number

    def _local_size(self, world_size: int) -> int:
        row = self.launcher
        if row.local_size is not None:
            return self._integer(row.local_size, "local_size", minimum=1, maximum=MAX_LOCAL_SIZE)
        if row.tasks_per_node is not None and row.node_rank is not None:
            node_counts = slurm_node_counts(self.env, row, world_size, self._integer(row.node_rank, "node_rank"))
            self.sources["local_size"] = node_counts.source
            self.ranks_per_node = node_counts.counts
            return node_counts.local_size
        # Flux: the node count, but not the ranks per node; divided out, assumed even (an uneven job is refused).
        assert row.num_nodes is not None
        nodes = self._integer(row.num_nodes, "num_nodes", minimum=1)
        local_rank = self._integer(row.local_rank, "local_rank")
        local_size = flux_local_size(row, world_size, nodes, local_rank)
        share = f"{row.world_size} / {row.num_nodes}"
        self.sources["local_size"] = share if nodes == 1 else f"{share} ({ASSUMED_EVEN})"
        return local_size

    def _check_bounds(self, variable: str, value: int, size_variable: str, size: int) -> None:
        if value >= size:
            raise LayoutError(
                f"{variable}={value} is out of range: {self.launcher.name} says there are only {size} "
                f"({size_variable}={size}), so it must be below {size}.",
                f"The variables disagree, so they were not all set by one launch. {self.launcher.launch_hint}",
                variable=variable,
                value=str(value),
                launcher=self.launcher.name,
            )

    def _node(self, rank: int, world_size: int, local_rank: int, local_size: int) -> tuple[int, int | None, Placement]:
        row = self.launcher
        if row.node_rank is not None:
            return self._node_from_launcher(world_size, local_size)
        guess = guess_node(row, rank, world_size, local_rank, local_size, self.sources["local_size"])
        self.sources.update(guess.sources)
        if guess.warning is not None:
            self.warnings.append(guess.warning)
        return guess.node_rank, guess.num_nodes, guess.placement

    def _node_from_launcher(self, world_size: int, local_size: int) -> tuple[int, int | None, Placement]:
        row = self.launcher
        assert row.node_rank is not None
        node = self._integer(row.node_rank, "node_rank")
        if row.tasks_per_node is not None:
            # Read with the local size, which came from the same counts (and checked this node index against them).
            self.sources["num_nodes"] = f"len({row.tasks_per_node})"
            return node, len(self.ranks_per_node), Placement.LAUNCHER
        # Nodes 0 to node-1 run a rank each at least, and this one local_size: more than that cannot be one launch.
        if node + local_size > world_size:
            raise launch_conflict(
                self.launcher,
                f"{row.node_rank}={node} with {self.sources['local_size']}={local_size} ranks on this node needs "
                f"at least {node + local_size} ranks, but {row.world_size}={world_size}.",
                row.node_rank,
                str(node),
            )
        # Divided out, assumed even; a node index at or past it proves the nodes uneven (mpiexec -n 6 --ppn 4).
        num_nodes = world_size // local_size if world_size % local_size == 0 else None
        if num_nodes is not None and node >= num_nodes:
            num_nodes = None
        self.sources["num_nodes"] = num_nodes_source(row, self.sources["local_size"], world_size, local_size)
        return node, num_nodes, Placement.LAUNCHER

    def _check_rank_twin(self, rank: int) -> None:
        row = self.launcher
        twin = row.rank_twin
        if twin is None or twin not in self.env or as_count(self.env[twin]) == rank:
            return
        value = self.env[twin]
        raise LayoutError(
            f"{row.rank}={rank} but {twin}={shown(value)}, which {row.name} sets to the same rank: one of them was "
            "set after the launch.",
            "A wrapper or job script that exports a rank gives every process the same one: two processes claim it, "
            f"and where none claims rank 0 nothing serves the roll call. Do not set {row.rank} (or {twin}) in a "
            f"wrapper or job script. {row.launch_hint}",
            variable=row.rank,
            value=str(rank),
            launcher=row.name,
        )

    def _check_stale_torch_variables(self, resolved: Mapping[str, int]) -> None:
        for variable, field_name in STALE_TORCH_VARIABLES:
            if variable not in self.env or variable in self.launcher.variables:
                continue
            value = self.env[variable]
            if as_count(value) != resolved[field_name]:
                raise LayoutError(
                    f"{variable}={shown(value)} disagrees with {self.launcher.name}, which says "
                    f"{self.sources[field_name]}={resolved[field_name]}. A stale {variable} (exported by a job "
                    f"script or left over from torchrun) would give this process the wrong {field_name}.",
                    f"Unset {variable} before launching (`unset {variable}`), or do not pass it to the ranks "
                    f"(`mpirun -x` / `--export`).",
                    variable=variable,
                    value=value[:SHOWN_CHARACTERS],
                    launcher=self.launcher.name,
                )

    def _main_address(self, num_nodes: int | None, world_size: int, local_size: int) -> str:
        given = given_main_address(self.env, self.launcher)
        if given is not None:
            self.sources["main_address"] = TORCH.master_addr
            return given
        if every_rank_here(world_size, local_size):
            # Before the job's host list: in an ensemble of one-node launches, its first host is another launch's.
            self.sources["main_address"] = "single node: loopback"
            return LOOPBACK_ADDRESS
        het = het_step_needs_main_address(self.env, self.launcher)
        if het is not None:
            raise het
        found = first_host(self.env, self.read_text, launch=(self.launcher.host_lists, self.launcher.name))
        if found is not None:
            host, variable = found
            # On the fabric's name where the user gave a template (JSC: `{host}i`); a MASTER_ADDR stays as given.
            template = host_template(self.env)
            self.sources["main_address"] = f"{variable} (first host)" + (
                f" as {VARIABLE['main_host']}={template}" if template else ""
            )
            # A host file's line is as untrusted as MASTER_ADDR: the same syntax check.
            return check_host(
                apply_host_template(template, host), variable=variable, launcher=self.launcher.name, source="first host"
            )
        sources = [*self.launcher.host_lists, *(source for scheduler in SCHEDULERS for source in scheduler.host_lists)]
        lists = ", ".join(source.variable for source in sources)
        nodes = f"{num_nodes} nodes" if num_nodes is not None else "more than one node"
        raise LayoutError(
            f"{self.launcher.name} started {world_size} ranks on {nodes} ({local_size} on this node), but "
            f"MASTER_ADDR is not set and no scheduler host list ({lists}) names the host of rank 0. Using "
            f"this host's loopback address would leave the other nodes waiting forever.",
            "export MASTER_ADDR=<host name of rank 0's node> and pass it to every rank"
            + (
                f" ({self.launcher.name}: {self.launcher.pass_main_address})."
                if self.launcher.pass_main_address
                else "."
            )
            + " Under a scheduler, its host list does this for you.",
            variable=TORCH.master_addr,
            launcher=self.launcher.name,
        )
