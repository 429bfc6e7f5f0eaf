"""Which ranks a generation lost: every living process says it lives, rank 0 names the others once, all read it.

A rank whose collective fails sounds the alarm: one key per rank of the generation. Each process keeps a lookout
thread waiting on its own key, which answers at once, whatever the main thread is doing (computing a step, or still
inside a collective with a peer that has already given up on it). A process that is gone or frozen does not
answer. Rank 0's lookout then waits until every rank has answered or ended (:mod:`.liveness`) or, once some have,
until ``settle`` seconds pass without another, and writes the list by ``compare_set``: the first list written is
the one every rank reads. Being a thread, it names the lost while rank 0's main thread may still be held in a
collective. A rank that finds itself in the list answered too late, and ends.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.worlds import World, lost_text, prefix, read_lost
from lightning_mpi_env.rollcall.batches import multi_set, present
from lightning_mpi_env.rollcall.deadline import Deadline, Unanswered

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

POLL = 0.02
"""Seconds between rank 0's looks at how many ranks have answered."""

GRACE = 5.0
"""Seconds past rank 0's deadline that another rank waits for the list rank 0 is writing."""

LOOKOUT_WAIT = 3600.0
"""Seconds of one wait of the lookout thread; it waits again after each, for as long as the generation runs."""

FAILED, DONE = b"failed", b"done"
"""What a rank's alarm key holds: a rank of the generation failed; or this rank's generation ended well."""


class Keys(NamedTuple):
    """The keys of one generation's end."""

    alarm: str
    """Add a rank: its lookout's key."""
    answered: str
    """How many ranks answered."""
    alive: str
    """Add a rank: set once that rank's lookout answered."""
    lost: str
    """The list of the lost, written once."""


def keys_of(world: World) -> Keys:
    """The keys of ``world``'s end, under its own prefix."""
    end = prefix(world.number) + "end/"
    return Keys(end + "alarm/", end + "count", end + "alive/", end + "lost")


class Lookout:
    """A thread of this process that answers the alarm of its generation at once (:mod:`.agreement`)."""

    def __init__(
        self,
        store: Store,
        client: Store,
        world: World,
        rank: int,
        *,
        settle: float,
        timeout: float,
        gone: Callable[[int], bool] = lambda rank: False,
        requests: Deadline | None = None,
    ) -> None:
        """``client``: a client of ``store``'s server of the thread's own (a pending wait holds up its client).

        ``settle`` and ``timeout``: rank 0's lookout names the lost once no rank answered for ``settle`` seconds,
        or at the latest ``timeout`` seconds after the alarm; at once where every rank answered or its process is
        ``gone`` (by its rank in ``world``: :mod:`.liveness`). ``requests``: what runs this process's requests to
        ``store`` with a deadline (:func:`agree_on_lost`'s too): a frozen server holds a request without end.
        """
        self._gone = gone
        self._store = store
        self._requests = requests or Deadline()
        self._client = client
        self._world = world
        self._keys = keys_of(world)
        self._rank = rank
        self._settle = settle
        self._timeout = timeout
        self._thread = threading.Thread(target=self._run, name="lightning-mpi-env-lookout", daemon=True)

    def start(self) -> Lookout:
        """Start the thread; returns this lookout."""
        self._thread.start()
        return self

    def close(self) -> None:
        """End the thread (the generation ended well on this rank)."""
        from torch.distributed import DistError

        done = functools.partial(self._store.set, self._keys.alarm + str(self._rank), DONE.decode())
        with contextlib.suppress(DistError, Unanswered):  # the store is gone or frozen: so is the thread's wait
            self._requests.run(done, GRACE)
        self._thread.join(timeout=GRACE)

    def _run(self) -> None:
        from torch.distributed import DistError

        key = self._keys.alarm + str(self._rank)
        while True:
            started = time.monotonic()
            try:
                self._client.wait([key], timedelta(seconds=LOOKOUT_WAIT))
                if self._client.get(key) == FAILED:
                    self._client.set(self._keys.alive + str(self._rank), "1")
                    self._client.add(self._keys.answered, 1)
                    if self._rank == 0:
                        _name_lost(self._client, self._world, self._settle, self._timeout, self._gone)
                return
            except DistError:
                if time.monotonic() - started < LOOKOUT_WAIT / 2:
                    return  # not a wait that ran out: the store is gone
            except Exception:  # noqa: BLE001  # a daemon thread's error would only print; the main thread decides
                return


