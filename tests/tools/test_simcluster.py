"""Real Open MPI jobs on simulated nodes, training with Lightning's real Trainer on CPU (gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import lightning_mpi_env.tools.simcluster as simcluster
from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.tools.cli import main
from lightning_mpi_env.tools.simcluster import (
    MAX_NODES,
    MAX_SLOTS,
    RSH_AGENT,
    SimulatedCluster,
    loopback_hosts,
    processes_with,
)
from tests.clusters.children import communicate_from, wait_until_none
from tests.conftest import TRAINER_JOB, python_path

ROOT = Path(__file__).parents[2]

SAMPLES = 64


def run_lightning_job(cluster: SimulatedCluster, *args: str, map_by: str = "slot") -> list[dict]:
    completed = cluster.run(
        [sys.executable, str(TRAINER_JOB), "--samples", str(SAMPLES), *args],
        timeout=240,
        map_by=map_by,
        export={**cluster.job_environment(), "PYTHONPATH": python_path(Path(__file__).parents[2])},
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    return [json.loads(line.split(" ", 1)[1]) for line in completed.stdout.splitlines() if line.startswith("RESULT ")]


def assert_trained_as_one_job(results: list[dict], cluster: SimulatedCluster, per_node: int) -> None:
    world = per_node * len(cluster.hosts)
    assert len(results) == world
    assert sorted(result["global_rank"] for result in results) == list(range(world))
    assert {result["world_size"] for result in results} == {world}
    for result in results:
        # Each simulated node has its own host name (its address), so the truth is known from outside.
        assert result["node_rank"] == cluster.hosts.index(result["hostname"]), result
    assert len({(result["node_rank"], result["local_rank"]) for result in results}) == world
    shards = [set(result["seen"]) for result in results]
    assert sum(len(shard) for shard in shards) == SAMPLES  # disjoint ...
    assert set().union(*shards) == set(range(SAMPLES))  # ... and covering the data set
    assert len({json.dumps(result["weights"]) for result in results}) == 1  # DDP kept the replicas identical


@pytest.mark.mpi
def test_one_node_two_ranks(tmp_path: Path):
    cluster = SimulatedCluster(tmp_path, hosts=("127.0.0.2",), slots=2)
    results = run_lightning_job(cluster, "--devices", "2", "--num-nodes", "1")
    assert_trained_as_one_job(results, cluster, per_node=2)
    assert {result["hostname"] for result in results} == {"127.0.0.2"}


@pytest.mark.mpi
def test_two_simulated_nodes_round_robin(cluster: SimulatedCluster):
    # Block placement trains on simulated nodes in tests/lightning/test_strategy.py and tests/rollcall/.
    results = run_lightning_job(cluster, "--namespace", "lightning.pytorch", map_by="node")
    assert_trained_as_one_job(results, cluster, per_node=2)
    # --map-by node deals ranks out in turn: rank 1 is on the second node, where rank // local_size says 0.
    assert next(result for result in results if result["global_rank"] == 1)["node_rank"] == 1


def test_mpirun_command_line(tmp_path: Path):
    cluster = SimulatedCluster(tmp_path)
    args = cluster.mpirun(["python", "x.py"], np=3, map_by="node", export={"A": "1"})
    assert args[-2:] == ["python", "x.py"]
    assert args[args.index("-np") + 1] == "3"
    assert args[args.index("--map-by") + 1] == "node"
    assert args[args.index("-x") + 1] == "A=1"
    assert cluster.hostfile.read_text() == "127.0.0.2 slots=2\n127.0.0.3 slots=2\n"
    assert args[args.index("prte_tmpdir_base") + 1] == str(tmp_path / "prte")


def test_a_node_s_own_etc_hosts_goes_to_the_agent(tmp_path: Path):
    cluster = SimulatedCluster(tmp_path, etc_hosts={"127.0.0.3": "224.0.0.9 main-host"})
    args = cluster.mpirun(["true"])
    agent = args[args.index("plm_rsh_agent") + 1]
    assert agent == f"{RSH_AGENT} --etc-hosts {tmp_path / 'etc-hosts'}"
    own = (tmp_path / "etc-hosts" / "127.0.0.3").read_text()
    assert own.startswith("224.0.0.9 main-host\n")  # first: the first line naming a host wins
    assert own.endswith(Path("/etc/hosts").read_text())
    assert not (tmp_path / "etc-hosts" / "127.0.0.2").exists()  # node 1 keeps this machine's /etc/hosts
    assert SimulatedCluster(tmp_path).mpirun(["true"])[args.index("plm_rsh_agent") + 1] == str(RSH_AGENT)


def test_any_number_of_nodes(tmp_path: Path):
    cluster = SimulatedCluster.of(tmp_path, nodes=5, per_node=3)
    assert cluster.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6")
    assert (cluster.slots, cluster.size) == (3, 15)
    args = cluster.mpirun(["true"])
    assert args[args.index("-np") + 1] == "15"
    assert cluster.hostfile.read_text().splitlines()[-1] == "127.0.0.6 slots=3"
    assert loopback_hosts(256)[253:] == ("127.0.0.255", "127.0.1.0", "127.0.1.1")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda path: SimulatedCluster.of(path, nodes=0), "A simulated cluster of 0 node"),
        (lambda path: loopback_hosts(2**24), "Ask for 1 to 16777213 nodes"),
        (lambda path: SimulatedCluster.of(path, nodes=2**24), f"Ask for 1 to {MAX_NODES} nodes"),
        (lambda path: SimulatedCluster.of(path, nodes=MAX_NODES + 1), f"more than the {MAX_NODES} nodes"),
        (lambda path: SimulatedCluster.of(path, nodes=2, per_node=MAX_SLOTS), f"more than the {MAX_SLOTS} slots"),
        (lambda path: SimulatedCluster(path, hosts=loopback_hosts(MAX_NODES + 1)), f"the {MAX_NODES} nodes"),
        (lambda path: SimulatedCluster(path, slots=MAX_SLOTS), f"x --per-node {MAX_SLOTS} is more than"),
        (lambda path: SimulatedCluster(path, hosts=()), "needs at least one host"),
        (lambda path: SimulatedCluster(path, hosts=("127.0.0.2", "127.0.0.2")), "each named once"),
        (lambda path: SimulatedCluster(path, slots=0), "slots=0: every simulated node needs at least one slot"),
        (lambda path: SimulatedCluster(path).mpirun(["true"], np=5), "np=5 does not fit 2 simulated node"),
        (lambda path: SimulatedCluster(path, etc_hosts={"10.0.0.1": "x"}), "etc_hosts names 10.0.0.1, which is not"),
        (
            lambda path: (
                (path / "a b").mkdir() or SimulatedCluster(path / "a b", etc_hosts={"127.0.0.2": "x"}).mpirun(["true"])
            ),
            "etc_hosts needs a work directory without spaces",
        ),
    ],
    ids=[
        "no-nodes",
        "past-loopback",
        "past-max-nodes",
        "max-nodes-plus-one",
        "past-max-slots",
        "hosts-past-max",
        "slots-past-max",
        "no-hosts",
        "twice",
        "no-slots",
        "np",
        "etc-hosts-stranger",
        "etc-hosts-space",
    ],
)
def test_impossible_clusters_are_setting_errors(tmp_path: Path, make, match):
    with pytest.raises(SettingError, match=match):
        make(tmp_path)


RANKS_UP_LIMIT = 120
"""Seconds 4 ranks get to start and print ``up``: only a hang takes longer."""


class _LimitFromUp(subprocess.Popen[str]):
    """``mpirun`` whose time limit counts from the moment all 4 ranks printed ``up``, not from its start.

    Then a short limit is the event it tests (the job is stopped while every rank runs), not a bet on how fast 4
    ranks start on a loaded machine.
    """

    counting = False

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        if timeout is None or self.counting:  # the wait for the ranks, or the job's output after its limit
            return super().communicate(input, timeout)
        self.counting = True
        return communicate_from(self, timeout, lambda stdout, _: stdout.count(b"up\n") == 4, RANKS_UP_LIMIT)


@pytest.mark.mpi
def test_timeout_stops_every_rank(cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch):
    tag = f"simcluster-timeout-{uuid.uuid4().hex[:12]}"
    # Only simcluster's mpirun counts its limit from the ranks' start; every other process here is as ever.
    monkeypatch.setattr(simcluster, "subprocess", SimpleNamespace(**{**vars(subprocess), "Popen": _LimitFromUp}))
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        cluster.run([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(3600)", tag], timeout=3)
    so_far = raised.value.output + (raised.value.stderr or "")
    assert raised.value.output.count("up\n") == 4, so_far  # the output so far comes with the exception
    assert raised.value.timeout == 3
    # And its message, which a CI log shows: mpirun's own warnings on stderr may follow the ranks' lines.
    assert str(raised.value).endswith(so_far[-4000:]), str(raised.value)
    assert "up\n" * 4 in str(raised.value), str(raised.value)
    # mpirun ends its ranks before it exits; a rank a killed daemon left behind would end a moment later.
    assert wait_until_none(lambda: processes_with(tag)) == []


@pytest.mark.mpi
def test_three_nodes_have_their_own_host_names(tmp_path: Path):
    cluster = SimulatedCluster.of(tmp_path, nodes=3, per_node=1)
    completed = cluster.run([sys.executable, "-c", "import socket; print(socket.gethostname())"], timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert sorted(completed.stdout.split()) == list(cluster.hosts)


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        (["--nodes", "1000000"], f"argument --nodes: must be at most {MAX_NODES}"),
        (["--nodes", "2", "--per-node", "1000000"], f"argument --per-node/--ppn: must be at most {MAX_SLOTS}"),
        (["--nodes", str(MAX_NODES), "--per-node", "5"], f"x --per-node 5 is more than the {MAX_SLOTS} slots"),
    ],
    ids=["nodes", "per-node", "product"],
)
def test_an_oversized_simcluster_is_one_usage_error_and_starts_no_mpirun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sizes: list[str], match: str
):
    started: list[str] = []
    # Finding mpirun is the first step of every mpirun command line: nothing may get that far.
    monkeypatch.setattr(simcluster, "find_mpirun", lambda: started.append("mpirun") or "mpirun")
    assert main(["simcluster", *sizes, "--", "true"]) == 2
    assert started == []
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("usage: ")]
    (error,) = [line for line in errors if not line.startswith(" ")]  # one line, no traceback
    assert error.startswith("lightning-mpi-env: error: ")
    assert match in error
    assert "HINT: " in error


def test_the_maxima_are_the_largest_accepted(tmp_path: Path):
    assert SimulatedCluster.of(tmp_path, nodes=MAX_NODES, per_node=MAX_SLOTS // MAX_NODES).size == MAX_SLOTS
    assert SimulatedCluster.of(tmp_path, nodes=1, per_node=MAX_SLOTS).size == MAX_SLOTS


@pytest.mark.mpi
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_simcluster_leaves_no_process_behind(tmp_path: Path, signum: signal.Signals):
    tag = f"simcluster-stopped-{uuid.uuid4().hex[:12]}"
    rank = "import time; print('up', flush=True); time.sleep(600)"
    cli = [sys.executable, "-m", "lightning_mpi_env", "simcluster", "--nodes", "2", "--per-node", "1"]
    environ = {**os.environ, "PYTHONPATH": python_path(ROOT)}
    # stderr to a file: a job left behind would hold a pipe open, and reading it would wait for the job.
    with (tmp_path / "stderr").open("w") as stderr:
        process = subprocess.Popen(
            [*cli, "--", sys.executable, "-c", rank, tag], stdout=subprocess.PIPE, stderr=stderr, text=True, env=environ
        )
    try:
        assert process.stdout is not None
        ups = 0
        while ups < 2:  # both ranks running: mpirun, its daemons and the ranks all exist
            line = process.stdout.readline()
            assert line, (tmp_path / "stderr").read_text()[-3000:]  # the job ended early: say why
            ups += line == "up\n"
        assert len(processes_with(tag)) >= 4  # the CLI, mpirun, two ranks: what must go
        # Signalled alone, not as a group: as `timeout` or `kill PID` does it, so only the CLI can pass it on.
        process.send_signal(signum)
        try:
            status = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            left = "\n".join(processes_with(tag))
            pytest.fail(f"the CLI still ran 120 s after {signum.name}:\n{left}\n" + (tmp_path / "stderr").read_text())
        errors = (tmp_path / "stderr").read_text()
        assert status == 128 + signum, errors[-3000:]
        assert f"stopped by {signum.name}; the job was ended" in errors
        # mpirun (prterun) and every rank carry the tag on their command line; mpirun ends its ranks before it
        # exits, and a rank that a killed daemon left behind would end a moment later.
        assert wait_until_none(lambda: processes_with(tag)) == []
    finally:
        process.stdout.close()
        for left in processes_with(tag):  # after a failure: end what this test started, one by one
            os.kill(int(left.split()[0]), signal.SIGKILL)
        process.wait()


@pytest.mark.mpi
def test_session_directories_stay_in_the_cluster_s_folder(tmp_path: Path):
    # Open MPI's daemons name their session directory after their pid (/tmp/prted.PID); one killed with its job leaves
    # it behind, and a later daemon given that pid fails at start. In the cluster's folder, no other job's leftovers
    # meet this cluster's daemons. The ranks see their daemon's directory as PMIX_SERVER_TMPDIR.
    cluster = SimulatedCluster(tmp_path)
    program = "import os, socket; print('RESULT', socket.gethostname(), os.environ['PMIX_SERVER_TMPDIR'])"
    completed = subprocess.run(
        cluster.mpirun([sys.executable, "-c", program]), capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split()[1:] for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(host for host, _ in lines) == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    for _, directory in lines:
        assert Path(directory).parent == tmp_path / "prte", directory
    assert len({directory for _, directory in lines}) == 2  # one daemon per simulated node
