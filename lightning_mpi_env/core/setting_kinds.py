"""The kinds of value a ``LIGHTNING_MPI_ENV_*`` setting takes: a switch, seconds, a count, a folder.

One reader per kind, each refusing a bad value with a :class:`~lightning_mpi_env.core.errors.SettingError` that
names the variable, its value and the fix; :mod:`~lightning_mpi_env.core.settings` says which variable is which kind.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, as_count, parse_seconds, parse_switch, shown, switch_word


def switch(env: Mapping[str, str], variable: str, *, default: bool) -> bool:
    """An on/off variable (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``); ``default`` when unset.

    Raises:
        SettingError: Naming the variable and its value.

    >>> switch({"LIGHTNING_MPI_ENV_DEBUG": "yes"}, "LIGHTNING_MPI_ENV_DEBUG", default=False)
    True
    """
    return parse_switch(
        env.get(variable, ""), variable=variable, default=default, hint=f"Unset {variable}, or set it to 1 or 0."
    )


def seconds(value: float | None, env: Mapping[str, str], variable: str, default: float) -> float:
    """A timeout: ``value`` if given, else ``variable`` of ``env``, else ``default`` (:func:`~.values.parse_seconds`).

    Raises:
        SettingError: If the value is not a positive number of seconds in plain digits, up to a week.

    >>> seconds(None, {"T": "2.5"}, "T", 120.0), seconds(None, {}, "T", 120.0)
    (2.5, 120.0)
    """
    if value is None and variable not in env:
        return default
    raw = value if value is not None else env[variable]
    hint = f"Set {variable} to a number of seconds, e.g. {default or 60:g}."
    return parse_seconds(raw, variable=variable, hint=hint)


def seconds_or_off(value: float | None, env: Mapping[str, str], variable: str, default: float) -> float:
    """:func:`seconds`, where ``0`` (or ``off``, any switch's off word) turns the feature off and reads as ``0.0``.

    >>> seconds_or_off(None, {"T": "off"}, "T", 300.0), seconds_or_off(None, {"T": "20"}, "T", 300.0)
    (0.0, 20.0)
    """
    raw = value if value is not None else env.get(variable)
    if isinstance(raw, str) and (switch_word(raw) is False or raw.strip() in ("0.0", "0.")):
        return 0.0
    if raw is not None and not isinstance(raw, str) and raw == 0:
        return 0.0
    return seconds(value, env, variable, default)


MAX_REQUEUES = 1_000_000
"""The largest ``LIGHTNING_MPI_ENV_MAX_REQUEUES`` taken."""

MAX_CHECKPOINT_EVERY = 1_000_000_000
"""The largest ``LIGHTNING_MPI_ENV_CHECKPOINT_EVERY`` taken (steps; more than any training run takes)."""


def count_or_off(
    env: Mapping[str, str], variable: str, default: int, *, high: int = MAX_REQUEUES, zero: str = "no limit"
) -> int:
    """A count from ``0`` (``zero``: what it means) to ``high``: ``variable`` of ``env``, else ``default``.

    Raises:
        SettingError: If the value is not a whole number of zero or more in plain digits, or is too large.

    >>> count_or_off({"N": "5"}, "N", 20), count_or_off({}, "N", 20)
    (5, 20)
    """
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


MAX_PATH = 4096
"""The longest folder taken (Linux's ``PATH_MAX``)."""


def folder(env: Mapping[str, str], variable: str) -> str:
    """A folder's path: at most :data:`MAX_PATH` characters, no control characters; empty when unset.

    It need not exist yet: its writer makes it.

    Raises:
        SettingError: Naming the variable and its value.

    >>> folder({"D": " /scratch/run "}, "D"), folder({}, "D")
    ('/scratch/run', '')
    """
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


__all__ = [
    "MAX_CHECKPOINT_EVERY",
    "MAX_PATH",
    "MAX_REQUEUES",
    "count_or_off",
    "folder",
    "seconds",
    "seconds_or_off",
    "switch",
]
