"""The supervisor on the two-node simulated Slurm cluster: a frozen rank's step relaunched on the other node.

Inside ``salloc -N2`` (one node used, one spare), ``lightning-mpi-env run -- srun -N1 -n2 ...`` runs a Fabric loop
under ``ddp_mpi`` whose rank 1 freezes (``SIGSTOP``) at step 10 the first time only (``--freeze-once``). The
watchdog names it, rank 0 writes the record and ends the step; the supervisor relaunches the step with the frozen
rank's node excluded, and it finishes on the other node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.tools.supervise.loop import supervise
from lightning_mpi_env.tools.supervise.policy import RestartPolicy
from lightning_mpi_env.tools.supervise.srun_line import SrunLineError
from tests.clusters.slurm import SlurmCluster
from tests.test_slurm import FABRIC_FREEZE, LIGHTNING_TIMEOUT, STALL_TIMEOUT


def test_a_line_that_is_not_srun_runs_nothing(tmp_path):
    ran: list[object] = []
    with pytest.raises(SrunLineError, match=r"is 'mpirun', not srun"):
        supervise(["mpirun", "-np", "2", "a"], RestartPolicy(1), env={}, state=str(tmp_path), run=ran.append)
    assert ran == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.mpi
@pytest.mark.slurm
def test_a_frozen_rank_s_step_is_relaunched_without_its_node(slurm_cluster: SlurmCluster, tmp_path: Path):
    state, marker = tmp_path / "state", tmp_path / "frozen-once"
    step = ["srun", "-N1", "-n2", sys.executable, str(FABRIC_FREEZE), "--strategy", "ddp_mpi", "--num-nodes", "1"]
    step += ["--steps", "60", "--freeze", "1:10", "--freeze-once", str(marker), "--tag", f"loop-{tmp_path.name}"]
    supervisor = [sys.executable, "-m", "lightning_mpi_env", "run", "--restarts", "2", "--backoff", "1"]
    supervisor += ["--state-dir", str(state), "--", *step]
    done = slurm_cluster.run(
        ["salloc", "-N2", "--ntasks-per-node=2", *supervisor],
        timeout=2 * LIGHTNING_TIMEOUT,
        env={"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "FREEZE rank=1 step=10" in done.stdout, output[-6000:]
    (journal,) = state.glob("*/timeline.jsonl")
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [event["event"] for event in events] == ["launch", "failure", "excluded", "relaunch", "launch", "done"]
    (frozen_host,) = events[2]["hosts"]
    assert frozen_host in slurm_cluster.hosts
    assert events[1]["hosts"] == [frozen_host]
    assert events[1]["message"].startswith(f"frozen: rank(s) 1 on {frozen_host}"), events[1]
    assert events[4]["argv"][:2] == ["srun", f"--exclude={frozen_host}"]
    # The relaunched step ran on the other node, and finished there.
    (other,) = [host for host in slurm_cluster.hosts if host != frozen_host]
    finished = [line for line in done.stdout.splitlines() if line.startswith("DONE rank=")]
    assert sorted(finished) == [f"DONE rank=0 host={other}", f"DONE rank=1 host={other}"], output[-6000:]
    # One human line per event on stderr.
    shown = [line for line in done.stderr.splitlines() if line.startswith("lightning-mpi-env run: step ")]
    assert len(shown) == len(events), output[-6000:]
    (frozen_at,) = [float(line.rsplit("time=", 1)[1]) for line in done.stdout.splitlines() if "FREEZE rank=1" in line]
    failed, relaunched, finished_at = events[1]["when"], events[4]["when"], events[5]["when"]
    print(
        f"FIGURE run, srun, ddp_mpi, stall timeout {STALL_TIMEOUT} s: step 1 ended {failed - frozen_at:.1f} s after "
        f"the freeze, step 2 started {relaunched - frozen_at:.1f} s after it, and finished "
        f"{finished_at - frozen_at:.1f} s after it (Lightning's start included)"
    )
