"""The schedulers we understand, one row each: the job's identity (for the main port) and its first host."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from lightning_mpi_env.core.errors import JobIdError
from lightning_mpi_env.core.hostlist import HostList, HostListForm, read_hosts
from lightning_mpi_env.core.state_files import read_host_file
from lightning_mpi_env.core.torch_names import TORCH


class Scheduler(NamedTuple):
    """Everything about one scheduler."""

    key: str
    name: str
    job_id: tuple[str, ...]
    """Variables that together identify the job, identically on all of its ranks."""
    host_lists: tuple[HostList, ...]
    """Where it lists the job's hosts, in the order consulted."""
    simulated: Mapping[str, str]
    """What ``simulate`` exports, as templates (host files: ``{file:hosts}``, ``{file:slots}``, ``{file:pe}``)."""
    array_task: tuple[str, ...] = ()
    """Variables that tell apart an array job's tasks (which share :attr:`job_id`), appended to its identity if set."""
    requeue_command: tuple[str, ...] = ()
    """The command that requeues this job (``{job}``: :attr:`requeue_job`); empty: by exit status, or not at all."""
    requeue_job: tuple[str, ...] = ()
    """How that command names the job: the first template whose variables are all set (:attr:`nonzero`: not 0)."""
    nonzero: tuple[str, ...] = ()
    """Variables that count as unset when ``0`` (LSF's ``LSB_JOBINDEX`` outside job arrays)."""
    requeue_exit_code: int = 0
    """The exit status of every rank after a checkpoint-and-requeue."""
    warning_signal: signal.Signals = signal.SIGUSR1
    """The signal sent before the limit (as :attr:`job_script` sets it up): the default ``requeue_signal``."""
    job_script: str = ""
    """The job-script lines that make the scheduler send the requeue signal before the wall-clock limit."""
    warning: str = ""
    """When the signal comes, and what to do where the job script alone cannot make it come."""
    run_for_real: str = ""
    job_syntax: Mapping[str, str] = MappingProxyType({})
    """The ASCII regular expression each job variable must match whole before a command or file name uses it."""
    restart_count: str = ""
    """The variable counting this job's restarts (``SLURM_RESTART_COUNT``); empty: the requeue record counts."""
    end_time: str = ""
    """The variable holding the job's projected end, in epoch seconds; empty: the scheduler exports none."""
    end_reason: tuple[str, ...] = ()
    """A command printing why the job ends (``{job}``: :attr:`requeue_job`), asked on a ``SIGTERM`` where
    :attr:`end_time` is unset; empty: none."""
    time_limit_reason: str = ""
    """What :attr:`end_reason` prints when the job reached its time limit."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # A row is an entry of the table: pickled by its key.
        return (scheduler_by_key, (self.key,))


_NUMBER = "[0-9]{1,19}"
"""A job number: ASCII digits, at most 19 (every scheduler's ids fit in 64 bits)."""

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
    # RESTARTED is a 0/1 flag, not a count: the requeue record counts restarts.
    job_syntax=MappingProxyType({"JOB_ID": _NUMBER, "SGE_TASK_ID": f"{_NUMBER}|undefined"}),
    warning="SIGUSR2 comes `notify` seconds (60 by default) before h_rt's SIGKILL; with s_rt instead, SIGUSR1: "
    "`requeue_signal=signal.SIGUSR1`",
)
PBS = Scheduler(
    key="pbs",
    name="PBS",
    job_id=("PBS_JOBID",),
    host_lists=(HostList("PBS_NODEFILE", HostListForm.HOST_PER_LINE),),
    simulated=MappingProxyType({"PBS_JOBID": "{job}.pbs", "PBS_NODEFILE": "{file:slots}"}),
    # PBS_ARRAY_INDEX (PBS Professional), PBS_ARRAYID (Torque): should a site give the array's id as PBS_JOBID.
    array_task=("PBS_ARRAY_INDEX", "PBS_ARRAYID"),
    # qrerun needs manager or operator rights on most sites: requeue_command=("qsub", "job.sh") resubmits instead.
    requeue_command=("qrerun", "{job}"),
    requeue_job=("{PBS_JOBID}",),
    job_script="#PBS -r y",
    # `<sequence>[<index>].<server>` (the server part may be a dotted host name); no restart count is exported.
    job_syntax=MappingProxyType(
        {
            "PBS_JOBID": r"[0-9]{1,19}(\[[0-9]{0,19}\])?(\.[A-Za-z0-9][A-Za-z0-9_-]{0,62}){0,8}",
            "PBS_ARRAY_INDEX": _NUMBER,
            "PBS_ARRAYID": _NUMBER,
        }
    ),
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
    # LSB_RESTART is "Y", not a count (LSF Configuration Reference): the requeue record counts restarts.
    job_syntax=MappingProxyType({"LSB_JOBID": _NUMBER, "LSB_JOBINDEX": _NUMBER}),
    warning="SIGUSR2 at the run limit, SIGKILL ten minutes later; `#BSUB -wa USR2 -wt 5` sends it five minutes "
    "before the limit instead",
)
SLURM = Scheduler(
    key="slurm",
    name="Slurm",
    # The job, not the step: ranks that mpirun starts inside a batch job inherit different steps on different nodes.
    job_id=("SLURM_JOB_ID",),
    # The job's list only: SLURM_STEP_NODELIST belongs to srun's row (mpirun's ranks inherit a daemon's step).
    host_lists=(HostList("SLURM_JOB_NODELIST", HostListForm.NODELIST),),
    simulated=MappingProxyType(
        {"SLURM_JOB_ID": "{job}", "SLURM_JOB_NODELIST": "{nodelist}", "SLURM_JOB_NUM_NODES": "{num_nodes}"}
    ),
    requeue_command=("scontrol", "requeue", "{job}"),  # the job's owner may requeue it (a batch job, requeueable)
    # An array task by its array id: the task holding the array's master id would requeue the whole array.
    requeue_job=("{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}", "{SLURM_JOB_ID}"),
    # Under mpirun in sbatch the steps are Open MPI's daemons, which SIGUSR1 kills: the batch script gets it (B:).
    job_script="#SBATCH --signal=USR1@90\n#SBATCH --requeue",
    warning="SIGUSR1 to every `srun` step 90 s before the limit; `mpirun` in `sbatch`: `--signal=B:USR1@90` and a "
    "trap that passes it on to `mpirun`, as `examples/jobs/slurm_mpirun.sbatch` does",
    run_for_real="Slurm 22.05 from Debian (`slurm-wlm`): slurmctld and two slurmd on one machine",
    job_syntax=MappingProxyType(
        {
            "SLURM_JOB_ID": _NUMBER,
            "SLURM_ARRAY_JOB_ID": _NUMBER,
            "SLURM_ARRAY_TASK_ID": _NUMBER,
            "SLURM_RESTART_COUNT": _NUMBER,
            "SLURM_JOB_END_TIME": _NUMBER,
        }
    ),
    # sbatch(1): the number of times the job has been restarted or requeued; kept across requeues.
    restart_count="SLURM_RESTART_COUNT",
    # sbatch(1), Slurm 23.02 and newer: "The UNIX timestamp for a job's projected end time".
    end_time="SLURM_JOB_END_TIME",
    # squeue(1) %r: the reason a job is in its state; a job past its time limit is completing with "TimeLimit",
    # one cancelled with "None" (both seen on Slurm 22.05, which exports no end time).
    end_reason=("squeue", "--noheader", "--jobs={job}", "--format=%r"),
    time_limit_reason="TimeLimit",
)

