"""One step under the supervisor, with real child processes: its status, srun's death lines, and the grace."""

from __future__ import annotations

import sys

from lightning_mpi_env.supervise import step
from lightning_mpi_env.supervise.step import recorded, run_step


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_status_and_the_end_of_stderr_come_back_and_the_output_is_passed_on(tmp_path, capfd):
    code = "import sys; sys.stderr.write('srun: error: node2: task 3: Killed\\nsomething else\\n'); sys.exit(3)"
    ticks: list[None] = []
    end = run_step(_python(code), {}, str(tmp_path), tick=lambda: ticks.append(None))
    assert end.status == 3
    assert end.errors == "srun: error: node2: task 3: Killed\nsomething else\n"
    assert not end.abandoned
    assert ticks  # at least once, after the end
    assert "something else" in capfd.readouterr().err


def test_only_the_end_of_a_long_stderr_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(step, "MAX_ERRORS", 1000)
    code = "import sys; [sys.stderr.write(f'line {n:06d}\\n') for n in range(5000)]"
    end = run_step(_python(code), {}, str(tmp_path))
    assert len(end.errors) == 1000
    assert end.errors.endswith("line 004999\n")


def test_a_step_killed_by_a_signal_has_status_128_plus_it(tmp_path):
    end = run_step(_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), {}, str(tmp_path))
    assert end.status == 137


def test_a_step_that_goes_on_after_its_failure_record_is_ended_after_the_grace(tmp_path):
    # Its record is written, and it hangs (as srun does when the node that should end its tasks hangs).
    code = f"import time; open({str(tmp_path / 'failure-rank0-1.json')!r}, 'w').close(); time.sleep(600)"
    end = run_step(_python(code), {}, str(tmp_path), grace=0.5)
    assert end.abandoned
    assert end.status == 128 + 9


def test_only_a_record_s_name_counts_as_recorded(tmp_path):
    assert not recorded(str(tmp_path / "absent"))
    (tmp_path / "first-step.json").write_text("{}")
    (tmp_path / ".failure-tmp123").write_text("")
    assert not recorded(str(tmp_path))
    (tmp_path / "failure-rank3-4242.json").write_text("")
    assert recorded(str(tmp_path))
