"""The first-step record: written whole, read back bounded and checked field by field, one named error otherwise."""

from __future__ import annotations

import json
import os
import re

import pytest

from lightning_mpi_env.core.errors import ProgressRecordError
from lightning_mpi_env.core.records import (
    FIRST_STEP,
    MAX_STRAGGLERS,
    FirstStep,
    StragglerFinding,
    first_step,
    parse_first_step,
    parse_stragglers,
    write_first_step,
    write_stragglers,
)
from lightning_mpi_env.core.records import MAX_FIRST_STEP_BYTES as MAX_RECORD_BYTES
from lightning_mpi_env.supervise.records import read_first_step, read_stragglers

GOOD = {"format": 1, "step": 11, "resumed_from": "hpc_ckpt_2.ckpt", "resumed_step": 10, "when": 5.5, "job_id": "77"}


def test_written_then_read_back(tmp_path):
    folder = tmp_path / "job" / "step-2"  # made by the writer
    record = first_step(11, "/runs/77/hpc_ckpt_2.ckpt", 10, 5.5, "77")
    assert write_first_step(str(folder), record) is None
    assert read_first_step(str(folder)) == FirstStep(11, "hpc_ckpt_2.ckpt", 10, 5.5, "77")
    assert os.listdir(folder) == [FIRST_STEP]


def test_a_fresh_start_and_a_job_id_out_of_syntax():
    record = first_step(1, None, 0, 1.0, "7; rm -rf /")
    assert (record.resumed_from, record.resumed_step, record.job_id) == (None, None, None)
    assert parse_first_step(record.to_json(), "f") == record


def test_absent_is_none(tmp_path):
    assert read_first_step(str(tmp_path)) is None
    assert read_first_step(str(tmp_path / "never-made")) is None
    (tmp_path / "a-file").write_text("")
    assert read_first_step(str(tmp_path / "a-file")) is None  # a file where the folder would be: no record in it


def test_a_write_that_fails_returns_a_line(tmp_path):
    (tmp_path / "blocked").write_text("")
    problem = write_first_step(str(tmp_path / "blocked" / "state"), first_step(1, None, None, 1.0, None))
    assert problem is not None
    assert problem.startswith("lightning-mpi-env: could not write the progress record first-step.json into")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"format": 2}, "format='2' is not 1"),
        ({"step": -1}, "step holds '-1', not a whole number"),
        ({"step": True}, "step holds 'True'"),
        ({"step": 1 << 63}, "step holds"),
        ({"step": 1.5}, "step holds '1.5'"),
        ({"resumed_step": None}, "not both set or both null"),
        ({"resumed_from": None}, "not both set or both null"),
        ({"resumed_step": 12}, "resumed_step 12 is past step 11"),
        ({"resumed_from": "../hpc_ckpt_2.ckpt"}, "which is not a file name"),
        ({"resumed_from": "a\nb"}, "which is not a file name"),
        ({"resumed_from": ""}, "which is not a file name"),
        ({"resumed_from": "x" * 256}, "which is not a file name"),
        ({"resumed_from": 3}, "which is not a file name"),
        ({"when": -1}, "when holds '-1'"),
        ({"when": "now"}, "when holds 'now'"),
        ({"job_id": "7 8"}, "which is not a job id"),
        ({"extra": 1}, "fields ['extra'] are unknown"),
    ],
)
def test_every_field_is_checked(change, reason):
    with pytest.raises(ProgressRecordError, match=rf"The progress record f\.json is malformed: .*{re.escape(reason)}"):
        parse_first_step(json.dumps(GOOD | change), "f.json")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("[]", "it holds list, not an object"),
        ('{"format": 1, "step": NaN}', "NaN is not a number"),
        ("{", "it is not JSON"),
        (b"\xff\xfe", "it is not JSON"),
        ("[" * 60_000, "it is not JSON"),  # a RecursionError
        ("{}", "format='None' is not 1"),
        (json.dumps({"format": 1}), "are missing"),
    ],
)
def test_what_is_not_a_record(raw, reason):
    with pytest.raises(ProgressRecordError, match=reason):
        parse_first_step(raw, "f.json")