FLUX = Scheduler(
    key="flux",
    name="Flux",
    # `flux run`'s tasks have their own FLUX_JOB_ID (the launcher's row); the batch job's id is this one.
    job_id=("FLUX_ENCLOSING_ID",),
    host_lists=(),  # Flux exports none: `flux hostlist local` prints the job's hosts.
    simulated=MappingProxyType({"FLUX_ENCLOSING_ID": "ƒ{job}", TORCH.master_addr: "{first_host}"}),
    # flux-jobs(1) ID forms: F58 (``ƒ`` or ``f`` and base58), decimal, hexadecimal, dotted hex.
    job_syntax=MappingProxyType(
        {
            "FLUX_ENCLOSING_ID": r"[ƒf][1-9A-HJ-NP-Za-km-z]{1,16}|[0-9]{1,20}|0x[0-9a-f]{1,16}"
            r"|[0-9a-f]{4}(\.[0-9a-f]{4}){3}"
        }
    ),
)

SCHEDULERS: tuple[Scheduler, ...] = (SGE, PBS, LSF, SLURM, FLUX)
"""Every supported scheduler, in the order their host lists and job ids are consulted."""

SCHEDULERS_BY_KEY: Mapping[str, Scheduler] = MappingProxyType({row.key: row for row in SCHEDULERS})


def scheduler_by_key(key: str) -> Scheduler:
    """The row whose key is ``key`` (what a pickled row unpickles to)."""
    return SCHEDULERS_BY_KEY[key]


