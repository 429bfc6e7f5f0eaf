"""Failure records: written atomically where the state folder is set, read back bounded and validated in one place."""

from __future__ import annotations

import json
import os

import pytest

from lightning_mpi_env.core.errors import FailureRecordError, SettingError
from lightning_mpi_env.core.records import (
    MAX_RECORD_BYTES,
    FailureKind,
    FailureRecord,
    FailureRecorder,
    Fault,
    parse_record,
)
from lightning_mpi_env.core.settings import VARIABLE, Settings
from lightning_mpi_env.supervise.records import MAX_RECORDS, read_records

RECORDER = FailureRecorder("", "srun", "4242")


def _record(**changes: object) -> dict[str, object]:
    record = FailureRecord(FailureKind.FROZEN, (3,), ("node2",), 1_700_000_000.5, 10, "srun", "4242", 0, "Rank 3 ...")
    data = json.loads(record.to_json())
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("kind", "blames"),
    [
        (FailureKind.MISSING, True),
        (FailureKind.FROZEN, True),
        (FailureKind.STRAGGLER, True),  # a slow host: the relaunch runs on a spare instead
        (FailureKind.DUPLICATE, False),
        (FailureKind.MISMATCH, False),
    ],
)
def test_only_host_faults_blame_their_hosts(kind, blames):
    # A duplicate or disagreeing rank is a wrong launch: leaving its host out would fail the same way elsewhere.
    assert RECORDER.record(Fault(kind, (1,), ("node1",)), problem="p", written_by=0).blames_hosts is blames


def test_nothing_is_planned_without_the_state_folder():
    assert FailureRecorder.plan("", "srun", "42") is None
    assert Settings.from_env({}).state_dir == ""


def test_the_state_folder_setting_is_bounded():
    assert Settings.from_env({VARIABLE["state_dir"]: " /scratch/job "}).state_dir == "/scratch/job"
    for hostile in ("/a\nb", "/a\x00b", "/" + "a" * 5000):
        with pytest.raises(SettingError, match=r"LIGHTNING_MPI_ENV_STATE_DIR=.* is not a folder's path"):
            Settings.from_env({VARIABLE["state_dir"]: hostile})


def test_a_written_record_reads_back(tmp_path):
    recorder = FailureRecorder.plan(str(tmp_path / "state" / "job-42"), "Open MPI", "42")
    assert recorder is not None
    fault = Fault(FailureKind.MISSING, (3, 2, 3), ("127.0.0.3", "127.0.0.3"), None)
    assert recorder.write(fault, problem="Ranks 2, 3 of 4 never arrived\n  within 20 s.", written_by=1) is None
    (record,) = read_records(recorder.folder)
    assert record.kind is FailureKind.MISSING
    assert record.ranks == (2, 3)  # sorted, each once
    assert record.hosts == ("127.0.0.3",)
    assert (record.launcher, record.job_id, record.written_by, record.step) == ("Open MPI", "42", 1, None)
    assert record.problem == "Ranks 2, 3 of 4 never arrived within 20 s."  # one line
    assert os.listdir(recorder.folder) == [f"failure-rank1-{os.getpid()}.json"]  # no temporary file left


def test_hosts_that_are_no_host_names_are_left_out_of_a_written_record(tmp_path):
    record = FailureRecorder(str(tmp_path), "srun", None).record(
        Fault(FailureKind.STALLED, (1,), ("node1", "bad host\n", "")), problem="p", written_by=0
    )
    assert record.hosts == ("node1",)


def test_a_record_that_cannot_be_written_is_said_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    recorder = FailureRecorder(str(blocker / "state"), "srun", "7")
    failed = recorder.write(Fault(FailureKind.FROZEN, (1,)), problem="p", written_by=0)
    assert failed is not None
    assert failed.startswith("lightning-mpi-env: could not write the failure record failure-rank0-")
    assert "NotADirectoryError" in failed or "FileExistsError" in failed


