"""This package's own settings, the ``LIGHTNING_MPI_ENV_*`` variables, parsed once into one typed record.

Each variable has one row in :data:`SETTINGS` and one parser per kind of value (an on/off switch, seconds, a
choice), so a variable is never read twice or two ways. Constructor arguments override the environment through
:meth:`Settings.with_arguments`. Standard library only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, resolve_switch, shown


class MixedImportMode(enum.Enum):
    """What a mixed import of both Lightning namespaces does (``LIGHTNING_MPI_ENV_MIXED_IMPORTS``)."""

    WARN = "warn"
    ERROR = "error"
    IGNORE = "ignore"


class Setting(NamedTuple):
    """One ``LIGHTNING_MPI_ENV_*`` variable."""

    field: str
    """The :class:`Settings` field it fills."""
    variable: str
    """The environment variable."""
    meaning: str
    """What it does, for the docs and for the error's hint."""


SETTINGS: tuple[Setting, ...] = (
    Setting("roll_call", "LIGHTNING_MPI_ENV_ROLL_CALL", "`0` skips the roll call before `init_process_group`"),
    Setting("rendezvous_timeout", "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT", "seconds the roll call waits (120)"),
    Setting("requeue", "LIGHTNING_MPI_ENV_REQUEUE", "`0` turns checkpoint-and-requeue off"),
    Setting("debug", "LIGHTNING_MPI_ENV_DEBUG", "`1` shows full tracebacks of this package's errors"),
    Setting("mixed_imports", "LIGHTNING_MPI_ENV_MIXED_IMPORTS", "`warn`, `error` or `ignore` on mixed imports"),
)
"""Every variable this package reads about itself; a test keeps the docs' table equal to these rows."""

VARIABLE = {row.field: row.variable for row in SETTINGS}
"""The variable of each :class:`Settings` field."""

DEFAULT_RENDEZVOUS_TIMEOUT = 120.0
"""Seconds the roll call waits for every rank unless told otherwise; separate from the collective timeout."""


@dataclass(frozen=True)
class Settings:
    """The ``LIGHTNING_MPI_ENV_*`` settings of one process, read once."""

    roll_call: bool = True
    """Run the roll call before ``init_process_group``."""
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT
    """Seconds the roll call waits for every rank."""
    requeue: bool = True
    """Checkpoint and requeue on the scheduler's warning signal (where a scheduler can requeue)."""
    debug: bool = False
    """Show full tracebacks of this package's errors."""
    mixed_imports: MixedImportMode = MixedImportMode.WARN
    """What a mixed import of both Lightning namespaces does."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Parse every ``LIGHTNING_MPI_ENV_*`` variable of ``env``; unset ones keep their defaults.

        Raises:
            SettingError: Naming the variable, its value and the values it takes.

        >>> Settings.from_env({"LIGHTNING_MPI_ENV_ROLL_CALL": "off", "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": "20"})
        Settings(roll_call=False, rendezvous_timeout=20.0, requeue=True, debug=False, mixed_imports=<MixedImportMode.WARN: 'warn'>)
        """  # noqa: E501
        return cls(
            roll_call=switch(env, VARIABLE["roll_call"], default=True),
            rendezvous_timeout=seconds(None, env, VARIABLE["rendezvous_timeout"], DEFAULT_RENDEZVOUS_TIMEOUT),
            requeue=switch(env, VARIABLE["requeue"], default=True),
            debug=switch(env, VARIABLE["debug"], default=False),
            mixed_imports=mixed_import_mode(env),
        )

    def with_arguments(self, **arguments: object) -> Settings:
        """These settings with the constructor arguments that were given (not ``None``) taking precedence.

        Raises:
            SettingError: For a timeout that is not a positive, finite number of seconds.
        """
        given = {name: value for name, value in arguments.items() if value is not None}
        if "rendezvous_timeout" in given:
            given["rendezvous_timeout"] = seconds(given["rendezvous_timeout"], {}, "rendezvous_timeout", 0.0)  # type: ignore[arg-type]
        unknown = set(given) - {field.name for field in fields(self)}
        if unknown:  # a programming error of this package, not a user's
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        return replace(self, **given)  # type: ignore[arg-type]


def switch(env: Mapping[str, str], variable: str, *, default: bool) -> bool:
    """An on/off variable (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``); ``default`` when unset.

    Raises:
        SettingError: Naming the variable and its value.

    >>> switch({"LIGHTNING_MPI_ENV_DEBUG": "yes"}, "LIGHTNING_MPI_ENV_DEBUG", default=False)
    True
    """
    if not env.get(variable, "").strip():
        return default
    return resolve_switch(None, env, variable, hint=f"Unset {variable}, or set it to 1 or 0.")


def seconds(value: float | None, env: Mapping[str, str], variable: str, default: float) -> float:
    """A positive, finite number of seconds: ``value`` if given, else ``variable`` of ``env``, else ``default``.

    Raises:
        SettingError: If the value is not a positive, finite number of seconds.

    >>> seconds(None, {"T": "2.5"}, "T", 120.0), seconds(None, {}, "T", 120.0)
    (2.5, 120.0)
    """
    if value is not None:
        raw = str(value)
    elif variable in env:
        raw = env[variable]
    else:
        return default
    try:
        parsed = float(raw)
    except ValueError:
        parsed = float("nan")
    if not parsed > 0 or parsed == float("inf"):
        raise SettingError(
            f"{variable}={shown(raw)} is not a positive, finite number of seconds.",
            f"Set {variable} to a number of seconds, e.g. {default or DEFAULT_RENDEZVOUS_TIMEOUT:g}.",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return parsed


def mixed_import_mode(env: Mapping[str, str]) -> MixedImportMode:
    """``LIGHTNING_MPI_ENV_MIXED_IMPORTS``: ``warn`` (also when unset), ``error`` or ``ignore``.

    Raises:
        SettingError: The variable holds anything else (a ``ValueError``).

    >>> mixed_import_mode({"LIGHTNING_MPI_ENV_MIXED_IMPORTS": "Error"})
    <MixedImportMode.ERROR: 'error'>
    """
    variable = VARIABLE["mixed_imports"]
    raw = env.get(variable, "")
    try:
        return MixedImportMode(raw.strip().lower() or MixedImportMode.WARN.value)
    except ValueError:
        allowed = ", ".join(mode.value for mode in MixedImportMode)
        raise SettingError(
            f"{variable}={shown(raw)} is not one of {allowed}.",
            f"Set {variable}=warn (the default), =error to fail on mixed Lightning imports, or =ignore to "
            "silence them.",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        ) from None


__all__ = [
    "DEFAULT_RENDEZVOUS_TIMEOUT",
    "SETTINGS",
    "VARIABLE",
    "MixedImportMode",
    "Setting",
    "Settings",
    "mixed_import_mode",
    "seconds",
    "switch",
]
