"""The one strict parser for every number this package reads, for its own on/off switches and its seconds.

Numbers are ranks, sizes, counts, ports and node indices; each kind has a sane maximum, so that nothing sized by a
number someone typed grows past it.

Only plain ASCII digits are numbers: ``str.isdigit()`` also accepts ``'²'`` and ``int()`` accepts ``'٣'``, ``' 3'``
and ``'+3'``, none of which a launcher ever exports. A bad value is a :class:`LayoutError` or :class:`SettingError`
naming the variable, never a bare ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_mpi_env.core.errors import LayoutError, SettingError

PORT_RANGE = range(1, 65536)
"""Valid TCP ports."""

MAX_DIGITS = 18
"""The most digits a count may have: no launcher sets a rank, size or count of 10**18 or more. Longer numbers are
refused before ``int()`` sees them (which refuses more than 4300 digits with a bare ``ValueError``)."""

MAX_WORLD_SIZE = 1 << 24
"""The most ranks in one job: 16,777,216, twice Fugaku's 7.6 million cores (the largest MPI jobs yet run)."""

MAX_LOCAL_SIZE = 1 << 14
"""The most ranks on one node: 16,384, several times the hardware threads of the largest single machines."""

MIN_SECONDS = 0.001
"""The shortest timeout this package takes, in seconds."""

MAX_SECONDS = 7 * 24 * 3600.0
"""The longest timeout this package takes: a week (``0`` turns the stall watchdog off instead)."""

SWITCH_WORDS: Mapping[str, bool] = MappingProxyType(
    {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
)
"""The values of an on/off setting (any case, blanks around ignored): the one table both parsers of switches use."""

SHOWN_CHARACTERS = 40
"""How much of a hostile value a message repeats (:func:`shown`)."""


def shown(value: str) -> str:
    """A value as a message repeats it: quoted, and cut after :data:`SHOWN_CHARACTERS` characters.

    >>> shown("12")
    "'12'"
    >>> shown("9" * 5000)
    "'9999999999999999999999999999999999999999'... (5000 characters)"
    """
    if len(value) <= SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value)} characters)"


def as_count(text: str) -> int | None:
    """``text`` as a count when it is one of at most :data:`MAX_DIGITS` plain ASCII digits; else ``None``.

    >>> as_count("12"), as_count("x"), as_count("1" * 19)
    (12, None, None)
    """
    return int(text) if is_count(text) and len(text) <= MAX_DIGITS else None


def is_count(text: str) -> bool:
    """Whether ``text`` is a non-negative integer written in plain ASCII digits.

    >>> [is_count(text) for text in ("12", "0", "²", "٣", "-1", " 3", "")]
    [True, True, False, False, False, False, False]
    """
    return text.isascii() and text.isdigit()


def parse_count(
    value: str,
    *,
    variable: str,
    launcher: str | None = None,
    minimum: int = 0,
    maximum: int | None = None,
    hint: str | None = None,
) -> int:
    """Parse a rank, size, count, port or index strictly.

    Args:
        value: The text as read (from a variable, a host file or an argument).
        variable: Where it came from, for the message (``PMI_RANK``, ``PE_HOSTFILE line 2``).
        launcher: The launcher or scheduler that set it, for the message; ``None`` outside any.
        minimum: The smallest value allowed.
        maximum: The largest value allowed, if any.
        hint: The fix; by default, to let the launcher set the variable.

    Returns:
        The number.

    Raises:
        LayoutError: Naming the variable, the value and the launcher.

    >>> parse_count("12", variable="PMI_RANK", launcher="MPICH/Intel MPI (Hydra)")
    12
    >>> parse_count("²", variable="MASTER_PORT")
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.errors.LayoutError: MASTER_PORT='²' (no launcher) is not a non-negative integer.
    HINT: Unset MASTER_PORT, or set it to a plain number.
    """
    where = launcher if launcher is not None else "no launcher"
    fix = hint if hint is not None else f"Unset {variable}, or set it to a plain number."
    fields = {"variable": variable, "value": value[:SHOWN_CHARACTERS], "launcher": launcher}
    if not is_count(value):
        negative = value.startswith("-") and is_count(value[1:])
        problem = "is negative" if negative else "is not a non-negative integer"
        raise LayoutError(f"{variable}={shown(value)} ({where}) {problem}.", fix, **fields)
    number = as_count(value)
    if number is None:
        raise LayoutError(
            f"{variable}={shown(value)} ({where}) has {len(value)} digits; no launcher sets a number that large "
            f"(at most {MAX_DIGITS} digits).",
            fix,
            **fields,
        )
    if number < minimum:
        raise LayoutError(f"{variable}={shown(value)} ({where}) must be at least {minimum}.", fix, **fields)
    if maximum is not None and number > maximum:
        raise LayoutError(f"{variable}={shown(value)} ({where}) must be at most {maximum}.", fix, **fields)
    return number


