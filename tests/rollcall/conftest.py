"""Fixtures of the roll call's tests."""

from __future__ import annotations

import atexit
from collections.abc import Iterator

import pytest

from lightning_mpi_env.rollcall.stall_verdict import ask_on_plan
from lightning_mpi_env.rollcall.verdict import serve_verdict


@pytest.fixture(autouse=True)
def no_exit_handler_left() -> Iterator[None]:
    """Remove the exit handlers that a failed roll call run in the test's own process registers.

    Rank 0's handler serves the verdict for at least 3 s at exit and holds the store's server until then: left in
    place, a test worker keeps every such server to its end and then waits for each in turn at its exit.
    """
    yield
    atexit.unregister(serve_verdict)
    atexit.unregister(ask_on_plan)