def sound_alarm(store: Store, world: World) -> None:
    """Wake every rank's lookout of ``world``: a rank of it failed."""
    alarm = keys_of(world).alarm
    multi_set(store, [alarm + str(rank) for rank in range(world.world_size)], [FAILED.decode()] * world.world_size)


def agree_on_lost(
    store: Store,
    world: World,
    rank: int,
    *,
    settle: float,
    timeout: float,
    requests: Deadline | None = None,
    store_lost: Callable[[RecoveryError], object] = lambda failure: None,
) -> tuple[int, ...]:
    """Sound the alarm, and return the ranks of ``world`` that are lost, as every living rank reads them (``()``: none).

    ``timeout``: how long a living rank may still be held in a collective (the process group's timeout); the other
    ranks wait that long and more for rank 0's list. ``requests``: runs this process's requests to ``store``, which a
    frozen server would hold without end. ``store_lost``: called with the error before it is raised, where the store
    does not answer (rank 0's process, which serves it, is gone or frozen).

    Raises:
        RecoveryError: This rank was counted lost (it answered after the list was written), or no list came (rank 0,
            which writes it and serves the store, is gone).
    """
    from torch.distributed import DistError

    wait = timeout + settle + GRACE
    try:  # the store's timeout bounds each request to a living server, the deadline one to a frozen one
        lost = (requests or Deadline()).run(functools.partial(_read_agreed, store, world, wait), wait + GRACE)
    except (DistError, Unanswered) as error:
        failure = RecoveryError(
            f"rank {rank} of generation {world.number} could not learn which ranks are lost: {error}",
            "rank 0 writes the list and serves the job's store; if it is gone, the job is started again"
            " (`lightning-mpi-env run` does that)",
        )
        store_lost(failure)
        raise failure from error
    if rank in lost:
        raise RecoveryError(
            f"rank {rank} of generation {world.number} was counted lost: it answered after the others had gone on",
            f"rank 0 waited {settle:g} s after the last rank that answered; a rank that was frozen (SIGSTOP) for"
            " longer cannot rejoin, so the job goes on without it",
        )
    return lost


def _read_agreed(store: Store, world: World, wait: float) -> tuple[int, ...]:
    """Sound ``world``'s alarm, and read the list of the lost once rank 0 wrote it (``wait``: the store's timeout)."""
    keys = keys_of(world)
    store.set_timeout(timedelta(seconds=wait))
    sound_alarm(store, world)
    store.wait([keys.lost])
    return read_lost(store.get(keys.lost), world.world_size, keys.lost)


def _name_lost(store: Store, world: World, settle: float, timeout: float, gone: Callable[[int], bool]) -> None:
    keys = keys_of(world)
    deadline = time.monotonic() + timeout
    seen, quiet_since = store.add(keys.answered, 0), time.monotonic()
    while seen < world.world_size and time.monotonic() - quiet_since < settle and time.monotonic() < deadline:
        ended = [rank for rank in range(world.world_size) if gone(rank)]
        if ended and seen + len(ended) >= world.world_size and _accounted(store, world, ended):
            break  # every rank answered or ended: nothing is left to wait for
        time.sleep(POLL)
        now = store.add(keys.answered, 0)
        if now != seen:
            seen, quiet_since = now, time.monotonic()
    alive = _answered(store, world)
    store.compare_set(keys.lost, "", lost_text([rank for rank in range(world.world_size) if rank not in alive]))


def _answered(store: Store, world: World) -> set[int]:
    """The ranks of ``world`` whose lookout answered the alarm."""
    alive = keys_of(world).alive
    return {int(key[len(alive) :]) for key in present(store, [alive + str(rank) for rank in range(world.world_size)])}


def _accounted(store: Store, world: World, ended: list[int]) -> bool:
    """Whether every rank of ``world`` answered or is among the ``ended``."""
    return _answered(store, world) | set(ended) >= set(range(world.world_size))
