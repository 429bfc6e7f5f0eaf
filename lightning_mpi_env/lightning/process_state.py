"""What an ``MPIClusterEnvironment`` changes process-wide for one run, and how each change goes back.

Nothing is changed by an import. Each change goes in when it is needed and comes out at the end of the run:

- the filter for Lightning's srun advice: in when the environment is made, under a launcher other than ``srun``;
  out at the end;
- ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``: in at the roll call, right before ``init_process_group``; out at
  the end;
- the stall watchdog's thread: started by the roll call; stopped at the end;
- the exit hook that settles collectives: in at the roll call; out at the end, unless a process group is alive;
- the requeue signal handler: in when training starts (Trainer: after Lightning set its own handlers; Fabric: the
  first ``requeue_requested()``); out at the end;
- the ``SIGTERM`` handler without a collective (Trainer, Lightning 2.5.2+): in when training starts; out at
  Lightning's teardown, which puts back the handlers from before ``fit``;
- ``sys.excepthook``: in when an error of ours leaves a public method; out at the end, unless that error is on its
  way out then (:mod:`lightning_mpi_env.core.report`);
- the exit hook that ends the run: in with the first change above; out at the end.

**The end** is ``ClusterEnvironment.teardown()``: a Trainer calls it through its strategy's ``teardown`` after
every ``fit``/``validate``/``test``/``predict``, also when they fail, and the callback's ``teardown`` hook calls it
again once Lightning put back its signal handlers. Fabric calls no teardown of its own: a Fabric program ends its
run with ``fabric.strategy.cluster_environment.teardown()`` (or ``environment.teardown()``); whatever it left is
put back at interpreter exit.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from enum import Enum


class Change(Enum):
    """A process-wide change the environment can make, named in the order of the table above."""

    SRUN_FILTER = "filter for Lightning's srun advice"
    FABRIC_EXPORTS = "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME"
    WATCHDOG = "the stall watchdog's thread"
    SETTLE_AT_EXIT = "the exit hook that settles collectives"
    REQUEUE_HANDLER = "the requeue signal handler"


class ProcessChanges:
    """The changes one environment made for its run, each with the function that undoes it.

    :meth:`undo` runs them in reverse order and is idempotent; the first change registers it with ``atexit`` (so a
    Fabric run that is never ended explicitly is ended at exit), and :meth:`undo` unregisters it.
    """

    def __init__(self) -> None:
        self._undo: dict[Change, Callable[[], object]] = {}

    @property
    def made(self) -> list[Change]:
        """The changes in place now, oldest first."""
        return list(self._undo)

    def __contains__(self, change: Change) -> bool:
        return change in self._undo

    def add(self, change: Change, undo: Callable[[], object]) -> None:
        """Record ``change`` (made just now) and how to undo it; a change already recorded keeps its first undo."""
        if not self._undo:
            atexit.register(self.undo)
        self._undo.setdefault(change, undo)

    def undo(self) -> None:
        """Undo every change, newest first (the end of the run)."""
        while self._undo:
            change = next(reversed(self._undo))
            self._undo.pop(change)()
        atexit.unregister(self.undo)

    def __reduce__(self) -> tuple[type[ProcessChanges], tuple[()]]:
        # The changes are this process's: a copy Lightning pickles into a worker (ddp_spawn) starts with none.
        return ProcessChanges, ()

    def __repr__(self) -> str:
        return f"ProcessChanges({', '.join(change.name for change in self._undo) or 'none'})"


__all__ = ["Change", "ProcessChanges"]
