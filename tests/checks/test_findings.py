"""The node check's findings as data: who stops, the store's form read back strictly, and the lines."""

import json

import pytest

from lightning_mpi_env.checks.findings import (
    FOLDER_HINT,
    Finding,
    Kind,
    Writers,
    flags,
    from_wire,
    go_on_warning,
    must_stop,
    stop_error,
    to_wire,
)
from lightning_mpi_env.core.errors import NodeCheckError, NodeCheckWarning
from lightning_mpi_env.core.state_files import FieldError

READ_ONLY = "'/ckpt' cannot be written (Read-only file system)"
ON_NODE_1 = Finding(2, "nodeb", 1, Kind.FOLDER, READ_ONLY, "/ckpt")
ON_NODE_0 = Finding(0, "nodea", 0, Kind.FOLDER, READ_ONLY, "/ckpt")
WRONG_GPU = Finding(3, "nodeb", 1, Kind.DEVICE, "drives cuda:0, but the launch gave it cuda:1")


@pytest.mark.parametrize(
    ("finding", "writers", "stops"),
    [
        (ON_NODE_1, Writers.RANK_ZERO, False),  # DDP: rank 0 alone writes, and not there
        (ON_NODE_1, Writers.EVERY_RANK, True),  # sharded: node 1's ranks write their shards there
        (ON_NODE_0, Writers.RANK_ZERO, True),  # rank 0 runs there
        (WRONG_GPU, Writers.RANK_ZERO, True),
        (Finding(2, "nodeb", 1, Kind.SPACE, "little free space", "/ckpt"), Writers.RANK_ZERO, False),
    ],
)
def test_who_stops(finding, writers, stops):
    assert must_stop(flags([finding]), finding.rank, writers) is stops


def test_each_kind_has_its_own_bit():
    assert sorted(kind.flag for kind in Kind) == [1, 2, 4, 8]


def test_findings_read_back_from_the_store_as_written():
    wire = to_wire([ON_NODE_1, Finding(2, "nodeb", 1, Kind.SPACE, "x", "/other")])
    assert from_wire(wire.encode(), 2, 4) == [ON_NODE_1, Finding(2, "nodeb", 1, Kind.SPACE, "x", "/other")]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"not json", "not JSON"),
        (b"x" * 20000, "more than"),
        (json.dumps([1, 2]).encode(), "not an object"),
        (json.dumps({"rank": 3, "host": "h", "node": 0, "findings": [["folder", "c", "/f"]]}).encode(), "rank 3's"),
        (json.dumps({"rank": 2, "host": "h", "node": 99, "findings": [["folder", "c", "/f"]]}).encode(), "node"),
        (json.dumps({"rank": 2, "host": "h", "node": 0, "findings": [["evil", "c", "/f"]]}).encode(), "kind"),
        (json.dumps({"rank": 2, "host": "h", "node": 0, "findings": []}).encode(), "not a list"),
        (json.dumps({"rank": 2, "host": 7, "node": 0, "findings": [["folder", "c", "/f"]]}).encode(), "host"),
        (json.dumps({"rank": 2, "host": "h", "node": 0, "findings": [["folder", "c" * 5000, ""]]}).encode(), "clause"),
        (json.dumps({"rank": True, "host": "h", "node": 0, "findings": [["folder", "c", ""]]}).encode(), "rank"),
        (json.dumps({"rank": 2, "host": "h\nHINT: x", "node": 0, "findings": [["folder", "c", ""]]}).encode(), "host"),
        (json.dumps({"rank": 2, "host": "h", "node": 0, "findings": [["folder", "c\x1b[2J", ""]]}).encode(), "clause"),
    ],
)
def test_a_record_in_the_store_is_checked_before_use(raw, problem):
    with pytest.raises(FieldError, match=problem):
        from_wire(raw, 2, 4)


def test_under_ddp_rank_0_s_line_names_node_folder_and_the_relaunch_risk():
    warning = go_on_warning([ON_NODE_1], 0, Writers.RANK_ZERO)
    assert isinstance(warning, NodeCheckWarning)
    assert "on node 1 (host nodeb, rank 2) the checkpoint folder '/ckpt' cannot be written" in warning.problem
    assert "The run goes on, since rank 0 alone writes checkpoints" in warning.problem
    assert "a relaunch that puts rank 0 on nodeb" in warning.problem
    assert warning.hint == FOLDER_HINT


def test_the_error_names_what_stops_and_each_kind_s_fix():
    error = stop_error([ON_NODE_0, WRONG_GPU, ON_NODE_1], 3, Writers.RANK_ZERO)
    assert isinstance(error, NodeCheckError)
    assert "on node 0 (host nodea, rank 0) the checkpoint folder '/ckpt' cannot be written" in error.problem
    assert "rank 0, which writes the checkpoints, runs there" in error.problem
    assert "rank 3 on host nodeb drives cuda:0, but the launch gave it cuda:1" in error.problem
    assert "node 1" not in error.problem  # under DDP node 1's folder stops nothing
    assert "And 3 more finding(s) on other ranks." in error.problem
    assert FOLDER_HINT in error.hint
    assert "ddp_mpi" in error.hint


def test_under_a_sharded_checkpoint_the_error_says_every_rank_writes_there():
    error = stop_error([ON_NODE_1], 0, Writers.EVERY_RANK)
    assert "on node 1 (host nodeb, rank 2) the checkpoint folder" in error.problem
    assert "every rank writes its shard there" in error.problem
