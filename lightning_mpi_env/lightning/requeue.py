"""Checkpoint and requeue on a scheduler's warning signal, on Slurm, Grid Engine, PBS and LSF.

The handler only notes the signal; the ranks agree on one step (through the roll call's store, else a collective),
save the HPC checkpoint there, rank 0 runs the scheduler's requeue command, and every rank exits with the
scheduler's requeue status, or 1 past ``LIGHTNING_MPI_ENV_MAX_REQUEUES`` (a job warned after each restart would
requeue forever), or :data:`REQUEUE_BY_JOB_SCRIPT` where the command is missing or failed. The handler goes in
when the environment is made, so that data loader workers, forked later, inherit it and ignore the signal. Started
again, it resumes with ``trainer.fit(model, ckpt_path=hpc_checkpoint(trainer))``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from lightning_mpi_env.core.errors import CheckpointError, SettingError
from lightning_mpi_env.core.schedulers import SCHEDULERS, Scheduler, SchedulerJob, detect_scheduler, scheduler_job
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning.checkpoints import Record
from lightning_mpi_env.lightning.compat import hpc_checkpoint_name, hpc_resume_path

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.watchdog import Watchdog

log = logging.getLogger(__name__)

_received: dict[int, int] = {}  # signal number -> how many times it came; written by the handler only

REQUEUE_BY_JOB_SCRIPT = 75
"""Every rank's exit status where the requeue command cannot run or failed (``EX_TEMPFAIL``, sysexits.h): the
checkpoint is saved, and the job script, outside the container, puts the job back in the queue."""


class _Note:
    """The requeue signal's handler: counts the signal in the process that installed it, then chains to ``previous``.

    ``previous`` is the user's, submitit's or Lightning's. In a process forked since (a data loader worker: the
    scheduler signals every process of the step) it does nothing, so the signal neither ends the worker nor saves
    there; once restored, it behaves as ``previous`` would.
    """

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.owner = os.getpid()
        self.active = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.owner:
            return
        if self.active:
            _received[signum] = _received.get(signum, 0) + 1
        elif self.previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)  # the default action, as if this handler had never been there
            return
        if callable(self.previous):
            self.previous(signum, frame)


class Requeue(NamedTuple):
    """How this job checkpoints and goes back in the queue."""

    scheduler: Scheduler
    signum: signal.Signals
    command: tuple[str, ...]
    """The command rank 0 runs after the checkpoint (empty: the exit status does it)."""
    exit_code: int
    """The exit status of every rank afterwards."""
    job: SchedulerJob
    """The job, its id checked against the scheduler's syntax."""

    @classmethod
    def plan(
        cls,
        env: Mapping[str, str],
        *,
        enabled: bool,
        requeue_signal: signal.Signals | int | None,
        command: Sequence[str] | None,
    ) -> Requeue | None:
        """The plan for this job, or ``None`` (off, no scheduler, none that requeues); ``JobIdError``: a bad job id."""
        scheduler = detect_scheduler(env) if enabled else None
        if scheduler is None or (command is None and not scheduler.requeue_command and not scheduler.requeue_exit_code):
            return None  # off, no scheduler, or Flux: nothing puts a job back in its queue
        job = scheduler_job(env)
        assert job is not None  # detected by the same variables
        if command is None:
            name = job.requeue_name
            command = () if name is None else tuple(part.format(job=name) for part in scheduler.requeue_command)
        if not command and not scheduler.requeue_exit_code:
            return None  # a requeue command that cannot name the job
        signum = scheduler.warning_signal if requeue_signal is None else signal.Signals(requeue_signal)
        return cls(scheduler, signum, tuple(command), scheduler.requeue_exit_code, job)

    def install(self) -> None:
        """Note the signal when it comes (in the main thread only; Python allows handlers nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            log.debug("Not in the main thread: no requeue signal handler.")
            return
        current = signal.getsignal(self.signum)
        if isinstance(current, _Note):
            if current.active and current.owner == os.getpid():
                return
            current = current.previous  # one put back after restore(), or inherited through a fork
        signal.signal(self.signum, _Note(current))

    def restore(self) -> None:
        """Put back the handler :meth:`install` replaced, if this package's is the one in place (repeatable).

        Lightning's Trainer records the handlers in place when it registers its own and puts them back after the
        strategy's teardown: a handler restored before is put back too, inert, until the callback's teardown.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(self.signum)
        if isinstance(current, _Note):
            current.active = False
            signal.signal(self.signum, signal.SIG_DFL if current.previous is None else current.previous)

    @property
    def requested(self) -> bool:
        """Whether the signal came to this process."""
        return _received.get(int(self.signum), 0) > 0

    def runnable(self) -> bool:
        """Whether the requeue command is on ``PATH`` here (a container often lacks the scheduler's client)."""
        return not self.command or shutil.which(self.command[0]) is not None

    def fallback(self) -> str:
        """What the job script adds so that a job whose ranks exit :data:`REQUEUE_BY_JOB_SCRIPT` is requeued."""
        command = " ".join(self.command)
        return (
            f"every rank exits {REQUEUE_BY_JOB_SCRIPT}: in the job script, outside the container, follow the "
            f"launch with `|| {{ s=$?; [ $s -eq {REQUEUE_BY_JOB_SCRIPT} ] && {command}; exit $s; }}` "
            "(docs/preemption.md, 'In a container')"
        )

    def agree(self, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """Whether the signal came to any rank (a collective: every rank must call it, at the same step)."""
        return bool(reduce_boolean_decision(self.requested, all=False))

    def run_command(self) -> bool:
        """Put the job back in the queue (rank 0 calls this, after the checkpoint); whether that worked."""
        if not self.command:
            return True
        # Said first: the scheduler may end this job the moment its command returns (Slurm does, under load).
        _say(f"the job goes back in the queue: `{' '.join(self.command)}`")
        try:
            done = subprocess.run(self.command, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            _say(f"`{' '.join(self.command)}` could not run ({error}).")
            return False
        if done.returncode != 0:
            _say(f"`{' '.join(self.command)}` failed (exit status {done.returncode}): {done.stderr.strip()}")
            return False
        return True


OUTSIDE_A_JOB = "last"
"""What :func:`hpc_checkpoint` gives outside a scheduler: Lightning's ``ckpt_path`` for the newest last checkpoint."""


def hpc_checkpoint(trainer: Any) -> str | None:
    """This job's own newest complete HPC checkpoint, for ``trainer.fit(model, ckpt_path=...)`` on every scheduler.

    ``None`` on a job's first run; a ``CheckpointError`` where the job has none and Lightning would resume another
    job's file by itself. Outside a scheduler there is no job to own a checkpoint: ``"last"``, Lightning's own resume
    of the newest ``last.ckpt`` of the Trainer's ``ModelCheckpoint`` callbacks (none yet: it starts afresh).
    """
    job = scheduler_job(os.environ)
    if job is None:
        if trainer.global_rank == 0:
            unset = ", ".join(name for row in SCHEDULERS for name in row.job_id)
            _say(f"no scheduler job here ({unset} unset): resuming as ckpt_path='last' does")
        return OUTSIDE_A_JOB
    directory = str(trainer.default_root_dir)
    path = checkpoints.resumable(directory, checkpoints.read_record(directory, job), report=trainer.global_rank == 0)
    if path is None:
        _refuse_another_jobs(trainer, directory, job)
    elif trainer.global_rank == 0:
        _say(f"resuming from {path}")
    return path


def refuse_another_jobs_resume(trainer: Any, plan: Requeue) -> None:
    """A ``CheckpointError`` where a fit resumed another job's HPC checkpoint (as Lightning's Slurm resume may)."""
    resumed = trainer.ckpt_path
    if not resumed:
        return
    directory = str(trainer.default_root_dir)
    path = str(resumed)
    name = os.path.basename(path)
    if checkpoints.checkpoint_number(name) is None or os.path.realpath(os.path.dirname(path)) != os.path.realpath(
        directory
    ):
        return
    if any(item.file == name for item in checkpoints.read_record(directory, plan.job).saved):
        return
    owner = checkpoints.owner_of(directory, name)
    whose = f"saved by {owner}" if owner is not None else "with no record of the job that saved it"
    raise CheckpointError(
        f"{plan.job} resumed {path}, {whose}, not by this job (Lightning's own Slurm resume takes the highest "
        "hpc_ckpt_<n>.ckpt of default_root_dir, whichever job saved it).",
        "Resume this job's own checkpoint with trainer.fit(model, ckpt_path=lightning_mpi_env.hpc_checkpoint("
        "trainer)), and give each job its own default_root_dir, e.g. Trainer(default_root_dir=os.path.join('runs', "
        f"os.environ['{plan.job.variables[0]}'])).",
        variable="ckpt_path",
        value=path,
        launcher=plan.scheduler.name,
    )


def _refuse_another_jobs(trainer: Any, directory: str, job: SchedulerJob) -> None:
    hint = (
        "Give each job its own default_root_dir, e.g. Trainer(default_root_dir=os.path.join('runs', "
        f"os.environ['{job.variables[0]}'])), or move the file out of {directory}."
    )
    try:
        theirs = hpc_resume_path(trainer)
    except ValueError as error:
        raise CheckpointError(
            f"{job} has no checkpoint of its own in default_root_dir={directory}, and Lightning's own Slurm resume "
            f"cannot read the checkpoint names there: {error}.",
            hint,
            variable="default_root_dir",
            value=directory,
            launcher=job.scheduler.name,
        ) from error
    if theirs is None:
        return
    owner = checkpoints.owner_of(directory, os.path.basename(theirs))
    whose = f"saved by {owner}" if owner is not None else "with no record of the job that saved it"
    raise CheckpointError(
        f"{job} has no checkpoint of its own in default_root_dir={directory}, and Lightning would resume {theirs}, "
        f"{whose}, by itself under Slurm.",
        hint,
        variable="default_root_dir",
        value=directory,
        launcher=job.scheduler.name,
    )


def newest_checkpoint(directory: str) -> str | None:
    """The HPC checkpoint with the highest number in ``directory`` by name alone, or ``None``."""
    numbers = [n for name in checkpoints.names(directory) if (n := checkpoints.checkpoint_number(name)) is not None]
    return os.path.join(directory, hpc_checkpoint_name(max(numbers))) if numbers else None


def _say(message: str) -> None:
    # One line on stderr, in one write: several ranks share the launcher's output.
    sys.stderr.write(f"lightning-mpi-env: requeue: {message}\n")
    sys.stderr.flush()


def checkpoint_and_requeue(trainer: Any, plan: Requeue, max_requeues: int, cause: str = "") -> None:
    """Save the HPC checkpoint on every rank, requeue from rank 0, and exit with the plan's status (1: over, failed)."""
    directory = str(trainer.default_root_dir)

    def number(requeues: int) -> int:  # this requeue's number: Slurm counts restarts itself, else the job's record
        return (plan.job.restarts if plan.job.restarts is not None else requeues) + 1

    def over(requeues: int) -> bool:
        return bool(max_requeues) and number(requeues) > max_requeues

    def counted(record: Record) -> Record:  # in the same write as the finished save: the requeue may end us at once
        return record._replace(requeues=record.requeues + (not over(record.requeues)))

    # Rank 0's answer on every rank: one job, one exit status, also where the command is missing.
    runnable = bool(trainer.strategy.broadcast(plan.runnable() if trainer.global_rank == 0 else None, src=0))
    saved = checkpoints.save_recorded(trainer, plan.job, finish=counted)
    path = saved.path
    let_workers_end()
    if saved.record is None:
        # No collective after this: the scheduler ends every rank of a requeued job at once.
        raise SystemExit(1 if over(saved.requeues) else (plan.exit_code if runnable else REQUEUE_BY_JOB_SCRIPT))
    _say(f"saved {path} at step {trainer.global_step} after {cause or plan.signum.name}")
    if over(saved.requeues):
        counter = plan.job.scheduler.restart_count or f"the job's record {checkpoints.record_path(directory, plan.job)}"
        _say(
            f"not requeued: this would be requeue {number(saved.requeues)} of {plan.job}, past "
            f"{VARIABLE['max_requeues']}={max_requeues} (counted by {counter}). Resume from {path} in a new job with "
            f"`trainer.fit(model, ckpt_path=...)`, or raise {VARIABLE['max_requeues']} (0: no limit)."
        )
        raise SystemExit(1)
    if not runnable:
        _say(f"`{plan.command[0]}` is not on PATH here: the checkpoint {path} is saved, and {plan.fallback()}.")
        raise SystemExit(REQUEUE_BY_JOB_SCRIPT)
    if plan.run_command():
        raise SystemExit(plan.exit_code)
    _say(f"the checkpoint {path} is saved, and {plan.fallback()}.")
    raise SystemExit(REQUEUE_BY_JOB_SCRIPT)


END_TIME_SLACK = 60.0
"""Seconds before the job's projected end from which a ``SIGTERM`` counts as its time limit: the controller checks
the limits periodically and never early, so only clock skew between the nodes and the controller comes first."""


def ended_by_time_limit(
    job: SchedulerJob, now: float, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> bool | None:
    """Whether a ``SIGTERM`` to ``job`` now is its time limit (``True``) or a cancel (``False``); ``None``: unknown.

    The exported end time answers where the scheduler exports one; else its reason for ending the job (Slurm's
    ``squeue --format=%r``), which needs the scheduler's client.
    """
    row = job.scheduler
    if job.end_time is not None:
        return now >= job.end_time - END_TIME_SLACK
    if not row.end_reason or job.requeue_name is None:
        return None
    command = [part.format(job=job.requeue_name) for part in row.end_reason]
    try:
        done = run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    answer = done.stdout.strip()[:100]  # one reason word; anything else is no time limit
    return answer == row.time_limit_reason


def requeue_at_time_limit(plan: Requeue | None, rank: int, reduce_boolean_decision: Callable[..., bool]) -> bool:
    """Whether the ``SIGTERM`` every rank stops on is the job's time limit, rank 0's answer on every rank.

    Every rank calls it at the same step (a collective where the scheduler can tell a time limit at all). Where it
    cannot be told, rank 0 says what the job script needs, and the ranks stop as on any ``SIGTERM``.
    """
    if plan is None or not (plan.job.scheduler.end_time or plan.job.scheduler.end_reason):
        return False
    answer = ended_by_time_limit(plan.job, time.time()) if rank == 0 else True
    if answer is None:
        row = plan.job.scheduler
        _say(
            f"not requeued: {plan.job} got SIGTERM, and neither {row.end_time} nor `{row.end_reason[0]}` says whether "
            f"it is the time limit. Add `{row.job_script.splitlines()[0]}` to the job script: the warning signal "
            "checkpoints and requeues before the limit."
        )
    return bool(reduce_boolean_decision(answer is True, all=True))


def let_workers_end() -> Any:
    """Let data loader workers end without a traceback; the handler replaced (``None`` outside the main thread).

    For a rank that stops: past the requeue's save, or after a ``SIGTERM`` that reached the workers too. torch's
    ``SIGCHLD`` handler would raise "DataLoader worker ... is killed by signal" wherever the rank's main thread is.
    A handler that does nothing, not ``SIG_DFL``: a ``SIGCHLD`` that came with the ``SIGTERM`` is run after it, and
    Python names one whose handler became ``SIG_DFL`` meanwhile ("Signal 17 ignored due to race condition").
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGCHLD, _worker_ended)


def _worker_ended(signum: int, frame: FrameType | None) -> None:
    """A data loader worker of a stopping rank ended: no error (multiprocessing reaps it, as under ``SIG_DFL``)."""


def requeue_due(
    plan: Requeue | None, stall_watchdog: Watchdog | None, finished: int, reduce_boolean_decision: Callable[..., bool]
) -> bool:
    """Whether every rank checkpoints and requeues now, after its ``finished``-th step (``LoopCalls.requeue_due``)."""
    if plan is None:
        return False
    agreement = stall_watchdog.agreement if stall_watchdog is not None else None
    if agreement is None or plan.signum == signal.SIGTERM:
        return plan.agree(reduce_boolean_decision)
    assert stall_watchdog is not None
    return agreement.due(finished, wait=max(60.0, 10 * stall_watchdog.interval))


def requeue_now(plan: Requeue | None, fabric: object) -> NoReturn:
    """After a Fabric loop's checkpoint: rank 0 requeues the job, then every rank exits (``LoopCalls.requeue_now``)."""
    if plan is None:
        raise SettingError(
            "requeue_now() was called, but this job has no scheduler that can requeue it, or requeue is off.",
            "Call it only when requeue_requested() said so.",
        )
    runnable = bool(fabric.broadcast(plan.runnable(), src=0))  # type: ignore[attr-defined]  # rank 0's answer
    fabric.barrier("lightning_mpi_env.lightning.requeue.saved")  # type: ignore[attr-defined]  # every rank's save is done
    let_workers_end()
    # No collective after this: the scheduler ends every rank of a requeued job at once.
    if not runnable:
        if fabric.global_rank == 0:  # type: ignore[attr-defined]
            _say(f"`{plan.command[0]}` is not on PATH here: the checkpoint is saved, and {plan.fallback()}.")
        raise SystemExit(REQUEUE_BY_JOB_SCRIPT)
    if fabric.global_rank != 0 or plan.run_command():  # type: ignore[attr-defined]
        raise SystemExit(plan.exit_code)
    _say(f"the checkpoint is saved, and {plan.fallback()}.")
    raise SystemExit(REQUEUE_BY_JOB_SCRIPT)
