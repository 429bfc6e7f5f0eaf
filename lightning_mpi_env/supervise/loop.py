"""The supervisor's loop: run the step, read its failure records, decide, relaunch without the hosts to blame.

Each step gets a folder of its own, ``<state>/<job>/step-<n>``, which the child alone sees as
``LIGHTNING_MPI_ENV_STATE_DIR``; the timeline goes to stderr and to ``<state>/<job>/timeline.jsonl``. The lines said
before a wait (the backoff, the probe) are no events: the timeline records what happened.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_mpi_env.core.errors import FailureRecordError, MpiEnvError, SettingError
from lightning_mpi_env.core.network import host_of_fabric_name
from lightning_mpi_env.core.records import FailureRecord
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.settings import VARIABLE, Settings, host_template
from lightning_mpi_env.core.state_files import ask_to_leave_out
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.supervise.allocation import same_host
from lightning_mpi_env.supervise.exits import died_record
from lightning_mpi_env.supervise.policy import Action, RestartPolicy, StepOutcome, describe
from lightning_mpi_env.supervise.probe import PROBE_TIMEOUT, probe
from lightning_mpi_env.supervise.records import read_first_step, read_records, read_stragglers
from lightning_mpi_env.supervise.relaunch_hosts import Relaunch, Shortfall
from lightning_mpi_env.supervise.step import GRACE, StepEnd, run_step
from lightning_mpi_env.supervise.steps import Step, step_line
from lightning_mpi_env.supervise.timeline import PREFIX, Event, EventKind, Timeline, Value

DEFAULT_STATE = ".lightning-mpi-env-run"
"""The state folder under the working directory (a batch job's, on a file system every node sees)."""
SHOWN_HOSTS = 8
"""The most host names the probe's line lists; the rest are counted."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

RunStep = Callable[..., StepEnd]
Probe = Callable[..., dict[str, str]]


@dataclass
class _Job:
    """What the loop knows of the job across its steps."""

    line: Step
    timeline: Timeline
    excluded: list[str] = field(default_factory=list)
    last_fault_step: int | None = None
    first_step_seen: bool = False
    stragglers_said: dict[int, float] = field(default_factory=dict)
    """This step's stragglers, each rank with the factor it was last shown at."""
    stragglers_unreadable: bool = False
    """This step's straggler record could not be read, and that was said."""
    leave_out: bool = False
    """Whether to ask a step to end at a checkpoint and leave its stragglers' hosts out (where there are spares)."""
    leave_out_asked: bool = False
    """This step was asked to, or told that no host is spare."""


def supervise(
    words: Sequence[str],
    policy: RestartPolicy,
    *,
    env: Mapping[str, str],
    state: str = DEFAULT_STATE,
    probe_timeout: float = PROBE_TIMEOUT,
    grace: float = GRACE,
    min_nodes: int | None = None,
    leave_out_stragglers: bool = False,
    say: Callable[[str], object] = lambda line: print(line, file=sys.stderr, flush=True),
    run: RunStep = run_step,
    check: Probe = probe,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """Run the launcher line ``words`` under ``policy`` until it succeeds or the policy stops; the last step's status.

    ``min_nodes``: an ``mpirun`` line may be relaunched on as few hosts (see :mod:`.steps`). A line the supervisor
    cannot relaunch raises :func:`~.steps.step_line`'s errors, and settings under which no host would be left out
    :func:`check_leave_out`'s, before anything runs. ``leave_out_stragglers``: once rank 0 names a straggler, ask
    the step to end at its next periodic checkpoint and leave the straggler's host out of the relaunch, where the
    allocation has a spare host for it.
    """
    line = step_line(words, env, min_nodes=min_nodes)
    if leave_out_stragglers:
        check_leave_out(env)
    template = host_template(env)
    identity = job_identity(env)
    job_id = identity[0] if identity is not None else None
    root = Path(state) / (_UNSAFE.sub("_", job_id) if job_id is not None else f"pid-{os.getpid()}")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "timeline.jsonl", "a", encoding="utf-8") as journal:

        def keep(text: str) -> None:
            journal.write(text + "\n")
            journal.flush()  # a reader (or the next step's supervisor) sees each event as it happens

        job = _Job(line, Timeline(say, keep), leave_out=leave_out_stragglers)
        argv = list(line.words)
        step_env: Mapping[str, str] = env  # the relaunch's own (rank 0's host) over the supervisor's
        step = 0
        while True:
            step += 1
            folder = root / f"step-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            job.timeline.add(Event(EventKind.LAUNCH, step, " ".join(argv), fields={"argv": list(argv)}))
            job.first_step_seen, job.stragglers_said, job.stragglers_unreadable = False, {}, False
            job.leave_out_asked = False
            end = run(
                argv,
                {**step_env, VARIABLE["state_dir"]: str(folder)},
                str(folder),
                tick=functools.partial(_look_at_progress, job, step, str(folder)),
                grace=grace,
            )
            outcome = StepOutcome(end.status, _records(str(folder), end, line, job_id, say))
            if end.status != 0 and not outcome.recovered:
                job.timeline.add(_failure(step, outcome, end))
                job.last_fault_step = next((r.step for r in outcome.records if r.step is not None), None)
            decision = policy.decide(outcome)
            if decision.action is Action.DONE:
                job.timeline.add(Event(EventKind.DONE, step, decision.message, fields={"status": end.status}))
                return 0 if outcome.recovered else end.status
            if decision.action is Action.STOP:
                reason = decision.reason.value if decision.reason is not None else None
                stop: dict[str, Value] = {"status": end.status, "reason": reason}
                job.timeline.add(Event(EventKind.STOP, step, decision.message, fields=stop))
                return end.status
            hosts = line.hosts
            _exclude(job, step, [_node_name(host, template, hosts) for host in decision.exclude], EventKind.EXCLUDED)
            relaunches = f"relaunch {policy.relaunched} of at most {policy.restarts}"
            if decision.wait > 0:
                job.timeline.say(f"{PREFIX}: waiting {decision.wait:g} s (the backoff) before {relaunches}")
            sleep(decision.wait)
            if hosts is not None:
                candidates = [host for host in hosts if host not in job.excluded]
                if candidates:
                    job.timeline.say(_probing_text(candidates, probe_timeout, relaunches))
                failed = check(candidates, env=env, timeout=probe_timeout, line_for=line.probe_line)
                _exclude(job, step, [host for host in candidates if host in failed], EventKind.PROBE, failed)
            placed = line.relaunch(job.excluded, overlap=end.abandoned, folder=root / f"step-{step + 1}")
            if isinstance(placed, Shortfall):
                message = f"{placed.message} {placed.hint}"
                job.timeline.add(Event(EventKind.STOP, step, message, fields={"status": end.status, "reason": "hosts"}))
                return end.status
            argv, (step_env, stale) = placed.argv, _relaunch_env(env, placed, job.excluded)
            relaunch: dict[str, Value] = {"wait": decision.wait, "nodes": placed.nodes}
            relaunch["unmatched"] = list(placed.unmatched)
            relaunch["dropped_main_address"] = stale
            text = _relaunch_text(decision.message, placed, stale)
            job.timeline.add(Event(EventKind.RELAUNCH, step + 1, text, fields=relaunch))


def check_leave_out(env: Mapping[str, str]) -> None:
    """A ``SettingError`` where the ranks would never leave a straggler's host out (``--leave-out-stragglers``)."""
    settings = Settings.from_env(env)
    every = VARIABLE["checkpoint_every"]
    if not settings.checkpoint_every:
        raise SettingError(
            f"--leave-out-stragglers ends the step at a periodic checkpoint, and {every} is unset or 0: there is none.",
            f"Export {every}=N for the step: a checkpoint every N training steps (docs/recovery.md).",
            variable=every,
            value=env.get(every, ""),
        )
    if not (settings.stragglers and settings.straggler_window):
        off = VARIABLE["stragglers"] if not settings.stragglers else VARIABLE["straggler_window"]
        raise SettingError(
            f"--leave-out-stragglers acts on the stragglers rank 0 names, and {off}=0 turns the straggler watch off.",
            f"Unset {off}, or run without --leave-out-stragglers.",
            variable=off,
            value=env.get(off, ""),
        )


def _records(
    folder: str, end: StepEnd, line: Step, job_id: str | None, say: Callable[[str], object]
) -> tuple[FailureRecord, ...]:
    try:
        records = tuple(read_records(folder))
    except FailureRecordError as error:
        say(f"lightning-mpi-env run: {error.one_line()}")
        records = ()
    if records or end.status == 0:
        return records
    died = died_record(line.exits(end.errors), launcher=line.launcher, job_id=job_id)
    return (died,) if died is not None else ()


def _failure(step: int, outcome: StepOutcome, end: StepEnd) -> Event:
    fields: dict[str, Value] = {"status": end.status, "hosts": list(outcome.hosts_to_blame)}
    fields["verdict_at"] = min((record.when for record in outcome.records), default=None)
    fields["abandoned"] = end.abandoned
    message = describe(outcome)
    if end.abandoned:
        message += "; the step did not end after the verdict, so its launcher was killed"
    return Event(EventKind.FAILURE, step, message, fields=fields)


def _node_name(name: str, template: str, hosts: Sequence[str] | None) -> str:
    """The node a record's host name stands for; a name that is itself a host of the allocation stays.

    ``node1`` for ``node1-ib`` where ``LIGHTNING_MPI_ENV_MAIN_HOST`` names rank 0's host on the fabric.
    """
    node = host_of_fabric_name(template, name)
    if node != name and any(same_host(name, host) for host in hosts or ()):
        return name
    return node


def _probing_text(hosts: Sequence[str], timeout: float, relaunches: str) -> str:
    """The line said before the health probe waits: how many hosts, the longest wait, and the first few names."""
    more = len(hosts) - SHOWN_HOSTS
    names = ", ".join(hosts[:SHOWN_HOSTS]) + (f" and {more} more" if more > 0 else "")
    return f"{PREFIX}: probing {len(hosts)} host(s), up to {timeout:g} s, before {relaunches}: {names}"


def _relaunch_env(
    env: Mapping[str, str], placed: Relaunch, excluded: Sequence[str]
) -> tuple[dict[str, str], str | None]:
    """The relaunched step's environment, and the ``MASTER_ADDR`` taken out of it (``None``: none was).

    A ``MASTER_ADDR`` that the batch script exported and that names a host left out is taken out: rank 0 no longer
    runs there, and without it the ranks take rank 0's host from the launch (srun's step node list starts with it).
    """
    stepped = {**env, **placed.env}
    given = env.get(TORCH.master_addr)
    if TORCH.master_addr in placed.env or given is None or not any(same_host(given, host) for host in excluded):
        return stepped, None
    del stepped[TORCH.master_addr]
    return stepped, given


def _relaunch_text(message: str, placed: Relaunch, stale: str | None) -> str:
    """The relaunch's line: blamed names that no host of the allocation bears, and a stale ``MASTER_ADDR``."""
    if placed.unmatched:
        message += (
            f"; no host of the allocation is named {' or '.join(placed.unmatched)}, as the failure records name the "
            "failed host, so nothing was left out for it: compare the host names the ranks report (hostname) with "
            "the scheduler's node names"
        )
    if stale is not None:
        message += (
            f"; MASTER_ADDR={stale}, exported for the job, names a host left out: the relaunched step runs without "
            "it, and its ranks take rank 0's host from the launch"
        )
    return message


def _exclude(job: _Job, step: int, hosts: list[str], kind: EventKind, why: Mapping[str, str] | None = None) -> None:
    new = [host for host in hosts if host not in job.excluded]
    if not new:
        return
    job.excluded.extend(new)
    text = ", ".join(f"{host} ({why[host]})" for host in new) if why else ", ".join(new)
    job.timeline.add(Event(kind, step, text, fields={"hosts": new}))


def _look_at_progress(job: _Job, step: int, folder: str) -> None:
    """What the step's rank 0 recorded while it runs: its first training step, and the stragglers it named."""
    _look_for_first_step(job, step, folder)
    try:
        found = read_stragglers(folder)
    except MpiEnvError as error:
        if not job.stragglers_unreadable:  # said once a step
            job.stragglers_unreadable = True
            job.timeline.say(f"lightning-mpi-env run: {error.one_line()}")
        return
    for finding in () if found is None else found.stragglers:
        if job.stragglers_said.get(finding.rank) == finding.factor:
            continue
        job.stragglers_said[finding.rank] = finding.factor
        message = (
            f"rank {finding.rank} on {finding.host} works x{finding.factor:.1f} the median of all ranks a step, "
            f"over its last {finding.steps} steps (training step {finding.step})"
        )
        fields: dict[str, Value] = {"rank": finding.rank, "host": finding.host, "factor": round(finding.factor, 3)}
        fields.update({"steps": finding.steps, "training_step": finding.step})
        job.timeline.add(Event(EventKind.STRAGGLER, step, message, when=finding.when, fields=fields))
    if job.leave_out and job.stragglers_said and not job.leave_out_asked:
        _ask_to_leave_out(job, folder)


def _ask_to_leave_out(job: _Job, folder: str) -> None:
    """Ask the step's rank 0 to leave its stragglers' hosts out at its next periodic checkpoint: at most the spares."""
    job.leave_out_asked = True
    spares = job.line.spares(job.excluded)
    if not spares:
        job.timeline.say(
            f"{PREFIX}: the stragglers' hosts stay in the step: the allocation has no host the step leaves spare "
            "(--leave-out-stragglers needs one: a host more in the allocation than the step runs on)"
        )
        return
    problem = ask_to_leave_out(folder, spares)
    if problem is not None:
        job.timeline.say(f"{PREFIX}: the stragglers' hosts stay in the step: {problem}")
        return
    job.timeline.say(
        f"{PREFIX}: asked the step to end at its next periodic checkpoint and leave out the hosts of the ranks that "
        f"still stand out then, at most {spares} (the allocation's spare hosts)"
    )


def _look_for_first_step(job: _Job, step: int, folder: str) -> None:
    """The ``first_step`` event, once per step, when the step's first training step is recorded."""
    if job.first_step_seen:
        return
    try:
        first = read_first_step(folder)
    except MpiEnvError as error:
        job.first_step_seen = True
        job.timeline.say(f"lightning-mpi-env run: {error.one_line()}")
        return
    if first is None:
        return
    job.first_step_seen = True
    fields: dict[str, Value] = {"global_step": first.step, "resumed_from": first.resumed_from}
    fields["resumed_step"] = first.resumed_step
    if first.resumed_from is None:
        message = f"training step {first.step}, started afresh: no checkpoint of this job to resume"
    else:
        message = f"training step {first.step}, resumed from {first.resumed_from} (step {first.resumed_step})"
    if first.resumed_step is not None and job.last_fault_step is not None:
        lost = max(0, job.last_fault_step - first.resumed_step)
        fields["steps_lost"] = lost
        message += f"; {lost} step(s) since that checkpoint were lost and are done again"
    job.timeline.add(Event(EventKind.FIRST_STEP, step, message, when=first.when, fields=fields))
