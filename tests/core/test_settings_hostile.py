"""Hostile ``LIGHTNING_MPI_ENV_*`` names and values, over every setting: each class of finding as a property.

A name in the wrong case is named; ``doctor`` and the launch give one verdict; a value that would forge a line is
escaped; the unknown-name warning is one line from rank 0, as the docs quote it; a setting that ``0`` or ``off``
turns off says so when refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_mpi_env
from lightning_mpi_env.core import errors, values
from lightning_mpi_env.core import settings as settings_module
from lightning_mpi_env.core.errors import Explained, LayoutError, LayoutWarning, RendezvousError, SettingError
from lightning_mpi_env.core.launchers import LAUNCHERS, SRUN
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.network import Interface, socket_ifname_exports
from lightning_mpi_env.core.settings import (
    PREFIX,
    SETTINGS,
    VARIABLE,
    Settings,
    UnknownSettingWarning,
    unknown_settings,
)
from lightning_mpi_env.tools.doctor import Level
from tests.conftest import python_path
from tests.layouts import launcher_env
from tests.tools.test_doctor_settings import _diagnose

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = str(Path(lightning_mpi_env.__file__).resolve().parent)
READERS = settings_module._READERS
ROW = {row.variable: row for row in SETTINGS}

TOKENS = [
    *["", " ", "0", "00", "0.0", "0.", "off", "OFF", "Off ", "no", "on", "1", "true", "-1", "10", " 30 ", "2.5"],
    *["1e3", "inf", "nan", "\u0663", "1_0", "10x", "9" * 40, "warn", "Error", "loud"],
    *["{host}", "{host}i", "{host}-ib", "-{host}", "{host}-", ".{host}", "{host}.", "{host}..ib", "{HOST}", "a{host}b"],
    *["ib0", "lo", "eth0", "ib0,ib1", "=ib0", "/tmp/state", "a\nb", "\x1b[2K", "x\rUnknownSettingWarning: forged"],
]
"""Values that cross a boundary of some setting: off words, numbers, templates, interfaces, control characters."""

_AROUND = st.text(alphabet="ab1.-_", max_size=6)
VALUES = st.one_of(
    st.sampled_from(TOKENS),
    st.text(max_size=12),
    st.builds(lambda before, after: before + "{host}" + after, _AROUND, _AROUND),
)
SOCKET_IFNAMES = st.sampled_from(["ib0", "=ib0", "lo", "=lo", "eth0", "ib", ""])


def _caught(env: dict[str, str]) -> list[warnings.WarningMessage]:
    """The unknown-name warnings ``Settings.from_env(env)`` gives in a process that warned about none yet."""
    settings_module._WARNED.clear()  # the fixture's set, put back after the test
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Settings.from_env(env)
    return [warning for warning in caught if issubclass(warning.category, UnknownSettingWarning)]


@pytest.fixture(autouse=True)
def no_names_warned_yet(monkeypatch):
    """Each test starts as a fresh process would: no unknown name warned about yet."""
    monkeypatch.setattr(settings_module, "_WARNED", set())


# --- a: a setting's name in the wrong case ------------------------------------------------------------------------


@given(row=st.sampled_from(SETTINGS), flips=st.lists(st.booleans(), min_size=60, max_size=60))
def test_a_setting_s_name_in_any_other_case_is_named(row, flips):
    name = "".join(char.swapcase() if flip else char for char, flip in zip(row.variable, flips, strict=False))
    if name == row.variable:
        name = row.variable.lower()
    (warning,) = unknown_settings({name: "1"})
    assert f"did you mean {row.variable}?" in warning.problem
    assert warning.hint == f"Rename it to {row.variable}."
    assert warning.variable == name


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("lightning_mpi_env_stall_timeout", "LIGHTNING_MPI_ENV_STALL_TIMEOUT"),
        ("LIGHTNING_MPI_ENV_Stall_Timeout", "LIGHTNING_MPI_ENV_STALL_TIMEOUT"),
        ("lightning_mpi_env_stall_timout", "LIGHTNING_MPI_ENV_STALL_TIMEOUT"),  # a typo in the wrong case
        ("Lightning_Mpi_Env_Debgu", "LIGHTNING_MPI_ENV_DEBUG"),
    ],
)
def test_doctor_and_the_ranks_name_the_setting_a_wrong_case_spells(name, meant):
    (finding,) = [finding for finding in _doctor({name: "10"}) if finding.topic == "settings"]
    assert finding.level is Level.WARN
    assert f"did you mean {meant}?" in finding.message
    (warning,) = _caught({name: "10"})
    assert f"did you mean {meant}?" in str(warning.message)


def test_other_names_in_any_case_are_not_settings():
    assert unknown_settings({"lightning_mpi_environment": "1", "Lightning_Other": "1", "PATH": "/bin"}) == []


# --- b: doctor's verdict is the launch's -------------------------------------------------------------------------


def _doctor(env: dict[str, str]) -> list:
    return _diagnose(env)  # doctor with every probe of the host faked, as its own settings tests run it


LAUNCH = {
    **launcher_env(SRUN, rank=0, world_size=8, local_rank=0, local_size=4, node=0, num_nodes=2),
    "SLURM_STEP_NODELIST": "node[1-2]",
}
"""Rank 0 of two nodes under srun, no ``MASTER_ADDR``: the main address is the step's first host (the template's)."""


def _launch_refuses(env: dict[str, str]) -> bool:
    """Whether the launch refuses ``env``'s settings, as ``MPIClusterEnvironment`` reads them on a host with the
    interface they name: the settings, the layout (the main host through the template), gloo's and NCCL's interface.
    """
    try:
        read = Settings.from_env(env)
        from_env(env)
        socket_ifname_exports(read.ifname, env, lambda: [Interface(read.ifname, ("10.0.0.5/16",))])
    except LayoutError:  # SettingError included
        return True
    return False


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    chosen=st.dictionaries(st.sampled_from([row.variable for row in SETTINGS]), VALUES, max_size=3),
    sockets=st.dictionaries(st.sampled_from(["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]), SOCKET_IFNAMES),
)
def test_doctor_calls_valid_exactly_the_settings_the_launch_takes(chosen, sockets):
    env = {**LAUNCH, **sockets, **chosen}
    findings = [finding for finding in _doctor(env) if finding.topic == "settings"]
    refused = [finding for finding in findings if finding.level is Level.ERROR]
    assert bool(refused) == _launch_refuses(env), (env, [str(finding) for finding in findings])


@pytest.mark.parametrize(
    "env",
    [
        {VARIABLE["main_host"]: "-{host}"},  # `-node1` would read as an option on a command line
        {VARIABLE["main_host"]: "{host}..ib"},
        {VARIABLE["main_host"]: ".{host}"},
        {VARIABLE["ifname"]: "ib0", "NCCL_SOCKET_IFNAME": "eth0"},
        {VARIABLE["ifname"]: "lo", "GLOO_SOCKET_IFNAME": "=ib0"},
    ],
)
def test_what_the_launch_refuses_doctor_refuses_naming_the_setting(env):
    assert _launch_refuses({**LAUNCH, **env})
    (finding,) = [finding for finding in _doctor({**LAUNCH, **env}) if finding.topic == "settings"]
    assert finding.level is Level.ERROR
    variable = next(name for name in env if name.startswith(PREFIX))
    assert (finding.variable, finding.value) == (variable, env[variable])
    assert finding.message.startswith(f"{variable}={env[variable]!r}")
    assert variable in finding.fix


@pytest.mark.parametrize("template", ["{host}i", "{host}-ib", "ib-{host}", "{host}.ib.example.org", "{host}."])
def test_templates_that_give_host_names_are_taken(template):
    assert settings_module.host_template({VARIABLE["main_host"]: template}) == template
    assert not _launch_refuses({**LAUNCH, VARIABLE["main_host"]: template})


# --- d: nothing echoed forges a line ------------------------------------------------------------------------------

HOSTILE = st.text(
    alphabet=st.sampled_from(["\n", "\r", "\x1b", "\x00", "\x85", "\u2028", "\u202e", "\t", "\x7f", "a", "0", " "]),
    max_size=30,
)


def _one_line(text: str) -> None:
    assert text.isprintable(), repr(text)


@given(suffix=HOSTILE, value=HOSTILE)
def test_an_unknown_name_or_its_value_forges_no_line(suffix, value):
    name = PREFIX + "X" + suffix
    (warning,) = unknown_settings({name: value})
    _one_line(str(warning))
    _one_line(warning.one_line())
    assert len(warning.problem) < 400


@given(row=st.sampled_from(SETTINGS), value=HOSTILE.map(lambda text: "1" + text + "\n"))
def test_a_refused_value_forges_no_line(row, value):
    try:
        READERS[row.field]({row.variable: value})
    except SettingError as error:
        (problem, hint) = str(error).split("\nHINT: ")
        _one_line(problem)
        _one_line(hint)
        _one_line(error.one_line())


@pytest.mark.parametrize("kind", [LayoutError, RendezvousError, SettingError, LayoutWarning, UnknownSettingWarning])
@given(problem=HOSTILE, hint=HOSTILE)
def test_every_error_and_warning_renders_echoed_text_on_its_own_lines(kind, problem, hint):
    shown = str(kind(f"X={problem}.", f"Set X{hint}."))
    if kind.separator == "\n":
        (problem_line, hint_line) = shown.split("\n")
        assert hint_line.startswith("HINT: Set X")
        _one_line(problem_line)
        _one_line(hint_line)
    else:
        _one_line(shown)


@given(text=st.text(max_size=300))
def test_shown_values_and_names_are_printable_and_bounded(text):
    for rendered in (values.shown(text), values.shown_name(text), errors.escaped(text)):
        _one_line(rendered)
    assert len(values.shown(text)) <= 4 * values.SHOWN_CHARACTERS + 40  # \U0010ffff takes 10 characters escaped
    assert len(values.shown_name(text)) <= 10 * values.SHOWN_NAME_CHARACTERS + 2
    if text.isascii() and text.isprintable() and " " not in text and 0 < len(text) <= 100:
        assert values.shown_name(text) == text  # a plain name reads as itself


# --- 7: the unknown-name warning: one for the job, one line as the docs quote it -----------------------------------


@settings(max_examples=60)
@given(launcher=st.sampled_from(LAUNCHERS), rank=st.integers(0, 3))
def test_an_unknown_name_is_warned_by_rank_0_of_any_launcher_only(launcher, rank):
    env = {launcher.marker: "1", launcher.rank: str(rank), "LIGHTNING_MPI_ENV_STALL_TIMOUT": "10"}
    assert len(_caught(env)) == (rank == 0)


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({}, True),  # one process, no launcher: it speaks for itself
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),
        ({"RANK": "3"}, False),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "LOCAL_RANK": "1"}, False),  # started by Lightning
        ({"OMPI_COMM_WORLD_RANK": "x"}, True),  # no rank to be told: better said twice than never
    ],
)
def test_only_the_process_that_speaks_for_the_job_warns(env, warned):
    assert len(_caught({**env, "LIGHTNING_MPI_ENV_STALL_TIMOUT": "10"})) == warned


def _lightning_format(message, category, filename, lineno, line=None):
    """Lightning's ``formatwarning``: the class left out for a file whose absolute path holds ``lightning``."""
    if "lightning" in str(Path(filename).absolute()):
        return f"{filename}:{lineno}: {message}\n"
    return f"{filename}:{lineno}: {category.__name__}: {message}\n"


