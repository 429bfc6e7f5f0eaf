"""Where a launcher line's options end and its program starts: one grammar, one row per launcher family."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from lightning_mpi_env.core.errors import MpiEnvError
from lightning_mpi_env.core.values import SHOWN_CHARACTERS, shown


class Arity(enum.Enum):
    """How many words an option takes after its name."""

    NONE = "a flag"
    ONE = "one value: attached with '=', or the next word"
    OPTIONAL = "a value attached with '=' only"
    TWO = "two values, the next two words (Open MPI's --mca NAME VALUE, --prepend-env NAME VALUE)"
    PAIR = "NAME=VALUE in one word, or NAME VALUE in two (Hydra's -genv)"


_WANTED = {Arity.NONE: 0, Arity.OPTIONAL: 0, Arity.ONE: 1, Arity.TWO: 2, Arity.PAIR: 1}


class Syntax(enum.Enum):
    """How a family's parser reads a word that starts with a dash."""

    GETOPT = "getopt_long(3): --name[=value] or an unambiguous prefix; one-letter options cluster (-lN2), '--' ends"
    PRRTE = "getopt_long after PRRTE's rewrites: a single-dash word of more than two characters is a long option"
    HYDRA = "Hydra's match_arg: any leading dashes, name=value, whole names only, no '--'"


class Problem(enum.Enum):
    """What is wrong with a line; each row words it (:attr:`Grammar.texts`)."""

    NO_PROGRAM = "no program after the options"
    SEVERAL = "several programs or components (':')"
    UNKNOWN = "an unknown option without its value attached"
    UNKNOWN_SHORT = "an unknown one-letter option"
    AMBIGUOUS = "a prefix of several options"
    NEEDS = "an option whose values the line lacks"
    NO_VALUE = "a flag given a value (where a row words it: srun takes the word whole)"
    NO_DASHES = "Hydra's '--'"


def arities(**names: str) -> dict[str, Arity]:
    """``NONE="a b"`` -> ``{"a": Arity.NONE, "b": Arity.NONE}``."""
    return {name: Arity[arity] for arity, words in names.items() for name in words.split()}


