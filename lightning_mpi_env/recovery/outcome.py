"""How ``restartable`` ends once ``main`` returned: every rank says so, and rank 0 waits for each word.

The launcher's exit status counts the lost ranks' ends (srun's is not 0 once a task was killed), so ``run`` would
take the step for a failure and start it again. Once every rank of the last generation has returned from ``main``,
rank 0 writes a record of kind ``recovered`` into the state folder (``LIGHTNING_MPI_ENV_STATE_DIR``), naming the
lost ranks and their nodes, and ``run`` takes the step as done.

A program that catches its steps' errors returns from ``main`` with a rank lost, and ``restartable`` never saw the
loss. A killed rank's status ends the step; a frozen one would hold it (``srun`` and ``mpirun`` wait for every
task), so rank 0 waits for its word at most the process group's timeout, then ends it and raises.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.recovery.worlds import World, prefix
from lightning_mpi_env.rollcall.batches import Arrivals
from lightning_mpi_env.rollcall.claims import format_ranks

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

DONE_KEY = "done/"
"""Under each generation: add a rank, once it returned from ``main``."""

POLL = 0.05


def finished(
    store: Store,
    world: World,
    rank: int,
    lost: Mapping[int, str],
    recorder: FailureRecorder | None,
    timeout: float,
    gone: Callable[[int], bool] = lambda rank: False,
) -> tuple[int, ...]:
    """Say that this rank returned from ``main`` in ``world``; rank 0 waits for every rank's word or end.

    Rank 0 returns the ranks of ``world`` that did neither within ``timeout`` seconds: a frozen process whose peers
    caught their steps' errors, so that ``main`` returned on them; the launcher would wait for it. ``()`` elsewhere.
    ``gone``: whether a rank's process ended (by its rank in ``world``); a killed rank's status ends the step.

    After a loss (``world.number > 1``), with every rank's word, rank 0 writes the ``recovered`` record into ``run``'s
    state folder (``recorder``; none outside it). ``lost``: each lost launch rank's node (rank 0 knows them).
    """
    from torch.distributed import DistError

    keys = [f"{prefix(world.number)}{DONE_KEY}{number}" for number in range(world.world_size)]
    try:
        store.set(keys[rank], "1")
        if rank != 0:
            return ()
        missing, ended = _unreturned(store, keys, gone, time.monotonic() + timeout)
    except DistError:  # rank 0 ended, or its store did: no record, so run takes the step for what its status says
        return ()
    if not missing and recorder is not None and world.number > 1:
        _record(world, lost, recorder)
    return tuple(number for number in missing if number not in ended)


def _unreturned(
    store: Store, keys: list[str], gone: Callable[[int], bool], deadline: float
) -> tuple[list[int], set[int]]:
    """The ranks yet to say they returned, and the ended ones among them: once they all ended, or past ``deadline``."""
    arrivals = Arrivals(store, keys)
    while True:
        ended = {number for number in range(len(keys)) if gone(number)}  # first: a rank says it returned, then ends
        here = set(arrivals.present())
        missing = [number for number, key in enumerate(keys) if key not in here]
        if set(missing) <= ended or time.monotonic() >= deadline:
            return missing, ended
        time.sleep(POLL)


def _record(world: World, lost: Mapping[int, str], recorder: FailureRecorder) -> None:
    """Rank 0: the ``recovered`` record, naming the lost ranks and their nodes."""
    names = format_ranks(lost)
    problem = (
        f"{names} lost; the others went on in their processes through generation {world.number}, and all"
        f" {world.world_size} ranks finished"
    )
    nodes = tuple(dict.fromkeys(node for node in lost.values() if node))
    fault = Fault(FailureKind.RECOVERED, tuple(sorted(lost)), nodes)
    why = recorder.write(fault, problem=problem, written_by=0)
    if why is not None:
        print(why, file=sys.stderr, flush=True)


def unreturned(world: World, ranks: Mapping[int, str], timeout: float) -> RecoveryError:
    """Rank 0's error when ``ranks`` of ``world`` (each with its node, ``""`` unknown) did not return from ``main``."""
    names = ", ".join(f"{number} ({node})" if node else str(number) for number, node in ranks.items())
    return RecoveryError(
        f"rank {names} of generation {world.number} did not return from the function restartable runs within"
        f" {timeout:g} s of the others, and its process still runs: frozen, while the others caught their steps'"
        " errors and went on, so nothing recovered; rank 0 ends it, and the job with this error",
        "let a step's error leave the function, for restartable to recover; start the job again"
        " (`lightning-mpi-env run` does). The wait is the stall timeout (LIGHTNING_MPI_ENV_STALL_TIMEOUT)",
        value=names,
    )
