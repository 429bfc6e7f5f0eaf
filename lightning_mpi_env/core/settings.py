"""This package's own settings, the ``LIGHTNING_MPI_ENV_*`` variables: one row and one reader each, read once."""

from __future__ import annotations

import difflib
import enum
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

from lightning_mpi_env.core.errors import Explained, SettingError
from lightning_mpi_env.core.launchers import detect_launcher
from lightning_mpi_env.core.network import apply_host_template, contradicting_ifname
from lightning_mpi_env.core.ports import host_syntax_problem
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import (
    MAX_CHECKPOINT_EVERY,
    SHOWN_CHARACTERS,
    SHOWN_NAME_CHARACTERS,
    as_count,
    count_or_off,
    factor,
    folder,
    seconds,
    seconds_or_off,
    shown,
    shown_name,
    switch,
)


class MixedImportMode(enum.Enum):
    """What a mixed import of both Lightning namespaces does (``LIGHTNING_MPI_ENV_MIXED_IMPORTS``)."""

    WARN = "warn"
    ERROR = "error"
    IGNORE = "ignore"


class Setting(NamedTuple):
    """One ``LIGHTNING_MPI_ENV_*`` variable."""

    field: str
    variable: str
    meaning: str
    """What it does, for the docs and for the error's hint."""


SETTINGS: tuple[Setting, ...] = (
    Setting("roll_call", "LIGHTNING_MPI_ENV_ROLL_CALL", "`0` skips the roll call before `init_process_group`"),
    Setting("rendezvous_timeout", "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT", "seconds the roll call waits for every rank"),
    Setting("requeue", "LIGHTNING_MPI_ENV_REQUEUE", "`0` turns checkpoint-and-requeue off"),
    Setting(
        "stall_timeout",
        "LIGHTNING_MPI_ENV_STALL_TIMEOUT",
        "seconds without progress, ranks not level, before the stall watchdog ends the job (the hard timeout); "
        "`0`: no watchdog",
    ),
    Setting(
        "stall_soft_timeout",
        "LIGHTNING_MPI_ENV_STALL_SOFT_TIMEOUT",
        "seconds without progress, ranks not level, before rank 0 reports the stall and the job goes on; `0`: no "
        "report; ignored unless below the hard timeout",
    ),
    Setting("stragglers", "LIGHTNING_MPI_ENV_STRAGGLERS", "`0` turns the straggler watch off"),
    Setting(
        "straggler_factor",
        "LIGHTNING_MPI_ENV_STRAGGLER_FACTOR",
        "how many times the median of all ranks a rank's own work a step must take, over the window, to be named",
    ),
    Setting(
        "straggler_window",
        "LIGHTNING_MPI_ENV_STRAGGLER_WINDOW",
        "training steps over which each rank's work a step is taken (their median); `0`: no straggler watch",
    ),
    Setting(
        "max_requeues",
        "LIGHTNING_MPI_ENV_MAX_REQUEUES",
        "the most requeues of one job (its HPC checkpoints count them); `0`: no limit",
    ),
    Setting("debug", "LIGHTNING_MPI_ENV_DEBUG", "`1` shows full tracebacks of this package's errors"),
    Setting("mixed_imports", "LIGHTNING_MPI_ENV_MIXED_IMPORTS", "`warn`, `error` or `ignore` on mixed imports"),
    Setting(
        "main_host",
        "LIGHTNING_MPI_ENV_MAIN_HOST",
        "the main host's name on the fabric, from the host list's first host: `{host}i` (JSC's InfiniBand names)",
    ),
    Setting(
        "ifname",
        "LIGHTNING_MPI_ENV_IFNAME",
        "the fabric's interface (`ib0`, `hsn0`): exported as `GLOO_SOCKET_IFNAME` and `NCCL_SOCKET_IFNAME`",
    ),
    Setting(
        "state_dir",
        "LIGHTNING_MPI_ENV_STATE_DIR",
        "the folder where the roll call and the stall watchdog write a failure record when they end the job, and "
        "rank 0 of a Trainer `first-step.json` after its first batch (read by a supervisor that relaunches the "
        "step); unset: none is written",
    ),
    Setting(
        "checkpoint_every",
        "LIGHTNING_MPI_ENV_CHECKPOINT_EVERY",
        "training steps between periodic HPC checkpoints of a Trainer job under a scheduler, the job's newest 2 "
        "kept (for a supervisor that relaunches the step); `0`: none",
    ),
)
"""Every variable this package reads about itself; a test keeps the docs' table equal to these rows."""