@dataclass(frozen=True, kw_only=True)
class Grammar:
    """One launcher family's row: how its parser reads a line, and how its errors say what is wrong."""

    name: str
    """For messages: ``srun``, ``Open MPI 5``."""
    options: Mapping[str, Arity]
    """Every option, by its name as the parser matches it (no dashes)."""
    shorts: Mapping[str, str]
    """Each one-letter option and the long option it is (its arity is the long one's)."""
    syntax: Syntax
    error: type[MpiEnvError]
    texts: Mapping[Problem, tuple[str, str]]
    """Each problem's message and hint, formatted with ``name``, ``word``, ``shown`` and the problem's own fields."""
    launcher: str | None = None
    renamed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Whole words renamed before parsing (Open MPI's ``--map-by`` is ``--mapby``)."""
    case_sensitive: bool = True

    @property
    def hydra(self) -> bool:
        """Hydra's syntax (any dashes, ``name=value``, whole names)."""
        return self.syntax is Syntax.HYDRA

    def fail(self, problem: Problem, word: str = "", **fields: str) -> MpiEnvError:
        """The error for ``problem`` at ``word`` (the option as the line spells it)."""
        text, hint = self.texts[problem]
        values = {"name": self.name, "word": word, "shown": shown(word), **fields}
        return self.error(
            text.format(**values),
            hint.format(**values),
            variable=word[:SHOWN_CHARACTERS] or None,
            value=":" if problem is Problem.SEVERAL else None,
            launcher=self.launcher,
        )


@dataclass(frozen=True)
class Option:
    """One option of the line, as its launcher reads it."""

    name: str
    """As the family's table names it (``np`` for ``-n``, ``exclude`` for ``-x``, ``hosts`` for ``--HOSTS``)."""
    spelled: str
    """As the line spells it, for messages (``-n``)."""
    values: tuple[str, ...]
    """Its values: none for a flag, two for ``--mca NAME VALUE``."""
    start: int
    """Index of its first word in the line."""
    stop: int
    """Index past its last word."""
    flags: str = ""
    """One-letter flags before it in its first word (``-l`` of ``-lx node1``): kept when the option is taken out."""

    @property
    def value(self) -> str | None:
        """Its first value; ``None`` for a flag or an optional value left out."""
        return self.values[0] if self.values else None


def parse_options(
    words: Sequence[str], grammar: Grammar, check: Callable[[Option], object] = lambda option: None
) -> tuple[list[Option], int]:
    """The options of ``words`` (after the launcher) and the index of the program's first word.

    An unknown option is taken only with its value attached (``--name=value``, skipped whole): without one, where the
    program starts is unknown. ``check`` sees each option as it is read, and may refuse it by raising.

    Raises:
        MpiEnvError: ``grammar.error``: an option unknown (and without ``=value``), ambiguous or missing its value;
            no program; or several programs (``:``).
    """
    options: list[Option] = []
    index = 1
    while index < len(words):
        word = words[index]
        if word == "--" and not grammar.hydra:  # the options end here (Hydra has no "--")
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        option = _option(words, index, grammar)
        if option is None:
            index += 1
            continue
        check(option)
        options.append(option)
        index = option.stop
    if index >= len(words):
        raise grammar.fail(Problem.NO_PROGRAM, line=shown(" ".join(words)), whole=repr(" ".join(words)))
    if ":" in words[index:]:
        raise grammar.fail(Problem.SEVERAL)
    return options, index


def _option(words: Sequence[str], index: int, grammar: Grammar) -> Option | None:
    """The option at ``words[index]``; ``None`` for an unknown one with its value attached (skipped whole)."""
    word = grammar.renamed.get(words[index], words[index])
    if grammar.hydra:
        spelled, equals, value = word.lstrip("-").partition("=")
        if not spelled:
            raise grammar.fail(Problem.NO_DASHES, word)
        name: str | None = spelled if grammar.case_sensitive else spelled.lower()
        name = name if name in grammar.options else None
    elif word.startswith("--") or (grammar.syntax is Syntax.PRRTE and len(word) > 2):
        spelled, equals, value = (word[2:] if grammar.syntax is Syntax.GETOPT else word.lstrip("-")).partition("=")
        name = _resolve(spelled, grammar, words[index])
    else:
        return _short(words, index, grammar, word)
    if name is None:
        if equals:
            return None
        raise grammar.fail(Problem.UNKNOWN, words[index])
    return _take(words, index, grammar, name, words[index], value if equals else None)


def _resolve(spelled: str, grammar: Grammar, word: str) -> str | None:
    """The long option ``spelled`` names: itself, or the one option it is a prefix of (getopt_long(3))."""
    if spelled in grammar.options:
        return spelled
    candidates = [name for name in grammar.options if name.startswith(spelled)] if spelled else []
    if len(candidates) > 1:
        listed = [f"--{name}" for name in candidates]
        raise grammar.fail(Problem.AMBIGUOUS, word, every=", ".join(listed), first=", ".join(listed[:5]))
    return candidates[0] if candidates else None


def _short(words: Sequence[str], index: int, grammar: Grammar, word: str) -> Option:
    """The one-letter options of ``word`` (``-l``, ``-N2``, ``-lN2``, ``-x node1``): the first that takes a value."""
    for position, letter in enumerate(word[1:], start=1):
        name = grammar.shorts.get(letter)
        if name is None:
            raise grammar.fail(Problem.UNKNOWN_SHORT, f"-{letter}", whole=shown(word))
        rest = word[position + 1 :]
        if grammar.options[name] is Arity.NONE and rest:
            continue
        flags = word[:position] if position > 1 else ""
        return _take(words, index, grammar, name, f"-{letter}", rest or None, flags)
    raise AssertionError("unreachable: an option word has a letter")


def _take(
    words: Sequence[str], index: int, grammar: Grammar, name: str, spelled: str, attached: str | None, flags: str = ""
) -> Option:
    """The option ``name`` at ``words[index]`` with the words its arity takes (``attached``: its ``=value``)."""
    arity = grammar.options[name]
    if arity is Arity.NONE and attached is not None and Problem.NO_VALUE in grammar.texts:
        raise grammar.fail(Problem.NO_VALUE, spelled, option=name, value=shown(attached))
    values = [] if attached is None else [attached]
    stop = index + 1
    while len(values) < _WANTED[arity] or (arity is Arity.PAIR and len(values) == 1 and "=" not in values[0]):
        if stop >= len(words):
            raise grammar.fail(Problem.NEEDS, spelled, arity=arity.value)
        values.append(words[stop])
        stop += 1
    return Option(name, spelled, tuple(values), index, stop, flags)
