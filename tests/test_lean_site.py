"""The suite's lean interpreters (tests/jobs/site/sitecustomize.py): in effect in what the tests start, and harmless."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import LEAN_SITE

pytestmark = pytest.mark.skipif(bool(os.environ.get("LMPI_TEST_PLAIN_GC")), reason="left out: LMPI_TEST_PLAIN_GC")


def _python(code: str, pythonpath: str | None = None) -> str:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_python_the_tests_start_collects_less_often():
    # conftest.py put the folder on PYTHONPATH for the run; a child inherits it, as ranks under a launcher do.
    assert str(LEAN_SITE) in os.environ["PYTHONPATH"].split(os.pathsep)
    assert _python("import gc; print(gc.get_threshold())").strip() == "(100000, 50, 100)"


def test_the_freeze_comes_after_every_exit_handler_of_the_program():
    # A program's own atexit handlers still see a normal collector; only then is what is left frozen.
    out = _python(
        """
        import atexit, gc
        atexit.register(lambda: print("handler saw frozen:", gc.get_freeze_count()))
        """
    )
    assert out == "handler saw frozen: 0\n"


def test_a_sitecustomize_later_on_the_path_still_runs(tmp_path: Path):
    (tmp_path / "sitecustomize.py").write_text("print('the distribution\\'s own ran')\n")
    out = _python("import gc; print(gc.get_threshold())", pythonpath=os.pathsep.join([str(LEAN_SITE), str(tmp_path)]))
    assert out.splitlines() == ["the distribution's own ran", "(100000, 50, 100)"]


def test_below_python_3_12_each_fork_first_waits_out_a_thread_making_its_thread_state():
    # sys._current_frames() takes and releases the thread-state lock; its audit event shows it ran before the fork,
    # after every before-fork hook the program registered.
    out = _python(
        """
        import os, sys
        sys.addaudithook(lambda event, args: event == "sys._current_frames" and print("lock taken", flush=True))
        os.register_at_fork(before=lambda: print("program's hook", flush=True))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("forked")
        """
    )
    taken = ["lock taken"] if sys.version_info < (3, 12) else []
    assert out.splitlines() == ["program's hook", *taken, "forked"]
