"""Requests about many keys, in batches of at most :data:`BATCH` keys each.

torch's ``TCPStore`` server parses a request's keys at a cost that grows with the square of their count: one
``check`` of 16,384 keys takes longer than sixteen of 1,024. Rank 0 asks about every rank's key (claims, node
assignments, watchdog reports) through these functions, never in one request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

BATCH = 1024
"""The most keys one request names."""


def batches(keys: Sequence[str], size: int = BATCH) -> Iterator[Sequence[str]]:
    """``keys`` in consecutive slices of at most ``size``."""
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def multi_get(store: Store, keys: Sequence[str]) -> list[bytes]:
    """The values of ``keys``, in order; the server holds each batch until all its keys are set."""
    values: list[bytes] = []
    for batch in batches(keys):
        values.extend(store.multi_get(list(batch)))
    return values


def multi_set(store: Store, keys: Sequence[str], values: Sequence[str]) -> None:
    """Set every key of ``keys`` to the value at its index in ``values``."""
    for start in range(0, len(keys), BATCH):
        store.multi_set(  # type: ignore[attr-defined]  # public, not in torch's type stubs
            list(keys[start : start + BATCH]), list(values[start : start + BATCH])
        )


SINGLES = 32
"""Below this many keys, a batch not all set is asked about key by key: halving it further would cost more."""


def present(store: Store, keys: Sequence[str]) -> list[str]:
    """The keys of ``keys`` that are set: one ``check`` for a batch that is all set, else its halves, in turn."""
    found: list[str] = []
    for batch in batches(keys):
        _present(store, batch, found)
    return found


def _present(store: Store, keys: Sequence[str], found: list[str]) -> None:
    if store.check(list(keys)):
        found.extend(keys)
    elif 1 < len(keys) <= SINGLES:
        found.extend(key for key in keys if store.check([key]))
    elif len(keys) > SINGLES:
        half = len(keys) // 2
        _present(store, keys[:half], found)
        _present(store, keys[half:], found)


class Arrivals:
    """Which of many keys are set, asking the server only about the batches not yet known to be complete."""

    def __init__(self, store: Store, keys: Sequence[str]) -> None:
        self.store, self.batches = store, list(batches(keys))
        self.complete = 0
        """The batches at the start that are known to be all set."""

    def all_in(self) -> bool:
        """Whether every key is set: one ``check`` of the first open batch, more only while batches complete."""
        while self.complete < len(self.batches) and self.store.check(list(self.batches[self.complete])):
            self.complete += 1
        return self.complete == len(self.batches)

    def present(self) -> list[str]:
        """The keys set so far (:func:`present` of the open batches only)."""
        done = [key for batch in self.batches[: self.complete] for key in batch]
        return done + [key for batch in self.batches[self.complete :] for key in present(self.store, batch)]