def test_records_come_oldest_first_and_other_files_are_left_alone(tmp_path):
    (tmp_path / "failure-rank2-10.json").write_text(json.dumps(_record(when=20.0, written_by=2)))
    (tmp_path / "failure-rank0-11.json").write_text(json.dumps(_record(when=10.0)))
    (tmp_path / "notes.txt").write_text("not JSON at all")
    (tmp_path / ".failure-tmp123").write_text("half a rec")  # a writer's temporary file
    assert [record.written_by for record in read_records(str(tmp_path))] == [0, 2]


def test_a_folder_that_does_not_exist_holds_no_record(tmp_path):
    assert read_records(str(tmp_path / "nothing")) == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("[1, 2]", "it holds list, not an object"),
        ("{", "it is not JSON"),
        (b"\xff\xfe", "it is not JSON"),
        (json.dumps(_record(format=2)), "format='2' is not 1"),
        (json.dumps(_record(kind="bored")), "kind='bored' is not one of missing"),
        (json.dumps(_record(extra=1)), r"fields \['extra'\] are unknown"),
        (json.dumps({k: v for k, v in _record().items() if k != "hosts"}), r"fields \['hosts'\] are missing"),
        (json.dumps(_record(ranks=[True])), "ranks holds 'True', not a whole number"),
        (json.dumps(_record(ranks=[-1])), "ranks holds '-1', not a whole number"),
        (json.dumps(_record(ranks="3")), "ranks is str, not a list"),
        (json.dumps(_record(hosts=["node 1"])), "hosts holds 'node 1', which is not a host name"),
        (json.dumps(_record(hosts=["n"] * 5000)), "hosts holds 5000 items"),
        (json.dumps(_record(step=1.5)), "step holds '1.5', not a whole number"),
        (json.dumps(_record(job_id="4242; rm -rf /")), "job_id holds .*which is not a job_id name"),
        (json.dumps(_record()).replace("1700000000.5", "NaN"), "NaN is not a number"),
        (json.dumps(_record(when=-1)), "when holds '-1', not a time"),
        (json.dumps(_record(problem=7)), "problem is not a text"),
        ("[" * 100_000 + "]" * 100_000, "it is not JSON"),  # nesting past the recursion limit
    ],
)
def test_a_malformed_record_is_one_named_error(tmp_path, content, reason):
    path = tmp_path / "failure-rank0-1.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(FailureRecordError, match=rf"The failure record {path} is malformed: {reason}") as raised:
        read_records(str(tmp_path))
    assert raised.value.value == str(path)
    assert "HINT: Delete the file" in str(raised.value)


def test_an_over_long_record_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "failure-rank0-1.json"
    path.write_bytes(b" " * (MAX_RECORD_BYTES + 10))
    with pytest.raises(FailureRecordError, match=rf"it is more than {MAX_RECORD_BYTES} bytes long"):
        read_records(str(tmp_path))


def test_a_fifo_named_like_a_record_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "failure-rank0-1.json")
    with pytest.raises(FailureRecordError, match="it is not a regular file"):
        read_records(str(tmp_path))


def test_a_folder_named_like_a_record_is_refused(tmp_path):
    (tmp_path / "failure-rank0-1.json").mkdir()
    with pytest.raises(FailureRecordError, match="failure-rank0-1.json is malformed"):
        read_records(str(tmp_path))


def test_too_many_records_are_refused(tmp_path):
    for number in range(MAX_RECORDS + 1):
        (tmp_path / f"failure-rank0-{number}.json").touch()
    with pytest.raises(FailureRecordError, match=rf"holds {MAX_RECORDS + 1} failure records"):
        read_records(str(tmp_path))


def test_a_folder_that_cannot_be_listed_is_one_named_error(tmp_path):
    # A file where the folder should be (what the supervisor meets on a shared file system gone wrong); a folder
    # with no read permission would do too, except as root, who reads anything: this one fails for everyone.
    folder = tmp_path / "not-a-folder"
    folder.write_text("")
    with pytest.raises(
        FailureRecordError, match=r"The state folder .*not-a-folder cannot be listed \(NotADirectoryError"
    ):
        read_records(str(folder))


def test_record_text_round_trips():
    record = FailureRecord(FailureKind.STORE_UNREACHABLE, (0,), ("node1",), 5.0, None, "srun", None, 2, "silent")
    assert parse_record(record.to_json(), "x") == record
