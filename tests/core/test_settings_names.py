"""``core/settings.py``: unknown ``LIGHTNING_MPI_ENV_*`` names, and every setting checked by its one reader."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

from lightning_mpi_env.core import settings
from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.settings import (
    PREFIX,
    REPLACES,
    SETTINGS,
    VARIABLE,
    Settings,
    UnknownSettingWarning,
    setting_errors,
    unknown_settings,
)

PACKAGE = Path(settings.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_names_warned_yet(monkeypatch):
    """Each test starts as a fresh process would: no unknown name warned about yet."""
    monkeypatch.setattr(settings, "_WARNED", set())


def test_an_unknown_name_is_warned_with_the_nearest_known_one():
    with pytest.warns(UnknownSettingWarning, match="did you mean LIGHTNING_MPI_ENV_STALL_TIMEOUT\\?") as caught:
        assert Settings.from_env({"LIGHTNING_MPI_ENV_STALL_TIMOUT": "10"}) == Settings()  # ignored, not read
    (warning,) = caught
    assert isinstance(warning.message, UnknownSettingWarning)
    assert (warning.message.variable, warning.message.value) == ("LIGHTNING_MPI_ENV_STALL_TIMOUT", "10")
    assert warning.message.hint == "Rename it to LIGHTNING_MPI_ENV_STALL_TIMEOUT."
    assert warning.filename == settings.WARNED_FROM  # the environment is blamed: no line of this package's code


def test_each_unknown_name_is_warned_once_per_process():
    env = {"LIGHTNING_MPI_ENV_ROLLCALL": "0", "LIGHTNING_MPI_ENV_DEBGU": "1"}
    with pytest.warns(UnknownSettingWarning) as caught:
        Settings.from_env(env)
    assert sorted(str(warning.message.variable) for warning in caught) == sorted(env)  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Settings.from_env(env)  # the same names again: no second warning
    with pytest.warns(UnknownSettingWarning, match="LIGHTNING_MPI_ENV_REQUEUES"):
        Settings.from_env({**env, "LIGHTNING_MPI_ENV_REQUEUES": "0"})  # a new name is warned about


def test_a_name_near_none_lists_the_settings():
    (warning,) = unknown_settings({"LIGHTNING_MPI_ENV_XYZZY": "1", "OTHER_STALL_TIMEOUT": "5"})
    assert warning.problem == "LIGHTNING_MPI_ENV_XYZZY is not a setting of this package and is ignored."
    assert all(row.variable in warning.hint for row in SETTINGS)


def test_known_names_and_other_prefixes_are_not_warned():
    env = {row.variable: "" for row in SETTINGS} | {"LIGHTNING_MPI_ENVIRONMENT": "1", "SLURM_PROCID": "0"}
    assert unknown_settings(env) == []


def test_a_hostile_name_is_cut_and_not_guessed():
    name = PREFIX + "X" * 100_000
    (warning,) = unknown_settings({name: "1"})
    assert len(warning.problem) < 200
    assert warning.variable is not None
    assert len(warning.variable) <= 100


def _code_strings(path: Path) -> list[str]:
    """Every string constant of a module's code, its docstrings (and the doctests in them) left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(statement.value)
        for node in ast.walk(tree)
        if isinstance(getattr(node, "body", None), list)
        for statement in node.body  # type: ignore[attr-defined]
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_prefixed_name_the_package_reads_is_a_setting():
    spelled = set()
    for path in PACKAGE.rglob("*.py"):
        for text in _code_strings(path):
            spelled.update(re.findall(rf"\b{PREFIX}[A-Z][A-Z0-9_]*[A-Z0-9]\b", text))
    assert spelled, "the pattern finds nothing: the test would pass for nothing"
    # REPLACES is no setting: restartable sets it for the process it starts in a lost rank's place.
    assert spelled <= {*VARIABLE.values(), REPLACES}, sorted(spelled - {*VARIABLE.values(), REPLACES})


def test_the_replacement_s_variable_is_no_unknown_setting():
    assert unknown_settings({REPLACES: "2 1 4 0 2 node1 29500"}) == []


def test_setting_errors_names_every_bad_setting_as_from_env_refuses_each():
    env = {
        VARIABLE["stall_timeout"]: "10x",
        VARIABLE["roll_call"]: "maybe",
        VARIABLE["ifname"]: "ib0,ib1",
        VARIABLE["checkpoint_every"]: "-1",
        VARIABLE["rendezvous_timeout"]: "30",
    }
    errors = setting_errors(env)
    assert sorted(error.variable for error in errors) == sorted(  # type: ignore[type-var]
        [VARIABLE["stall_timeout"], VARIABLE["roll_call"], VARIABLE["ifname"], VARIABLE["checkpoint_every"]]
    )
    for error in errors:
        assert error.value == env[error.variable]  # type: ignore[index]
        with pytest.raises(SettingError) as refused:
            Settings.from_env({error.variable: env[error.variable]})  # type: ignore[index,dict-item]
        assert (refused.value.problem, refused.value.hint) == (error.problem, error.hint)
    assert setting_errors({VARIABLE["rendezvous_timeout"]: "30"}) == []