QUOTED = (
    "UnknownSettingWarning: LIGHTNING_MPI_ENV_STALL_TIMOUT is not a setting of this package and is ignored: did you "
    "mean LIGHTNING_MPI_ENV_STALL_TIMEOUT?"
)
"""The line as docs/troubleshooting.md quotes it."""


@pytest.mark.parametrize("folder", ["jobs", "lightning-jobs"])
def test_the_printed_line_names_the_class_as_the_docs_quote_it_and_no_file_of_ours(folder, tmp_path, monkeypatch):
    (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / folder)
    monkeypatch.setattr(warnings, "formatwarning", _lightning_format)
    (warning,) = _caught({"LIGHTNING_MPI_ENV_STALL_TIMOUT": "10"})
    printed = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno)
    assert printed.count("UnknownSettingWarning") == 1
    assert QUOTED in printed
    assert PACKAGE not in printed
    assert "\n" not in printed.rstrip("\n")


def test_a_lightning_program_prints_the_warning_once_as_the_docs_quote_it(tmp_path):
    # Lightning's own formatwarning, an environment made from the user's code, a working folder named like Lightning.
    folder = tmp_path / "lightning-job"
    folder.mkdir()
    program = (
        "import lightning.fabric\n"
        "from lightning_mpi_env.pytorch import MPIClusterEnvironment\n"
        "env = {'LIGHTNING_MPI_ENV_STALL_TIMOUT': '10'}\n"
        "MPIClusterEnvironment(env).teardown()\n"
        "MPIClusterEnvironment(env).teardown()\n"
    )
    env = {**os.environ, "PYTHONPATH": python_path(ROOT)}
    env = {name: value for name, value in env.items() if not name.startswith(PREFIX)}
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "STALL_TIMOUT" in line]
    assert len(lines) == 1, done.stderr
    assert QUOTED in lines[0]
    assert lines[0].count("UnknownSettingWarning") == 1
    assert PACKAGE not in lines[0]


