"""How ``restartable`` ends once ``main`` returned: every rank says so, and rank 0 waits for each word.

The launcher's exit status counts the lost ranks' ends (srun's is not 0 once a task was killed), so ``run`` would
take the step for a failure and start it again. Once every rank of the last generation has returned from ``main``,
rank 0 writes a record of kind ``recovered`` into the state folder (``LIGHTNING_MPI_ENV_STATE_DIR``), naming the
lost ranks and their nodes, and ``run`` takes the step as done.

A program that catches its steps' errors returns from ``main`` with a rank lost, and ``restartable`` never saw the
loss. A killed rank's status ends the step; a frozen one would hold it (``srun`` and ``mpirun`` wait for every
task), so rank 0 waits for its word at most the process group's timeout, and writes which ranks did not return:
every rank ends those on its node, rank 0 the others too, and raises. The other ranks wait for that list: a rank 0
frozen after they returned would hold the step too, and its store answers no request then.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.recovery.worlds import World, lost_text, prefix, read_lost
from lightning_mpi_env.rollcall.batches import Arrivals
from lightning_mpi_env.rollcall.claims import format_ranks
from lightning_mpi_env.rollcall.deadline import Deadline, Unanswered

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

DONE_KEY = "done/"
"""Under each generation: add a rank, once it returned from ``main``."""

UNRETURNED_KEY = "done/unreturned"
"""Under each generation: rank 0's list of the ranks that did not return, once it waited for every rank's word."""

POLL = 0.05

HEARD = 10.0
"""Seconds of one wait of a rank for rank 0's list; between two, a request shows that rank 0's store still answers."""

GRACE = 5.0
"""Seconds past a wait that a request to the store may take before it is taken for unanswered (rank 0 frozen)."""


def finished(
    store: Store,
    world: World,
    rank: int,
    lost: Mapping[int, str],
    recorder: FailureRecorder | None,
    timeout: float,
    gone: Callable[[int], bool] = lambda rank: False,
    *,
    requests: Deadline | None = None,
    store_lost: Callable[[RecoveryError], object] = lambda failure: None,
) -> tuple[int, ...]:
    """Say that this rank returned from ``main`` in ``world``; return the ranks of ``world`` rank 0 found frozen.

    Rank 0 waits for every rank's word or end, at most ``timeout`` seconds, and names the ranks that did neither: a
    frozen process whose peers caught their steps' errors, so that ``main`` returned on them; the launcher would wait
    for it. ``gone``: whether a rank's process ended (by its rank in ``world``); a killed rank's status ends the step.
    The other ranks wait for rank 0's list, as long as its store answers: ``()`` where the store ended (rank 0's
    status ends the step). ``requests`` runs their requests with a deadline.

    After a loss (``world.number > 1``), with every rank's word, rank 0 writes the ``recovered`` record into ``run``'s
    state folder (``recorder``; none outside it). ``lost``: each lost launch rank's node (rank 0 knows them).

    Raises:
        RecoveryError: Rank 0's store did not answer (rank 0 frozen, or its node hung), after ``store_lost`` was
            called with the error.
    """
    from torch.distributed import DistError

    keys = [f"{prefix(world.number)}{DONE_KEY}{number}" for number in range(world.world_size)]
    unreturned_key = f"{prefix(world.number)}{UNRETURNED_KEY}"
    if rank != 0:
        try:
            return _heard(store, keys[rank], unreturned_key, world, requests or Deadline())
        except DistError:  # rank 0 ended, or its store did: no record, so run takes the step for what its status says
            return ()
        except Unanswered as error:
            failure = RecoveryError(
                f"rank {rank} of generation {world.number} returned from the function restartable runs, and rank 0's"
                f" store stopped answering ({error}): rank 0 is frozen, or its node hung",
                "start the job again (`lightning-mpi-env run` does); a survivor ends rank 0's process, which the"
                " launcher would wait for",
            )
            store_lost(failure)
            raise failure from error
    try:
        store.set(keys[0], "1")
        missing, ended = _unreturned(store, keys, gone, time.monotonic() + timeout)
        frozen = tuple(number for number in missing if number not in ended)
        store.set(unreturned_key, lost_text(frozen))
    except DistError:  # its own store: only where torch failed it
        return ()
    if not missing and recorder is not None and world.number > 1:
        _record(world, lost, recorder)
    return frozen


def _heard(store: Store, key: str, unreturned_key: str, world: World, requests: Deadline) -> tuple[int, ...]:
    """A rank other than 0: say it returned (``key``), then wait for rank 0's list, while its store answers.

    Raises:
        DistError: The store ended.
        Unanswered: A request to it did not return (rank 0 frozen).
    """
    requests.run(functools.partial(store.set, key, "1"), GRACE)
    while not requests.run(functools.partial(_set_within, store, unreturned_key, HEARD), HEARD + GRACE):
        pass
    raw = requests.run(functools.partial(store.get, unreturned_key), GRACE)
    return read_lost(raw, world.world_size, unreturned_key)


def _set_within(store: Store, key: str, seconds: float) -> bool:
    """Whether ``key`` is set within ``seconds``; the answer to a request shows the store's server answers.

    Raises:
        DistError: The store ended.
    """
    from torch.distributed import DistStoreError

    try:
        store.wait([key], timedelta(seconds=seconds))
    except DistStoreError:  # the wait's time ran out: a check answers where the server does, else raises
        return store.check([key])
    return True


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