def first_host(
    env: Mapping[str, str],
    read_text: Callable[[str], str] = read_host_file,
    *,
    launch: tuple[tuple[HostList, ...], str] | None = None,
) -> tuple[str, str] | None:
    """``(host, variable)`` of the first host list present (``launch``'s first), or ``None``; bad lists: LayoutError."""
    sources = [(source, launch[1]) for source in launch[0]] if launch is not None else []
    sources += [(source, scheduler.name) for scheduler in SCHEDULERS for source in scheduler.host_lists]
    for source, owner in sources:
        value = env.get(source.variable)
        if value is not None:
            host, _ = next(read_hosts(value, source, owner, read_text))
            return host, source.variable
    return None


def detect_scheduler(env: Mapping[str, str]) -> Scheduler | None:
    """The scheduler whose job this process runs in: the first row whose job id variables are all set and non-empty."""
    return next((row for row in SCHEDULERS if all(env.get(variable) for variable in row.job_id)), None)


def job_identity(env: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """The first scheduler job id present (all of its variables set and non-empty), and the variables it came from."""
    scheduler = detect_scheduler(env)
    if scheduler is None:
        return None
    names = (*scheduler.job_id, *(name for name in scheduler.array_task if _is_set(env, name, scheduler)))
    return "/".join(env[variable] for variable in names), names


def _is_set(env: Mapping[str, str], name: str, scheduler: Scheduler) -> bool:
    # Not an array task: unset, empty, "undefined" (Grid Engine) and, for the nonzero variables, "0" (LSF).
    value = env.get(name, "")
    return value not in ("", "undefined") and not (name in scheduler.nonzero and value == "0")


def requeue_name(scheduler: Scheduler, env: Mapping[str, str]) -> str | None:
    """The job as the scheduler's requeue command names it (an array task by its array id), unchecked."""
    for template in scheduler.requeue_job:
        names = re.findall(r"\{(\w+)\}", template)
        if all(_is_set(env, name, scheduler) for name in names):
            return template.format(**{name: env[name] for name in names})
    return None


class SchedulerJob(NamedTuple):
    """The scheduler job this process runs in, every value in the scheduler's own syntax (:func:`scheduler_job`)."""

    scheduler: Scheduler
    identity: str
    """The job id and, for a task of an array job, its index (``77/3``): what tells this job from every other."""
    variables: tuple[str, ...]
    requeue_name: str | None
    """The job as the scheduler's requeue command names it (``36_1``, ``7[3]``); ``None`` where it has none."""
    restarts: int | None
    """How often the scheduler restarted this job (``SLURM_RESTART_COUNT``); ``None`` where it exports no count."""
    end_time: int | None = None
    """The job's projected end in epoch seconds (``SLURM_JOB_END_TIME``); ``None`` where it exports none."""

    @property
    def key(self) -> str:
        """The job as a file name: scheduler and identity (``slurm-123``, ``sge-77.3``); safe by its syntax."""
        return f"{self.scheduler.key}-{self.identity.replace('/', '.')}"

    def __str__(self) -> str:
        return describe_job(self.scheduler.name, self.identity)


def describe_job(scheduler_name: str, identity: str) -> str:
    """A job in words, as messages name it (``SGE job 77 task 3``)."""
    return f"{scheduler_name} job {identity.replace('/', ' task ')}"


def scheduler_job(env: Mapping[str, str]) -> SchedulerJob | None:
    """The scheduler job of ``env`` (``None``: none); a variable not in its scheduler's syntax is a JobIdError."""
    scheduler = detect_scheduler(env)
    if scheduler is None:
        return None
    used = [name for name in scheduler.job_syntax if name in scheduler.job_id or _is_set(env, name, scheduler)]
    for name in used:
        check_job_variable(scheduler, name, env[name])
    identity = job_identity(env)
    assert identity is not None  # the scheduler was detected by the same variables
    count = env.get(scheduler.restart_count, "") if scheduler.restart_count else ""
    end = env.get(scheduler.end_time, "") if scheduler.end_time else ""
    return SchedulerJob(
        scheduler,
        identity[0],
        identity[1],
        requeue_name(scheduler, env),
        int(count) if count else None,
        int(end) if end else None,
    )


def check_job_variable(scheduler: Scheduler, name: str, value: str) -> str:
    """``value`` of the job variable ``name`` when in ``scheduler``'s syntax; else a :class:`JobIdError`."""
    if re.fullmatch(scheduler.job_syntax[name], value, flags=re.ASCII) is None:
        shown = value if len(value) <= 80 else f"{value[:80]}..."
        raise JobIdError(
            f"{name}={ascii(shown)} is not in {scheduler.name}'s syntax for it ({scheduler.job_syntax[name]}); it is "
            "not passed to a command or used in a file name.",
            f"Run inside a {scheduler.name} job, which sets {name} itself, and do not set {name} by hand "
            "(unset it in the job script if something else did).",
            variable=name,
            value=value,
            launcher=scheduler.name,
        )
    return value
