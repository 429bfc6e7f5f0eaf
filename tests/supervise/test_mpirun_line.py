"""The user's mpirun/mpiexec line read as its launcher reads it, and the relaunch on the hosts left.

The forms, by family (the tables and their sources are in ``lightning_mpi_env/supervise/mpirun_options.py``;
``test_mpirun_options.py`` checks them against the installed launchers):

- Open MPI 5, mpirun(1) (https://docs.open-mpi.org/en/v5.0.x/man-openmpi/man1/mpirun.1.html): ``-H, --host
  <host1,host2,...>`` with ``host:N`` for N slots; ``--hostfile``/``--machinefile <file>`` of ``host slots=N``
  lines; ``-n, --n, -c, -np <#>``; ``-N <num>`` "Launch num processes per node on all allocated nodes";
  ``--map-by ppr:N:node``; the deprecated ``--npernode``, ``--pernode``, ``--ppr``. Single-dash long options
  (``-np``, ``-host``) are accepted as double-dash ones; ``-n4`` is not (checked on the real mpirun).
- MPICH's Hydra, mpiexec(1) and ``mpiexec -h``: ``-n/-np``, ``-f {name}``/``-hostfile``/``-machinefile``
  (``host:N`` lines), ``-hosts {host list}`` (``host:N``), ``-ppn``, ``-genv {name} {value}``; any number of leading
  dashes, ``name=value``, names case aside.
- Intel MPI, Developer Reference "Global Hydra Options": ``-hostfile``/``-f`` ("If a host name is repeated, this name
  is used only once"), ``-machinefile``/``-machine`` (``host:N``), ``-hosts``, ``-hosts-group`` (Slurm ranges),
  ``-perhost``/``-ppn``/``-grr``, ``-rr``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_mpi_env.core.errors import LayoutError, MpirunLineError
from lightning_mpi_env.supervise.allocation import Allocation, Host
from lightning_mpi_env.supervise.mpirun_line import MpirunLine, StepShape, TooFewHostsError
from lightning_mpi_env.supervise.mpirun_options import INTEL_MPI_LINE, MPICH_LINE, OPEN_MPI_LINE, Family
from lightning_mpi_env.tools.simcluster import RSH_AGENT, find_mpirun, session_dir_arguments

FAMILIES = {"openmpi": OPEN_MPI_LINE, "mpich": MPICH_LINE, "intelmpi": INTEL_MPI_LINE}


def _parse(line: str, family: Family = OPEN_MPI_LINE) -> MpirunLine:
    return MpirunLine.parse(line.split(), family)


@pytest.mark.parametrize(
    ("family", "line", "options", "program"),
    [
        ("openmpi", "mpirun -np 4 python t.py -np 9", [("np", ("4",))], "python t.py -np 9"),
        ("openmpi", "mpirun -n 4 -H a,b python t.py", [("np", ("4",)), ("host", ("a,b",))], "python t.py"),
        ("openmpi", "mpirun --np=4 --host=a:2,b:2 ./a.out", [("np", ("4",)), ("host", ("a:2,b:2",))], "./a.out"),
        ("openmpi", "mpirun -c 2 -host a ./a.out", [("np", ("2",)), ("host", ("a",))], "./a.out"),
        ("openmpi", "mpirun --mca btl tcp,self -N 2 ./a.out", [("mca", ("btl", "tcp,self")), ("N", ("2",))], "./a.out"),
        ("openmpi", "mpirun -mca btl tcp ./a.out", [("mca", ("btl", "tcp"))], "./a.out"),
        ("openmpi", "mpirun --map-by ppr:2:node ./a.out", [("mapby", ("ppr:2:node",))], "./a.out"),
        ("openmpi", "mpirun --hostf hosts ./a.out", [("hostfile", ("hosts",))], "./a.out"),  # a prefix
        ("openmpi", "mpirun --prepend-env PATH /x ./a.out", [("prepend-env", ("PATH", "/x"))], "./a.out"),
        ("openmpi", "mpirun --display-map -x A=1 ./a.out", [("display-map", ()), ("x", ("A=1",))], "./a.out"),
        ("openmpi", "mpirun --unknown-thing=3 -np 2 ./a.out", [("np", ("2",))], "./a.out"),  # skipped whole
        # prte.c renames the bare word --map-by only: mpirun refuses this one, and the relaunch keeps it as it is
        ("openmpi", "mpirun --map-by=ppr:2:node -np 2 ./a.out", [("np", ("2",))], "./a.out"),
        ("openmpi", "mpirun -np 2 -- ./a.out -np 3", [("np", ("2",))], "./a.out -np 3"),
        (
            "mpich",
            "mpiexec -n 4 -hosts a:2,b:2 python t.py -n 9",
            [("n", ("4",)), ("hosts", ("a:2,b:2",))],
            "python t.py -n 9",
        ),
        ("mpich", "mpiexec --np=4 -HOSTS=a ./a.out", [("np", ("4",)), ("hosts", ("a",))], "./a.out"),
        (
            "mpich",
            "mpiexec -genv A 1 -genv B=2 -l ./a.out",
            [("genv", ("A", "1")), ("genv", ("B=2",)), ("l", ())],
            "./a.out",
        ),
        ("mpich", "mpiexec -f hosts -ppn 2 ./a.out", [("f", ("hosts",)), ("ppn", ("2",))], "./a.out"),
        (
            "intelmpi",
            "mpirun -machinefile m -perhost 2 ./a.out",
            [("machinefile", ("m",)), ("perhost", ("2",))],
            "./a.out",
        ),
        (
            "intelmpi",
            "mpiexec.hydra -hosts-group n[1-2] -rr ./a.out",
            [("hosts-group", ("n[1-2]",)), ("rr", ())],
            "./a.out",
        ),
    ],
)
def test_the_program_starts_where_the_launcher_s_options_end(family, line, options, program):
    parsed = _parse(line, FAMILIES[family])
    assert [(option.name, option.values) for option in parsed.options] == options
    assert " ".join(parsed.words[parsed.program :]) == program


@pytest.mark.parametrize(
    ("family", "line", "message"),
    [
        ("openmpi", "srun -n 2 ./a.out", r"'srun', not mpirun or mpiexec"),
        ("openmpi", "mpirun -np 2", r"names no program"),
        ("openmpi", "mpirun -np", r"'-np' needs one value"),
        ("openmpi", "mpirun --mca btl", r"'--mca' needs two values"),
        ("openmpi", "mpirun -n4 ./a.out", r"'-n4' is unknown"),  # Open MPI reads --n4
        ("openmpi", "mpirun -Z ./a.out", r"-Z is not one of Open MPI's one-letter options"),
        ("openmpi", "mpirun --ho a ./a.out", r"--ho' is ambiguous"),
        ("openmpi", "mpirun --display-map=yes ./a.out", r"takes no value"),
        ("openmpi", "mpirun --rankfile r ./a.out", r"--rankfile cannot be relaunched .* rank file"),
        ("openmpi", "mpirun --app appfile", r"--app cannot be relaunched"),
        ("openmpi", "mpirun -np 1 ./a.out : -np 1 ./b.out", r"several programs"),
        ("mpich", "mpiexec -n 2 -- ./a.out", r"has no '--' option"),
        ("mpich", "mpiexec -frobnicate 2 ./a.out", r"-frobnicate' is unknown"),
        ("mpich", "mpiexec -l=1 ./a.out", r"takes no value: Hydra would run '1' as the program"),
        ("mpich", "mpiexec -configfile c", r"-configfile cannot be relaunched"),
        ("mpich", "mpiexec -rankmap (vector,0) -n 2 ./a.out", r"-rankmap cannot be relaunched"),
        ("intelmpi", "mpiexec -NP 2 ./a.out", r"-NP' is unknown"),  # Intel MPI's names are case-sensitive
        ("intelmpi", "mpiexec -genv A", r"'-genv' needs NAME=VALUE"),
    ],
)
def test_a_line_the_supervisor_cannot_read_is_one_named_error(family, line, message):
    with pytest.raises(MpirunLineError, match=message) as caught:
        _parse(line, FAMILIES[family])
    assert caught.value.hint


@pytest.mark.parametrize(
    ("family", "line", "world", "per_node"),
    [
        ("openmpi", "mpirun -np 8 -N 4 ./a.out", 8, 4),
        ("openmpi", "mpirun --npernode 2 ./a.out", None, 2),
        ("openmpi", "mpirun --pernode ./a.out", None, 1),
        ("openmpi", "mpirun --map-by ppr:3:node:PE=2 ./a.out", None, 3),
        ("openmpi", "mpirun --map-by ppr:2:socket ./a.out", None, None),  # per socket: no per-node count
        ("openmpi", "mpirun --ppr 2:node ./a.out", None, 2),
        ("openmpi", "mpirun -np 2 -np 6 ./a.out", 6, None),  # the last one
        ("mpich", "mpiexec -n 8 -ppn 4 ./a.out", 8, 4),
        ("intelmpi", "mpiexec -np 8 -perhost 2 ./a.out", 8, 2),
        ("intelmpi", "mpiexec -rr ./a.out", None, 1),
    ],
)
def test_the_counts_are_the_launcher_s(family, line, world, per_node):
    parsed = _parse(line, FAMILIES[family])
    assert (parsed.world(), parsed.per_node()) == (world, per_node)


@pytest.mark.parametrize("line", ["mpirun -np 0 ./a.out", "mpirun -np x ./a.out", "mpirun -N 99999 ./a.out"])
def test_a_count_that_is_not_one_is_named(line):
    parsed = _parse(line)
    with pytest.raises(LayoutError, match=r"-np|-N"):
        (parsed.world(), parsed.per_node())


@pytest.mark.parametrize(
    ("family", "line", "files", "hosts"),
    [
        ("openmpi", "mpirun -H a,b:2,a ./a.out", {}, [("a", 2), ("b", 2)]),  # a host named twice: two slots
        ("openmpi", "mpirun -H a -H b:3 ./a.out", {}, [("a", 1), ("b", 3)]),  # every -H counts
        (
            "openmpi",
            "mpirun --hostfile /h ./a.out",
            {"/h": "# cluster\na slots=4 max_slots=8\nb slots=2 # spare\nc\n"},
            [("a", 4), ("b", 2), ("c", None)],  # no slots=: Open MPI counts the host's cores
        ),
        ("openmpi", "mpirun --machinefile=/h ./a.out", {"/h": "a slots=1\n"}, [("a", 1)]),
        ("mpich", "mpiexec -hosts a:2,b ./a.out", {}, [("a", 2), ("b", 1)]),
        ("mpich", "mpiexec -f /h ./a.out", {"/h": "a:4\n# x\nb\n"}, [("a", 4), ("b", 1)]),
        ("intelmpi", "mpiexec -machinefile /h ./a.out", {"/h": "a:4\nb:4\n"}, [("a", 4), ("b", 4)]),
        ("intelmpi", "mpiexec -f /h ./a.out", {"/h": "a:4\nb\n"}, [("a", None), ("b", None)]),  # counts ignored
        ("intelmpi", "mpiexec -hosts-group n[1-2] ./a.out", {}, [("n1", None), ("n2", None)]),
    ],
)
def test_the_line_s_own_hosts_come_first(family, line, files, hosts):
    parsed = _parse(line, FAMILIES[family])
    allocation = parsed.allocation({"SLURM_JOB_NODELIST": "other[1-9]"}, read_text=lambda path: files[path])
    assert [(host.name, host.slots) for host in allocation.hosts] == hosts


def test_without_hosts_on_the_line_the_scheduler_s_are_taken():
    allocation = _parse("mpirun -np 4 ./a.out").allocation(
        {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    )
    assert allocation == Allocation((Host("n1", 2), Host("n2", 2)), "SLURM_JOB_NODELIST")


@pytest.mark.parametrize(
    ("family", "line", "files", "message"),
    [
        ("openmpi", "mpirun -np 2 ./a.out", {}, r"names no hosts, and no scheduler's allocation is set"),
        ("openmpi", "mpirun -H a --hostfile /h ./a.out", {"/h": "a\n"}, r"names its hosts 2 times"),
        ("mpich", "mpiexec -hosts a -hosts b ./a.out", {}, r"names its hosts 2 times"),
        ("openmpi", "mpirun --hostfile /h ./a.out", {"/h": "a cpus=4\n"}, r"has 'cpus=4', which the relaunch"),
        ("mpich", "mpiexec -f /h ./a.out", {"/h": "a:2 binding=user:0\n"}, r"more than 'host:N'"),
        ("openmpi", "mpirun --hostfile /missing ./a.out", {}, r"--hostfile '/missing' cannot be read"),
    ],
)
def test_hosts_the_relaunch_cannot_carry_are_named(family, line, files, message):
    parsed = _parse(line, FAMILIES[family])

    def read_text(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    with pytest.raises(MpirunLineError, match=message):
        parsed.allocation({}, read_text=read_text)


def test_a_bad_host_or_count_on_the_line_is_named():
    with pytest.raises(LayoutError, match=r"'-oProxyCommand=x', which is not a host name"):
        _parse("mpirun -H -oProxyCommand=x ./a.out").allocation({})
    with pytest.raises(LayoutError, match=r"must be at least 1"):
        _parse("mpirun -H a:0 ./a.out").allocation({})


THREE = Allocation((Host("n1", 2), Host("n2", 2), Host("n3", 2)), "SLURM_JOB_NODELIST")


@pytest.mark.parametrize(
    ("family", "line", "excluded", "argv", "host_file"),
    [
        (
            "openmpi",
            "mpirun -np 4 --map-by ppr:2:node --mca btl tcp ./a.out -np 9",
            ["n2"],
            "mpirun --hostfile /s/hosts -np 4 -x MASTER_ADDR=n1 --map-by ppr:2:node --mca btl tcp ./a.out -np 9",
            "n1 slots=2\nn3 slots=2\n",
        ),
        (  # the line's own host options go; one host file takes their place
            "openmpi",
            "mpirun -H n1:2,n2:2,n3:2 -np 4 ./a.out",
            ["n1"],
            "mpirun --hostfile /s/hosts -np 4 -x MASTER_ADDR=n2 ./a.out",  # rank 0 moves to n2
            "n2 slots=2\nn3 slots=2\n",
        ),
        (  # no -np: one process per slot; the relaunch says how many, on the hosts it needs
            "openmpi",
            "mpirun -N 2 ./a.out",
            ["n3"],
            None,
            None,
        ),
        (
            "mpich",
            "mpiexec -n 4 -ppn 2 -genv A 1 ./a.out",
            ["n1.cluster"],
            "mpiexec -machinefile /s/hosts -n 4 -genv MASTER_ADDR n2 -ppn 2 -genv A 1 ./a.out",
            "n2:2\nn3:2\n",
        ),
        (
            "intelmpi",
            "mpirun -hosts n1,n2,n3 -np 4 -perhost 2 ./a.out",
            ["n2"],
            "mpirun -machinefile /s/hosts -n 4 -genv MASTER_ADDR n1 -perhost 2 ./a.out",
            "n1:2\nn3:2\n",
        ),
    ],
)
def test_the_relaunch_keeps_the_world_on_the_hosts_left(family, line, excluded, argv, host_file):
    parsed = _parse(line, FAMILIES[family])
    allocation = parsed.allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x3)"})
    if argv is None:  # -N 2 on all 3 hosts: 6 processes, no spare
        assert parsed.shape(allocation) == StepShape(world=6, per_node=2, nodes=3)
        with pytest.raises(TooFewHostsError, match=r"needs 3 host\(s\) \(2 processes each\); 2 of the 3 hosts"):
            parsed.relaunch(allocation, excluded, "/s/hosts")
        return
    relaunch = parsed.relaunch(allocation, excluded, "/s/hosts")
    assert " ".join(relaunch.argv) == argv
    assert relaunch.host_file_text == host_file
    assert (relaunch.world, relaunch.per_node, relaunch.unmatched) == (4, 2, ())
    assert relaunch.main_address == host_file.split()[0].partition(":")[0]  # the host file's first: rank 0's


@pytest.mark.parametrize(
    ("line", "allocation", "excluded", "spares"),
    [
        ("mpirun -np 4 -N 2 ./a.out", THREE, [], 1),  # n1, n2 run it; n3 is spare
        ("mpirun -np 4 -N 2 ./a.out", THREE, ["n3"], 0),
        ("mpirun -np 4 -N 2 ./a.out", THREE, ["n1", "n2"], 0),  # it does not fit at all: none spare
        ("mpirun -N 2 ./a.out", THREE, [], 0),  # no -np: a process per slot, every host
        ("mpirun -np 2 ./a.out", THREE, [], 2),  # by slot: n1 holds both
        ("mpirun -np 3 ./a.out", Allocation((Host("a", 1), Host("b", 2), Host("c", 4)), "x"), [], 1),
        ("mpirun -np 3 ./a.out", Allocation((Host("a", 1), Host("b", 2), Host("c", 4)), "x"), ["b"], 0),
    ],
)
def test_the_spares_are_the_hosts_the_step_leaves_unused(line, allocation, excluded, spares):
    assert _parse(line).spares(allocation, excluded) == spares


def test_with_a_spare_the_step_keeps_its_node_count_and_leaves_the_spare_out():
    relaunch = _parse("mpirun -np 4 -N 2 ./a.out").relaunch(THREE, [], "/h")
    assert [host.name for host in relaunch.hosts] == ["n1", "n2"]  # n3 stays spare


def test_too_few_hosts_says_to_add_a_spare():
    parsed = _parse("mpirun -np 4 -N 2 ./a.out")
    with pytest.raises(TooFewHostsError) as caught:
        parsed.relaunch(THREE, ["n1", "n2"], "/h")
    assert "Add a spare host to the allocation" in caught.value.hint
    assert "relaunch on the 1 host(s) left" in caught.value.hint


def test_on_fewer_hosts_the_per_node_count_stays():
    relaunch = _parse("mpirun -np 4 -N 2 ./a.out").relaunch(THREE, ["n1", "n2"], "/h", nodes=1)
    assert (relaunch.world, relaunch.per_node, relaunch.host_file_text) == (2, 2, "n3 slots=2\n")
    assert relaunch.argv[:5] == ("mpirun", "--hostfile", "/h", "-np", "2")
    with pytest.raises(TooFewHostsError):
        _parse("mpirun -np 4 -N 2 ./a.out").relaunch(THREE, ["n1", "n2"], "/h", nodes=2)


def test_uneven_slots_fill_hosts_in_order():
    uneven = Allocation((Host("a", 4), Host("b", 2), Host("c", 2), Host("d", 1)), "PE_HOSTFILE")
    parsed = _parse("mpirun -np 5 ./a.out")
    assert parsed.shape(uneven) == StepShape(world=5, per_node=None, nodes=2)
    relaunch = parsed.relaunch(uneven, ["a"], "/h")
    assert relaunch.host_file_text == "b slots=2\nc slots=2\nd slots=1\n"
    with pytest.raises(MpirunLineError, match=r"per-node count"):
        parsed.relaunch(uneven, ["a"], "/h", nodes=2)  # no per-node count to keep


def test_unknown_slots_need_a_count_on_the_line():
    cores = Allocation((Host("a", None), Host("b", None)), "Open MPI 5 --hostfile")
    with pytest.raises(MpirunLineError, match=r"per-node count .* cannot be told") as caught:
        _parse("mpirun -np 4 ./a.out").shape(cores)
    assert "-N N or --map-by ppr:N:node" in caught.value.hint
    assert _parse("mpirun -np 2 -N 2 ./a.out").relaunch(cores, ["a"], "/h").host_file_text == "b slots=2\n"


def test_an_excluded_name_that_matches_no_host_is_reported():
    relaunch = _parse("mpirun -np 2 -N 2 ./a.out").relaunch(THREE, ["10.0.0.9"], "/h")
    assert relaunch.unmatched == ("10.0.0.9",)
    assert relaunch.host_file_text == "n1 slots=2\n"


# Real launchers: the relaunch's argv and host file run the program on the hosts left, and only there. Three
# simulated nodes (127.0.0.2-4, each its own UTS namespace named after its address, reached through the project's
# rsh-agent); the step uses two with 2 ranks each, the third is the spare; the failed host is the second.
SIMULATED = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


# Each rank prints its host and the MASTER_ADDR it was given, then lives a second: Open MPI 5's daemons can lose a
# rank that ends before its pid is recorded, and mpirun then waits with every line printed (openpmix/prrte#2713; one
# launch of 120 here, with two busy loops). The probe's rank lives a second for the same reason (PROBE_PROGRAM).
WHERE = ["sh", "-c", 'echo "$(hostname) $MASTER_ADDR"; sleep 1']


def _hosts_of(stdout: str) -> Counter[str]:
    return Counter(line.split()[0] for line in stdout.splitlines() if line.strip().startswith("127."))


def _main_addresses(stdout: str) -> set[str]:
    return {" ".join(line.split()[1:]) for line in stdout.splitlines() if line.strip().startswith("127.")}


@pytest.mark.mpi
def test_open_mpi_runs_the_relaunch_on_the_hosts_left(tmp_path: Path):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    words = [find_mpirun(), *root, "--mca", "plm_rsh_agent", str(RSH_AGENT)]
    words += [*session_dir_arguments(tmp_path / "prte"), "-H", ",".join(f"{host}:2" for host in SIMULATED)]
    words += ["-np", "4", "--map-by", "ppr:2:node", *WHERE]
    line = MpirunLine.parse(words, OPEN_MPI_LINE)
    allocation = line.allocation({})
    for excluded, nodes, hosts in (
        ("127.0.0.3", None, {"127.0.0.2": 2, "127.0.0.4": 2}),
        ("127.0.0.3", 1, {"127.0.0.2": 2}),
        ("127.0.0.2", None, {"127.0.0.3": 2, "127.0.0.4": 2}),  # rank 0's host left out: rank 0 moves
    ):
        relaunch = line.relaunch(allocation, [excluded], str(tmp_path / "hosts"), nodes=nodes)
        (tmp_path / "hosts").write_text(relaunch.host_file_text)
        done = subprocess.run(relaunch.argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert _hosts_of(done.stdout) == hosts
        assert _main_addresses(done.stdout) == {next(iter(hosts))}  # every rank is told rank 0's host


@pytest.mark.mpi
@pytest.mark.hydra
@pytest.mark.parametrize("hydra_cluster", ["mpich", "intelmpi"], indirect=True)
def test_hydra_runs_the_relaunch_on_the_hosts_left(hydra_cluster, tmp_path: Path):
    from tests.clusters.hydra import launcher_free

    cluster = replace(hydra_cluster, hosts=SIMULATED)
    words = cluster.mpiexec(WHERE, np=4, ppn=2)  # -hosts 127.0.0.2,127.0.0.3,127.0.0.4 -n 4 -ppn 2
    line = MpirunLine.parse(words, FAMILIES[cluster.kind])
    relaunch = line.relaunch(line.allocation({}), ["127.0.0.2"], str(tmp_path / "hosts"))  # rank 0's host
    assert "-hosts" not in relaunch.argv
    (tmp_path / "hosts").write_text(relaunch.host_file_text)
    done = subprocess.run(
        relaunch.argv,
        env=launcher_free(os.environ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert _hosts_of(done.stdout) == {"127.0.0.3": 2, "127.0.0.4": 2}
    assert _main_addresses(done.stdout) == {"127.0.0.3"}  # rank 0 moved there, and every rank is told so


DRIVER = """
import json, os, subprocess, sys
sys.path.insert(0, {repo!r})
from lightning_mpi_env.supervise.mpirun_family import detect_family
from lightning_mpi_env.supervise.mpirun_line import MpirunLine, TooFewHostsError
words, out = json.loads(sys.argv[1]), sys.argv[2]
line = MpirunLine.parse(words, detect_family(words[0], env=os.environ))
allocation = line.allocation(os.environ)
result = {{"hosts": [list(host) for host in allocation.hosts], "source": allocation.source}}
try:
    line.relaunch(allocation, ["node1"], out + "/hosts")
