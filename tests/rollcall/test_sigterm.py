"""``SigtermStop.watch_workers``: a child ended by ``SIGTERM`` counts as the signal reaching this process, for real.

Real child processes and real signals in this process's main thread; the full jobs are in ``tests/lightning``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from lightning_mpi_env.rollcall.sigterm import SigtermStop, child_ended_by_sigterm

LIMIT = 60  # a child's start and end on a busy machine: only a hang takes longer


@pytest.fixture
def torch_like_handler():
    """A Python ``SIGCHLD`` handler in place, as torch's DataLoader puts in; the one before it put back after."""
    before = signal.getsignal(signal.SIGCHLD)
    calls: list[int] = []
    signal.signal(signal.SIGCHLD, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGCHLD, before)


@pytest.fixture
def torchs_check():
    """A ``SIGCHLD`` handler that raises as torch's does for a worker a signal ended (not reaped yet); calls counted."""
    before = signal.getsignal(signal.SIGCHLD)
    calls: list[int] = []

    def check(signum, frame):
        calls.append(signum)
        if child_ended_by_sigterm():
            raise RuntimeError("DataLoader worker (pid N) is killed by signal: Terminated.")

    signal.signal(signal.SIGCHLD, check)
    yield calls
    signal.signal(signal.SIGCHLD, before)


def child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def wait_for(done) -> None:
    """Until ``done()`` (a handler ran in this main thread: it runs between two of its bytecodes)."""
    deadline = time.monotonic() + LIMIT
    while not done():
        assert time.monotonic() < deadline, "the handler never ran"
        time.sleep(0.01)


def test_a_child_ended_by_sigterm_is_noted_and_left_to_its_owner(torch_like_handler):
    stop = SigtermStop(rank=0, world_size=2)
    noted = []
    stop.on_note = lambda: noted.append(True)
    torchs = signal.getsignal(signal.SIGCHLD)
    assert stop.watch_workers()
    process = child()
    process.terminate()
    wait_for(stop.noted)
    assert noted == [True]
    assert torch_like_handler == []  # torch's would have raised "is killed by signal: Terminated"
    assert process.wait(LIMIT) == -signal.SIGTERM  # WNOWAIT: its owner still reaps it
    stop.unwatch_workers()
    assert signal.getsignal(signal.SIGCHLD) is torchs


def test_between_steps_a_worker_s_end_runs_the_loop_s_stop_in_the_handler_once(torch_like_handler):
    stop = SigtermStop(rank=0, world_size=2)
    decided: list[bool] = []
    stop.between_steps = lambda: decided.append(stop.noted())  # the loop's stop check, as the callback sets it
    assert stop.watch_workers()
    process = child()
    process.terminate()
    wait_for(lambda: decided)
    assert decided == [True]  # run after the note, in the handler
    assert stop.between_steps is None  # once: a nested handler does not decide again
    stop.stop_between_steps()
    assert decided == [True]
    assert process.wait(LIMIT) == -signal.SIGTERM
    stop.unwatch_workers()


def test_once_the_signal_is_noted_no_worker_s_end_reaches_torchs_handler(torchs_check):
    # As when the rank's SIGTERM handler noted it, or a call of this handler run inside another: on_note's
    # signal.signal first runs the handlers pending, this one among them, before it swaps it for its own.
    stop = SigtermStop(rank=0, world_size=2)
    assert stop.watch_workers()
    stop.note()
    worker = child()
    worker.terminate()
    wait_for(child_ended_by_sigterm)
    signal.getsignal(signal.SIGCHLD)(signal.SIGCHLD, None)  # as Python runs it for the pending signal, now
    assert torchs_check == []  # torch's would have raised "is killed by signal: Terminated" in this main thread
    assert worker.wait(LIMIT) == -signal.SIGTERM
    stop.unwatch_workers()


def test_a_worker_ended_by_sigterm_after_this_handler_looked_and_before_torchs_did_is_the_signal(torchs_check):
    stop = SigtermStop(rank=0, world_size=2)
    worker = child()
    calls = torchs_check

    def later(signum, frame):  # torch's handler, run once a worker ended meanwhile
        if not calls:
            worker.terminate()
            wait_for(child_ended_by_sigterm)
        check(signum, frame)

    check = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, later)
    assert stop.watch_workers()
    decided: list[bool] = []
    stop.between_steps = lambda: decided.append(stop.noted())
    other = child()
    other.communicate(b"", timeout=LIMIT)  # status 0: this handler finds no end by SIGTERM, torch's then does
    wait_for(stop.noted)
    assert calls  # torch's looked, and raised: this handler took it as the signal
    assert stop.noted()
    assert decided == [True]
    assert worker.wait(LIMIT) == -signal.SIGTERM
    stop.unwatch_workers()


