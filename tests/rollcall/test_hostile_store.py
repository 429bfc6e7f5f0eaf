"""Forged and malformed values in a real job's store: real mpirun, two simulated nodes, a real ``TCPStore``.

torch's store has no authentication: anyone who reaches the main port can write under the roll call's keys. Here a
second client on rank 3's node does (tests/jobs/forged_store.py). Whatever it writes ends in one named
``RendezvousError`` on every rank that read it, or is skipped and named by the watchdog, which goes on; a forged node
index is never taken.
"""

import re

import pytest

from tests.conftest import JOBS
from tests.rollcall.test_fail_fast import PACKAGE_FRAME, _run

FORGED_STORE = JOBS / "forged_store.py"
STALL_TIMEOUT = "40"
"""No rank stalls in these jobs. While its reports are forged, rank 2 looks silent to rank 0 for up to a 1.5 s window,
a report interval (1 s) for its own report to come through and one for rank 0 to read it: this is over ten times
that, so the forgery, not the timing, decides what the watchdog says."""

# KIND: the key named, and a piece of the reason, in every rank's error.
FAILS = {
    "node": (r"lightning_mpi_env/node/\d", "node_rank=7 is outside 0..2"),
    "claim": ("lightning_mpi_env/claim/3", "the claim lacks world_size, host, local_rank, pid"),
    "verdict": ("lightning_mpi_env/verdict", "it is not JSON"),
}


@pytest.mark.mpi
# A forged assignment, a malformed claim and a malformed verdict: one of each store value's readers (rank 0, every
# rank). A forged device index and a malformed stop record take the same parser
# (tests/rollcall/test_store_values.py) and reader (tests/rollcall/test_agreement.py) over a real store.
@pytest.mark.parametrize("kind", ["node", "claim", "verdict"])
def test_a_forged_or_malformed_value_ends_the_job_with_the_key_named(cluster, kind):
    job = _run(cluster, [str(FORGED_STORE), kind], LIGHTNING_MPI_ENV_STALL_TIMEOUT=STALL_TIMEOUT)
    key, reason = FAILS[kind]
    assert job.returncode != 0, job.tail()
    shown = [line for line in job.stderr if line.startswith("RendezvousError: rank ")]
    assert shown, job.tail()
    for line in shown:
        assert re.search(f"The rendezvous store holds a malformed value under '{key}': ", line), job.tail()
        assert reason in line, job.tail()
        assert "HINT: Something other than this job's ranks wrote to its rendezvous store" in line, job.tail()
    assert "Traceback (most recent call last)" not in job.text, job.tail()
    assert not PACKAGE_FRAME.search(job.text), job.tail()
    if kind == "node":
        assert "MET rank=" not in job.text, job.tail()  # no rank took the forged assignment
    assert "DONE rank=" not in job.text, job.tail()


@pytest.mark.mpi
def test_a_malformed_watchdog_report_is_skipped_and_named_once(cluster):
    # A malformed report is rank 0's to read: its watchdog names it once and goes on, and the job runs to its end.
    # The ranks run until rank 0 has named it (FORGED_STORE_NAMED), however late its watchdog reads. A malformed
    # stall verdict, every rank's to read: tests/rollcall/test_watchdog.py, over a real store.
    key = "lightning_mpi_env/watchdog/2"
    named = cluster.workdir / "named"
    job = _run(
        cluster,
        [str(FORGED_STORE), "report"],
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=STALL_TIMEOUT,
        FORGED_STORE_NAMED=str(named),
    )
    assert job.returncode == 0, job.tail()
    assert sorted(line for line in job.output if line.startswith("DONE rank=")) == [
        f"DONE rank={rank} named={[key] if rank == 0 else []}\n" for rank in range(4)
    ], job.tail()
    named = [line for line in job.stderr if "skips" in line]
    assert len(named) == 1, job.tail()
    for line in named:
        assert re.match(r"lightning-mpi-env: the stall watchdog of rank \d skips The rendezvous store holds ", line)
        assert f"a malformed value under '{key}'" in line, job.tail()
    assert "StallError" not in job.text, job.tail()
    assert " stopped on " not in job.text, job.tail()  # no watchdog thread ended
    assert "Traceback" not in job.text, job.tail()
