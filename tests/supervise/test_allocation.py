"""The hosts of a job as each scheduler lists them, read whole, bounded and checked.

Each variable and its format, as the schedulers document them:

- Slurm, sbatch(1) "OUTPUT ENVIRONMENT VARIABLES": ``SLURM_JOB_NODELIST`` "List of nodes allocated to the job";
  ``SLURM_TASKS_PER_NODE`` "Number of tasks to be initiated on each node. Values are comma separated and in the same
  order as SLURM_JOB_NODELIST. If two or more consecutive nodes are to have the same task count, that count is
  followed by "(x#)"" (https://slurm.schedmd.com/sbatch.html).
- PBS Professional Reference Guide, "PBS environment variables": ``PBS_NODEFILE`` "Filename containing a list of
  vnodes assigned to the job", a host once per MPI process (``mpiprocs``) of each chunk.
- Grid Engine, sge_pe(5): ``$PE_HOSTFILE`` "contains the hostname, the number of parallel processes to be run on the
  host, the queue and the processor range" on each line.
- LSF, "Environment variables reference": ``LSB_DJOB_HOSTFILE`` "Path to the hostfile used by blaunch ... each line
  ... one host", a host once per slot; ``LSB_MCPU_HOSTS`` "The list of the hosts and the number of CPUs used":
  ``"hostA 2 hostB 3"``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.schedulers import SCHEDULERS
from lightning_mpi_env.supervise.allocation import (
    ALLOCATION_SOURCES,
    MAX_ALLOCATION_HOSTS,
    Allocation,
    Host,
    allocation_from_env,
    merge,
    same_host,
)


def _files(**texts: str):
    """A ``read_text`` serving ``texts`` by path, as a scheduler's files would be read."""
    return lambda path: texts[path]


@pytest.mark.parametrize(
    ("env", "files", "hosts", "source"),
    [
        (
            {"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"},
            {},
            [("node1", 2), ("node2", 2), ("node3", 1)],
            "SLURM_JOB_NODELIST",
        ),
        ({"SLURM_JOB_NODELIST": "gpu[07-08]"}, {}, [("gpu07", None), ("gpu08", None)], "SLURM_JOB_NODELIST"),
        (
            {"PBS_NODEFILE": "/pbs"},
            {"/pbs": "n1\nn1\nn2\nn2\n\n"},
            [("n1", 2), ("n2", 2)],
            "PBS_NODEFILE",
        ),
        (
            {"PE_HOSTFILE": "/pe"},
            {"/pe": "node07.cluster 4 all.q@node07.cluster UNDEFINED\nnode08.cluster 2 all.q@node08 <NULL>\n"},
            [("node07.cluster", 4), ("node08.cluster", 2)],
            "PE_HOSTFILE",
        ),
        ({"LSB_DJOB_HOSTFILE": "/lsf"}, {"/lsf": "b1\nh1\nh1\n"}, [("b1", 1), ("h1", 2)], "LSB_DJOB_HOSTFILE"),
        ({"LSB_MCPU_HOSTS": "hostA 4 hostB 4"}, {}, [("hostA", 4), ("hostB", 4)], "LSB_MCPU_HOSTS"),
        # The first variable set wins, in the table's order (a PBS job inside nothing else).
        (
            {"LSB_MCPU_HOSTS": "hostA 4", "PBS_NODEFILE": "/pbs"},
            {"/pbs": "p1\n"},
            [("p1", 1)],
            "PBS_NODEFILE",
        ),
    ],
)
def test_each_scheduler_s_list_gives_hosts_and_slots(env, files, hosts, source):
    allocation = allocation_from_env(env, read_text=_files(**files))
    assert allocation == Allocation(tuple(Host(*host) for host in hosts), source)


def test_outside_a_scheduler_there_is_no_allocation():
    assert allocation_from_env({"PATH": "/bin"}) is None


