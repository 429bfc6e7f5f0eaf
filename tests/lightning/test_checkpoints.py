"""Which requeue checkpoint a job resumes from: its own record, the files checked, other jobs' never."""

from __future__ import annotations

import json
import os
import re

import pytest

from lightning_mpi_env.core.errors import CheckpointError, CheckpointWarning
from lightning_mpi_env.core.schedulers import scheduler_job
from lightning_mpi_env.lightning import checkpoints
from lightning_mpi_env.lightning.checkpoints import Saved

JOB_A = scheduler_job({"SLURM_JOB_ID": "101"})
JOB_B = scheduler_job({"SLURM_JOB_ID": "202"})


def save(directory, job, step: int, *, size: int = 64, finished: bool = True) -> str:
    """As checkpoint_and_requeue does: reserve a name, record it pending, write the file, record it finished."""
    record = checkpoints.read_record(str(directory), job)
    name = checkpoints.reserve_next(str(directory))
    record = record._replace(saved=(*record.saved, Saved(name, None, step)))
    checkpoints.write_record(str(directory), job, record)
    if finished:
        (directory / name).write_bytes(b"x" * size)
        record = record._replace(saved=(*record.saved[:-1], Saved(name, size, step)), requeues=record.requeues + 1)
        checkpoints.write_record(str(directory), job, record)
    return name


def resumable(directory, job):
    return checkpoints.resumable(str(directory), checkpoints.read_record(str(directory), job))


def test_a_job_resumes_its_own_newest_and_never_another_job_s(tmp_path):
    # Two jobs in one folder, saving in turn: each resumes its own newest, though the other's number is higher.
    names = [save(tmp_path, job, step) for step, job in enumerate([JOB_A, JOB_B, JOB_A, JOB_B, JOB_B])]
    assert names == [f"hpc_ckpt_{n}.ckpt" for n in range(1, 6)]
    assert resumable(tmp_path, JOB_A) == str(tmp_path / "hpc_ckpt_3.ckpt")
    assert resumable(tmp_path, JOB_B) == str(tmp_path / "hpc_ckpt_5.ckpt")
    assert resumable(tmp_path, scheduler_job({"SLURM_JOB_ID": "303"})) is None
    assert checkpoints.owner_of(str(tmp_path), "hpc_ckpt_4.ckpt") == "Slurm job 202"
    assert checkpoints.owner_of(str(tmp_path), "hpc_ckpt_9.ckpt") is None


def test_an_array_task_is_its_own_job(tmp_path):
    task = {"LSB_JOBID": "7", "LSB_JOBINDEX": "1"}
    save(tmp_path, scheduler_job(task), 5)
    assert resumable(tmp_path, scheduler_job({**task, "LSB_JOBINDEX": "2"})) is None
    assert resumable(tmp_path, scheduler_job(task)) == str(tmp_path / "hpc_ckpt_1.ckpt")
    record = json.loads((tmp_path / ".lightning-mpi-env" / "lsf-7.1.json").read_text())
    assert (record["job"], record["variables"], record["name"]) == ("7/1", ["LSB_JOBID", "LSB_JOBINDEX"], "7[1]")
    # A Slurm array task has a job id of its own; the record keeps its array name too.
    slurm_task = scheduler_job({"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "1"})
    save(tmp_path, slurm_task, 5)
    record = json.loads((tmp_path / ".lightning-mpi-env" / "slurm-37.json").read_text())
    assert (record["job"], record["name"]) == ("37", "36_1")


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda path: path.write_bytes(b""), "it is empty"),
        (lambda path: path.unlink(), "it cannot be read (No such file or directory)"),
        (lambda path: path.write_bytes(b"x" * 10), "it has 10 bytes, where the job saved 64"),
        (lambda path: (path.unlink(), path.mkdir()), "it is not a regular file"),
    ],
    ids=["empty", "gone", "other-size", "directory"],
)
def test_a_newest_checkpoint_that_does_not_check_out_is_skipped_with_a_warning(tmp_path, spoil, problem):
    save(tmp_path, JOB_A, 10)
    newest = save(tmp_path, JOB_A, 20)
    spoil(tmp_path / newest)
    expected = rf"Slurm job 101: the checkpoint .*{newest} is skipped: {re.escape(problem)}"
    with pytest.warns(CheckpointWarning, match=expected):
        assert resumable(tmp_path, JOB_A) == str(tmp_path / "hpc_ckpt_1.ckpt")


