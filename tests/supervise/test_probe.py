"""The health probe's bookkeeping: hosts that answer, fail, or hang past the time limit (real child processes).

The probe line itself is srun's; here each host's probe is a stand-in command (srun needs a cluster: the real probe
runs against a hung slurmd in test_relaunch_slurm.py), so what is checked is the timing out, the killing and the
reasons.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lightning_mpi_env.supervise.mpirun_line import MpirunLine
from lightning_mpi_env.supervise.mpirun_options import OPEN_MPI_LINE
from lightning_mpi_env.supervise.probe import probe, probe_line
from lightning_mpi_env.tools.simcluster import RSH_AGENT, find_mpirun, session_dir_arguments

BEHAVIOUR = {
    "node1": "pass",
    "node2": "import sys; sys.stderr.write('srun: error: Unable to create step: Node not responding\\n'); sys.exit(1)",
    "node3": "import time; time.sleep(600)",
}


def _start(argv, **options):
    host = argv[argv.index("--overlap") - 1].removeprefix("--nodelist=")
    return subprocess.Popen([sys.executable, "-c", BEHAVIOUR[host]], **options)


def test_a_host_that_fails_or_hangs_is_named_with_the_reason_and_a_healthy_one_passes():
    failed = probe(list(BEHAVIOUR), env={}, timeout=5, start=_start)
    assert set(failed) == {"node2", "node3"}
    assert (
        failed["node2"]
        == "the probe step failed (exit status 1): srun: error: Unable to create step: Node not responding"
    )
    assert failed["node3"] == "no answer in 5 s"


def test_the_probe_is_one_task_on_that_host_sharing_its_cpus():
    line = probe_line("node7")
    assert line[0] == "srun"
    assert {"--nodes=1", "--ntasks=1", "--nodelist=node7", "--overlap"} <= set(line)


@pytest.mark.mpi
def test_an_mpirun_line_s_probe_runs_its_own_launcher_on_one_host(tmp_path):
    # Real Open MPI: through the project's rsh agent (the line's own --mca setting, kept by the probe) a simulated
    # node answers; with Open MPI's own agent (ssh), a host that does not resolve fails in the launcher's words.
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    launcher = [find_mpirun(), *root, *session_dir_arguments(tmp_path / "p")]
    step = ["-H", "127.0.0.2:2,127.0.0.3:2", "-np", "4", "-N", "2", "hostname"]
    simulated = MpirunLine.parse([*launcher, "--mca", "plm_rsh_agent", str(RSH_AGENT), *step], OPEN_MPI_LINE)
    # A rank that lives a second (PROBE_PROGRAM): Open MPI 5 can lose one that ends at once, and hang (prrte#2713).
    assert simulated.probe_line("127.0.0.3")[-6:] == ["--host", "127.0.0.3", "-np", "1", "sleep", "1"]
    assert probe(["127.0.0.3"], env=os.environ, timeout=60, line_for=simulated.probe_line) == {}
    plain = MpirunLine.parse([*launcher, *step], OPEN_MPI_LINE)
    failed = probe(["no-such-node.invalid"], env=os.environ, timeout=60, line_for=plain.probe_line)
    assert list(failed) == ["no-such-node.invalid"]
    assert failed["no-such-node.invalid"].startswith("the probe step failed (exit status")