VARIABLE = {row.field: row.variable for row in SETTINGS}

PREFIX = "LIGHTNING_MPI_ENV_"
"""The prefix of every setting: another variable under it is a typo, warned about (:func:`unknown_settings`)."""
REPLACES = "LIGHTNING_MPI_ENV_REPLACES"  # no setting: restartable's word to a replacement (recovery/replacement.py)

DEFAULT_RENDEZVOUS_TIMEOUT = 120.0
"""Seconds the roll call waits for every rank unless told otherwise; separate from the collective timeout."""

DEFAULT_MAX_REQUEUES = 20
"""Weeks of 24-hour slots, yet bounded for a job warned again right after each restart."""

DEFAULT_CHECKPOINT_EVERY = 0
"""None unless asked: each stops every rank for a whole save, and only ``lightning-mpi-env run`` reads them."""

DEFAULT_STALL_TIMEOUT = 300.0
"""Longer than a slow batch, well inside torch's collective timeouts (which name no rank)."""

DEFAULT_STALL_SOFT_TIMEOUT = 60.0
"""A report ends nothing, so it comes early: a fifth of the hard timeout."""

DEFAULT_STRAGGLER_FACTOR, DEFAULT_STRAGGLER_WINDOW = 1.5, 20
"""Below x1.5 the ranks' own noise names healthy ranks; in 20 steps one slow step (a save, a collection) moves no
median."""

OFF = {"stall_timeout": "no watchdog", "stall_soft_timeout": "no report"}
"""What ``0`` or ``off`` does for each timeout that takes them; its error for any other value says so."""


@dataclass(frozen=True)
class Settings:
    """The ``LIGHTNING_MPI_ENV_*`` settings of one process, read once; :data:`SETTINGS` says what each field does."""

    roll_call: bool = True
    rendezvous_timeout: float = DEFAULT_RENDEZVOUS_TIMEOUT
    requeue: bool = True
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    stall_soft_timeout: float = DEFAULT_STALL_SOFT_TIMEOUT
    stragglers: bool = True
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR
    straggler_window: int = DEFAULT_STRAGGLER_WINDOW
    max_requeues: int = DEFAULT_MAX_REQUEUES
    debug: bool = False
    mixed_imports: MixedImportMode = MixedImportMode.WARN
    main_host: str = ""
    ifname: str = ""
    state_dir: str = ""
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Parse every ``LIGHTNING_MPI_ENV_*`` variable of ``env`` (unset: default), or a :class:`SettingError`."""
        warn_unknown_settings(env)
        return cls(**{field: read(env) for field, read in _READERS.items()})  # type: ignore[arg-type]

    def with_arguments(self, **arguments: object) -> Settings:
        """These settings with the constructor arguments that were given (not ``None``) taking precedence."""
        given = {name: value for name, value in arguments.items() if value is not None}
        for name, off in OFF.items():
            if name in given:
                given[name] = seconds_or_off(given[name], {}, name, 0.0, off=off)  # type: ignore[arg-type]
        if "rendezvous_timeout" in given:
            given["rendezvous_timeout"] = seconds(given["rendezvous_timeout"], {}, "rendezvous_timeout", 0.0)  # type: ignore[arg-type]
        unknown = set(given) - {field.name for field in fields(self)}
        if unknown:  # a programming error of this package, not a user's
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        return replace(self, **given)  # type: ignore[arg-type]


def setting_errors(env: Mapping[str, str]) -> list[SettingError]:
    """Every setting of ``env`` that :meth:`Settings.from_env` refuses, each read by its one reader (``doctor``)."""
    errors = []
    for read in _READERS.values():
        try:
            read(env)
        except SettingError as error:
            errors.append(error)
    return errors


class UnknownSettingWarning(Explained, UserWarning):
    """A ``LIGHTNING_MPI_ENV_*`` variable that is no setting of this package (a typo?), and is ignored."""

    separator = " "


def unknown_settings(env: Mapping[str, str]) -> list[UnknownSettingWarning]:
    """A warning for each name of ``env`` under :data:`PREFIX`, in any case, not in :data:`SETTINGS`, with the nearest.

    A setting's name in the wrong case (``lightning_mpi_env_stall_timeout``) is unknown too: the environment's names
    are case-sensitive, so it would be ignored; the warning names the setting it spells.
    """
    known, found = list(VARIABLE.values()), []
    for name in sorted(env):
        if name not in (*known, REPLACES) and name.upper().startswith(PREFIX):
            near = _nearest_setting(name)
            case = " (the names of settings are upper case)" if near == name.upper() else ""
            found.append(
                UnknownSettingWarning(
                    f"{shown_name(name)} is not a setting of this package and is ignored"
                    + (f": did you mean {near}?{case}" if near else "."),
                    f"Rename it to {near}." if near else f"Unset it; the settings are {', '.join(known)}.",
                    variable=name[:SHOWN_NAME_CHARACTERS],
                    value=env[name][:SHOWN_CHARACTERS],
                )
            )
    return found


def _nearest_setting(name: str) -> str | None:
    """The setting ``name`` spells in another case, else the closest one by :mod:`difflib`, else ``None``."""
    folded = name.upper()
    if folded in VARIABLE.values():
        return folded
    if len(name) > SHOWN_NAME_CHARACTERS:  # difflib's time goes with the product of the lengths
        return None
    # Compared after the prefix they share, in one case.
    suffixes = [variable[len(PREFIX) :] for variable in VARIABLE.values()]
    near = difflib.get_close_matches(folded[len(PREFIX) :], suffixes, n=1)
    return PREFIX + near[0] if near else None


_WARNED: set[str] = set()
"""The unknown names warned about in this process: each once."""

WARNED_FROM = "<environment>"
"""Where the warning about an unknown name says it comes from: the environment, no line of this package's or
Lightning's code (a ``stacklevel`` cannot reach the user's line through Lightning's frames)."""


