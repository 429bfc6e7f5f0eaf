"""The one home of files that a job's processes leave for each other: opened, read, parsed and written safely."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.state_files import (
    HOST_LINES_NEEDED,
    LEAVE_OUT,
    MAX_HOST_FILE_BYTES,
    MAX_SPARES,
    FieldError,
    HostFileError,
    NotARegularFile,
    ask_to_leave_out,
    exact_fields,
    host_file_head,
    load_json,
    open_regular,
    read_capped,
    read_host_file,
    read_whole_host_file,
    seconds,
    spares_given,
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


# --- host files: regular files only, line by line, a byte cap, stopping at the hosts needed ---

OPEN_MPI_TWO_NODES = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def test_the_head_ends_at_the_hosts_needed(tmp_path: Path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("# job 7\n\nnode1\nnode1\nnode2\nnode2\n")
    assert read_host_file(str(nodefile)) == "# job 7\n\nnode1\nnode1\n"
    assert read_host_file(str(nodefile), host_lines=1) == "# job 7\n\nnode1\n"
    assert HOST_LINES_NEEDED == 2  # jsrun's rank file: the launch node, then the first host


def test_a_short_file_is_read_whole(tmp_path: Path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node1")  # no final newline
    assert read_host_file(str(nodefile)) == "node1"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    # In a thread, so that a regression (open() waiting for a writer) fails the test instead of hanging the suite.
    reader = threading.Thread(target=lambda: _record(outcome, str(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], HostFileError)
    assert "is a FIFO, not a regular file" in str(outcome[0])


def _record(outcome: list[BaseException], path: str) -> None:
    try:
        read_host_file(path)
    except BaseException as error:  # noqa: BLE001 - handed to the test thread
        outcome.append(error)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device"), ("/", "a directory")]
)
def test_special_files_are_refused(path, kind):
    with pytest.raises(HostFileError, match=rf"{path} is {kind}, not a regular file"):
        read_host_file(path)


def test_a_huge_file_gives_its_first_lines_only(tmp_path: Path):
    # 1 GB (a hole after the first lines, so the test writes almost nothing): read up to the hosts needed.
    nodefile = tmp_path / "nodefile"
    with nodefile.open("wb") as file:
        file.write(b"node001\nnode002\n")
        file.truncate(10**9)
    assert read_host_file(str(nodefile)) == "node001\nnode002\n"


def test_the_cap_after_the_first_host_ends_the_head(tmp_path: Path):
    # A first host, then one endless line: the first host is all there is to read.
    nodefile = tmp_path / "nodefile"
    with nodefile.open("wb") as file:
        file.write(b"node001\n")
        file.truncate(10**9)
    assert read_host_file(str(nodefile)) == "node001\n"


def test_a_file_without_hosts_in_its_first_bytes_is_refused(tmp_path: Path):
    zeros = tmp_path / "zeros"  # one endless line: what /dev/zero would be as a regular file
    with zeros.open("wb") as file:
        file.truncate(10**9)
    with pytest.raises(HostFileError, match=rf"names no host in its first {MAX_HOST_FILE_BYTES} bytes"):
        read_host_file(str(zeros))
    comments = tmp_path / "comments"
    comments.write_text("# padding\n" * 200)
    with pytest.raises(HostFileError, match="names no host in its first 1000 bytes"):
        read_host_file(str(comments), max_bytes=1000)


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_bytes(b"# ok\nnode\xff\n")
    with pytest.raises(HostFileError, match="line 2 is not UTF-8 text"):
        read_host_file(str(nodefile))


def test_host_file_head_of_text_in_memory():
    assert host_file_head(iter(["a\n", "# c\n", "b\n", "c\n"])) == "a\n# c\nb\n"
    assert host_file_head(iter([])) == ""


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_the_layout_names_the_variable_for_a_file_it_will_not_read(tmp_path: Path, kind):
    path = {"/dev/zero": "/dev/zero", "directory": str(tmp_path)}.get(kind, str(tmp_path / "fifo"))
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(LayoutError, match=r"PBS_NODEFILE=.* \(PBS\) names a host file that cannot be read: .* not a"):
        from_env({**OPEN_MPI_TWO_NODES, "PBS_NODEFILE": path})


def test_the_whole_file_is_read_or_refused_never_cut(tmp_path: Path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("# job 7\nnode1\nnode1\nnode2\nnode2\n")
    assert read_whole_host_file(str(nodefile), max_bytes=100) == "# job 7\nnode1\nnode1\nnode2\nnode2\n"
    with pytest.raises(HostFileError, match=r"nodefile is longer than 20 bytes"):
        read_whole_host_file(str(nodefile), max_bytes=20)  # the head holds hosts: still refused, not cut
    with pytest.raises(HostFileError, match=r"/dev/zero is a character device"):
        read_whole_host_file("/dev/zero", max_bytes=100)


def test_run_s_request_to_leave_stragglers_out_reads_back_its_spares(tmp_path: Path):
    assert spares_given(str(tmp_path)) == 0  # none asked
    assert ask_to_leave_out(str(tmp_path), 2) is None
    assert spares_given(str(tmp_path)) == 2
    assert ask_to_leave_out(str(tmp_path / "file" / "below"), 1) is None  # the folder is made
    (tmp_path / "blocked").write_text("")
    assert "could not write" in (ask_to_leave_out(str(tmp_path / "blocked"), 1) or "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"format": 1, "spares": -1}', "not a whole number from 0 to"),
        (f'{{"format": 1, "spares": {MAX_SPARES + 1}}}', "not a whole number from 0 to"),
        ('{"format": 1, "spares": true}', "not a whole number"),
        ('{"format": 1, "spares": 1, "hosts": ["node2"]}', "unknown"),
        ('{"format": 2, "spares": 1}', "format='2' is not 1"),
        ('{"format": 1, "spares": NaN}', "NaN is not a number"),
        ("1", "not an object"),
        ('{"format": 1, "spares": 1}' + " " * 64, "more than 64 bytes"),
    ],
)
def test_a_request_that_is_not_run_s_is_one_named_error(tmp_path: Path, text: str, reason: str):
    (tmp_path / LEAVE_OUT).write_text(text)
    with pytest.raises(FieldError, match=reason) as raised:
        spares_given(str(tmp_path))
    assert str(raised.value).startswith(str(tmp_path / LEAVE_OUT))


def test_a_request_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path):
    os.mkfifo(tmp_path / LEAVE_OUT)
    with pytest.raises(FieldError, match="it is not a regular file"):
        spares_given(str(tmp_path))
