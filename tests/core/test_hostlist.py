from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.hostlist import (
    MAX_HOSTS,
    RANK_ZERO_FALLBACK,
    HostList,
    HostListForm,
    compress_tasks_per_node,
    expand_nodelist,
    expand_tasks_per_node,
    first_nodelist_host,
    read_hosts,
)

PE = HostList("PE_HOSTFILE", HostListForm.PE_HOSTFILE)


def pe_hostfile_host(text: str) -> str:
    return next(read_hosts("/pe", PE, "SGE", {"/pe": text}.__getitem__))[0]


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


@pytest.mark.parametrize(
    ("form", "value", "files", "slots", "expected"),
    [
        (HostListForm.NODELIST, "n[1-2]", {}, None, [("n1", None), ("n2", None)]),
        (HostListForm.NODELIST, "n[1-2]", {}, ("SLURM_TASKS_PER_NODE", "4,2"), [("n1", 4), ("n2", 2)]),
        (
            HostListForm.HOST_PER_LINE,
            "/f",
            {"/f": "# job\nn1 slots=4\n\nn1\nn2\n"},
            None,
            [("n1", 1)] * 2 + [("n2", 1)],
        ),
        (HostListForm.PE_HOSTFILE, "/f", {"/f": "n1 4 q UNDEFINED\nn2 2 q <NULL>\n"}, None, [("n1", 4), ("n2", 2)]),
        (HostListForm.LSF_PAIRS, "b1 1 n1 4", {}, None, [("b1", 1), ("n1", 4)]),
    ],
)
def test_one_reader_for_every_form_yields_host_and_slots_in_order(form, value, files, slots, expected):
    assert list(read_hosts(value, HostList("V", form), "S", files.__getitem__, slots=slots)) == expected


@pytest.mark.parametrize(
    ("form", "value", "slots", "match"),
    [
        (HostListForm.NODELIST, "n[1-", None, r"V='n\[1-' is not a valid Slurm node list"),
        (HostListForm.NODELIST, "n[1-3]", ("T", "2(x2)"), r"T='2\(x2\)' gives 2 counts for the 3 hosts of V"),
        (HostListForm.LSF_PAIRS, "a 1 b", None, r"V='a 1 b' \(S\) is not a list of 'host slots' pairs"),
        (HostListForm.LSF_PAIRS, "a 0", None, r"V \(slots\)='0' \(S\) must be at least 1"),
        (HostListForm.HOST_PER_LINE, "/none", None, r"V='/none' \(S\) names a host file that cannot be read"),
        (HostListForm.HOST_PER_LINE, "/empty", None, r"V='/empty' \(S\) names an empty host file"),
    ],
)
def test_every_form_has_one_hint_ending_in_the_caller_s_fallback(form, value, slots, match):
    def read(path: str) -> str:
        if path == "/empty":
            return "# nothing\n"
        raise FileNotFoundError(path)

    for fallback in (RANK_ZERO_FALLBACK, "name the hosts"):
        with pytest.raises(LayoutError, match=match) as raised:
            list(read_hosts(value, HostList("V", form), "S", read, slots=slots, fallback=fallback))
        assert raised.value.hint.endswith(f"{fallback}."), raised.value.hint


def test_the_first_host_comes_without_expanding_the_rest():
    hosts = read_hosts("gpu[0000001-999999]", HostList("V", HostListForm.NODELIST), "Slurm", str)
    assert next(hosts) == ("gpu0000001", None)


# --- hostile values: one LayoutError, fast, never a bare ValueError or a huge list ------------------------------------


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


# --- the cap is on the whole list, and the first host needs no expansion ----------------------------------------------


def test_the_host_cap_is_on_the_whole_list_not_each_item():
    # 40 items of 999,999 hosts each: each under the cap, 40 million together (24 s and 2.9 GB before).
    nodelist = ",".join(f"n{item}x[1-999999]" for item in range(40))
    with pytest.raises(LayoutError, match=r"it lists more than 1000000 hosts"):
        expand_nodelist(nodelist)
    with pytest.raises(LayoutError, match=r"it lists more than 1000000 hosts"):
        first_nodelist_host(nodelist)
    assert len(expand_nodelist("a[1-500000],b[1-500000]")) == MAX_HOSTS


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu[07-08,10],cpu1", "gpu07"),
        ("r[1-2]n[01-02]", "r1n01"),
        ("login1,gpu[1-999999]", "login1"),
        ("n[000001-999999]", "n000001"),
        ("node-[3,1]-ib", "node-3-ib"),  # the order Slurm wrote, not sorted
    ],
)
def test_first_nodelist_host_is_the_first_of_the_expansion(nodelist, first):
    assert first_nodelist_host(nodelist) == first
    assert first == next(iter(expand_nodelist(nodelist)))


def test_the_first_host_of_a_long_range_is_found_without_expanding_it():
    tracemalloc.start()
    try:
        assert first_nodelist_host("n[000001-999000],login[1-999]") == "n000001"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the expansion alone would be about 60 MB


@pytest.mark.parametrize("nodelist", ["gpu[07-", "gpu[5-3],a", "a,gpu[x]", "", "a,b[1-" + "9" * 19 + "]"])
def test_first_nodelist_host_checks_the_whole_list(nodelist):
    # The first host alone would be fine; the rest of the list is malformed, so it is not Slurm's.
    with pytest.raises(LayoutError, match=r"is not a valid Slurm node list"):
        first_nodelist_host(nodelist)


@settings(deadline=None)
@given(st.lists(st.tuples(st.text("ab-", max_size=3), st.integers(0, 30), st.integers(0, 5)), min_size=1, max_size=5))
def test_first_nodelist_host_agrees_with_the_expansion(items):
    nodelist = ",".join(f"{prefix}x[{low}-{low + span}]" for prefix, low, span in items)
    assert first_nodelist_host(nodelist) == expand_nodelist(nodelist)[0]


@settings(deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_compress_tasks_per_node_round_trips(counts):
    assert expand_tasks_per_node(compress_tasks_per_node(counts)) == counts
