"""Store requests with a deadline: a frozen store host must not freeze the thread that would name it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, cast

_T = TypeVar("_T")


class Unanswered(Exception):
    """A store request that did not return within its deadline."""


class Deadline:
    """Runs one interval's store requests on a thread of its own, and waits for them at most a deadline.

    A request to a store whose host is frozen (rank 0 under ``SIGSTOP``, a node swapping) never returns: the
    client's timeout does not cover a server that accepted the connection and stopped answering.
    """

    def __init__(self, name: str = "lightning-mpi-env-watchdog-request") -> None:
        """``name``: its threads' (each request's thread, while one runs)."""
        self._name = name
        self._runner: threading.Thread | None = None
        self._outcome: list[tuple[bool, object]] = []

    def run(self, work: Callable[[], _T], seconds: float) -> _T:
        """``work()``'s value (or exception), on a thread of its own; :class:`Unanswered` after ``seconds``.

        While an earlier call's work is unanswered, ``work`` is not started: this call waits for that one instead.
        """
        if self._runner is None:
            outcome: list[tuple[bool, object]] = []
            self._outcome = outcome

            def target() -> None:
                try:
                    outcome.append((True, work()))
                except BaseException as error:  # handed to the caller, which decides
                    outcome.append((False, error))

            self._runner = threading.Thread(target=target, name=self._name, daemon=True)
            self._runner.start()
        self._runner.join(seconds)
        if self._runner.is_alive():
            raise Unanswered(f"no answer in {seconds:g} s")
        self._runner = None
        ((returned, value),) = self._outcome
        if not returned:
            assert isinstance(value, BaseException)
            raise value
        return cast(_T, value)  # what work returned
