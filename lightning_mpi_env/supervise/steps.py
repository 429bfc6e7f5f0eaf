"""The job step's launcher line, whichever launcher it is, as the loop uses it: one :class:`Step`.

``srun`` runs on fewer nodes where the line says ``--nodes=MIN-MAX``; ``mpirun``, which has no range of its own, where
``--min-nodes`` allows, on a host file written into the next step's state folder.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.core.launchers import SRUN
from lightning_mpi_env.core.settings import host_template
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.supervise.allocation import Allocation
from lightning_mpi_env.supervise.exits import TaskExit, mpirun_exits, srun_exits
from lightning_mpi_env.supervise.mpirun_family import detect_family
from lightning_mpi_env.supervise.mpirun_line import MpirunLine, TooFewHostsError
from lightning_mpi_env.supervise.mpirun_options import LAUNCHER_NAMES
from lightning_mpi_env.supervise.probe import probe_line
from lightning_mpi_env.supervise.relaunch_hosts import Relaunch, Shortfall, allocation_hosts, place, spares
from lightning_mpi_env.supervise.srun_line import SrunLine, SrunLineError

HOST_FILE = "hosts"
"""The host file an ``mpirun`` relaunch names, in the relaunched step's state folder."""


@dataclass(frozen=True)
class Step:
    """A job step's launcher line: what the loop asks of it, whichever launcher it is."""

    launcher: str
    """The launcher's name, in the records the supervisor makes (``Slurm srun``, ``Open MPI 5``)."""
    words: tuple[str, ...]
    hosts: tuple[str, ...] | None
    """The allocation's hosts, where known (the health probe's candidates)."""
    relaunch: Callable[..., Relaunch | Shortfall]
    """``relaunch(excluded, *, overlap, folder)``: the line without ``excluded``, or why none fits; ``folder`` is the
    next step's state folder."""
    probe_line: Callable[[str], list[str]]
    exits: Callable[[str], list[TaskExit]]
    """The ranks the launcher's standard error says ended badly."""
    spares: Callable[[Sequence[str]], int]
    """``spares(excluded)``: how many hosts of the allocation a step without ``excluded`` leaves unused."""


def mpirun_step(line: MpirunLine, hosts: Allocation, min_nodes: int | None, main_host: str = "") -> Step:
    """The step of an ``mpirun`` line on ``hosts``; ``main_host``: ``LIGHTNING_MPI_ENV_MAIN_HOST``'s template."""
    relaunch = functools.partial(_mpirun_relaunch, line, hosts, min_nodes, main_host)
    spare = functools.partial(line.spares, hosts)
    return Step(line.family.name, line.words, tuple(hosts.names()), relaunch, line.probe_line, mpirun_exits, spare)


def _mpirun_relaunch(
    line: MpirunLine,
    hosts: Allocation,
    min_nodes: int | None,
    main_host: str,
    excluded: Sequence[str],
    *,
    overlap: bool,
    folder: Path,
) -> Relaunch | Shortfall:
    """The same world on the hosts left, else ``min_nodes`` or more hosts at the same ranks per host."""
    path = folder / HOST_FILE
    nodes = None
    try:
        plan = line.relaunch(hosts, excluded, str(path), main_host=main_host)
    except TooFewHostsError as error:
        left, _ = hosts.split(excluded)
        if min_nodes is None or len(left) < min_nodes:
            return Shortfall(error.problem, error.hint or "")
        nodes = len(left)
        try:
            plan = line.relaunch(hosts, excluded, str(path), nodes=nodes, main_host=main_host)
        except MpirunLineError as fewer:  # no ranks per host on the line: it cannot shrink
            return Shortfall(f"{error.problem} {fewer.problem}", fewer.hint)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.host_file_text, encoding="utf-8")
    names = tuple(host.name for host in plan.hosts)
    # The line names rank 0's host too (-x/-genv): a MASTER_ADDR exported by the batch script is replaced.
    return Relaunch(list(plan.argv), names, nodes, plan.unmatched, {TORCH.master_addr: plan.main_address})


def _srun_relaunch(
    line: SrunLine, hosts: tuple[str, ...] | None, excluded: Sequence[str], *, overlap: bool, folder: Path
) -> Relaunch | Shortfall:
    return place(line, hosts, excluded, overlap=overlap)


def step_line(words: Sequence[str], env: Mapping[str, str], *, min_nodes: int | None = None) -> Step:
    """The line ``words``, read once, before anything runs.

    Raises:
        SrunLineError: Neither ``srun`` nor ``mpirun``/``mpiexec``, an ``srun`` line it cannot relaunch, or
            ``min_nodes`` with ``srun`` (whose own ``--nodes=MIN-MAX`` says it).
        MpirunLineError: An ``mpirun`` line it cannot relaunch, or no hosts to relaunch on.
        LayoutError: An allocation variable that is malformed.
    """
    name = os.path.basename(words[0]) if words else ""
    if name in LAUNCHER_NAMES:
        line = MpirunLine.parse(words, detect_family(words[0], env=env))
        found = line.allocation(env)
        line.shape(found)  # a world size it cannot tell is refused now, not after the first failure
        return mpirun_step(line, found, min_nodes, host_template(env))
    srun = SrunLine.parse(words)
    srun.excluded()  # a malformed or file exclusion is refused before the first step
    srun.chosen()
    if min_nodes is not None:
        raise SrunLineError(
            "--min-nodes is for mpirun lines; an srun line says its own range of nodes.",
            f"Write it on the srun line: srun --nodes={min_nodes}-N ...",
            variable="--min-nodes",
            value=str(min_nodes),
        )
    hosts = allocation_hosts(env)
    relaunch = functools.partial(_srun_relaunch, srun, hosts)
    return Step(SRUN.name, srun.words, hosts, relaunch, probe_line, srun_exits, functools.partial(spares, srun, hosts))