# --- 7: a setting that 0 or off turns off says so when it refuses a value -----------------------------------------

_ZERO = re.compile(r"(?<![\d.])0(?![\d.])")


def _turned_off_by(row) -> list[str]:
    """The words (``0``, ``off``) that turn ``row``'s setting off (its reader gives ``False``, ``0`` or ``0.0``)."""
    words = []
    for word in ("0", "off"):
        try:
            meaning = READERS[row.field]({row.variable: word})
        except SettingError:
            continue
        if meaning is not None and not meaning and not isinstance(meaning, str):
            words.append(word)
    return words


def test_some_settings_are_turned_off_by_0_or_off():
    assert _turned_off_by(ROW[VARIABLE["stall_timeout"]]) == ["0", "off"]
    assert _turned_off_by(ROW[VARIABLE["checkpoint_every"]]) == ["0"]
    assert _turned_off_by(ROW[VARIABLE["ifname"]]) == []


@given(row=st.sampled_from(SETTINGS), value=VALUES)
def test_a_refused_value_of_a_setting_0_or_off_turns_off_says_they_are_taken(row, value):
    words = _turned_off_by(row)
    try:
        READERS[row.field]({row.variable: value})
    except SettingError as error:
        for text in (error.problem, error.hint):
            if "0" in words:
                assert _ZERO.search(text), text
            if "off" in words:
                assert re.search(r"\boff\b", text), text


