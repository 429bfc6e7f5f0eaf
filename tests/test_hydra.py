"""MPICH's and Intel MPI's real ``mpiexec`` (Hydra) on two simulated nodes, each checked against what Hydra says.

Every rank runs ``lightning-mpi-env show --json`` under a probe that records, beside its output, the rank's own
Hydra variables and the host name it really ran on (:func:`tests.clusters.hydra.probe`). Those are the truth: ranks
from ``PMI_RANK``/``MPI_LOCALRANKID``, the node index from the host's place in ``-hosts``. Each MPI runs from its
own venv under ``.venv/launchers`` (installed on first use by the ``hydra_cluster`` fixture).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.ports import DEFAULT_MAIN_PORT, derive_port
from tests.clusters.hydra import (
    HydraCluster,
    free_port,
    launcher_truth,
    printed_results,
    probe_command,
    read_probes,
    shown,
)
from tests.conftest import TRAINER_JOB
from tests.tools.test_simcluster import SAMPLES, assert_trained_as_one_job

pytestmark = [pytest.mark.mpi, pytest.mark.hydra]

CONSOLE_SCRIPT = Path(sys.executable).parent / "lightning-mpi-env"
TIMEOUT = 120
LIGHTNING_TIMEOUT = 300  # four Lightning processes on two (maybe busy) cores


def run_probed(cluster: HydraCluster, out: Path, command: list[str], **kwargs) -> list[dict]:
    """Run ``command`` in every rank under the probe; one record per rank, each with the rank's truth."""
    out.mkdir()
    completed = cluster.run(probe_command(out, command), **kwargs)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    records = read_probes(out)
    for record in records:
        assert record["returncode"] == 0, record["stderr"][-4000:]
    return records


def hydra_truth(records: list[dict], hosts: tuple[str, ...]) -> list[dict]:
    """Hydra's own word for every rank, with the host it really ran on."""
    return launcher_truth(records, hosts, rank="PMI_RANK", world_size="PMI_SIZE", local_rank="MPI_LOCALRANKID")


PLACEMENTS = {"block": 2, "round-robin": 1}
"""``-ppn`` for each placement, 4 ranks on 2 hosts: 2 gives blocks (0, 1 | 2, 3); 1 deals them out in turn."""


@pytest.mark.parametrize("hydra_cluster", ["mpich", "intelmpi"], indirect=True)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_show_resolves_what_hydra_says(hydra_cluster: HydraCluster, placement: str, tmp_path: Path):
    hosts = hydra_cluster.hosts
    # Hydra lists no hosts to its ranks: a multi-node job passes MASTER_ADDR, as the README says (`-genv`).
    env = {"MASTER_ADDR": hosts[0]}
    if hydra_cluster.kind == "mpich" and placement == "round-robin":
        env["MASTER_PORT"] = str(free_port())
    records = run_probed(
        hydra_cluster,
        tmp_path / "probes",
        [str(CONSOLE_SCRIPT), "show", "--json"],
        np=4,
        ppn=PLACEMENTS[placement],
        env=env,
        timeout=TIMEOUT,
    )
    truth = hydra_truth(records, hosts)
    assert [row["global_rank"] for row in truth] == [0, 1, 2, 3]
    if placement == "round-robin":
        assert [row["node_rank"] for row in truth] == [0, 1, 0, 1]  # the launch really dealt the ranks out
    resolved = shown(records)
    assert [{name: row[name] for name in truth[0]} for row in resolved] == truth
    assert {(row["launcher"], row["main_address"]) for row in resolved} == {("mpich", truth[0]["host"])}
    ports = {row["main_port"] for row in resolved}
    sources = {row["sources"]["main_port"] for row in resolved}
    if hydra_cluster.kind == "intelmpi":
        # Intel MPI names each mpiexec (I_MPI_HYDRA_UUID, the same on all its ranks): the port comes from it.
        uuids = {record["launcher"]["I_MPI_HYDRA_UUID"] for record in records}
        assert len(uuids) == 1
        assert (ports, sources) == ({derive_port(uuids.pop())}, {"derived from I_MPI_HYDRA_UUID"})
    elif "MASTER_PORT" in env:
        assert (ports, sources) == ({int(env["MASTER_PORT"])}, {"MASTER_PORT"})
    else:
        # MPICH exports nothing that names the launch (no scheduler here either): PyTorch's default port.
        assert not any(name.startswith("I_MPI") for record in records for name in record["launcher"])
        assert (ports, sources) == ({DEFAULT_MAIN_PORT}, {"default"})


@pytest.mark.parametrize("hydra_cluster", ["mpich"], indirect=True)
def test_mpich_trains_lightning_on_two_nodes(hydra_cluster: HydraCluster, tmp_path: Path):
    # 2 nodes x 2 ranks, strategy "ddp" with MPIClusterEnvironment; the job script passes the main address and port.
    env = {"MASTER_ADDR": hydra_cluster.hosts[0], "MASTER_PORT": str(free_port())}
    records = run_probed(
        hydra_cluster,
        tmp_path / "probes",
        [sys.executable, str(TRAINER_JOB), "--samples", str(SAMPLES), "--strategy", "ddp"],
        ppn=2,
        env=env,
        timeout=LIGHTNING_TIMEOUT,
    )
    results = printed_results(records)
    assert_trained_as_one_job(results, hydra_cluster, per_node=2)
    truth = hydra_truth(records, hydra_cluster.hosts)
    assert sorted((r["global_rank"], r["local_rank"], r["hostname"]) for r in results) == [
        (row["global_rank"], row["local_rank"], row["host"]) for row in truth
    ]