def warn_unknown_settings(env: Mapping[str, str]) -> None:
    """Warn (:class:`UnknownSettingWarning`) about each unknown ``LIGHTNING_MPI_ENV_*`` name: once per job.

    Every rank inherits the same environment, so only the process that speaks for the job warns
    (:func:`speaks_for_the_job`), each name once. The line reads ``<environment>:0: UnknownSettingWarning: ...``
    whatever ``warnings.formatwarning`` is in place; the filters apply as to any warning.
    """
    if not speaks_for_the_job(env):
        return
    for warning in unknown_settings(env):
        if warning.variable not in _WARNED:
            _WARNED.add(str(warning.variable))
            _warn(warning)


def speaks_for_the_job(env: Mapping[str, str]) -> bool:
    """Whether this process is rank 0 of its job, or one whose rank no variable gives (a single process).

    The rank is the launcher row's (:func:`~.core.launchers.detect_launcher`), else torch's ``RANK``; a process that
    Lightning started beside the launcher's on a node has a ``LOCAL_RANK`` above 0 and does not speak either.
    """
    launcher = detect_launcher(env)
    for variable in (launcher.rank if launcher is not None else TORCH.rank, TORCH.local_rank):
        count = as_count(env.get(variable, "").strip())
        if count is not None and count > 0:
            return False
    return True


def _warn(warning: UnknownSettingWarning) -> None:
    category = type(warning)
    named = f"{category.__name__}: "
    # Lightning's formatwarning leaves the class out for a file whose absolute path holds "lightning" (the working
    # folder's may): then the message names it, so that the line reads as the docs quote it either way.
    if named not in warnings.formatwarning(warning, category, WARNED_FROM, 0, ""):
        fields = {"variable": warning.variable, "value": warning.value}
        warning = category(named + warning.problem, warning.hint, **fields)
    warnings.warn_explicit(warning, category, WARNED_FROM, 0, module=__name__)


