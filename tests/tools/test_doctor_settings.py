"""``doctor``: every ``LIGHTNING_MPI_ENV_*`` setting read as the ranks read it, unknown names, and ``~`` explained."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.settings import VARIABLE, Settings
from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.cli_output import APPROXIMATE
from lightning_mpi_env.tools.doctor import Level, diagnose
from tests.layouts import OPEN_MPI_RANK_5


def _diagnose(env):
    return diagnose(
        env,
        module_available=lambda name: False,
        loaded_modules=(),
        gpu_count=lambda: None,
        resolve=lambda host: "10.0.0.1",
        bind=lambda address, port: None,
    )


def _settings(findings):
    return [finding for finding in findings if finding.topic == "settings"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (VARIABLE["stall_timeout"], "10x"),
        (VARIABLE["rendezvous_timeout"], "1e18"),
        (VARIABLE["roll_call"], "maybe"),
        (VARIABLE["max_requeues"], "-1"),
        (VARIABLE["mixed_imports"], "loud"),
        (VARIABLE["ifname"], "ib0,ib1"),
        (VARIABLE["checkpoint_every"], "often"),
        (VARIABLE["state_dir"], "a\nb"),
    ],
)
def test_a_setting_every_rank_refuses_is_an_error_naming_variable_value_and_fix(variable, value):
    with pytest.raises(SettingError) as refused:  # what each rank would do
        Settings.from_env({variable: value})
    (finding,) = _settings(_diagnose({**OPEN_MPI_RANK_5, variable: value}))
    assert finding.level is Level.ERROR
    assert (finding.message, finding.fix) == (refused.value.problem, refused.value.hint)
    assert (finding.variable, finding.value) == (variable, value)
    assert variable in finding.message


def test_doctor_exits_1_on_a_bad_setting_and_says_which(capsys):
    with mock.patch.dict(os.environ, {"PATH": os.environ["PATH"], VARIABLE["stall_timeout"]: "10x"}, clear=True):
        assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"[error] settings: {VARIABLE['stall_timeout']}='10x' is not a positive, finite number of seconds" in out
    assert f"HINT: Set {VARIABLE['stall_timeout']} to a number of seconds" in out


def test_every_bad_setting_is_a_finding_not_just_the_first():
    env = {VARIABLE["stall_timeout"]: "10x", VARIABLE["requeue"]: "perhaps", VARIABLE["rendezvous_timeout"]: "20"}
    findings = _settings(_diagnose(env))
    assert [(finding.level, finding.variable) for finding in findings] == [
        (Level.ERROR, VARIABLE["requeue"]),
        (Level.ERROR, VARIABLE["stall_timeout"]),
    ]


def test_an_unknown_name_is_a_warning_with_the_nearest_known_one():
    (finding,) = _settings(_diagnose({"LIGHTNING_MPI_ENV_STALL_TIMOUT": "10"}))
    assert finding.level is Level.WARN
    assert finding.message.endswith("did you mean LIGHTNING_MPI_ENV_STALL_TIMEOUT?")
    assert finding.variable == "LIGHTNING_MPI_ENV_STALL_TIMOUT"


def test_valid_settings_are_ok_and_named():
    (finding,) = _settings(_diagnose({VARIABLE["stall_timeout"]: "off", VARIABLE["ifname"]: "ib0"}))
    assert str(finding) == f"[ok] settings: {VARIABLE['stall_timeout']}, {VARIABLE['ifname']}: valid."
    (finding,) = _settings(_diagnose({}))
    assert finding.level is Level.OK


def test_an_approximate_node_rank_is_explained_where_it_is_shown():
    (layout,) = [finding for finding in _diagnose(OPEN_MPI_RANK_5) if finding.topic == "layout"]
    assert "node=1~/2~" in layout.message
    assert layout.message.endswith(APPROXIMATE)
    exact = {**OPEN_MPI_RANK_5, "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "5"}
    (layout,) = [finding for finding in _diagnose(exact) if finding.topic == "layout"]
    assert "~" not in layout.message  # every rank on this node: nothing approximate, nothing to explain


def test_doctor_json_is_one_object_with_every_finding(capsys):
    env = {"PATH": os.environ["PATH"], **OPEN_MPI_RANK_5, VARIABLE["stall_timeout"]: "10x", "MASTER_ADDR": "127.0.0.1"}
    with mock.patch.dict(os.environ, env, clear=True):
        assert main(["doctor", "--json"]) == 1  # the status without --json
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    result = json.loads(out)
    assert (result["ok"], result["rank"]) == (False, 5)
    (setting,) = [finding for finding in result["findings"] if finding["topic"] == "settings"]
    assert (setting["level"], setting["variable"], setting["value"]) == ("error", VARIABLE["stall_timeout"], "10x")
    assert setting["hint"].startswith(f"Set {VARIABLE['stall_timeout']}")
