from __future__ import annotations

import re

import pytest

from lightning_mpi_env.errors import LayoutError
from lightning_mpi_env.hostlist import expand_nodelist, expand_tasks_per_node, first_host


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("gpu07", ["gpu07"]),
        ("gpu[07-08,10]", ["gpu07", "gpu08", "gpu10"]),
        ("gpu[007-008]", ["gpu007", "gpu008"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("a[1-2],b3,c[5]", ["a1", "a2", "b3", "c5"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("node-[1-2]-ib", ["node-1-ib", "node-2-ib"]),
    ],
)
def test_expand_nodelist(nodelist, expected):
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize(
    ("nodelist", "match"),
    [
        ("gpu[07-", r"'\[' is never closed"),
        ("gpu]07", r"'\]' has no '\['"),
        ("gpu[[1]]", r"brackets are nested"),
        ("gpu[a-b]", r"'a-b' is not a number or a range"),
        ("gpu[5-3]", r"the range '5-3' runs backwards"),
        ("", r"it names no host"),
        (" , ", r"it names no host"),
    ],
)
def test_malformed_nodelist_names_the_variable_and_value(nodelist, match):
    with pytest.raises(LayoutError, match=rf"SLURM_STEP_NODELIST='{re.escape(nodelist)}'.*{match}"):
        expand_nodelist(nodelist, variable="SLURM_STEP_NODELIST")


@pytest.mark.parametrize(
    ("counts", "expected"), [("4", [4]), ("4(x2)", [4, 4]), ("4(x2),3", [4, 4, 3]), ("1,2(x3)", [1, 2, 2, 2])]
)
def test_expand_tasks_per_node(counts, expected):
    assert expand_tasks_per_node(counts) == expected


@pytest.mark.parametrize("counts", ["", "x", "4(x)", "4(2)", "0", "4(x0)", "-1", "4,,4"])
def test_malformed_tasks_per_node(counts):
    with pytest.raises(LayoutError, match=r"SLURM_STEP_TASKS_PER_NODE=.*\(Slurm srun\) is not a list of task counts"):
        expand_tasks_per_node(counts)


def test_first_host_order_and_sources():
    files = {"/sge": "g0001\ng0002\n", "/pbs": "cn1\ncn1\ncn2\n"}
    read = files.__getitem__
    assert first_host({}, read) is None
    assert first_host({"PBS_NODEFILE": "/pbs"}, read) == ("cn1", "PBS_NODEFILE")
    assert first_host({"PBS_NODEFILE": "/pbs", "SGE_JOB_HOSTLIST": "/sge"}, read) == ("g0001", "SGE_JOB_HOSTLIST")
    assert first_host({"LSB_MCPU_HOSTS": "hostA 4 hostB 4"}, read) == ("hostA", "LSB_MCPU_HOSTS")
    assert first_host({"SLURM_JOB_NODELIST": "a[3-4]", "SLURM_STEP_NODELIST": "a[4]"}, read) == (
        "a4",
        "SLURM_STEP_NODELIST",
    )


def test_host_file_with_slots_and_comments():
    text = "# allocated\n\n  g0002 slots=4\n"
    assert first_host({"SGE_JOB_HOSTLIST": "/x"}, lambda _: text) == ("g0002", "SGE_JOB_HOSTLIST")


def test_host_file_that_is_not_text(tmp_path):
    binary = tmp_path / "hosts"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LayoutError, match=r"LSB_DJOB_HOSTFILE=.*\(LSF\) names a host file that cannot be read"):
        first_host({"LSB_DJOB_HOSTFILE": str(binary)})
