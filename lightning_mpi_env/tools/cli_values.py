"""The types of the command line's arguments: each checks one value, and says what it must be."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from lightning_mpi_env.core.values import MAX_LOCAL_SIZE, as_count, shown
from lightning_mpi_env.supervise.policy import MAX_RESTARTS

MAX_SECONDS = 86_400
"""The most seconds an option takes (a day)."""


def positive(text: str) -> int:
    """A count of 1 or more."""
    number = as_count(text)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {shown(text)}")  # of at most 18 digits
    return number


def at_most(maximum: int, what: str) -> Callable[[str], int]:
    """A positive count of at most ``maximum`` (``what``: the limit, for the message)."""

    def check(text: str) -> int:
        number = positive(text)
        if number > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum} ({what}), got {shown(text)}")
        return number

    return check


def restarts_count(text: str) -> int:
    """A count from 0 to the most relaunches taken."""
    number = as_count(text)
    if number is None or number > MAX_RESTARTS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_RESTARTS}, got {shown(text)}")
    return number


NPROC_WORDS = ("gpu", "cpu", "auto")
"""What ``torchrun --nproc-per-node`` takes besides a count."""


def nproc(text: str) -> int | str:
    """What ``torchrun --nproc-per-node`` takes: a count of ranks on one node, or one of :data:`NPROC_WORDS`."""
    if text in NPROC_WORDS:
        return text
    number = as_count(text)
    if number is None or not 1 <= number <= MAX_LOCAL_SIZE:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer of at most {MAX_LOCAL_SIZE} (ranks on one node), or one of "
            f"{', '.join(NPROC_WORDS)}; got {shown(text)}"
        )
    return number


def positive_seconds(text: str) -> float:
    """Seconds above 0, at most :data:`MAX_SECONDS`."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, got {shown(text)} (at most {MAX_SECONDS})"
        )
    return seconds


def assignment(text: str) -> tuple[str, str]:
    """``NAME=VALUE``, the name an identifier."""
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE, got {shown(text)}")
    return name, value
