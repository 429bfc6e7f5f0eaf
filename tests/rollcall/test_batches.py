"""Requests about many keys, on a real ``TCPStore``: none names more than ``BATCH`` keys, and none loses one."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.rollcall.batches import BATCH, multi_get, multi_set, present
from tests.clusters.hydra import free_port

_PREFIXES = itertools.count()


class Recording:
    """The real store, recording each request's name and the number of keys it names."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.requests: list[tuple[str, int]] = []

    def check(self, keys: list[str]) -> bool:
        self.requests.append(("check", len(keys)))
        return self.store.check(keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.requests.append(("multi_get", len(keys)))
        return self.store.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        assert len(keys) == len(values)
        self.requests.append(("multi_set", len(keys)))
        self.store.multi_set(keys, values)

    def counts(self, name: str) -> list[int]:
        return [count for request, count in self.requests if request == name]

    def assert_batched(self) -> None:
        assert self.requests, "no request was made"
        assert all(0 < count <= BATCH for _, count in self.requests), self.requests


@pytest.fixture(scope="module")
def store() -> Iterator[object]:
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", free_port("127.0.0.1"), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield server
    del server


def _keys(count: int) -> list[str]:
    """``count`` keys no other test (or example) of this module uses."""
    prefix = f"batches/{next(_PREFIXES)}/"
    return [prefix + str(index) for index in range(count)]


def _set(store: object, keys: Sequence[str]) -> None:
    multi_set(Recording(store), keys, ["x"] * len(keys))


def test_multi_set_and_multi_get_round_trip_2500_keys(store):
    keys = _keys(2_500)
    values = [f"value of {key}" for key in keys]
    recording = Recording(store)
    multi_set(recording, keys, values)
    assert multi_get(recording, keys) == [value.encode() for value in values]
    recording.assert_batched()
    assert recording.counts("multi_set") == recording.counts("multi_get") == [1024, 1024, 452]


def test_present_asks_once_per_batch_where_every_key_is_set(store):
    # A healthy job: every rank's report is there, and the whole batch answers in one request.
    keys = _keys(2_500)
    _set(store, keys)
    recording = Recording(store)
    assert present(recording, keys) == keys
    assert recording.requests == [("check", 1024), ("check", 1024), ("check", 452)]


@pytest.mark.parametrize(
    "gaps",
    [
        pytest.param(set(), id="none"),
        pytest.param(set(range(2_500)), id="all"),
        pytest.param({0}, id="first"),
        pytest.param({2_499}, id="last"),
        pytest.param({BATCH - 1, BATCH}, id="across-a-batch-edge"),
        pytest.param(set(range(0, 2_500, 2)), id="every-other"),
        pytest.param(set(range(BATCH, 2 * BATCH)), id="a-whole-batch"),
    ],
)
def test_present_finds_exactly_the_set_keys(store, gaps):
    _present_finds_exactly(store, 2_500, gaps)


def _present_finds_exactly(store: object, count: int, gaps: set[int]) -> None:
    """Of ``count`` keys, set all but the ``gaps``: ``present`` names exactly the set ones, in batched requests."""
    keys = _keys(count)
    wanted = [key for index, key in enumerate(keys) if index not in gaps]
    if wanted:
        _set(store, wanted)
    recording = Recording(store)
    assert present(recording, keys) == wanted
    recording.assert_batched()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3_000).flatmap(lambda count: st.tuples(st.just(count), st.sets(st.integers(0, count - 1)))))
def test_present_finds_exactly_the_set_keys_whatever_the_gaps(store, case):
    _present_finds_exactly(store, *case)


def test_no_request_for_no_keys(store):
    recording = Recording(store)
    assert present(recording, []) == []
    assert multi_get(recording, []) == []
    multi_set(recording, [], [])
    assert recording.requests == []
