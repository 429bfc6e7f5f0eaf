"""Stragglers: each rank's own work a step, and the ranks rank 0 names as slower than the others, and records.

A rank's *work* is the part of a training step that waits for no other rank: from the step's start to ``backward``
(the Trainer's ``on_train_batch_start`` to ``on_before_backward``; Fabric under ``"ddp_mpi"``: from the end of one
``backward`` to the start of the next, the loop's forward, optimizer step and data). In DDP every rank waits for the
slowest at each step's collectives, so the whole job runs at the pace of a rank whose work stays slower. Each rank
keeps its last ``window`` work times and reports their median with the watchdog's report; rank 0 names a rank whose
median stays above ``factor`` times the median of all ranks. A median over the window ignores a single slow step (a
checkpoint save, a garbage collection); a job where every rank is slow has no rank above its own median.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.records import FailureRecorder, StragglerFinding, write_stragglers
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.core.values import MAX_FACTOR, shown
from lightning_mpi_env.rollcall.claims import format_ranks
from lightning_mpi_env.rollcall.store_values import Report

WORSE = 1.25
"""A rank already named is named again when its factor grew this much since (it got worse)."""
MIN_EXCESS = 0.002
"""Seconds a rank's work must exceed the median by: below, a timer's and the OS scheduler's noise."""
SHOWN_HOSTS = 5
"""The most hosts the summary at the end of a fit names."""


class WorkTimes:
    """One rank's last ``window`` work times in seconds: added by the training loop, read by the watchdog's thread."""

    def __init__(self, window: int) -> None:
        self._times: deque[float] = deque(maxlen=window)
        self.count = 0
        """Work times added so far."""

    def add(self, seconds: float) -> None:
        """One step's work (a ``deque`` append: no lock, no allocation beyond the float)."""
        self._times.append(seconds)
        self.count += 1

    def median(self) -> float:
        """The median of the last ``window`` work times; ``0.0`` before the first."""
        while True:
            try:
                times = list(self._times)  # another thread appends: a copy made during an append is tried again
            except RuntimeError:
                continue
            return statistics.median(times) if times else 0.0


def seconds_text(seconds: float) -> str:
    """``0.052`` as ``52 ms``, ``2.5`` as ``2.50 s``.

    >>> seconds_text(0.0523), seconds_text(2.5)
    ('52 ms', '2.50 s')
    """
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


@dataclass(frozen=True)
class Straggler:
    """A rank whose work a step stood out: its median over its window against the median of all ranks."""

    rank: int
    host: str
    work: float
    median: float
    steps: int
    """The steps over which its work stood out: its window, and the steps since the first report that showed it."""
    step: int
    """Its training step at the report that named it."""

    @property
    def factor(self) -> float:
        """Its work a step over the median of all ranks (at most :data:`~.core.values.MAX_FACTOR`)."""
        return min(self.work / self.median, MAX_FACTOR) if self.median > 0 else MAX_FACTOR

    def line(self, factor: float) -> str:
        """What rank 0 says: the rank, its host, its time against the median, for how many steps, and what to do."""
        host = _host(self.host)
        return (
            f"lightning-mpi-env: straggler: rank {self.rank} on {host} takes {seconds_text(self.work)} of its own "
            f"work a step, x{self.factor:.1f} the median of all ranks ({seconds_text(self.median)}), over its last "
            f"{self.steps} steps (step {self.step}); every rank waits for it at each step's collectives. Look at "
            f"{host}: its load, clocks, data loading and devices ({VARIABLE['straggler_factor']}={factor:g} "
            "sets the bar; docs/stragglers.md)."
        )