except TooFewHostsError as error:
    result["too_few"] = error.problem
plan = line.relaunch(allocation, ["node1"], out + "/hosts", nodes=1)
with open(out + "/hosts", "w") as file:
    file.write(plan.host_file_text)
done = subprocess.run(plan.argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
result |= {{"argv": plan.argv, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-3000:]}}
with open(out + "/result.json", "w") as file:
    json.dump(result, file)
"""


@pytest.mark.mpi
@pytest.mark.slurm
def test_inside_a_slurm_job_the_relaunch_leaves_the_failed_node_out(slurm_cluster, tmp_path: Path):
    # In `sbatch -N2 --ntasks-per-node=2` on the simulated Slurm cluster, the batch script (on node1) reads the line
    # `mpirun -np 4 -N 2 hostname` and the job's allocation from SLURM_JOB_NODELIST/SLURM_TASKS_PER_NODE. node1, the
    # batch host itself, is blamed: no spare is left, so the relaunch runs on the one node left with 2 per node, and
    # Open MPI takes the host file inside the allocation: both ranks on node2.
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(repo=str(Path(__file__).resolve().parents[2])))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    words = [find_mpirun(), *root, *session_dir_arguments(tmp_path / "prte"), "-np", "4", "-N", "2", "hostname"]
    script = f"#!/bin/bash\n'{sys.executable}' '{driver}' '{json.dumps(words)}' '{tmp_path}'\n"
    job = slurm_cluster.sbatch(script, ["--nodes=2", "--ntasks-per-node=2"])
    assert slurm_cluster.wait(job, timeout=180) == "COMPLETED", slurm_cluster.output(job)[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["hosts"], result["source"]) == ([["node1", 2], ["node2", 2]], "SLURM_JOB_NODELIST")
    assert "The step needs 2 host(s) (2 processes each); 1 of the 2 hosts" in result["too_few"]
    assert result["returncode"] == 0, result["stderr"]
    assert result["stdout"].split() == ["node2", "node2"]
    assert (tmp_path / "hosts").read_text() == "node2 slots=2\n"


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    slots=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    per_node=st.one_of(st.none(), st.integers(1, 4)),
    world=st.one_of(st.none(), st.integers(1, 16)),
    excluded=st.sets(st.integers(0, 7), max_size=4),
)
def test_a_relaunch_never_names_an_excluded_host_and_holds_the_world(family, slots, per_node, world, excluded):
    fam = FAMILIES[family]
    words = [fam.world_option, str(world)] if world is not None else []
    if per_node is not None:
        words += ["-N", str(per_node)] if not fam.hydra else ["-ppn", str(per_node)]
    line = MpirunLine.parse(["mpirun", *words, "python", "t.py", "-np", "3"], fam)
    allocation = Allocation(tuple(Host(f"n{index}", count) for index, count in enumerate(slots)), "test")
    gone = {f"n{index}" for index in excluded}
    shape = line.shape(allocation)
    left = [host for host in allocation.hosts if host.name not in gone]
    if shape.per_node is not None and left:  # on every host left, the same processes per host
        fewer = line.relaunch(allocation, gone, "/h", nodes=len(left))
        assert (fewer.hosts, fewer.world) == (
            tuple(host._replace(slots=shape.per_node) for host in left),
            len(left) * shape.per_node,
        )
    try:
        relaunch = line.relaunch(allocation, gone, "/h")
    except TooFewHostsError:
        capacity = len(left) * shape.per_node if shape.per_node else sum(host.slots or 0 for host in left)
        assert len(left) < shape.nodes or capacity < shape.world
        return
    names = [host.name for host in relaunch.hosts]
    assert not gone & set(names)
    assert relaunch.world == shape.world
    assert sum(host.slots or 0 for host in relaunch.hosts) >= relaunch.world
    assert relaunch.argv[1:5] == (fam.host_file_option, "/h", fam.world_option, str(shape.world))
    assert relaunch.argv[-4:] == ("python", "t.py", "-np", "3")  # the program's own words, untouched
    assert relaunch.host_file_text.count("\n") == len(names)
