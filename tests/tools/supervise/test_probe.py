"""The health probe's bookkeeping: hosts that answer, fail, or hang past the time limit (real child processes).

The probe line itself is srun's; here each host's probe is a stand-in command (srun needs a cluster: the real probe
runs against a hung slurmd in test_relaunch_slurm.py), so what is checked is the timing out, the killing and the
reasons.
"""

from __future__ import annotations

import subprocess
import sys

from lightning_mpi_env.tools.supervise.probe import probe, probe_line

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