class StragglerWatch:
    """Rank 0's side: the stragglers of the reports it reads each interval, each named once, again if it got worse."""

    def __init__(self, factor: float, window: int) -> None:
        self.factor, self.window = factor, window
        self.named: dict[int, Straggler] = {}
        """Each rank named, as last named."""
        self.worst: dict[int, Straggler] = {}
        """Each rank that stood out, at its highest factor (for :meth:`summary`)."""
        self._since: dict[int, int] = {}  # rank -> its work count at the first report of its current spell
        self.findings: dict[int, StragglerFinding] = {}
        """Each rank named, as the step's record keeps it."""
        self._unwritten = False  # the record could not be written, and this was said

    def name(self, reports: Iterable[Report], say: Callable[[str], object], recorder: FailureRecorder | None) -> None:
        """Say each straggler of ``reports`` to name now; rewrite the step's record of them where there is one."""
        found = self.judge(reports)
        for straggler in found:
            say(straggler.line(self.factor))
            finding = StragglerFinding(
                straggler.rank, straggler.host, straggler.factor, straggler.steps, straggler.step, time.time()
            )
            self.findings[straggler.rank] = finding
        if found and recorder is not None:
            failed = write_stragglers(recorder.folder, self.findings.values(), recorder.job_id)
            if failed is not None and not self._unwritten:
                self._unwritten = True
                say(failed)

    def judge(self, reports: Iterable[Report]) -> list[Straggler]:
        """The ranks of ``reports`` to name now: above the bar, and not named before at a factor this high."""
        full = [report for report in reports if report.worked >= self.window and not report.left]
        if len(full) < 2:
            return []
        median = statistics.median_low(report.work for report in full)
        found = []
        for report in full:
            if report.work <= self.factor * median or report.work - median < MIN_EXCESS:
                self._since.pop(report.rank, None)
                continue
            since = self._since.setdefault(report.rank, report.worked)
            steps = min(report.worked, report.worked - since + self.window)
            straggler = Straggler(report.rank, report.host, report.work, median, steps, report.step)
            worst = self.worst.get(report.rank)
            if worst is None or straggler.factor > worst.factor:
                self.worst[report.rank] = straggler
            last = self.named.get(report.rank)
            if last is None or straggler.factor >= WORSE * last.factor:
                self.named[report.rank] = straggler
                found.append(straggler)
        return found

    def standing(self) -> list[Straggler]:
        """The ranks named that still stood out at the last reports, as last named, the slowest first (any thread)."""
        since, named = self._since.copy(), self.named.copy()  # each one C call: the watchdog's thread may write them
        return sorted((named[rank] for rank in since if rank in named), key=lambda straggler: -straggler.factor)

    def summary(self) -> str | None:
        """One line for the end of a fit: the slowest hosts and their factor; ``None`` when no rank stood out."""
        if not self.worst:
            return None
        hosts: dict[str, list[Straggler]] = {}
        for straggler in self.worst.values():
            hosts.setdefault(straggler.host, []).append(straggler)
        ranked = sorted(hosts.items(), key=lambda item: -max(s.factor for s in item[1]))
        parts = [_host_text(host, stragglers) for host, stragglers in ranked[:SHOWN_HOSTS]]
        more = f" and {len(ranked) - SHOWN_HOSTS} more host(s)" if len(ranked) > SHOWN_HOSTS else ""
        return (
            f"lightning-mpi-env: stragglers in this run: {', '.join(parts)}{more}; every rank waited for them at each "
            "step (docs/stragglers.md)."
        )


def to_leave_out(standing: Sequence[Straggler], spares: int) -> list[Straggler]:
    """The stragglers on the ``spares`` hosts to leave out: the hosts of the slowest first, each host's ranks."""
    hosts = list(dict.fromkeys(straggler.host for straggler in standing))[:spares]
    return [straggler for straggler in standing if straggler.host in hosts]


def leave_out_line(left_out: Sequence[Straggler], step: int) -> str:
    """What rank 0 says (after ``lightning-mpi-env: straggler:``) and records, when it leaves stragglers' hosts out."""
    hosts: dict[str, list[Straggler]] = {}
    for straggler in left_out:
        hosts.setdefault(straggler.host, []).append(straggler)
    parts = ", ".join(_host_text(host, stragglers) for host, stragglers in hosts.items())
    return (
        f"leaving out {parts}, still slower than the others: the step ends at the "
        f"checkpoint of step {step}, and lightning-mpi-env run relaunches it from there on a spare host "
        "(run --leave-out-stragglers; docs/stragglers.md)."
    )


def _host_text(host: str, stragglers: Sequence[Straggler]) -> str:
    """``node2 x2.0 (rank 3)``: a host, its highest factor, its ranks that stood out."""
    ranks = format_ranks(sorted(straggler.rank for straggler in stragglers))
    return f"{_host(host)} x{max(straggler.factor for straggler in stragglers):.1f} ({ranks})"


def _host(host: str) -> str:
    """A host name as a report gave it, quoted and escaped where it is not printable (a forged report's)."""
    return host if host.isprintable() and " " not in host else shown(host)
