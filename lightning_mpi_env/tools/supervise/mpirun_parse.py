"""Where an ``mpirun``/``mpiexec`` line's options end and its program starts, read by its family's own rules.

The rules are :mod:`.mpirun_options`'s; each option comes back with the words it took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.errors import MpirunLineError
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, shown
from lightning_mpi_env.tools.supervise.mpirun_options import Arity, Family, Role


@dataclass(frozen=True)
class Option:
    """One option of the line, as its launcher reads it."""

    name: str
    """As the family's table names it (``np`` for ``-n``, ``mapby`` for ``--map-by``, ``hosts`` for ``--HOSTS``)."""
    spelled: str
    """As the line spells it, for messages (``-n``)."""
    values: tuple[str, ...]
    """Its values: none for a flag, two for ``--mca NAME VALUE``."""
    start: int
    """Index of its first word in the line."""
    stop: int
    """Index past its last word."""


def parse_options(words: Sequence[str], family: Family) -> tuple[list[Option], int]:
    """The options of ``words`` (after the launcher) and the index of the program's first word.

    Raises:
        MpirunLineError: An option unknown (and without ``=value``), ambiguous, missing its value or refused (a
            rank file, an application file); no program; or several programs (``:``).
    """
    options: list[Option] = []
    index = 1
    while index < len(words):
        word = words[index]
        if not family.hydra and word == "--":  # Open MPI: the options end here (Hydra has no "--")
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        option = _hydra(words, index, family) if family.hydra else _open_mpi(words, index, family)
        if option is not None:
            _refuse(option, family)
            options.append(option)
            index = option.stop
        else:
            index += 1
    if index >= len(words):
        raise MpirunLineError(
            f"The {family.name} line {shown(' '.join(words))} names no program to run.",
            "End it with the program: mpirun [OPTIONS] python train.py.",
            launcher=family.name,
        )
    if ":" in words[index:]:
        raise MpirunLineError(
            f"The {family.name} line runs several programs (separated by ':', MPMD), which the supervisor cannot "
            "relaunch.",
            "Run one program per line, or run this step without the supervisor.",
            value=":",
            launcher=family.name,
        )
    return options, index


def _open_mpi(words: Sequence[str], index: int, family: Family) -> Option | None:
    """The option at ``words[index]`` as ``getopt_long`` reads it, after PRRTE's rewrites (:mod:`.mpirun_options`)."""
    word = family.renamed.get(words[index], words[index])
    if not word.startswith("--") and len(word) == 2:
        name = family.shorts.get(word[1])
        if name is None:
            raise _unknown(family, word, f"-{word[1]} is not one of Open MPI's one-letter options")
        return _take(words, index, family, name, word, None)
    spelled, equals, value = word.lstrip("-").partition("=")
    name = _resolve(spelled, family, words[index])
    if name is None:
        if equals:
            return None  # unknown, its value attached: one word, skipped whole
        raise _unknown(family, words[index], "it is not in the table the supervisor reads Open MPI 5 lines by")
    return _take(words, index, family, name, words[index], value if equals else None)


def _resolve(spelled: str, family: Family, word: str) -> str | None:
    """The long option ``spelled`` names: itself, or the one option it is a prefix of (``getopt_long``)."""
    if spelled in family.options:
        return spelled
    candidates = [name for name in family.options if name.startswith(spelled)] if spelled else []
    if len(candidates) > 1:
        raise MpirunLineError(
            f"{family.name} option {shown(word)} is ambiguous: it abbreviates "
            f"{', '.join('--' + name for name in candidates[:5])}.",
            "Spell the option out.",
            variable=word[:SHOWN_CHARACTERS],
            launcher=family.name,
        )
    return candidates[0] if candidates else None


def _hydra(words: Sequence[str], index: int, family: Family) -> Option | None:
    """The option at ``words[index]`` as Hydra's ``match_arg`` reads it: any dashes, ``name=value``, exact names."""
    spelled, equals, value = words[index].lstrip("-").partition("=")
    if not spelled:
        raise MpirunLineError(
            f"{family.name} has no {shown(words[index])} option (Hydra reads '--' as an unknown one).",
            "Leave it out: the program starts at the first word that is not an option.",
            variable=words[index][:SHOWN_CHARACTERS],
            launcher=family.name,
        )
    name = spelled if family.case_sensitive else spelled.lower()
    if name not in family.options:
        if equals:
            return None  # Hydra takes "name=value" as the option and one value: one word, skipped whole
        raise _unknown(family, words[index], f"it is not in the table the supervisor reads {family.name} lines by")
    if equals and family.options[name] is Arity.NONE:
        raise MpirunLineError(
            f"{family.name} option {shown(words[index])} takes no value: Hydra would run {shown(value)} as the "
            "program.",
            f"Write -{name} alone.",
            variable=words[index][:SHOWN_CHARACTERS],
            launcher=family.name,
        )
    return _take(words, index, family, name, words[index], value if equals else None)


def _take(words: Sequence[str], index: int, family: Family, name: str, spelled: str, attached: str | None) -> Option:
    """The option ``name`` at ``words[index]`` with the words its arity takes (``attached``: its ``=value``)."""
    arity = family.options[name]
    if arity is Arity.NONE and attached is not None:
        raise MpirunLineError(
            f"{family.name} option {shown(spelled)} takes no value.",
            f"Write --{name} alone.",
            variable=spelled[:SHOWN_CHARACTERS],
            launcher=family.name,
        )
    values = [] if attached is None else [attached]
    wanted = {Arity.NONE: 0, Arity.OPTIONAL: 0, Arity.ONE: 1, Arity.TWO: 2, Arity.PAIR: 1}[arity]
    stop = index + 1
    while len(values) < wanted or (arity is Arity.PAIR and len(values) == 1 and "=" not in values[0]):
        if stop >= len(words):
            raise MpirunLineError(
                f"{family.name} option {shown(spelled)} needs {arity.value}, and the line ends there.",
                f"Give it its value(s), then the program: {spelled} VALUE python train.py.",
                variable=spelled[:SHOWN_CHARACTERS],
                launcher=family.name,
            )
        values.append(words[stop])
        stop += 1
    return Option(name, spelled, tuple(values), index, stop)


def _refuse(option: Option, family: Family) -> None:
    """Refuse an option that fixes where ranks run, or that makes the line several programs."""
    if family.roles.get(option.name) is Role.REFUSED:
        raise MpirunLineError(
            f"{family.name} option {option.spelled} cannot be relaunched on other hosts: "
            f"{family.refused_hint.get(option.name, 'it fixes where the ranks run')}.",
            "Take it out of the line, or run this step without the supervisor.",
            variable=option.spelled,
            launcher=family.name,
        )


def _unknown(family: Family, word: str, why: str) -> MpirunLineError:
    return MpirunLineError(
        f"{family.name} option {shown(word)} is unknown to the supervisor ({why}), so it cannot tell whether the "
        "next word is its value or the program.",
        "Write it with its value attached (--name=VALUE), or report the option so that it joins the table.",
        variable=word[:SHOWN_CHARACTERS],
        launcher=family.name,
    )


__all__ = ["Option", "parse_options"]
