"""When the supervisor relaunches a step, how long it waits first, and when it stops (:class:`StopReason`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lightning_mpi_env.core.records import FailureKind, FailureRecord

MAX_RESTARTS = 1000
"""The largest ``--restarts`` taken."""


class Action(enum.Enum):
    """What the supervisor does after a step."""

    DONE = "done"
    RELAUNCH = "relaunch"
    """Relaunch the step, without the hosts to blame, after :attr:`Decision.wait` seconds."""
    STOP = "stop"
    """Stop, exiting with the last step's status; :attr:`Decision.reason` says why."""


class StopReason(enum.Enum):
    """Why the loop stops after a failed step."""

    CAP = "restarts"
    SAME_FAULT = "same fault"
    """The same fault came back with the hosts it blamed left out: the program's, which a relaunch would repeat."""
    LAUNCH = "launch"
    """The launch itself is wrong (duplicate or disagreeing ranks): every relaunch would fail the same way."""


@dataclass(frozen=True)
class StepOutcome:
    """How one step ended."""

    status: int
    """The launcher's exit status (``srun``'s: the highest of its tasks')."""
    records: tuple[FailureRecord, ...] = ()

    @property
    def hosts_to_blame(self) -> tuple[str, ...]:
        """The hosts the records blame (kinds whose hosts are at fault), each once, in order."""
        return tuple(dict.fromkeys(host for record in self.records if record.blames_hosts for host in record.hosts))

    @property
    def recovered(self) -> bool:
        """Whether the step finished after recovering in its processes (``restartable``): its only records say so.

        The launcher's status counts the ranks it lost, and says nothing of that.
        """
        return bool(self.records) and all(record.kind is FailureKind.RECOVERED for record in self.records)


Signature = tuple[tuple[str, tuple[int, ...], int | None], ...] | tuple[tuple[str, int], ...]
"""What makes two failures the same fault (:func:`signature`)."""


def signature(outcome: StepOutcome) -> Signature:
    """The fault of a failed step, without its hosts: each record's kind, ranks and step; or how it died, unrecorded."""
    if not outcome.records:
        return ((FailureKind.DIED.value, outcome.status),)
    return tuple(sorted({(record.kind.value, record.ranks, record.step) for record in outcome.records}, key=str))


@dataclass(frozen=True)
class Decision:
    """What to do after a step, and why."""

    action: Action
    wait: float = 0.0
    exclude: tuple[str, ...] = ()
    """Hosts to leave out of the relaunch (added to those left out before)."""
    reason: StopReason | None = None
    message: str = ""
    """One line saying why, for the timeline."""


@dataclass
class RestartPolicy:
    """The restart loop's rules and memory: the cap, the backoff, and the faults seen so far.

    At most ``restarts`` relaunches; ``backoff`` seconds before the first, doubled for each one after up to
    ``max_backoff``, so a fault that comes back at once (a shared file system that hangs) does not relaunch in a tight
    loop; ``same_fault_limit`` steps in a row with one fault make it the program's.
    """

    restarts: int
    backoff: float = 10.0
    max_backoff: float = 300.0
    same_fault_limit: int = 2
    relaunched: int = 0
    faults: list[Signature] = field(default_factory=list)
    """The signature of every failed step so far, in order."""

    def __post_init__(self) -> None:
        if not 0 <= self.restarts <= MAX_RESTARTS:
            raise ValueError(f"restarts={self.restarts} is not from 0 to {MAX_RESTARTS}")  # the CLI checks first
        if self.same_fault_limit < 2:
            raise ValueError("same_fault_limit must be 2 or more: one failure proves nothing about the program")

    def wait_before(self, relaunch: int) -> float:
        """Seconds before relaunch number ``relaunch`` (1 for the first)."""
        return float(min(self.max_backoff, self.backoff * 2 ** max(0, relaunch - 1)))

    def decide(self, outcome: StepOutcome) -> Decision:
        """The decision after a step that ended with ``outcome``; a relaunch is counted here."""
        if outcome.status == 0:
            return Decision(Action.DONE, message="the step succeeded")
        if outcome.recovered:
            return Decision(Action.DONE, message=f"the step succeeded in its processes: {outcome.records[-1].problem}")
        fault = signature(outcome)
        self.faults.append(fault)
        launch_faults = [record for record in outcome.records if not record.blames_hosts]
        if launch_faults:
            kinds = ", ".join(dict.fromkeys(record.kind.value for record in launch_faults))
            return self._stop(
                StopReason.LAUNCH, f"the launch itself is wrong ({kinds}): a relaunch would fail the same way"
            )
        recent = self.faults[-self.same_fault_limit :]
        if len(recent) == self.same_fault_limit and all(seen == fault for seen in recent):
            return self._stop(
                StopReason.SAME_FAULT,
                f"the same fault ({describe(outcome)}) ended {self.same_fault_limit} steps in a row"
                f"{', the hosts it blamed left out' if outcome.hosts_to_blame else ''}: it follows the job, so it is "
                "the program's fault, not a node's",
            )
        if self.relaunched >= self.restarts:
            return self._stop(StopReason.CAP, f"the cap of {self.restarts} restart(s) is reached")
        self.relaunched += 1
        return Decision(
            Action.RELAUNCH,
            wait=self.wait_before(self.relaunched),
            exclude=outcome.hosts_to_blame,
            message=f"relaunch {self.relaunched} of at most {self.restarts} after {describe(outcome)}",
        )

    def _stop(self, reason: StopReason, message: str) -> Decision:
        return Decision(Action.STOP, reason=reason, message=message)


def describe(outcome: StepOutcome) -> str:
    """The fault of a step in a few words."""
    if not outcome.records:
        return f"the step died with status {outcome.status}, no record"
    parts = []
    for record in outcome.records:
        ranks = ", ".join(map(str, record.ranks)) or "-"
        at = f" at step {record.step}" if record.step is not None else ""
        on = f" on {','.join(record.hosts)}" if record.hosts else ""
        parts.append(f"{record.kind.value}: rank(s) {ranks}{on}{at}")
    return "; ".join(dict.fromkeys(parts))