def test_a_save_cut_off_leaves_an_empty_reserved_file_that_is_skipped(tmp_path):
    save(tmp_path, JOB_A, 10)
    cut = save(tmp_path, JOB_A, 20, finished=False)  # the kill came during the save
    assert (tmp_path / cut).stat().st_size == 0
    with pytest.warns(CheckpointWarning, match=r"is skipped: it is empty \(its save never finished\)"):
        assert resumable(tmp_path, JOB_A) == str(tmp_path / "hpc_ckpt_1.ckpt")
    # Only one good checkpoint, spoilt too: nothing to resume, and each is named.
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"")
    with pytest.warns(CheckpointWarning) as warned:
        assert resumable(tmp_path, JOB_A) is None
    assert len(warned) == 2


def test_numbers_ignore_names_that_are_not_this_package_s(tmp_path):
    # A stray name of 200 digits, and one with an Arabic-Indic 3 (int() reads it; no hpc_ckpt_3.ckpt exists).
    (tmp_path / f"hpc_ckpt_{'9' * 200}.ckpt").write_bytes(b"")
    (tmp_path / f"hpc_ckpt_{chr(0x663)}.ckpt").write_bytes(b"")
    assert checkpoints.reserve_next(str(tmp_path)) == "hpc_ckpt_1.ckpt"
    # O_EXCL: a name another job took a moment ago is passed over.
    (tmp_path / "hpc_ckpt_2.ckpt").write_bytes(b"")
    os.remove(tmp_path / "hpc_ckpt_1.ckpt")
    assert checkpoints.reserve_next(str(tmp_path)) == "hpc_ckpt_3.ckpt"


def test_an_unreadable_own_record_is_an_error_not_a_fresh_count(tmp_path):
    save(tmp_path, JOB_A, 10)
    path = checkpoints.record_path(str(tmp_path), JOB_A)
    with open(path, "w") as file:
        file.write('{"format": 1, "scheduler": "slurm", "job": "101", "variables": [], "requeues": -1, "saved": []}')
    with pytest.raises(CheckpointError, match=r"requeue record .*slurm-101.json of Slurm job 101 cannot be read"):
        checkpoints.read_record(str(tmp_path), JOB_A)
    os.remove(path)
    os.mkfifo(path)  # a FIFO in its place: an error at once, not a hang
    with pytest.raises(CheckpointError, match=r"not a regular file"):
        checkpoints.read_record(str(tmp_path), JOB_A)


def test_a_record_copied_from_another_job_is_refused(tmp_path):
    save(tmp_path, JOB_B, 10)
    folder = tmp_path / ".lightning-mpi-env"
    (folder / "slurm-202.json").rename(folder / "slurm-101.json")
    with pytest.raises(CheckpointError, match=r"belongs to Slurm job 202, not to Slurm job 101"):
        checkpoints.read_record(str(tmp_path), JOB_A)


def test_a_record_naming_a_file_outside_the_folder_is_refused(tmp_path):
    save(tmp_path, JOB_A, 10)
    path = checkpoints.record_path(str(tmp_path), JOB_A)
    with open(path) as file:
        data = json.load(file)
    data["saved"][0]["file"] = "../../etc/passwd"
    with open(path, "w") as file:
        json.dump(data, file)
    with pytest.raises(CheckpointError, match=r"a checkpoint named '../../etc/passwd', not hpc_ckpt_<n>.ckpt"):
        checkpoints.read_record(str(tmp_path), JOB_A)
