"""The user's srun line as srun reads it, and the relaunch's ``--exclude``.

Every form is srun(1)'s, Slurm 22.05 (https://slurm.schedmd.com/srun.html; the man page the simulated cluster's
Debian package installs):

- ``-x, --exclude={<host1[,<host2>...]|<filename>}``: "Request that a specific list of hosts not be included in the
  resources allocated to this job. The host list will be assumed to be a filename if it contains a "/" character."
- ``-N, --nodes=<minnodes>[-maxnodes]``: "If only one number is specified, this is used as both the minimum and
  maximum node count."
- ``srun [OPTIONS(0)... [executable(0) [args(0)...]]] [ : [OPTIONS(N)...]] executable(N) [args(N)...]``: the
  options end at the program; ``:`` separates the components of a heterogeneous step.
- Long options as getopt_long(3) takes them: ``--name=value``, ``--name value`` for a required value, and any
  unambiguous prefix (``--exclud``; ``--exc`` is ``--exclude`` or ``--exclusive``).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.supervise.options import Arity
from lightning_mpi_env.supervise.srun_line import SHORT_OPTIONS, SRUN_OPTIONS, SrunLine, SrunLineError

MAN_PAGE = Path("/usr/share/man/man1/srun.1.gz")


@pytest.mark.parametrize(
    ("line", "excluded"),
    [
        ("srun --exclude=node1,node2 python t.py", ["node1", "node2"]),  # --exclude=<host1[,<host2>...]>
        ("srun --exclude node1 python t.py", ["node1"]),  # a required value may be the next word
        ("srun -x node1 python t.py", ["node1"]),  # -x <hosts>
        ("srun -xnode1 python t.py", ["node1"]),  # -x<hosts>, attached
        ("srun -x node[1-3] python t.py", ["node1", "node2", "node3"]),  # a Slurm host list
        ("srun -x node[1-2] --exclude=node2,node5 python t.py", ["node1", "node2", "node5"]),  # both, merged
        ("srun --exclud=node4 python t.py", ["node4"]),  # the one unambiguous prefix of --exclude
        ("srun -lx node1 python t.py", ["node1"]),  # after a flag in one word: -l (--label), then -x
        ("srun -N2 python t.py -x node9", []),  # the program's -x is the program's
        ("srun -- python t.py -x node9", []),
    ],
)
def test_every_form_of_exclude_is_read(line, excluded):
    assert SrunLine.parse(line.split()).excluded() == excluded


@pytest.mark.parametrize(
    ("line", "hosts", "relaunch"),
    [
        ("srun -N2 python t.py", ["node2"], "srun --exclude=node2 -N2 python t.py"),
        ("srun -x node1 -N2 python t.py", ["node2"], "srun --exclude=node1,node2 -N2 python t.py"),
        (
            "srun -N2 --exclude=node[1-2] python t.py",
            ["node2", "node3"],
            "srun --exclude=node1,node2,node3 -N2 python t.py",
        ),
        ("srun --exclude node1 -N2 python t.py -x 7", ["node3"], "srun --exclude=node1,node3 -N2 python t.py -x 7"),
        ("srun -lx node1 -N2 python t.py", ["node3"], "srun --exclude=node1,node3 -l -N2 python t.py"),
        ("/usr/bin/srun -N2 python t.py", [], "/usr/bin/srun -N2 python t.py"),
    ],
)
def test_the_relaunch_holds_one_exclude_with_the_lines_own_and_the_new_hosts(line, hosts, relaunch):
    assert " ".join(SrunLine.parse(line.split()).with_excluded(hosts)) == relaunch
    # What the relaunch excludes reads back the same: nothing after it overrides it.
    again = SrunLine.parse(relaunch.split())
    assert again.excluded() == list(dict.fromkeys(SrunLine.parse(line.split()).excluded() + hosts))
    assert len(again.values("exclude")) == (1 if again.excluded() else 0)


@pytest.mark.parametrize(
    ("line", "program"),
    [
        ("srun --ntasks 4 --ntasks-per-node=2 python t.py", "python"),  # required values, both forms
        ("srun -n 4 -c2 python t.py", "python"),
        ("srun -K python t.py", "python"),  # -K[0|1]: optional value, attached only, so "python" is the program
        ("srun --kill-on-bad-exit python t.py", "python"),
        ("srun --kill-on-bad-exit=1 --no-kill python t.py", "python"),
        ("srun -l -u ./a.out", "./a.out"),
        ("srun --mpi=pmix --tres-per-task=cpu:2 python t.py", "python"),  # an option of a newer srun, value attached
        ("srun -N2 -- -weird-program", "-weird-program"),
    ],
)
def test_the_program_starts_where_srun_s_options_end(line, program):
    parsed = SrunLine.parse(line.split())
    assert parsed.words[parsed.program] == program


@pytest.mark.parametrize(
    ("line", "nodes"),
    [("srun -N2 a", (2, 2)), ("srun --nodes=2-3 a", (2, 3)), ("srun -N 1 -N 3 a", (3, 3)), ("srun -n4 a", None)],
)
def test_the_node_count_is_srun_s(line, nodes):
    assert SrunLine.parse(line.split()).nodes() == nodes


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("mpirun -np 4 python t.py", r"The command to run and relaunch is 'mpirun', not srun"),
        ("srun -N2", r"names no program to run"),
        ("srun --ntasks", r"srun option --ntasks needs a value"),
        (
            "srun --exc=node1 python t.py",
            r"srun option --exc=node1 is ambiguous: it abbreviates --exclude, --exclusive",
        ),
        ("srun --frobnicate 3 python t.py", r"srun option --frobnicate is not in srun\(1\)"),
        ("srun -j python t.py", r"srun option -j \(in '-j'\) is not in srun\(1\)"),
        ("srun -N1 a : -N1 b", r"heterogeneous step"),
        ("srun --nodes=two python t.py", r"srun --nodes=two is not a node count"),
    ],
)
def test_a_line_the_supervisor_cannot_relaunch_is_one_named_error(line, message):
    with pytest.raises(SrunLineError, match=message) as raised:
        SrunLine.parse(line.split()).nodes()
    assert "HINT: " in str(raised.value)


def test_an_exclusion_from_a_file_is_refused_naming_the_fix():
    with pytest.raises(
        SrunLineError, match=r"(?s)srun --exclude=./bad_hosts names a file of hosts.*HINT: Put the hosts"
    ):
        SrunLine.parse(["srun", "--exclude=./bad_hosts", "a"]).with_excluded(["node2"])


def test_a_malformed_host_list_is_named():
    with pytest.raises(LayoutError, match=r"srun --exclude"):
        SrunLine.parse(["srun", "-x", "node[3-", "a"]).excluded()


def test_every_short_option_spells_a_long_one():
    assert set(SHORT_OPTIONS.values()) <= set(SRUN_OPTIONS)


@pytest.mark.skipif(not MAN_PAGE.exists(), reason="srun(1) is not installed here")
def test_the_option_table_is_srun_1_s():
    # Each option's synopsis line in the installed man page: "-x, --exclude={<host1...", "--kill-on-bad-exit[=0|1]".
    text = gzip.decompress(MAN_PAGE.read_bytes()).decode()
    synopses = re.findall(r"^\.TP\n\\fB(\\-.*)$", text, re.MULTILINE)
    long_options: dict[str, Arity] = {}
    short_options: dict[str, str] = {}
    for synopsis in synopses:
        plain = re.sub(r"\\f[BIRP]", "", synopsis).replace("\\-", "-")
        match = re.match(r"^(?:-(\w), )?--([\w-]+)(.?)", plain)
        assert match is not None, plain
        letter, name, after = match.groups()
        long_options[name] = {"[": Arity.OPTIONAL, "=": Arity.ONE}.get(after, Arity.NONE)
        if letter:
            short_options[letter] = name
    assert long_options == SRUN_OPTIONS
    assert short_options == SHORT_OPTIONS
