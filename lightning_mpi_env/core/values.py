"""The strict parsers of every number and setting: ASCII digits only (``int()`` also takes ``'٣'``), sane maxima."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_mpi_env.core.errors import LayoutError, SettingError

PORT_RANGE = range(1, 65536)

MAX_DIGITS = 18
"""No launcher sets a count of 10**18 or more; longer text is refused before ``int()`` sees it."""

MAX_WORLD_SIZE = 1 << 24
"""The most ranks in one job: twice Fugaku's 7.6 million cores."""

MAX_LOCAL_SIZE = 1 << 14
"""The most ranks on one node: several times the hardware threads of the largest single machines."""

MIN_SECONDS = 0.001

MAX_SECONDS = 7 * 24 * 3600.0
"""The longest timeout this package takes: a week (``0`` turns the stall watchdog off instead)."""

SWITCH_WORDS: Mapping[str, bool] = MappingProxyType(
    {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
)
"""The values of an on/off setting (any case, blanks around ignored): the one table both parsers of switches use."""

SHOWN_CHARACTERS = 40


def shown(value: str) -> str:
    r"""A value as a message repeats it: quoted, what is not printable escaped, cut after :data:`SHOWN_CHARACTERS`.

    The one way a variable's value is echoed, so that a line break or a terminal escape in it cannot forge a line.

    >>> shown("9" * 5000)
    "'9999999999999999999999999999999999999999'... (5000 characters)"
    >>> shown("0\nHINT: x")
    "'0\\nHINT: x'"
    """
    if len(value) <= SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value)} characters)"


SHOWN_NAME_CHARACTERS = 100
"""The longest variable name echoed whole (the longest setting's name is 36 characters)."""


def shown_name(name: str) -> str:
    r"""A variable's name as a message repeats it: as it is when plain, else as :func:`shown` writes a value.

    A name with a blank, a character that is not printable ASCII, or over :data:`SHOWN_NAME_CHARACTERS` characters
    is quoted, escaped and cut, so that it reads as one name and forges no line.

    >>> shown_name("LIGHTNING_MPI_ENV_DEBGU"), shown_name("X\nY")
    ('LIGHTNING_MPI_ENV_DEBGU', "'X\\nY'")
    """
    if name and len(name) <= SHOWN_NAME_CHARACTERS and name.isascii() and name.isprintable() and " " not in name:
        return name
    if len(name) <= SHOWN_NAME_CHARACTERS:
        return repr(name)
    return shown(name)


def as_count(text: str) -> int | None:
    """``text`` as a count when it is one of at most :data:`MAX_DIGITS` plain ASCII digits; else ``None``."""
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
    """Parse a rank, size, count, port or index strictly; else a :class:`LayoutError` naming variable and launcher."""
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
    """Parse a TCP port strictly (1 to 65535); else a :class:`LayoutError` naming the variable, value and launcher."""
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
    """What an on/off value means by :data:`SWITCH_WORDS`, or ``None`` when it is not one."""
    return SWITCH_WORDS.get(raw.strip().lower())


def parse_switch(raw: str, *, variable: str, default: bool, hint: str) -> bool:
    """An on/off setting: ``default`` when empty, else one of :data:`SWITCH_WORDS`; else a :class:`SettingError`."""
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


def plain_decimal(raw: str) -> float:
    """``raw`` as a number where it is plain decimal digits with at most one dot (``12``, ``0.5``); else ``-1.0``."""
    whole, _, fraction = raw.strip().partition(".")
    plain = len(raw) <= 2 * MAX_DIGITS and (whole or fraction) and all(map(is_count, filter(None, (whole, fraction))))
    return float(raw) if plain else -1.0


def parse_seconds(raw: str | float, *, variable: str, hint: str, off: str = "") -> float:
    """Seconds from :data:`MIN_SECONDS` to :data:`MAX_SECONDS` in plain decimal digits; else a :class:`SettingError`.

    ``float()`` would also take ``1e18`` (which overflows a ``timedelta`` later), ``1_0``, ``٣``, ``inf`` and ``nan``.
    ``off``: what ``0`` or ``off`` does where the caller takes them (:func:`seconds_or_off`), said in the error.
    """
    seconds = plain_decimal(raw) if isinstance(raw, str) else float(raw)
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:  # also false for nan
        raise SettingError(
            f"{variable}={shown(str(raw))} is not a positive, finite number of seconds in plain digits, from "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:.0f}" + (f", nor 0 or off ({off})." if off else "."),
            hint,
            variable=variable,
            value=str(raw)[:SHOWN_CHARACTERS],
        )
    return seconds