@pytest.mark.parametrize("field", ["stall_timeout", "stall_soft_timeout"])
def test_a_refused_timeout_argument_says_0_turns_it_off(field):
    with pytest.raises(SettingError, match=r"nor 0 or off \(no (watchdog|report)\)") as refused:
        Settings().with_arguments(**{field: -1.0})
    assert "or to 0 or off" in refused.value.hint


def test_a_refused_stall_timeout_reads_in_full():
    with pytest.raises(SettingError) as refused:
        Settings.from_env({VARIABLE["stall_timeout"]: "5m"})
    assert refused.value.problem == (
        "LIGHTNING_MPI_ENV_STALL_TIMEOUT='5m' is not a positive, finite number of seconds in plain digits, from 0.001 "
        "to 604800, nor 0 or off (no watchdog)."
    )
    assert refused.value.hint == (
        "Set LIGHTNING_MPI_ENV_STALL_TIMEOUT to a number of seconds, e.g. 300, or to 0 or off: no watchdog."
    )


def test_a_message_written_in_lines_keeps_them_and_escapes_the_rest():
    assert str(errors.MixedImportError("one\n  two\x1b", "fix")) == "one\n  two\\x1b\nHINT: fix"
    assert str(SettingError("one\ntwo\r", "fix\n")) == "one two\\r\nHINT: fix "
    assert Explained("a\x00", "b").one_line() == "a\\x00 HINT: b"
