"""The job step's launcher line, whichever launcher it is: what the loop asks of it (:class:`StepLine`).

:func:`step_line` reads the line once: ``srun`` as :class:`SrunStep` (:mod:`.srun_line`, :mod:`.placement`), run on
fewer nodes where the line says ``--nodes=MIN-MAX``; ``mpirun``/``mpiexec`` (Open MPI 5, MPICH, Intel MPI) as
:class:`MpirunStep` (:mod:`.mpirun_line`), whose relaunch names a host file it writes into the next step's state
folder, run on fewer hosts where ``--min-nodes`` allows (the launcher has no range of its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.core.launchers import SLURM
from lightning_mpi_env.core.settings import host_template
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.tools.supervise.allocation import Allocation
from lightning_mpi_env.tools.supervise.deaths import Death, mpirun_deaths, srun_deaths
from lightning_mpi_env.tools.supervise.mpirun_family import detect_family
from lightning_mpi_env.tools.supervise.mpirun_line import MpirunLine, TooFewHostsError
from lightning_mpi_env.tools.supervise.mpirun_options import LAUNCHER_NAMES
from lightning_mpi_env.tools.supervise.placement import Placement, Shortfall, allocation, place
from lightning_mpi_env.tools.supervise.probe import probe_line
from lightning_mpi_env.tools.supervise.srun_line import SrunLine, SrunLineError

HOST_FILE = "hosts"
"""The host file an ``mpirun`` relaunch names, in the relaunched step's state folder."""


class StepLine(Protocol):
    """What the loop asks of a launcher line."""

    @property
    def launcher(self) -> str:
        """The launcher's name, in the records the supervisor makes."""
        ...

    @property
    def first(self) -> list[str]:
        """The words of the first launch: the line as given."""
        ...

    def hosts(self) -> tuple[str, ...] | None:
        """The allocation's hosts, where known (the health probe's candidates)."""
        ...

    def relaunch(self, excluded: Sequence[str], *, overlap: bool, folder: Path) -> Placement | Shortfall:
        """The line without ``excluded``, or why none fits; ``folder`` is the next step's state folder."""
        ...

    def probe_line(self, host: str) -> list[str]:
        """The health probe's line for ``host``."""
        ...

    def deaths(self, errors: str) -> list[Death]:
        """The ranks the launcher's standard error says died."""
        ...


@dataclass(frozen=True)
class SrunStep:
    """An ``srun`` line in a Slurm allocation."""

    line: SrunLine
    allocation: tuple[str, ...] | None

    @property
    def launcher(self) -> str:
        """``Slurm srun``, as the records of the roll call name it (the launcher table's row)."""
        return SLURM.name

    @property
    def first(self) -> list[str]:
        """The line as given."""
        return list(self.line.words)

    def hosts(self) -> tuple[str, ...] | None:
        """``SLURM_JOB_NODELIST``'s hosts."""
        return self.allocation

    def relaunch(self, excluded: Sequence[str], *, overlap: bool, folder: Path) -> Placement | Shortfall:
        """See :func:`~.placement.place`."""
        return place(self.line, self.allocation, excluded, overlap=overlap)

    def deaths(self, errors: str) -> list[Death]:
        """``srun: error: <host>: task <ranks>: <how>`` lines."""
        return srun_deaths(errors)

    def probe_line(self, host: str) -> list[str]:
        """A one-task step on ``host`` (:func:`~.probe.probe_line`)."""
        return probe_line(host)


@dataclass(frozen=True)
class MpirunStep:
    """An ``mpirun``/``mpiexec`` line of one family, and the hosts it may run on."""

    line: MpirunLine
    allocation: Allocation
    min_nodes: int | None
    main_host: str = ""
    """``LIGHTNING_MPI_ENV_MAIN_HOST``'s template (``{host}-ib``), for rank 0's host on the fabric; empty: none."""

    @property
    def launcher(self) -> str:
        """The family's name (``Open MPI``)."""
        return self.line.family.name

    @property
    def first(self) -> list[str]:
        """The line as given."""
        return list(self.line.words)

    def hosts(self) -> tuple[str, ...] | None:
        """The line's own hosts, else the scheduler's."""
        return tuple(self.allocation.names())

    def relaunch(self, excluded: Sequence[str], *, overlap: bool, folder: Path) -> Placement | Shortfall:
        """The same world on the hosts left, else ``--min-nodes`` or more hosts at the same ranks per host."""
        path = folder / HOST_FILE
        nodes = None
        try:
            plan = self.line.relaunch(self.allocation, excluded, str(path), main_host=self.main_host)
        except TooFewHostsError as error:
            left, _ = self.allocation.split(excluded)
            if self.min_nodes is None or len(left) < self.min_nodes:
                return Shortfall(error.problem, error.hint or "")
            nodes = len(left)
            try:
                plan = self.line.relaunch(self.allocation, excluded, str(path), nodes=nodes, main_host=self.main_host)
            except MpirunLineError as fewer:  # no ranks per host on the line: it cannot shrink
                return Shortfall(f"{error.problem} {fewer.problem}", fewer.hint)
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.host_file_text, encoding="utf-8")
        hosts = tuple(host.name for host in plan.hosts)
        # The line names rank 0's host too (-x/-genv): a MASTER_ADDR exported by the batch script is replaced.
        return Placement(list(plan.argv), hosts, nodes, plan.unmatched, {TORCH.master_addr: plan.main_address})

    def deaths(self, errors: str) -> list[Death]:
        """Open MPI's and Hydra's reports of a rank a signal ended."""
        return mpirun_deaths(errors)

    def probe_line(self, host: str) -> list[str]:
        """The line's own launcher on ``host`` alone (:meth:`~.mpirun_line.MpirunLine.probe_line`)."""
        return self.line.probe_line(host)


def step_line(words: Sequence[str], env: Mapping[str, str], *, min_nodes: int | None = None) -> StepLine:
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
        return MpirunStep(line, found, min_nodes, host_template(env))
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
    return SrunStep(srun, allocation(env))


__all__ = ["HOST_FILE", "MpirunStep", "SrunStep", "StepLine", "step_line"]