def switch(env: Mapping[str, str], variable: str, *, default: bool) -> bool:
    """An on/off variable (:func:`parse_switch`); ``default`` when unset."""
    hint = f"Unset {variable}, or set it to 1 (on) or 0 (off)."
    return parse_switch(env.get(variable, ""), variable=variable, default=default, hint=hint)


def seconds(value: float | None, env: Mapping[str, str], variable: str, default: float, *, off: str = "") -> float:
    """A timeout: ``value`` if given, else ``variable`` of ``env``, else ``default`` (:func:`parse_seconds`)."""
    if value is None and variable not in env:
        return default
    raw = value if value is not None else env[variable]
    hint = f"Set {variable} to a number of seconds, e.g. {default or 60:g}" + (
        f", or to 0 or off: {off}." if off else "."
    )
    return parse_seconds(raw, variable=variable, hint=hint, off=off)


def seconds_or_off(value: float | None, env: Mapping[str, str], variable: str, default: float, *, off: str) -> float:
    """:func:`seconds`, where ``0`` (or ``off``, any switch's off word) turns the feature off and reads as ``0.0``.

    ``off`` says what that does (``"no watchdog"``); the error for any other value says that 0 and off are taken.
    """
    raw = value if value is not None else env.get(variable)
    if isinstance(raw, str) and (switch_word(raw) is False or raw.strip() in ("0.0", "0.")):
        return 0.0
    if raw is not None and not isinstance(raw, str) and raw == 0:
        return 0.0
    return seconds(value, env, variable, default, off=off)


MAX_REQUEUES = 1_000_000
MAX_CHECKPOINT_EVERY = 1_000_000_000


def count_or_off(
    env: Mapping[str, str], variable: str, default: int, *, high: int = MAX_REQUEUES, zero: str = "no limit"
) -> int:
    """A count from ``0`` (``zero``: what it means) to ``high``: ``variable`` of ``env``, else ``default``."""
    raw = env.get(variable, "").strip()
    if not raw:
        return default
    count = as_count(raw)
    if count is None or count > high:
        example = default or 100
        raise SettingError(
            f"{variable}={shown(raw)} is not a whole number from 0 to {high} in plain digits.",
            f"Set {variable} to a number, e.g. {example} (0: {zero}), or unset it.",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return count


MAX_FACTOR = 100.0


def factor(env: Mapping[str, str], variable: str, default: float) -> float:
    """A ratio above 1, at most :data:`MAX_FACTOR`, in plain decimal digits: ``variable`` of ``env``, else ``default``.

    >>> factor({"F": "2.5"}, "F", 1.5)
    2.5
    """
    raw = env.get(variable, "").strip()
    if not raw:
        return default
    value = plain_decimal(raw)
    if not 1.0 < value <= MAX_FACTOR:
        raise SettingError(
            f"{variable}={shown(raw)} is not a number above 1 and at most {MAX_FACTOR:g} in plain digits.",
            f"Set {variable} to a factor such as {default:g}, or unset it.",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return value


MAX_PATH = 4096
"""The longest folder taken (Linux's ``PATH_MAX``)."""


def folder(env: Mapping[str, str], variable: str) -> str:
    """A folder's path, blanks dropped: at most :data:`MAX_PATH` characters, none a control one; empty when unset."""
    raw = env.get(variable, "").strip()
    if len(raw) > MAX_PATH or any(ord(character) < 32 or ord(character) == 127 for character in raw):
        raise SettingError(
            f"{variable}={shown(raw)} is not a folder's path (at most {MAX_PATH} characters, none a control "
            "character).",
            f"Set {variable} to a folder on a file system every node sees, e.g. $PWD/.lightning-mpi-env, or unset it.",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return raw
