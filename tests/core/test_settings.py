"""``LIGHTNING_MPI_ENV_*`` settings: finite, in a range, plain ASCII digits; one on/off parser."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.settings import VARIABLE, Settings
from lightning_mpi_env.core.values import MAX_CHECKPOINT_EVERY, MAX_REQUEUES, MAX_SECONDS, SWITCH_WORDS

TIMEOUTS = [VARIABLE["rendezvous_timeout"], VARIABLE["stall_timeout"], VARIABLE["stall_soft_timeout"]]


@pytest.mark.parametrize("variable", TIMEOUTS)
@pytest.mark.parametrize(
    "value",
    [
        "1e18",  # accepted by float(), then an OverflowError in the roll call's timedelta
        "1e-300",
        "\u0663",  # Arabic-Indic three: float() takes it
        "1_0",  # float() takes it as 10
        "inf",
        "nan",
        "-3",
        "0x10",
        "1.5.2",
        ".",
        "9" * 40,
        str(MAX_SECONDS + 1),
        "0.0001",
    ],
)
def test_hostile_timeouts_are_one_setting_error(variable, value):
    with pytest.raises(SettingError, match=rf"{variable}=.* is not a positive, finite number of seconds in plain"):
        Settings.from_env({variable: value})


@pytest.mark.parametrize(("value", "seconds"), [("20", 20.0), ("2.5", 2.5), (" 30 ", 30.0), (".5", 0.5), ("7.", 7.0)])
def test_plain_decimal_timeouts(value, seconds):
    assert Settings.from_env({VARIABLE["rendezvous_timeout"]: value}).rendezvous_timeout == seconds


@pytest.mark.parametrize("value", [1e18, float("inf"), float("nan"), -1.0, 1e-300])
def test_timeout_arguments_are_bounded_too(value):
    with pytest.raises(SettingError, match=r"rendezvous_timeout=.* is not a positive, finite number of seconds"):
        Settings().with_arguments(rendezvous_timeout=value)


@pytest.mark.parametrize("field", ["stall_timeout", "stall_soft_timeout"])
@pytest.mark.parametrize("value", ["0", "off", "OFF", "no", "false", "0.0"])
def test_stall_watchdog_off_words_are_the_switch_s(value, field):
    assert getattr(Settings.from_env({VARIABLE[field]: value}), field) == 0.0


def test_the_two_stall_thresholds_default_to_a_report_well_before_the_end():
    settings = Settings.from_env({})
    assert (settings.stall_soft_timeout, settings.stall_timeout) == (60.0, 300.0)
    assert Settings().with_arguments(stall_soft_timeout=10).stall_soft_timeout == 10.0
    with pytest.raises(SettingError, match=r"stall_soft_timeout=.* is not a positive, finite number of seconds"):
        Settings().with_arguments(stall_soft_timeout=float("inf"))


@pytest.mark.parametrize("field", ["roll_call", "requeue", "debug", "stragglers"])
def test_every_switch_reads_the_one_table(field):
    for word, meaning in SWITCH_WORDS.items():
        for spelled in (word, word.upper(), f" {word} "):
            assert getattr(Settings.from_env({VARIABLE[field]: spelled}), field) is meaning
    with pytest.raises(SettingError, match=rf"{VARIABLE[field]}='maybe' is not one of 1, 0"):
        Settings.from_env({VARIABLE[field]: "maybe"})


@pytest.mark.parametrize("value", ["\u0663", "1_0", "1e3", "-1", str(MAX_REQUEUES + 1), "9" * 30])
def test_max_requeues_is_plain_digits_in_a_range(value):
    with pytest.raises(SettingError, match=r"LIGHTNING_MPI_ENV_MAX_REQUEUES=.* is not a whole number from 0 to"):
        Settings.from_env({VARIABLE["max_requeues"]: value})
    assert Settings.from_env({VARIABLE["max_requeues"]: str(MAX_REQUEUES)}).max_requeues == MAX_REQUEUES


def test_periodic_checkpoints_are_off_unless_asked():
    assert Settings.from_env({}).checkpoint_every == 0
    assert Settings.from_env({VARIABLE["checkpoint_every"]: " 5 "}).checkpoint_every == 5
    assert Settings.from_env({VARIABLE["checkpoint_every"]: "0"}).checkpoint_every == 0
    assert Settings.from_env({VARIABLE["checkpoint_every"]: str(MAX_CHECKPOINT_EVERY)}).checkpoint_every > 0


@pytest.mark.parametrize("value", ["\u0663", "1_0", "1e3", "-1", "5.0", "off", str(MAX_CHECKPOINT_EVERY + 1), "9" * 30])
def test_checkpoint_every_is_plain_digits_in_a_range(value):
    with pytest.raises(
        SettingError, match=r"LIGHTNING_MPI_ENV_CHECKPOINT_EVERY=.* is not a whole number from 0 to"
    ) as raised:
        Settings.from_env({VARIABLE["checkpoint_every"]: value})
    assert raised.value.hint == "Set LIGHTNING_MPI_ENV_CHECKPOINT_EVERY to a number, e.g. 100 (0: none), or unset it."
    assert raised.value.variable == VARIABLE["checkpoint_every"]


def test_the_straggler_watch_is_on_with_its_defaults_unless_turned_off():
    assert (Settings().stragglers, Settings().straggler_factor, Settings().straggler_window) == (True, 1.5, 20)
    read = Settings.from_env({VARIABLE["straggler_factor"]: " 2.5 ", VARIABLE["straggler_window"]: "50"})
    assert (read.straggler_factor, read.straggler_window) == (2.5, 50)
    assert Settings.from_env({VARIABLE["straggler_window"]: "0"}).straggler_window == 0


@pytest.mark.parametrize("value", ["1", "0.99", "0", "off", "1e1", "inf", "nan", "101", "-2", "\u0663", "2,5", "9" * 9])
def test_the_straggler_factor_is_a_plain_number_above_one(value):
    variable = VARIABLE["straggler_factor"]
    with pytest.raises(SettingError, match=rf"{variable}=.* is not a number above 1 and at most 100") as raised:
        Settings.from_env({variable: value})
    assert raised.value.hint == f"Set {variable} to a factor such as 1.5, or unset it."
    assert raised.value.variable == variable


@pytest.mark.parametrize("value", ["-1", "2.5", "10001", "twenty"])
def test_the_straggler_window_is_a_count_of_steps(value):
    with pytest.raises(SettingError, match=r"STRAGGLER_WINDOW=.* is not a whole number from 0 to 10000"):
        Settings.from_env({VARIABLE["straggler_window"]: value})
