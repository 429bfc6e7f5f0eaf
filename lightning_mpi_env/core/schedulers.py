"""The schedulers we understand: one table row per scheduler, with its job id, its host lists and what it exports.

A scheduler (Slurm, Grid Engine, PBS, LSF, Flux) is not the launcher: ``mpirun`` inside a batch job inherits the
batch script's variables. From the scheduler this package takes the job's identity (to derive a main port that no
other job shares) and the first host of the job's host list (where rank 0 runs), when the launcher gives neither.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core import hostfile
from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import (
    HostList,
    HostListForm,
    first_nodelist_host,
    first_word_host,
    lsf_pairs_host,
    pe_hostfile_host,
)


class Scheduler(NamedTuple):
    """Everything about one scheduler."""

    key: str
    """Short name used on the command line (``slurm``, ``sge``, ...)."""
    name: str
    """Human name used in messages (``SGE``)."""
    job_id: tuple[str, ...]
    """Variables that together identify the job, identically on all of its ranks."""
    host_lists: tuple[HostList, ...]
    """Where it lists the job's hosts, in the order consulted."""
    simulated: Mapping[str, str]
    """What ``simulate`` exports for it, as templates: ``{job}``, ``{nodelist}``, ``{num_nodes}``,
    ``{lsf_pairs}``; a host file is ``{file:hosts}`` (one line per host), ``{file:slots}`` (one per slot) or
    ``{file:pe}`` (Grid Engine's ``PE_HOSTFILE``)."""
    array_task: tuple[str, ...] = ()
    """Variables that tell apart the tasks of one array job, which share :attr:`job_id`: appended to the job's
    identity (for the main port) where set, not ``undefined`` (Grid Engine outside arrays) and, for those in
    :attr:`nonzero`, not ``0``."""
    requeue_command: tuple[str, ...] = ()
    """The command that puts this job back in the queue (``{job}``: the job as :attr:`requeue_job` names it);
    empty where the job does it by its exit status (:attr:`requeue_exit_code`) or cannot."""
    requeue_job: tuple[str, ...] = ()
    """How the requeue command names this job: the first template whose variables are all set (and, for those in
    :attr:`nonzero`, not ``0``) wins; an array task before the whole array."""
    nonzero: tuple[str, ...] = ()
    """Variables that count as unset when ``0`` (LSF's ``LSB_JOBINDEX`` outside job arrays)."""
    requeue_exit_code: int = 0
    """The exit status of every rank after a checkpoint-and-requeue (Grid Engine reschedules a job that exits 99)."""
    warning_signal: signal.Signals = signal.SIGUSR1
    """The signal this scheduler sends before it kills a job at its limit (as :attr:`job_script` sets it up): the
    default ``requeue_signal``. ``SIGUSR1`` where the job script chooses it, as Lightning's ``SLURMEnvironment``."""
    job_script: str = ""
    """The job-script lines that make the scheduler send the requeue signal before the wall-clock limit."""
    warning: str = ""
    """When the signal comes, and what to do where the job script alone cannot make it come."""
    run_for_real: str = ""
    """How the test suite runs this scheduler for real; empty: documented variables, not run here."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # A row is an entry of the table: pickled by its key.
        return (scheduler_by_key, (self.key,))


SGE = Scheduler(
    key="sge",
    name="SGE",
    job_id=("JOB_ID",),
    host_lists=(
        HostList("SGE_JOB_HOSTLIST", HostListForm.HOST_PER_LINE, note="ABCI"),
        HostList("PE_HOSTFILE", HostListForm.PE_HOSTFILE),
    ),
    simulated=MappingProxyType({"JOB_ID": "{job}", "SGE_JOB_HOSTLIST": "{file:hosts}", "PE_HOSTFILE": "{file:pe}"}),
    # qsub(1): "SGE_TASK_ID ... set to 'undefined' for non-array jobs"; the tasks of an array share JOB_ID.
    array_task=("SGE_TASK_ID",),
    # A job that exits 99 is rescheduled (unless the site sets FORBID_RESCHEDULE); `qmod -rj` needs a manager.
    requeue_exit_code=99,
    warning_signal=signal.SIGUSR2,  # -notify: SIGUSR2 before SIGKILL (SIGUSR1 comes before a suspension)
    job_script="#$ -notify",
    warning="SIGUSR2 comes `notify` seconds (60 by default) before h_rt's SIGKILL; with s_rt instead, SIGUSR1: "
    "`requeue_signal=signal.SIGUSR1`",
)
PBS = Scheduler(
    key="pbs",
    name="PBS",
    job_id=("PBS_JOBID",),
    host_lists=(HostList("PBS_NODEFILE", HostListForm.HOST_PER_LINE),),
    simulated=MappingProxyType({"PBS_JOBID": "{job}.pbs", "PBS_NODEFILE": "{file:slots}"}),
    # A subjob's PBS_JOBID is `123[4].server` already; its index too, should a site give the array's id:
    # PBS_ARRAY_INDEX (PBS Professional), PBS_ARRAYID (Torque).
    array_task=("PBS_ARRAY_INDEX", "PBS_ARRAYID"),
    # qrerun needs manager or operator rights on most sites: requeue_command=("qsub", "job.sh") resubmits instead.
    requeue_command=("qrerun", "{job}"),
    requeue_job=("{PBS_JOBID}",),
    job_script="#PBS -r y",
    warning="PBS sends no warning signal: SIGTERM comes at the wall-clock limit, then SIGKILL after `kill_delay`; "
    "`requeue_signal=signal.SIGTERM`, or `qsig -s USR1 $PBS_JOBID` from a watcher",
)
LSF = Scheduler(
    key="lsf",
    name="LSF",
    job_id=("LSB_JOBID",),
    host_lists=(
        HostList("LSB_DJOB_HOSTFILE", HostListForm.HOST_PER_LINE),
        HostList("LSB_MCPU_HOSTS", HostListForm.LSF_PAIRS),
    ),
    simulated=MappingProxyType({"LSB_JOBID": "{job}", "LSB_MCPU_HOSTS": "{lsf_pairs}"}),
    array_task=("LSB_JOBINDEX",),  # the elements of a job array share LSB_JOBID; 0 outside arrays
    requeue_command=("brequeue", "{job}"),  # the job's owner may requeue it
    requeue_job=("{LSB_JOBID}[{LSB_JOBINDEX}]", "{LSB_JOBID}"),
    nonzero=("LSB_JOBINDEX",),
    # bsub -W: "the job is sent a SIGUSR2 signal, and is killed if it does not terminate within ten minutes".
    warning_signal=signal.SIGUSR2,
    job_script="#BSUB -W 0:30",
    warning="SIGUSR2 at the run limit, SIGKILL ten minutes later; `#BSUB -wa USR2 -wt 5` sends it five minutes "
    "before the limit instead",
)
SLURM = Scheduler(
    key="slurm",
    name="Slurm",
    # The job, not the step: ranks that mpirun starts inside a batch job inherit different steps on different nodes.
    job_id=("SLURM_JOB_ID",),
    # The job's list only: SLURM_STEP_NODELIST belongs to srun's row. Ranks that mpirun starts inside a batch job
    # inherit the step of the daemon that started them: on the second node, a step of that node alone.
    host_lists=(HostList("SLURM_JOB_NODELIST", HostListForm.NODELIST),),
    simulated=MappingProxyType(
        {"SLURM_JOB_ID": "{job}", "SLURM_JOB_NODELIST": "{nodelist}", "SLURM_JOB_NUM_NODES": "{num_nodes}"}
    ),
    requeue_command=("scontrol", "requeue", "{job}"),  # the job's owner may requeue it (a batch job, requeueable)
    # An array task by its array id: `scontrol requeue <SLURM_JOB_ID>` of the task running as the array's master
    # id would requeue the whole array.
    requeue_job=("{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}", "{SLURM_JOB_ID}"),
    # Under mpirun in sbatch the steps are Open MPI's daemons, which SIGUSR1 kills: the batch script gets it (B:).
    job_script="#SBATCH --signal=USR1@90\n#SBATCH --requeue",
    warning="SIGUSR1 to every `srun` step 90 s before the limit; `mpirun` in `sbatch`: `--signal=B:USR1@90` and a "
    "trap that passes it on to `mpirun`, as `examples/jobs/slurm_mpirun.sbatch` does",
    run_for_real="Slurm 22.05 from Debian (`slurm-wlm`): slurmctld and two slurmd on one machine",
)

FLUX = Scheduler(
    key="flux",
    name="Flux",
    # A batch script's tasks started by `flux run` get their own FLUX_JOB_ID (the launcher's row); processes that
    # another launcher starts inside `flux batch`/`flux alloc` see the batch job's id here.
    job_id=("FLUX_ENCLOSING_ID",),
    host_lists=(),  # Flux exports none: `flux hostlist local` prints the job's hosts.
    # What a batch script passes besides the id: Flux lists no hosts, so the script gives the first one.
    simulated=MappingProxyType({"FLUX_ENCLOSING_ID": "ƒ{job}", "MASTER_ADDR": "{first_host}"}),
)

SCHEDULERS: tuple[Scheduler, ...] = (SGE, PBS, LSF, SLURM, FLUX)
"""Every supported scheduler, in the order their host lists and job ids are consulted."""

SCHEDULERS_BY_KEY: Mapping[str, Scheduler] = MappingProxyType({row.key: row for row in SCHEDULERS})


def scheduler_by_key(key: str) -> Scheduler:
    """The row whose key is ``key`` (what a pickled row unpickles to)."""
    return SCHEDULERS_BY_KEY[key]


def read_host_file(path: str) -> str:
    """The head of a host file: its lines up to the hosts any host list needs, read bounded (UTF-8).

    Raises:
        OSError: The file cannot be read, is not a regular file (a FIFO, ``/dev/zero``), or is not text
            (:class:`~lightning_mpi_env.core.hostfile.HostFileError`).
    """
    return hostfile.read_host_file(path)


def first_host(
    env: Mapping[str, str],
    read_text: Callable[[str], str] = read_host_file,
    *,
    launch: tuple[tuple[HostList, ...], str] | None = None,
) -> tuple[str, str] | None:
    """The first host of the first host list present, with the variable it came from.

    Args:
        env: The process environment.
        read_text: Reads a host file; replaced in tests.
        launch: The launcher's own host lists and its name, consulted before any scheduler's (``srun``'s step).

    Returns:
        ``(host, variable)``, or ``None`` when nothing lists the job's hosts.

    Raises:
        LayoutError: If a host list is present but unreadable, empty or malformed.
    """
    sources = [(source, launch[1]) for source in launch[0]] if launch is not None else []
    sources += [(source, scheduler.name) for scheduler in SCHEDULERS for source in scheduler.host_lists]
    for source, owner in sources:
        value = env.get(source.variable)
        if value is not None:
            return _first_host(value, source, owner, read_text), source.variable
    return None


def _first_host(value: str, source: HostList, owner: str, read_text: Callable[[str], str]) -> str:
    if source.form is HostListForm.NODELIST:
        return first_nodelist_host(value, variable=source.variable)
    if source.form is HostListForm.LSF_PAIRS:
        return lsf_pairs_host(value, variable=source.variable, scheduler=owner)
    host = _host_from_file(value, source, owner, read_text)
    if host is None:
        raise LayoutError(
            f"{source.variable}='{value}' ({owner}) names an empty host file.",
            "Set MASTER_ADDR to the host of rank 0.",
            variable=source.variable,
            value=value,
            launcher=owner,
        )
    return host


def _host_from_file(path: str, source: HostList, owner: str, read_text: Callable[[str], str]) -> str | None:
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as error:
        raise LayoutError(
            f"{source.variable}='{path}' ({owner}) names a host file that cannot be read: {error}.",
            f"Run inside the {owner} job that created the file, or set MASTER_ADDR to the host of rank 0.",
            variable=source.variable,
            value=path,
            launcher=owner,
        ) from error
    if source.skip_lines:
        text = "\n".join(_host_lines(text)[source.skip_lines :])
    if source.form is HostListForm.PE_HOSTFILE:
        return pe_hostfile_host(text, variable=source.variable, scheduler=owner)
    return first_word_host(text)


def _host_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if hostfile.names_a_host(line)]


def job_identity(env: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """The first scheduler job id present (all of its variables set and non-empty), and the variables it came from.

    >>> job_identity({"PBS_JOBID": "4242.pbs01"})
    ('4242.pbs01', ('PBS_JOBID',))
    >>> job_identity({"JOB_ID": "77", "SGE_TASK_ID": "3"})  # one task of a Grid Engine array job
    ('77/3', ('JOB_ID', 'SGE_TASK_ID'))
    """
    for scheduler in SCHEDULERS:
        if all(env.get(variable) for variable in scheduler.job_id):
            tasks = tuple(name for name in scheduler.array_task if _is_array_task(env, name, scheduler))
            names = (*scheduler.job_id, *tasks)
            return "/".join(env[variable] for variable in names), names
    return None


def _is_array_task(env: Mapping[str, str], name: str, scheduler: Scheduler) -> bool:
    value = env.get(name, "")
    return value not in ("", "undefined") and not (name in scheduler.nonzero and value == "0")


__all__ = [
    "LSF",
    "PBS",
    "SCHEDULERS",
    "SCHEDULERS_BY_KEY",
    "SGE",
    "SLURM",
    "FLUX",
    "Scheduler",
    "first_host",
    "job_identity",
    "read_host_file",
]
