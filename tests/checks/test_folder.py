"""The folder check over real folders: writable, not made yet, a file in the way, not writable, short of space."""

import os

import pytest

from lightning_mpi_env.checks.folder import PROBE_PREFIX, FolderFault, check_folder, is_local, shown_path


def test_a_writable_folder_passes_and_keeps_no_probe(tmp_path):
    checked = check_folder(str(tmp_path), min_free=1)
    assert checked.fault is None
    assert checked.probed == str(tmp_path)
    assert checked.free is not None
    assert checked.free > 0
    assert not [name for name in os.listdir(tmp_path) if name.startswith(PROBE_PREFIX)]


def test_a_folder_not_made_yet_is_probed_at_its_deepest_existing_folder_and_not_made(tmp_path):
    folder = tmp_path / "runs" / "job-1" / "checkpoints"
    checked = check_folder(str(folder), min_free=1)
    assert checked.fault is None
    assert checked.probed == str(tmp_path)
    assert not (tmp_path / "runs").exists()  # Lightning makes it at its first save


def test_a_relative_folder_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checked = check_folder("checkpoints", min_free=1)
    assert checked.folder == str(tmp_path / "checkpoints")
    assert checked.fault is None


def test_a_file_in_the_folder_s_place_is_named(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    checked = check_folder(str(tmp_path / "runs" / "checkpoints"), min_free=1)
    assert checked.fault is FolderFault.NOT_A_FOLDER
    assert checked.probed == str(tmp_path / "runs")
    assert "is not a folder (a file is in its place)" in checked.sentence()


def test_a_link_to_nothing_is_named(tmp_path):
    (tmp_path / "runs").symlink_to(tmp_path / "gone")
    checked = check_folder(str(tmp_path / "runs"), min_free=1)
    assert checked.fault is FolderFault.NOT_A_FOLDER
    assert checked.detail == "a link to no folder"


def test_a_link_to_a_folder_is_that_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "real")
    assert check_folder(str(tmp_path / "runs"), min_free=1).fault is None
    assert not os.listdir(tmp_path / "real")


def test_a_folder_no_one_can_write_is_named_with_the_system_s_reason():
    # procfs takes no new file, whoever asks (root too, whom permission bits do not stop).
    checked = check_folder("/proc/self/checkpoints", min_free=1)
    assert checked.fault is FolderFault.NOT_WRITABLE
    assert checked.probed == "/proc/self"
    assert checked.detail  # the system's reason, e.g. "No such file or directory" or "Permission denied"
    assert checked.sentence().startswith("'/proc/self/checkpoints' (not made yet; its folder '/proc/self') cannot")


def test_less_free_space_than_the_floor_is_named(tmp_path):
    checked = check_folder(str(tmp_path), min_free=1 << 62)
    assert checked.fault is FolderFault.LOW_SPACE
    assert "MiB free, under the" in checked.detail


@pytest.mark.parametrize(
    "name",
    ["line\nbreak", "HINT: forged\r\x1b[2K", "spaces and 'quotes'", "é-ü-ß", "-starts-with-a-dash", "a" * 250],
)
def test_hostile_folder_names_are_probed_and_shown_on_one_line(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    checked = check_folder(str(folder), min_free=1)
    assert checked.fault is None
    assert os.listdir(folder) == []
    assert "\n" not in shown_path(str(folder))
    assert "\r" not in shown_path(str(folder))
    assert len(shown_path(str(folder))) < 260


def test_a_nul_character_is_a_fault_not_an_exception():
    checked = check_folder("/tmp/a\x00b", min_free=1)
    assert checked.fault is FolderFault.NOT_WRITABLE
    assert checked.detail == "the path holds a NUL character"


def test_a_url_is_not_a_local_folder():
    assert is_local("/scratch/runs")
    assert is_local("runs")
    assert not is_local("s3://bucket/runs")
