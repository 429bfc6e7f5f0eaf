"""The one home of files that a job's processes leave for each other: opened, read, parsed and written safely."""

from __future__ import annotations

import os
import socket

import pytest

from lightning_mpi_env.core.state_files import (
    FieldError,
    NotARegularFile,
    exact_fields,
    load_json,
    open_regular,
    read_capped,
    seconds,
    versioned_object,
    whole_number,
    write_whole,
)


def test_a_regular_file_is_opened_and_read_up_to_its_cap_plus_one(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_capped(str(path), 10) == b"x" * 11  # one past the cap: the reader can refuse, never hold, more
    assert read_capped(str(path), 1000) == b"x" * 100
    os.close(open_regular(str(path)))


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda path: os.mkfifo(path), "a FIFO"),  # no writer: a blocking open would hang the test here
        (lambda path: os.mkdir(path), "a directory"),
        (lambda path: socket.socket(socket.AF_UNIX).bind(str(path)), "a socket"),
    ],
)
def test_what_is_not_a_regular_file_is_named_without_blocking(tmp_path, make, kind):
    path = tmp_path / "record.json"
    make(path)
    with pytest.raises(NotARegularFile, match=f"^{path} is {kind}, not a regular file$"):
        read_capped(str(path), 10)


def test_a_device_is_named(tmp_path):
    with pytest.raises(NotARegularFile, match="^/dev/zero is a character device"):  # it would never end
        read_capped("/dev/zero", 10)


def test_a_link_is_followed_unless_links_are_refused(tmp_path):
    (tmp_path / "real").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_capped(str(tmp_path / "link"), 10) == b"{}"
    with pytest.raises(NotARegularFile, match="is a symbolic link, not a regular file"):
        read_capped(str(tmp_path / "link"), 10, follow_links=False)


def test_a_missing_file_is_the_os_error_it_is(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_capped(str(tmp_path / "none"), 10)


def test_json_is_bounded_and_refuses_constants():
    assert load_json(b'{"a": [1, 2.5]}', 64) == {"a": [1, 2.5]}
    with pytest.raises(FieldError, match="^it is more than 8 bytes long$"):
        load_json(b'{"a": "0123456789"}', 8)
    with pytest.raises(FieldError, match="^Infinity is not a number$"):
        load_json(b'{"a": Infinity}', 64)
    with pytest.raises(FieldError, match=r"^it is not JSON \(JSONDecodeError\)$"):
        load_json(b'{"a": ', 64)
    with pytest.raises(FieldError, match=r"^it is not JSON \(UnicodeDecodeError\)$"):
        load_json(b'"\xff\xfe\xfd"', 64)
    with pytest.raises(FieldError, match=r"^it is not JSON \(RecursionError\)$"):
        load_json(b"[" * 100_000 + b"]" * 100_000, 1 << 20)


def test_an_object_of_the_format_with_exactly_its_fields():
    assert versioned_object({"format": 2, "a": 1}, 2) == {"format": 2, "a": 1}
    with pytest.raises(FieldError, match="^it holds list, not an object$"):
        versioned_object([], 2)
    with pytest.raises(FieldError, match="^format='1' is not 2$"):
        versioned_object({"format": 1}, 2)
    exact_fields({"format": 2, "a": 1}, ("format", "a"))
    with pytest.raises(FieldError, match=r"^fields \['b'\] are unknown$"):
        exact_fields({"format": 2, "a": 1, "b": 2}, ("format", "a"))
    with pytest.raises(FieldError, match=r"^fields \['a'\] are missing$"):
        exact_fields({"format": 2}, ("format", "a"))


@pytest.mark.parametrize("value", [-1, 11, True, 1.0, "3", None])
def test_a_whole_number_is_an_int_in_range(value):
    assert whole_number(10, "step", 10) == 10
    with pytest.raises(FieldError, match="^step holds .*, not a whole number from 0 to 10$"):
        whole_number(value, "step", 10)


@pytest.mark.parametrize("value", [-0.5, float("inf"), float("nan"), False, "1", None])
def test_seconds_are_finite_and_not_negative(value):
    assert seconds(3) == 3.0
    with pytest.raises(FieldError, match="^when holds .*, not a time in seconds$"):
        seconds(value)


def test_a_file_is_written_whole_and_replaces_the_old_one(tmp_path):
    folder = tmp_path / "made" / "here"
    write_whole(str(folder), "r.json", "old")
    write_whole(str(folder), "r.json", "new")
    assert (folder / "r.json").read_text() == "new"
    assert os.listdir(folder) == ["r.json"]  # no temporary file left beside it


def test_a_failed_write_leaves_neither_a_temporary_file_nor_a_half_record(tmp_path):
    (tmp_path / "r.json").mkdir()  # os.replace cannot put a file over a folder
    with pytest.raises(IsADirectoryError):
        write_whole(str(tmp_path), "r.json", "text")
    assert os.listdir(tmp_path) == ["r.json"]
    assert (tmp_path / "r.json").is_dir()
