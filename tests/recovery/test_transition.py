"""The survivor's watch on rank 0's store from the agreement to the next group: real ``TCPStore`` servers.

A server in a process of its own stands for rank 0's (``conftest.StoreProcess``); frozen with ``SIGSTOP``, it holds
every request, as a frozen rank 0's does.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.connections import shut_to
from lightning_mpi_env.recovery.transition import Transition, watched
from lightning_mpi_env.recovery.worlds import first

LIMIT = 120.0  # only ends a hang
TIMEOUT = 2.0  # the process group's timeout the watch is given


def client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=LIMIT))


def test_a_request_held_by_a_frozen_rank_0_ends_in_the_watch_s_error(store_process):
    # The survivor waits for rank 0's choice of spares; rank 0 froze: the watch gives up on the store after the
    # group's timeout, ends rank 0 (here: only shuts this process's connections, as end_rank_0 does first), and the
    # request that waited fails into the watch's error.
    store = client(store_process.port)
    lost: list[RecoveryError] = []
    watch = Transition(
        store, first(4), 2, timeout=TIMEOUT, store_lost=lambda failure: (lost.append(failure), shut_to(store.port))
    ).start()
    store_process.freeze()
    started = time.monotonic()
    with pytest.raises(RecoveryError) as raised, watched(watch):
        store.get("lightning_mpi_env/recovery/spares")  # never written: waits for rank 0
    watch.stop()
    assert time.monotonic() - started < LIMIT
    assert lost == [raised.value]
    assert "rank 2 of generation 1 lost rank 0's store on the way to generation 2" in raised.value.problem
    assert raised.value.__cause__ is not None  # the request's own error, kept as the cause


def test_a_rank_0_that_answers_is_waited_for_past_the_timeout(store_process):
    # Rank 0 alive and slow (a replacement's start): its store answers the watch, which never gives up.
    store = client(store_process.port)
    lost: list[RecoveryError] = []
    watch = Transition(store, first(4), 1, timeout=TIMEOUT, store_lost=lost.append).start()
    rank_0 = client(store_process.port)
    started = time.monotonic()

    def write_late() -> None:  # rank 0 answers after twice the timeout
        while time.monotonic() - started < 2 * TIMEOUT:
            time.sleep(0.1)
        rank_0.set("lightning_mpi_env/recovery/spares", "node3")

    writer = threading.Thread(target=write_late)
    writer.start()
    with watched(watch):
        assert store.get("lightning_mpi_env/recovery/spares") == b"node3"
    writer.join(LIMIT)
    watch.stop()
    assert lost == []
    assert watch.failure is None


def test_an_error_of_the_way_on_is_raised_as_it_is():
    # A replacement that failed to start, say: the watch did not give up, and the error is the survivor's to raise.
    with pytest.raises(RecoveryError, match="the replacement's step ended"), watched(None):
        raise RecoveryError("the replacement's step ended", "start the job again")