def test_the_reader_is_bounded(tmp_path):
    path = tmp_path / FIRST_STEP
    path.write_text(json.dumps(GOOD) + " " * MAX_RECORD_BYTES)
    with pytest.raises(ProgressRecordError, match=rf"it is more than {MAX_RECORD_BYTES} bytes long"):
        read_first_step(str(tmp_path))


def test_a_fifo_or_a_folder_in_its_place_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / FIRST_STEP)  # no writer: a blocking open would hang here
    with pytest.raises(ProgressRecordError, match="it is not a regular file"):
        read_first_step(str(tmp_path))
    other = tmp_path / "other"
    (other / FIRST_STEP).mkdir(parents=True)
    with pytest.raises(ProgressRecordError, match="it is not a regular file"):
        read_first_step(str(other))


def test_the_error_names_the_file_and_the_fix(tmp_path):
    (tmp_path / FIRST_STEP).write_text("{")
    with pytest.raises(ProgressRecordError) as raised:
        read_first_step(str(tmp_path))
    assert raised.value.value == str(tmp_path / FIRST_STEP)
    assert "Delete the file" in raised.value.hint


FINDING = StragglerFinding(3, "node2", 2.0, 20, 21, 5.0)


def test_a_straggler_record_is_written_then_read_back_slowest_first(tmp_path):
    assert read_stragglers(str(tmp_path)) is None
    slower = StragglerFinding(5, "node3", 3.5, 40, 60, 9.0)
    assert write_stragglers(str(tmp_path), [FINDING, slower], "77") is None
    record = read_stragglers(str(tmp_path))
    assert record is not None
    assert record.stragglers == (slower, FINDING)
    assert record.job_id == "77"


def test_a_straggler_record_keeps_the_slowest_and_leaves_out_hosts_that_are_no_names(tmp_path):
    many = [StragglerFinding(rank, f"nid{rank:05d}", 1.5 + rank / 1000, 20, 21, 5.0) for rank in range(2000)]
    write_stragglers(str(tmp_path), [*many, StragglerFinding(7, "node 2; rm", 90.0, 20, 21, 5.0)], None)
    record = read_stragglers(str(tmp_path))
    assert record is not None
    assert len(record.stragglers) == MAX_STRAGGLERS - 1  # the forged host took a place among the slowest, then went
    assert record.stragglers[0].rank == 1999


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"rank": -1}, "rank holds '-1'"),
        ({"host": "a b"}, "which is not a host name"),
        ({"factor": 0.5}, "not a factor from 1 to 100"),
        ({"factor": 1e300}, "not a factor from 1 to 100"),
        ({"steps": "20"}, "steps holds"),
        ({"when": -1}, "not a time in seconds"),
        ({"extra": 1}, "['extra'] are unknown"),
    ],
)
def test_every_field_of_a_straggler_is_checked(change, reason):
    finding = {"rank": 3, "host": "node2", "factor": 2.0, "steps": 20, "step": 21, "when": 5.0, **change}
    raw = json.dumps({"format": 1, "stragglers": [finding], "job_id": None})
    with pytest.raises(ProgressRecordError, match=re.escape(reason)):
        parse_stragglers(raw, "stragglers.json")


def test_a_straggler_record_of_the_most_ranks_with_the_longest_host_names_is_read_back(tmp_path):
    host = "n" * 250
    longest = [StragglerFinding(rank, f"{rank:05d}{host}", 99.123456789, 10**9, 10**9, 1.8e9) for rank in range(2000)]
    assert write_stragglers(str(tmp_path), longest, "77") is None
    record = read_stragglers(str(tmp_path))
    assert record is not None
    assert len(record.stragglers) == MAX_STRAGGLERS