def parse_port(value: str, *, variable: str, launcher: str | None = None, hint: str) -> int:
    """Parse a TCP port strictly (1 to 65535).

    Raises:
        LayoutError: Naming the variable, the value and the launcher.

    >>> parse_port("29500", variable="MASTER_PORT", hint="Set a free port.")
    29500
    """
    port = as_count(value)
    if port is None or port not in PORT_RANGE:
        where = launcher if launcher is not None else "no launcher"
        raise LayoutError(
            f"{variable}={shown(value)} is not a port number between 1 and 65535 (launcher: {where}).",
            hint,
            variable=variable,
            value=value[:SHOWN_CHARACTERS],
            launcher=launcher,
        )
    return port


def switch_word(raw: str) -> bool | None:
    """What an on/off value means by :data:`SWITCH_WORDS`, or ``None`` when it is not one.

    >>> switch_word(" Off "), switch_word("maybe")
    (False, None)
    """
    return SWITCH_WORDS.get(raw.strip().lower())


def parse_switch(raw: str, *, variable: str, default: bool, hint: str) -> bool:
    """An on/off setting of this package: ``default`` when empty, else one of :data:`SWITCH_WORDS`.

    Raises:
        SettingError: Naming the variable and its value.

    >>> parse_switch("off", variable="X", default=True, hint="Unset X.")
    False
    """
    if not raw.strip():
        return default
    value = switch_word(raw)
    if value is None:
        raise SettingError(
            f"{variable}={shown(raw)} is not one of 1, 0 (also true/false, yes/no, on/off).",
            hint,
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return value


def parse_seconds(raw: str | float, *, variable: str, hint: str) -> float:
    """A timeout: a number of seconds from :data:`MIN_SECONDS` to :data:`MAX_SECONDS`, in plain decimal digits.

    Text takes ASCII digits with at most one decimal point: ``float()`` would also take ``1e18`` (which overflows a
    ``timedelta`` later), ``1e-300``, ``1_0``, Arabic-Indic ``٣``, ``inf`` and ``nan``. A number (a constructor
    argument) must be finite and in the range.

    Raises:
        SettingError: Naming the variable, its value and the range.

    >>> parse_seconds("2.5", variable="T", hint="Set T."), parse_seconds(30, variable="T", hint="Set T.")
    (2.5, 30.0)
    >>> parse_seconds("1e18", variable="T", hint="Set T.")
    Traceback (most recent call last):
    ...
    lightning_mpi_env.core.errors.SettingError: T='1e18' is not a positive, finite number of seconds in plain digits, from 0.001 to 604800.
    HINT: Set T.
    """  # noqa: E501
    if isinstance(raw, str):
        whole, _, fraction = raw.strip().partition(".")
        plain = (
            len(raw) <= 2 * MAX_DIGITS and (whole or fraction) and all(map(is_count, filter(None, (whole, fraction))))
        )
        seconds = float(raw) if plain else -1.0
    else:
        seconds = float(raw)
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:  # also false for nan
        raise SettingError(
            f"{variable}={shown(str(raw))} is not a positive, finite number of seconds in plain digits, from "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:.0f}.",
            hint,
            variable=variable,
            value=str(raw)[:SHOWN_CHARACTERS],
        )
    return seconds


__all__ = [
    "MAX_DIGITS",
    "MAX_LOCAL_SIZE",
    "MAX_SECONDS",
    "MAX_WORLD_SIZE",
    "MIN_SECONDS",
    "PORT_RANGE",
    "SHOWN_CHARACTERS",
    "SWITCH_WORDS",
    "as_count",
    "is_count",
    "parse_count",
    "parse_port",
    "parse_seconds",
    "parse_switch",
    "shown",
    "switch_word",
]
