from __future__ import annotations

import re

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import expand_nodelist, expand_tasks_per_node, pe_hostfile_host


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


@pytest.mark.parametrize("value", ["²", "٣", "+3", "3(x²)"])
def test_task_counts_are_ascii_digits_only(value):
    with pytest.raises(LayoutError, match=r"is not a list of task counts"):
        expand_tasks_per_node(value)


def test_pe_hostfile_first_line_is_the_master_host():
    text = "node07.cluster 4 all.q@node07.cluster UNDEFINED\nnode08.cluster 2 all.q@node08.cluster <NULL>\n"
    assert pe_hostfile_host(text) == "node07.cluster"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("node07\n", r"PE_HOSTFILE line 1 \('node07', SGE\) is not 'host slots queue processors'"),
        ("node07 four all.q UNDEFINED\n", r"PE_HOSTFILE line 1 \(slots\)='four' \(SGE\) is not a non-negative integer"),
        ("node07 0 all.q UNDEFINED\n", r"PE_HOSTFILE line 1 \(slots\)='0' \(SGE\) must be at least 1"),
    ],
)
def test_malformed_pe_hostfile_names_the_line(text, match):
    with pytest.raises(LayoutError, match=match):
        pe_hostfile_host(text)


# --- hostile values (issue 15): one LayoutError, fast, never a bare ValueError or a huge list --------------------


@pytest.mark.parametrize(
    ("nodelist", "match"),
    [
        ("gpu[1-" + "9" * 5000 + "]", r"a host number has more than 18 digits"),
        ("gpu[0-99999999]", r"it lists more than 1000000 hosts"),
        ("r[1-2000]n[1-2000]", r"it lists more than 1000000 hosts"),
    ],
)
def test_hostile_nodelists_are_one_clear_error(nodelist, match):
    with pytest.raises(LayoutError, match=match) as raised:
        expand_nodelist(nodelist)
    assert len(str(raised.value)) < 500


@pytest.mark.parametrize("counts", ["9" * 5000, "4(x" + "9" * 5000 + ")", "4(x99999999999)", "4(x600000),2(x600000)"])
def test_hostile_task_counts_are_one_clear_error(counts):
    with pytest.raises(LayoutError, match=r"SLURM_STEP_TASKS_PER_NODE=.* \(Slurm srun\) is not a list of task counts"):
        expand_tasks_per_node(counts)