def test_the_loop_s_stop_run_inside_torchs_handler_raises_its_own_error(torchs_check):
    # The stop's StallError, or a collective's error, from a call of this handler run inside torch's: never taken for
    # torch's, though the signal is noted by then.
    stop = SigtermStop(rank=0, world_size=2)
    worker = child()

    def later(signum, frame):  # torch's handler, entered before a worker's end ran this one inside it
        worker.terminate()
        wait_for(child_ended_by_sigterm)
        check(signum, frame)

    def stop_fails() -> None:
        raise RuntimeError("the stop's own error")

    check = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, later)
    assert stop.watch_workers()
    stop.between_steps = stop_fails
    other = child()

    def end_and_wait() -> None:  # the error comes with the note, in the same handler's call
        other.communicate(b"", timeout=LIMIT)
        wait_for(stop.noted)

    with pytest.raises(RuntimeError, match="the stop's own error"):
        end_and_wait()
    assert stop.noted()
    assert worker.wait(LIMIT) == -signal.SIGTERM
    stop.unwatch_workers()


def test_a_signal_noted_before_the_loop_is_between_steps_runs_its_stop_as_it_gets_there():
    # The handler ran after the loop's check at the step's end and before the loop set its stop: nothing to run then.
    stop = SigtermStop(rank=0, world_size=2)
    stop.note()
    decided: list[bool] = []
    stop.wait_between_steps(lambda: decided.append(True))
    assert decided == [True]
    assert stop.between_steps is None  # once
    stop.wait_between_steps(None)  # at the next step
    assert decided == [True]


def test_without_a_signal_the_loop_s_stop_waits_for_one():
    stop = SigtermStop(rank=0, world_size=2)
    decided: list[bool] = []
    stop.wait_between_steps(check := lambda: decided.append(True))
    assert decided == []
    assert stop.between_steps is check


def test_any_other_end_goes_to_the_handler_before(torch_like_handler):
    stop = SigtermStop(rank=0, world_size=2)
    assert stop.watch_workers()
    exits = child()
    exits.communicate(b"", timeout=LIMIT)  # status 0
    wait_for(lambda: len(torch_like_handler) == 1)
    killed = child()
    killed.kill()  # SIGKILL, as the kernel's out-of-memory killer sends: torch's handler names it
    wait_for(lambda: len(torch_like_handler) == 2)
    assert killed.wait(LIMIT) == -signal.SIGKILL
    assert not stop.noted()
    assert not child_ended_by_sigterm()
    stop.unwatch_workers()


def test_it_goes_in_only_over_a_python_handler_once_and_comes_out_as_it_went_in(torch_like_handler):
    stop = SigtermStop(rank=0, world_size=2)
    torchs = signal.getsignal(signal.SIGCHLD)
    assert stop.watch_workers()
    assert not stop.watch_workers()  # once
    assert signal.getsignal(signal.SIGCHLD) is not torchs
    stop.unwatch_workers()
    assert signal.getsignal(signal.SIGCHLD) is torchs
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # no loader with workers yet: torch's is not in, nothing raises
    assert not stop.watch_workers()
    assert signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL
    signal.signal(signal.SIGCHLD, torchs)
    stop.note()  # the signal came: let_workers_end's handler follows, not this one
    assert not stop.watch_workers()
    assert signal.getsignal(signal.SIGCHLD) is torchs


def test_the_loop_is_on_its_way_to_wait_only_between_steps_with_the_signal_in_hand(torch_like_handler):
    # The watchdog's thread asks it before posting this rank's step (the agreement's hold).
    stop = SigtermStop(rank=0, world_size=2)
    assert not stop.coming()
    assert not stop.is_between_steps()
    stop.wait_between_steps(lambda: None)  # the loop waits for its next batch
    assert stop.is_between_steps()
    assert not stop.coming()  # no signal here: nothing will make the loop wait
    process = child()
    process.terminate()  # a loader worker ended by the scheduler's SIGTERM, not reaped yet
    wait_for(lambda: torch_like_handler)  # its SIGCHLD went to the handler in place, torch's
    assert child_ended_by_sigterm()
    assert not stop.coming()  # no handler of this package in place: nothing would run the stop
    assert stop.watch_workers()
    assert stop.coming()  # its handler would (the signal it ran for is gone: it does not run now)
    stop.unwatch_workers()
    stop.wait_between_steps(None)  # the batch came: the loop is at a step
    assert not stop.coming()
    assert not stop.is_between_steps()
    assert process.wait(LIMIT) == -signal.SIGTERM
    stop.wait_between_steps(lambda: None)
    assert not stop.coming()
    stop.note()  # its own SIGTERM, noted by its handler
    assert stop.coming()
