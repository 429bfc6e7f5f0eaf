"""The one error type for layouts that cannot be trusted."""

from __future__ import annotations


class LayoutError(ValueError):
    """A rank layout that is malformed, incomplete, contradictory or stale.

    Every message names the variable, its value, the launcher it belongs to, and ends with a ``HINT:`` that says
    how to fix it.
    """


def layout_error(problem: str, hint: str) -> LayoutError:
    """Build a :class:`LayoutError` whose message ends with the fix.

    Args:
        problem: What is wrong, naming the variable, its value and the launcher.
        hint: The fix, one or two sentences.

    Returns:
        The error, ready to raise.

    >>> print(layout_error("OMPI_COMM_WORLD_RANK='x' is not an integer.", "Launch with mpirun."))
    OMPI_COMM_WORLD_RANK='x' is not an integer.
    HINT: Launch with mpirun.
    """
    return LayoutError(f"{problem}\nHINT: {hint}")


class LayoutWarning(UserWarning):
    """Something about the layout the user should hear about that does not stop the job."""
