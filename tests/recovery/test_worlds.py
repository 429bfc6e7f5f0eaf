"""The generations' rules (``successor``) as a table, and the values read back from the store, hostile ones too."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.worlds import (
    MAX_GENERATIONS,
    Relaunch,
    World,
    first,
    lost_text,
    prefix,
    read_lost,
    successor,
)


@pytest.mark.parametrize(
    ("world", "lost", "shrink", "expected"),
    [
        (first(4), [2], True, World(2, (0, 1, 3), (2,))),
        (first(4), [3, 1, 3], True, World(2, (0, 2), (1, 3))),
        (World(2, (0, 1, 3), (2,)), [2], True, World(3, (0, 1), (2,))),  # rank 2 of generation 2 is launch rank 3
        (first(4), [0], True, Relaunch("rank 0 is lost, and the job's store was in its process")),
        (first(4), [1, 0], True, Relaunch("rank 0 is lost, and the job's store was in its process")),
        (
            first(4),
            [2],
            False,
            Relaunch("the allocation has 0 spare node(s) for 1 lost rank(s), and shrinking was not chosen"),
        ),
        (
            World(MAX_GENERATIONS, (0, 1), ()),
            [1],
            True,
            Relaunch(f"this job has had {MAX_GENERATIONS} generations"),
        ),
    ],
)
def test_successor(world, lost, shrink, expected):
    assert successor(world, lost, shrink=shrink) == expected


@pytest.mark.parametrize(
    ("world", "lost", "shrink", "spares", "expected"),
    [
        (first(4), [2], False, 1, World(2, (0, 1, 2, 3), (2,))),  # the replacement takes rank 2
        (first(4), [1, 3], False, 2, World(2, (0, 1, 2, 3), (1, 3))),
        (
            first(4),
            [1, 3],
            False,
            1,
            Relaunch("the allocation has 1 spare node(s) for 2 lost rank(s), and shrinking was not chosen"),
        ),
        (first(4), [2], True, 1, World(2, (0, 1, 3), (2,))),  # shrinking chosen: the spare stays unused
        (first(4), [0], False, 1, Relaunch("rank 0 is lost, and the job's store was in its process")),
    ],
)
def test_a_spare_for_each_lost_rank_keeps_the_world(world, lost, shrink, spares, expected):
    assert successor(world, lost, shrink=shrink, spares=spares) == expected


@pytest.mark.parametrize("lost", [[], [4], [-1]])
def test_successor_refuses_a_loss_that_is_none_or_not_of_the_world(lost):
    with pytest.raises(ValueError, match="successor is for a generation that lost|are not ranks of a world of 4"):
        successor(first(4), lost, shrink=True)


@given(st.integers(2, 64).flatmap(lambda size: st.tuples(st.just(size), st.sets(st.integers(1, size - 1), min_size=1))))
def test_a_shrunk_world_keeps_each_survivor_once_in_launch_order(case):
    size, lost = case
    after = successor(first(size), lost, shrink=True)
    assert isinstance(after, World)
    assert after.launch_ranks == tuple(rank for rank in range(size) if rank not in lost)
    assert after.rank_of(0) == 0
    assert all(after.rank_of(rank) is None for rank in lost)
    assert (after.number, after.lost) == (2, tuple(sorted(lost)))


def test_each_generation_has_keys_of_its_own():
    assert prefix(1) == "lightning_mpi_env/gen/1/"
    assert not any(prefix(number).startswith(prefix(1)) for number in (2, 10, 12))


@given(st.integers(2, 2000).flatmap(lambda size: st.tuples(st.just(size), st.sets(st.integers(1, size - 1)))))
def test_the_lost_list_reads_back_as_written(case):
    size, lost = case
    assert read_lost(lost_text(lost).encode(), size, "k") == tuple(sorted(lost))


@pytest.mark.parametrize(
    "raw",
    [b"0", b"4", b"1,1", b"1,,2", b"1;2", b" 1", b"\xd9\xa1", b"\x1b[2K1", b"1," * 40, b"12345678", b"-1"],
)
def test_a_forged_lost_list_is_one_named_error(raw):
    with pytest.raises(RecoveryError) as caught:
        read_lost(raw, 4, "lightning_mpi_env/gen/1/end/lost")
    assert caught.value.variable == "lightning_mpi_env/gen/1/end/lost"
    assert "\x1b" not in str(caught.value)  # a terminal escape read from the store is shown escaped
    assert "MASTER_PORT" in caught.value.hint