def test_the_sources_are_the_scheduler_table_s_host_lists_that_carry_slots():
    # One home for which variable lists a job's hosts: core/schedulers.py's rows; ABCI's list has no slots.
    rows = [(h.variable, s.name) for s in SCHEDULERS for h in s.host_lists if h.variable != "SGE_JOB_HOSTLIST"]
    assert [(source.variable, source.scheduler) for source in ALLOCATION_SOURCES] == rows
    assert {source.variable for source in ALLOCATION_SOURCES} >= {"SLURM_JOB_NODELIST", "PBS_NODEFILE", "PE_HOSTFILE"}
    assert [source.slots for source in ALLOCATION_SOURCES if source.slots] == ["SLURM_TASKS_PER_NODE"]


def test_a_real_file_is_read_whole(tmp_path: Path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("".join(f"node{index // 4}\n" for index in range(4 * 300)))  # past the head's two lines
    allocation = allocation_from_env({"PBS_NODEFILE": str(nodefile)})
    assert allocation is not None
    assert len(allocation.hosts) == 300
    assert {host.slots for host in allocation.hosts} == {4}


@pytest.mark.parametrize(
    ("env", "files", "message"),
    [
        ({"PBS_NODEFILE": "/dev/zero"}, None, r"PBS_NODEFILE='/dev/zero' \(PBS\) names a host file that cannot"),
        ({"PE_HOSTFILE": "/pe"}, {"/pe": "node07\n"}, r"PE_HOSTFILE line 1 \('node07', SGE\) is not 'host slots"),
        ({"PE_HOSTFILE": "/pe"}, {"/pe": "node07 x all.q\n"}, r"PE_HOSTFILE line 1 \(slots\)='x'"),
        ({"PE_HOSTFILE": "/pe"}, {"/pe": "node07 0 all.q\n"}, r"must be at least 1"),
        ({"LSB_MCPU_HOSTS": "hostA 4 hostB"}, None, r"LSB_MCPU_HOSTS='hostA 4 hostB' \(LSF\) is not a list of"),
        ({"LSB_MCPU_HOSTS": "hostA 99999"}, None, r"must be at least 1|must be at most 16384"),
        ({"PBS_NODEFILE": "/pbs"}, {"/pbs": "# nothing\n"}, r"PBS_NODEFILE='/pbs' \(PBS\) names an empty host file"),
        ({"PBS_NODEFILE": "/pbs"}, {"/pbs": "-oProxyCommand=x\n"}, r"names the host '-oProxyCommand=x', which is not"),
        (
            {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
            None,
            r"SLURM_TASKS_PER_NODE='2\(x2\)' gives 2 counts for the 3 hosts",
        ),
    ],
)
def test_a_malformed_list_is_one_named_error(env, files, message):
    read_text = _files(**files) if files is not None else None
    with pytest.raises(LayoutError, match=message) as caught:
        allocation_from_env(env, **({"read_text": read_text} if read_text else {}))
    assert caught.value.hint


def test_the_number_of_hosts_is_bounded():
    entries = ((f"h{index}", 1) for index in range(MAX_ALLOCATION_HOSTS + 1))
    with pytest.raises(LayoutError, match=f"lists more than {MAX_ALLOCATION_HOSTS} hosts"):
        merge(entries, source="test", where="PBS_NODEFILE")


def test_a_host_listed_again_adds_its_slots():
    allocation = merge([("a", 2), ("b", 1), ("a", 1)], source="test", where="test")
    assert allocation.hosts == (Host("a", 3), Host("b", 1))


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("node2", "node2", True),
        ("node2", "NODE2", True),
        ("node2", "node2.cluster.org", True),  # a rank's short name, the scheduler's full one
        ("node2.a", "node2.b", True),
        ("node2", "node20", False),
        ("127.0.0.2", "127.0.0.3", False),  # addresses compare whole: 127 is no short name
        ("10.0.0.2", "10", False),
    ],
)
def test_a_record_s_host_matches_the_scheduler_s_spelling(one, other, same):
    assert same_host(one, other) is same
    assert same_host(other, one) is same


def test_split_keeps_order_and_names_what_matched_nothing():
    allocation = Allocation((Host("n1", 2), Host("n2", 2), Host("n3", 2)), "test")
    left, unmatched = allocation.split(["n3", "n2.cluster", "ghost", "n3"])
    assert left == (Host("n1", 2),)
    assert unmatched == ("ghost",)