def mixed_import_mode(env: Mapping[str, str]) -> MixedImportMode:
    """``LIGHTNING_MPI_ENV_MIXED_IMPORTS``: ``warn`` (also when unset), ``error`` or ``ignore``; else a SettingError.

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


_INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux: at most 15 characters (IFNAMSIZ - 1)
_HOST_TEMPLATE = re.compile(r"^[A-Za-z0-9._-]*\{host\}[A-Za-z0-9._-]*$")


_HOST_EXAMPLE = (
    "the fabric's name of a host, e.g. `{host}i` (JSC: `jwb0001` -> `jwb0001i`) or `{host}-ib`, or unset it."
)

SAMPLE_HOST = "a"
"""The shortest host name: a template that makes no host name of it makes none of any host (the launch's check)."""


def host_template(env: Mapping[str, str]) -> str:
    """``LIGHTNING_MPI_ENV_MAIN_HOST``: a host name around one ``{host}``, or empty when unset.

    The launch checks the main host's name the template gives (:func:`~.core.ports.host_syntax_problem`); a template
    that gives no host name whatever the host (``-{host}``, ``{host}..ib``) is refused here, where ``doctor`` reads it.
    """
    template = _word(
        env,
        "main_host",
        _HOST_TEMPLATE,
        "a host name template: it needs `{host}` once, with letters, digits, dots, dashes or underscores around it",
        _HOST_EXAMPLE,
    )
    sample = apply_host_template(template, SAMPLE_HOST)
    problem = host_syntax_problem(sample) if template else None
    if problem is not None:
        variable = VARIABLE["main_host"]
        raise SettingError(
            f"{variable}={shown(template)} is not a host name template"
            + f" that gives a host name: host {SAMPLE_HOST} becomes {shown(sample)}, and {problem}.",
            f"Set {variable} to {_HOST_EXAMPLE}",
            variable=variable,
            value=template[:SHOWN_CHARACTERS],
        )
    return template


def interface_name(env: Mapping[str, str]) -> str:
    """``LIGHTNING_MPI_ENV_IFNAME``: one interface's name (lists go to gloo and NCCL directly), or empty when unset.

    Refused too where ``GLOO_SOCKET_IFNAME`` or ``NCCL_SOCKET_IFNAME`` names another interface (NCCL reads ``=ib0``
    as exactly ib0): the launch would export one and find the other.
    """
    ifname = _word(
        env,
        "ifname",
        _INTERFACE_NAME,
        "the name of one network interface (at most 15 letters, digits or `_.:@-`)",
        "one interface such as ib0 or hsn0 (`ip -brief addr` lists them); for lists or prefixes, set "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME yourself.",
    )
    contradiction = contradicting_ifname(ifname, env, VARIABLE["ifname"])
    if contradiction is not None:
        raise contradiction
    return ifname


def _word(env: Mapping[str, str], field: str, form: re.Pattern[str], what: str, example: str) -> str:
    """The setting ``field`` of ``env`` when it has the ``form``; empty when unset; else a :class:`SettingError`."""
    variable = VARIABLE[field]
    raw = env.get(variable, "").strip()
    if raw and not form.match(raw):
        raise SettingError(
            f"{variable}={shown(raw)} is not {what}.",
            f"Set {variable} to {example}",
            variable=variable,
            value=raw[:SHOWN_CHARACTERS],
        )
    return raw


_READERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    "roll_call": lambda env: switch(env, VARIABLE["roll_call"], default=True),
    "rendezvous_timeout": lambda env: seconds(None, env, VARIABLE["rendezvous_timeout"], DEFAULT_RENDEZVOUS_TIMEOUT),
    "requeue": lambda env: switch(env, VARIABLE["requeue"], default=True),
    "stall_timeout": lambda env: seconds_or_off(
        None, env, VARIABLE["stall_timeout"], DEFAULT_STALL_TIMEOUT, off=OFF["stall_timeout"]
    ),
    "stall_soft_timeout": lambda env: seconds_or_off(
        None, env, VARIABLE["stall_soft_timeout"], DEFAULT_STALL_SOFT_TIMEOUT, off=OFF["stall_soft_timeout"]
    ),
    "stragglers": lambda env: switch(env, VARIABLE["stragglers"], default=True),
    "straggler_factor": lambda env: factor(env, VARIABLE["straggler_factor"], DEFAULT_STRAGGLER_FACTOR),
    "straggler_window": lambda env: count_or_off(
        env, VARIABLE["straggler_window"], DEFAULT_STRAGGLER_WINDOW, high=10_000, zero="no straggler watch"
    ),
    "max_requeues": lambda env: count_or_off(env, VARIABLE["max_requeues"], DEFAULT_MAX_REQUEUES),
    "debug": lambda env: switch(env, VARIABLE["debug"], default=False),
    "mixed_imports": mixed_import_mode,
    "main_host": host_template,
    "ifname": interface_name,
    "state_dir": lambda env: folder(env, VARIABLE["state_dir"]),
    "checkpoint_every": lambda env: count_or_off(
        env, VARIABLE["checkpoint_every"], DEFAULT_CHECKPOINT_EVERY, high=MAX_CHECKPOINT_EVERY, zero="none"
    ),
}
"""The one reader of each :class:`Settings` field, for :meth:`Settings.from_env` and :func:`setting_errors`."""
