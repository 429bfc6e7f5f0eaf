"""The stall rule, pure: what rank 0 remembers of every rank's reports, and when that adds up to a stall.

Two rules, either is a stall (:func:`find_stall`): no progress anywhere for the timeout while the ranks are not
level (some rank got further and waits in the next collective; work slow for everyone leaves them level), or one
rank's heartbeat silent for the timeout while the others' go on, whatever the loop marks. Marks come before the first
step too (:data:`BEFORE_THE_FIRST_STEP`), between the collectives of setup and the sanity check, so that a rank stuck
there is behind the others waiting in the next one; and at a validation's start and end, which every rank reaches as
often, so that a rank stuck in validation is behind the others waiting after it. A validation batch is no mark (ranks
may have uneven batches) but counts as progress (``busy``): a rank still validating while the others wait is working.
A rank behind whose heartbeat stopped too is *frozen*; else *alive*, its main thread's place shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.errors import StallError
from lightning_mpi_env.core.records import FailureKind, Fault
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.rollcall.claims import format_ranks
from lightning_mpi_env.rollcall.store_values import Report

PHASES: tuple[str, ...] = (
    "between steps",
    "in its training step",
    "in backward",
    "past backward",
    "before its first step",
    "in validation",
    "past validation",
)
"""Where in a step a rank is, by its last mark: after a step (loading the next batch), after the step started,
before backward, after backward; where the loop marks its way to the first step (setup, the sanity check); after a
validation started after a step, and after its last batch (the others wait for it in the next collective)."""

BEFORE_THE_FIRST_STEP = PHASES.index("before its first step")
"""The phase of a mark before the first training step: every rank makes the same marks there, in the same order."""
IN_VALIDATION = PHASES.index("in validation")
PAST_VALIDATION = PHASES.index("past validation")


def interval_for(timeout: float, world_size: int) -> float:
    """Seconds between reports: a quarter of the timeout, at least 0.5 s, and 1 s more per 1,000 ranks."""
    return max(0.5, min(timeout / 4, max(1.0, world_size / 1000)))


@dataclass
class Seen:
    """What rank 0 remembers of one rank: its last report, and since when its progress and heartbeat stood still."""

    report: Report
    progress_since: float
    beat_since: float


def observe(seen: dict[int, Seen], reports: Sequence[Report], now: float) -> None:
    """Take the latest reports into ``seen``."""
    for report in reports:
        before = seen.get(report.rank)
        if before is None:
            seen[report.rank] = Seen(report, now, now)
            continue
        moved = (report.progress, report.busy) != (before.report.progress, before.report.busy)
        progress_since = now if moved else before.progress_since
        beat_since = now if report.beat != before.report.beat else before.beat_since
        seen[report.rank] = Seen(report, progress_since, beat_since)


@dataclass(frozen=True)
class Stall:
    """A stall found: the error every rank shows, and the fault a failure record keeps."""

    error: StallError
    fault: Fault


def find_stall(
    seen: Mapping[int, Seen], now: float, timeout: float, frozen_after: float, world_size: int, started: float = 0.0
) -> StallError | None:
    """The stall in ``seen`` (the module docstring's two rules), as the error every rank shows; else ``None``.

    A heartbeat counts as beating within ``frozen_after``. A rank that never reported counts as behind, from
    ``started``, when rank 0 began watching.
    """
    stall = judge(seen, now, timeout, frozen_after, world_size, started)
    return None if stall is None else stall.error


def judge(
    seen: Mapping[int, Seen], now: float, timeout: float, frozen_after: float, world_size: int, started: float = 0.0
) -> Stall | None:
    """:func:`find_stall`'s verdict and its fault: ``FROZEN`` if a rank named froze or never reported, else stalled."""
    if not seen:
        return None
    top = max(entry.report.progress for entry in seen.values())
    never = [rank for rank in range(world_size) if rank not in seen]
    behind = sorted([rank for rank, entry in seen.items() if entry.report.progress < top] + never)
    last_progress = max([started] + [entry.progress_since for entry in seen.values()])
    no_progress = bool(behind) and now - last_progress >= timeout
    watching = {rank: entry for rank, entry in seen.items() if not entry.report.left}
    beating = [rank for rank, entry in watching.items() if now - entry.beat_since < frozen_after]
    silent = [rank for rank, entry in watching.items() if now - entry.beat_since >= max(timeout, frozen_after)]
    froze = bool(silent) and bool(beating)
    if not no_progress and not froze:
        return None
    named = sorted(set(behind if no_progress else ()) | set(silent if froze else ()))
    marked = top > 0
    if no_progress:
        waiting = sorted(rank for rank, entry in seen.items() if entry.report.progress == top and rank not in named)
    else:
        waiting = sorted(rank for rank in beating if rank not in named)
    stepped = marked and bool(waiting) and _stepped(seen[waiting[0]].report)
    if stepped:
        at = f" at step {seen[waiting[0]].report.step}"
    else:
        at = " before the first step" if marked and waiting else ""
    others = format_ranks(waiting) if waiting else "no other rank"
    if no_progress:
        wait = "waits" if len(waiting) == 1 else "wait"
        them = "it" if len(named) == 1 else "them"
        reason = f"no rank made progress for {timeout:g} s while {others} {wait} for {them}{at}"
    else:
        quiet = max(now - seen[rank].beat_since for rank in silent)
        whose = "its watchdog" if len(silent) == 1 else "their watchdogs"
        verb = "reports" if len(waiting) == 1 else "report"
        reason = f"{whose} fell silent {quiet:.0f} s ago while {others} still {verb}{at}"
    lines = [_describe(rank, seen.get(rank), now, frozen_after, marked) for rank in named]
    frozen = any(rank not in seen or now - seen[rank].beat_since >= frozen_after for rank in named)
    hosts = tuple(dict.fromkeys(seen[rank].report.host for rank in named if rank in seen))
    step = seen[waiting[0]].report.step if stepped else None
    fault = Fault(FailureKind.FROZEN if frozen else FailureKind.STALLED, tuple(named), hosts, step)
    error = StallError(
        f"{format_ranks(named).capitalize()} stalled: {reason}. " + "; ".join(lines) + ".",
        f"Look at the stalled rank's host: a data loader or file system that blocks, a deadlock in the training "
        f"step, or a frozen node. {VARIABLE['stall_timeout']}={timeout:g} sets the timeout (0 turns the watchdog "
        "off); a step that takes longer on some ranks than others needs a larger one.",
        variable=VARIABLE["stall_timeout"],
        value=f"{timeout:g}",
    )
    return Stall(error, fault)


def _stepped(report: Report) -> bool:
    """Whether ``report``'s rank made a training step's mark: its last mark is no setup or sanity check mark."""
    return report.progress > 0 and report.phase != BEFORE_THE_FIRST_STEP


def _describe(rank: int, entry: Seen | None, now: float, frozen_after: float, marked: bool) -> str:
    """One stalled rank: where it was by its last report, and how long ago that was when it is frozen."""
    if entry is None:
        return f"rank {rank} never reported (frozen, or stuck before its watchdog started)"
    report, quiet = entry.report, now - entry.beat_since
    if not marked:
        place = "no step (the loop marks no progress)"
    elif _stepped(report):
        place = f"step {report.step} ({PHASES[report.phase]})"
    else:
        place = f"no step yet ({PHASES[BEFORE_THE_FIRST_STEP]})"
    if quiet >= frozen_after:
        return f"rank {rank} on {report.host}, frozen: its watchdog last reported {quiet:.0f} s ago, at {place}"
    return f"rank {rank} on {report.host} at {place}, alive, main thread at {report.where}"
