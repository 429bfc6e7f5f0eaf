"""Multi-homed nodes, for real: mpirun jobs on two simulated nodes whose host names resolve differently.

Each simulated node gets its own ``/etc/hosts`` in a mount namespace of its own (``SimulatedCluster(etc_hosts=)``),
as nodes on a management network and a fabric see one host name as two addresses.
"""

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.tools.simcluster import SimulatedCluster, processes_with
from tests.conftest import JOBS

JOB_TIMEOUT = 120  # a bound on a hang only: 4 ranks importing torch on a loaded 2-core machine
# Node 2's ranks wait it out. Rank 1 must reach rank 0's store within it, though rank 0 may still be importing
# torch: with 5 s, CI-like load once made rank 1 say "rank 0 never answered" too (a true line, not the fault).
ROLL_CALL_TIMEOUT = 20
MAIN_HOST = "lme-main"
# Where nothing can answer on node 2: rank 0's store listens on every address of this machine (TCPStore binds the
# wildcard), so any 127.x address would reach it; and this machine's outside network accepts connections to any
# address (a connect to 240.0.0.9 succeeds here). No TCP connection reaches a multicast address: the connect fails
# at the route lookup (ENETUNREACH) and no packet leaves the machine.
NOWHERE = "224.0.0.9"
# Let every rank report: mpirun ends the job at the first rank's error (as srun --kill-on-bad-exit does), and which
# rank reports first is a race. PRRTE's state_base_error_non_zero_exit=0 keeps the others going, as srun does by
# default (prte_info --all: "Set default policy for marking it an error for a process to return a non-zero exit").
EVERY_RANK_REPORTS = ["--prtemca", "state_base_error_non_zero_exit", "0"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


@pytest.mark.mpi
def test_main_host_resolving_elsewhere_on_node_2_names_both_resolutions_and_rank_zero_s_interfaces(tmp_path: Path):
    cluster = SimulatedCluster(
        tmp_path, etc_hosts={"127.0.0.2": f"127.0.0.2 {MAIN_HOST}", "127.0.0.3": f"{NOWHERE} {MAIN_HOST}"}
    )
    tag = f"multihomed-{tmp_path.name}"
    export = {
        "MASTER_ADDR": MAIN_HOST,
        "MASTER_PORT": str(_free_port()),
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(ROLL_CALL_TIMEOUT),
    }
    job = cluster.run(
        [sys.executable, str(JOBS / "roll_call.py"), tag],
        timeout=JOB_TIMEOUT,
        export=export,
        mpirun_args=EVERY_RANK_REPORTS,
    )
    lines = [line for line in job.stderr.splitlines() if line.startswith("RendezvousError: rank ")]
    assert len(lines) == 4, job.stdout + job.stderr
    unreachable = [line for line in lines if "rank 0 never answered" in line]
    verdicts = [line for line in lines if "never arrived" in line]
    # Node 2's ranks say what they resolved and tried; node 1's the missing node and rank 0's view.
    assert {line.split(":")[1] for line in unreachable} == {" rank 2 on 127.0.0.3", " rank 3 on 127.0.0.3"}, lines
    for line in unreachable:
        assert f"rank 0 never answered at the main address {MAIN_HOST}:{export['MASTER_PORT']}" in line
        assert f"On this node {MAIN_HOST} resolves to {NOWHERE}; the last attempt failed: " in line
        assert "This node's interfaces: lo 127.0.0.1/8" in line
        assert "HINT: " in line
        assert "LIGHTNING_MPI_ENV_MAIN_HOST" in line.split("HINT: ")[1]
    assert len(verdicts) == 2, lines
    for line in verdicts:
        assert f"Ranks 2-3 of 4 never arrived within the rendezvous timeout of {ROLL_CALL_TIMEOUT} s" in line
        assert "node 1 (a node from which no rank arrived at all)" in line
        assert (
            f"Rank 0's node 127.0.0.2: {MAIN_HOST} resolves to 127.0.0.2 (lo); its interfaces: lo 127.0.0.1/8" in line
        )
    assert processes_with(tag) == []  # every rank ended


@pytest.mark.mpi
def test_fabric_interface_setting_reaches_gloo_on_every_rank(cluster: SimulatedCluster):
    # `exec` exports GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=lo beside torchrun's variables; gloo then meets over lo.
    job = cluster.run(
        [sys.executable, "-m", "lightning_mpi_env", "exec", "--", sys.executable, str(JOBS / "gloo_allreduce.py")],
        timeout=JOB_TIMEOUT,
        export={**cluster.job_environment(), "LIGHTNING_MPI_ENV_IFNAME": "lo"},
    )
    assert job.returncode == 0, job.stdout + job.stderr
    reports = [json.loads(line) for line in job.stdout.splitlines() if line.startswith("{")]
    assert sorted(report["RANK"] for report in reports) == ["0", "1", "2", "3"]
    for report in reports:
        assert report["sum"] == 0 + 1 + 2 + 3
        assert (report["GLOO_SOCKET_IFNAME"], report["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
        assert report["MASTER_ADDR"] == "127.0.0.2"


@pytest.mark.mpi
def test_fabric_interface_missing_on_the_nodes_is_one_error_per_rank(cluster: SimulatedCluster):
    job = cluster.run(
        [sys.executable, "-m", "lightning_mpi_env", "exec", "--", sys.executable, "-c", "print('ran')"],
        timeout=JOB_TIMEOUT,
        export={**cluster.job_environment(), "LIGHTNING_MPI_ENV_IFNAME": "hsn9"},
    )
    assert job.returncode != 0
    assert "ran" not in job.stdout
    # mpirun ends the job at the first rank's exit: whichever node reports first, its line names its own host.
    assert re.search(
        r"LIGHTNING_MPI_ENV_IFNAME='hsn9', but host 127\.0\.0\.[23] has no interface hsn9 \(it has lo 127\.0\.0\.1/8",
        job.stderr,
    ), job.stderr
    assert "Traceback" not in job.stderr
