"""The launchers we understand: one table row per launcher, naming the variables it exports to each process.

Adding a launcher means adding a row to :data:`LAUNCHERS` (and its tests); the parsing in
:mod:`lightning_mpi_env.layout` is generic over the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launcher:
    """The variables one launcher exports to every process it starts."""

    key: str
    """Short name used on the command line (``openmpi``, ``slurm``, ...)."""
    name: str
    """Human name used in messages (``Open MPI``)."""
    marker: str
    """The variable whose presence means this launcher started the process."""
    rank: str
    """Global rank of the process."""
    world_size: str
    """Number of processes in the job."""
    local_rank: str
    """Rank of the process on its node."""
    local_size: str | None
    """Number of processes on this node; ``None`` where it comes from :attr:`tasks_per_node`."""
    node_rank: str | None = None
    """Index of this node in the job, where the launcher exports one (then the node rank is exact)."""
    tasks_per_node: str | None = None
    """Slurm-style compressed count of processes per node (``4(x2),3``), indexed by :attr:`node_rank`."""
    launch_hint: str = ""
    """How a user starts processes with this launcher, for messages."""

    @property
    def variables(self) -> tuple[str, ...]:
        """Every variable this row reads, in the order it reads them."""
        names = (self.rank, self.world_size, self.local_rank, self.local_size, self.node_rank, self.tasks_per_node)
        return tuple(name for name in names if name is not None)


OPEN_MPI = Launcher(
    key="openmpi",
    name="Open MPI",
    marker="OMPI_COMM_WORLD_RANK",
    rank="OMPI_COMM_WORLD_RANK",
    world_size="OMPI_COMM_WORLD_SIZE",
    local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
    local_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    # OMPI_COMM_WORLD_NODE_RANK is the rank on the node across *all* jobs, not the node index: never read it.
    launch_hint="Start every rank with Open MPI's `mpirun`/`mpiexec`, which sets OMPI_COMM_WORLD_* itself.",
)
MVAPICH2 = Launcher(
    key="mvapich2",
    name="MVAPICH2",
    marker="MV2_COMM_WORLD_RANK",
    rank="MV2_COMM_WORLD_RANK",
    world_size="MV2_COMM_WORLD_SIZE",
    local_rank="MV2_COMM_WORLD_LOCAL_RANK",
    local_size="MV2_COMM_WORLD_LOCAL_SIZE",
    launch_hint="Start every rank with MVAPICH2's `mpirun_rsh` or `mpiexec`, which sets MV2_COMM_WORLD_* itself.",
)
CRAY_PALS = Launcher(
    key="pals",
    name="Cray PALS",
    marker="PALS_RANKID",
    rank="PALS_RANKID",
    world_size="PMI_SIZE",
    local_rank="PALS_LOCAL_RANKID",
    local_size="PMI_LOCAL_SIZE",
    node_rank="PALS_NODEID",
    launch_hint="Start every rank with Cray's `mpiexec`/`aprun` (PALS), which sets PALS_* and PMI_* itself.",
)
HYDRA = Launcher(
    key="mpich",
    name="MPICH/Intel MPI (Hydra)",
    # PMI_RANK alone is also set by `srun --mpi=pmi2`; MPI_LOCALRANKID is Hydra's own.
    marker="MPI_LOCALRANKID",
    rank="PMI_RANK",
    world_size="PMI_SIZE",
    local_rank="MPI_LOCALRANKID",
    local_size="MPI_LOCALNRANKS",
    launch_hint="Start every rank with MPICH's or Intel MPI's `mpiexec` (Hydra), which sets PMI_* and MPI_LOCAL*.",
)
SLURM = Launcher(
    key="slurm",
    name="Slurm srun",
    # A batch script inherits SLURM_PROCID=0 too; only a job step started by srun has SLURM_STEP_ID.
    marker="SLURM_STEP_ID",
    rank="SLURM_PROCID",
    world_size="SLURM_NTASKS",
    local_rank="SLURM_LOCALID",
    local_size=None,
    node_rank="SLURM_NODEID",
    tasks_per_node="SLURM_STEP_TASKS_PER_NODE",
    launch_hint="Start every rank with `srun` inside the allocation (srun sets SLURM_PROCID and SLURM_STEP_*).",
)
PMIX = Launcher(
    key="pmix",
    name="PMIx",
    marker="PMIX_RANK",
    rank="PMIX_RANK",
    # A bare PMIx server exports only the rank; the sizes live behind the PMIx API, which we do not link.
    # They can be given with the torchrun names, exported alike to every rank except LOCAL_RANK.
    world_size="WORLD_SIZE",
    local_rank="LOCAL_RANK",
    local_size="LOCAL_WORLD_SIZE",
    launch_hint=(
        "A bare PMIx launcher exports only PMIX_RANK. Prefer Open MPI's `mpirun` (which also sets "
        "OMPI_COMM_WORLD_*) or `srun --mpi=pmix` (which also sets SLURM_*); otherwise export WORLD_SIZE, "
        "LOCAL_WORLD_SIZE and LOCAL_RANK to every rank."
    ),
)

LAUNCHERS: tuple[Launcher, ...] = (OPEN_MPI, MVAPICH2, CRAY_PALS, HYDRA, SLURM, PMIX)
"""Every supported launcher, in order of precedence.

An MPI launcher's own variables come before the scheduler's, because ranks started by ``mpirun`` inside a batch job
inherit the batch script's ``SLURM_PROCID=0``; PMIx alone comes last because richer launchers set it too.
"""

LAUNCHERS_BY_KEY: Mapping[str, Launcher] = {launcher.key: launcher for launcher in LAUNCHERS}


def detect_launcher(env: Mapping[str, str]) -> Launcher | None:
    """The launcher that started this process, by precedence, or ``None`` outside any launcher.

    >>> detect_launcher({"OMPI_COMM_WORLD_RANK": "3", "SLURM_STEP_ID": "0"}).name
    'Open MPI'
    >>> detect_launcher({"SLURM_PROCID": "0"}) is None  # a batch script, not a job step
    True
    """
    for launcher in LAUNCHERS:
        if launcher.marker in env:
            return launcher
    return None
