"""The Slurm cluster harness itself: a client that runs past its limit says why, and a test can wait for idle nodes.

CI once reported only ``salloc ... timed out after 900 seconds``, most likely a node still ending the previous test's
job whose slurmd the next test had stopped: such a node stays completing and is never allocated. The harness now
quotes the nodes' and jobs' states in the error, and :meth:`~tests.clusters.slurm.SlurmCluster.wait_idle` lets a test
start from idle nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.clusters.slurm import ClientTimeout, SlurmCluster

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

REASON = "lme-harness-test"


@contextmanager
def _drained(cluster: SlurmCluster, node: str) -> Iterator[None]:
    """``node`` drained (no job is allocated it) while inside; resumed after."""
    update = ["scontrol", "update", f"NodeName={node}"]
    cluster.run([*update, "State=DRAIN", f"Reason={REASON}"], timeout=30, check=True)
    try:
        yield
    finally:
        cluster.run([*update, "State=RESUME"], timeout=30, check=True)


def test_a_client_that_waits_for_an_unavailable_node_times_out_naming_the_node_and_its_state(
    slurm_cluster: SlurmCluster,
):
    with _drained(slurm_cluster, "node2"), pytest.raises(ClientTimeout) as raised:
        # The limit counts from salloc's own word that it waits, however long a loaded machine took to get there.
        slurm_cluster.run(["salloc", "-N2", "true"], timeout=10, after="queued and waiting for resources")
    message = str(raised.value)
    assert "timed out after 10 seconds" in message
    assert "queued and waiting for resources" in message  # salloc's own output
    assert f"node2 drain {REASON}" in message  # sinfo's line for the node it waited for
    assert "PENDING" in message  # squeue's, taken before salloc was stopped: the job that waited
    slurm_cluster.wait_idle(timeout=60)  # resumed, and the cancelled request freed nothing it held


def test_waiting_for_idle_nodes_names_the_node_that_is_not(slurm_cluster: SlurmCluster):
    with _drained(slurm_cluster, "node2"):
        slurm_cluster.wait_idle(["node1"], timeout=60)  # the node left alone is idle
        with pytest.raises(RuntimeError, match=r"node\(s\) \['node2'\] not idle after 1 s: .*'node2': 'drain'"):
            slurm_cluster.wait_idle(["node2"], timeout=1)
    slurm_cluster.wait_idle(timeout=60)
