"""The stall watchdog's two thresholds on a real mpirun job on two simulated nodes: the soft one reports, the job
goes on; the hard one ends it (``test_fail_fast.py``). The jobs and the fault injector are ``test_fail_fast.py``'s.
"""

import pytest

from tests.rollcall.test_fail_fast import JOB_TIMEOUT, _command, _results, _run

SOFT_TIMEOUT = 10
"""Ten of the watchdog's report intervals (1 s): a healthy rank behind the others is seen to move again within one or
two, however loaded the machine, so only rank 0's work alone is reported."""
WORK_ALONE = SOFT_TIMEOUT + 10
"""Seconds rank 0 works alone in one training step (sampling, an evaluation of its own) while the others wait for it
in backward: ten report intervals past the soft timeout, for rank 0's watchdog to see it; far inside the hard one."""
STEP_SECONDS = 0.5
STEPS = 24
"""Training steps of ``STEP_SECONDS`` each (``--samples`` is 16 per step: 4 ranks, batches of 4). After rank 0's work
at step 2, ten seconds of them: ten report intervals for rank 0's watchdog to see the ranks move again."""


@pytest.mark.mpi
def test_rank_zero_working_alone_past_the_soft_timeout_is_reported_and_the_job_finishes(cluster):
    # On the ddp_mpi path; the plugin's watchdog is the same thread, whose hard timeout test_fail_fast.py meets on
    # both paths, and whose soft one test_watchdog.py meets over a real store.
    job = _run(
        cluster,
        _command(
            "trainer-ddp_mpi",
            *("--samples", str(16 * STEPS), "--step-seconds", str(STEP_SECONDS)),
            fault=["--stall", f"2:{WORK_ALONE}"],
            rank=0,
        ),
        limit=JOB_TIMEOUT + WORK_ALONE + STEPS * STEP_SECONDS,
        LIGHTNING_MPI_ENV_STALL_SOFT_TIMEOUT=str(SOFT_TIMEOUT),
        LIGHTNING_MPI_ENV_STALL_TIMEOUT="120",
    )
    assert job.returncode == 0, job.tail()
    assert len(_results(job)) == 4, job.tail()  # every rank finished its fit
    assert f"STALL: rank 0 works alone for {WORK_ALONE} s at step 2\n" in job.output, job.tail()
    reports = [line for line in job.stderr if line.startswith("lightning-mpi-env: stall watchdog: Rank 0 stalled: ")]
    assert len(reports) == 1, job.tail()  # once per stall, by rank 0's watchdog
    (report,) = reports
    assert f"no rank made progress for {SOFT_TIMEOUT} s while ranks 1-3 wait for it at step 2" in report, job.tail()
    assert "rank 0 on 127.0.0.2 at step 2 (in its training step), alive, main thread at " in report, job.tail()
    assert "tamper.py:" in report, job.tail()  # where rank 0 works: stall_here()
    assert "The job goes on; it ends if no rank makes progress for 120 s" in report, job.tail()
    over = [line for line in job.stderr if "stall watchdog: the stall reported " in line]
    assert len(over) == 1, job.tail()
    assert over[0].rstrip().endswith("is over: the ranks made progress."), job.tail()
    assert "StallError" not in job.text, job.tail()
