"""Uneven launches (nodes that run different numbers of ranks): ``"ddp_mpi"`` trains on them, the plugin refuses them.

``"ddp_mpi"`` takes the world size and every rank's global rank from the launcher, each node's size from the
launcher and the roll call, and deals the data sampler over every rank; Lightning's own strategies take ``devices x
num_nodes`` and ``node rank x devices + local rank``, which no uneven launch fits.

The launchers' variables these jobs rely on, as documented:

- Open MPI (https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html): ``OMPI_COMM_WORLD_SIZE`` "the
  number of processes in this process's MPI_COMM_WORLD", ``OMPI_COMM_WORLD_RANK`` "the MPI rank of this process",
  ``OMPI_COMM_WORLD_LOCAL_SIZE`` "the number of ranks from this job that are running on this node" (no variable
  gives another node's count: the roll call counts the hosts). ``mpirun --hostfile`` lines ``HOST slots=N`` and
  ``--map-by slot`` (fill a node's slots first) / ``--map-by node`` (one rank per node in turn) are in ``mpirun(1)``
  (https://docs.open-mpi.org/en/v5.0.x/man-openmpi/man1/mpirun.1.html).
- Slurm srun (https://slurm.schedmd.com/srun.html): ``SLURM_PROCID`` "the MPI rank (or relative process ID) of the
  current process", ``SLURM_NTASKS`` the number of tasks, ``SLURM_LOCALID`` "node local task ID",
  ``SLURM_NODEID`` "the relative node ID of the current node", ``SLURM_STEP_TASKS_PER_NODE`` "number of processes
  per node within the step" in the compressed form ``2(x3),1``. ``srun -N2 -n3`` places 2 + 1 (block distribution).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.lightning.strategy import public_module
from lightning_mpi_env.tools.simcluster import RSH_AGENT, find_mpirun
from tests.clusters.hydra import printed_results, probe_command, read_probes
from tests.clusters.slurm import SlurmCluster
from tests.conftest import JOBS, TAMPER, TRAINER_JOB, start_gate

JOB = JOBS / "uneven_train.py"
LENGTH = 163  # samples: not a multiple of 4 or 3, so the sampler pads, and each rank's share is ceil(len / N)
BATCH = 2
STEPS = 20
TOLERANCE = 1e-6
JOB_TIMEOUT = 400  # four Lightning processes on two busy cores; a bound on a hang, not a speed target

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SLOTS = {"3+1": {A: 3, B: 1}, "2+1+1": {A: 2, B: 1, C: 1}}
"""The host files: each simulated node's ``slots=``."""
PLACED = {
    # Where mpirun -np 4 puts each rank: --map-by slot fills a node's slots first, --map-by node deals in turn
    # (skipping full nodes).
    ("3+1", "slot"): [A, A, A, B],
    ("3+1", "node"): [A, B, A, A],
    ("2+1+1", "slot"): [A, A, B, C],
    ("2+1+1", "node"): [A, B, C, A],
}


def mpirun_uneven(tmp_path: Path, slots: dict[str, int], map_by: str, command: list[str]) -> list[str]:
    """``mpirun -np <slots> --map-by <map_by>`` over simulated nodes with these slots (a host file of uneven lines).

    ``SimulatedCluster`` writes equal slots; its agent (:data:`RSH_AGENT`) starts the daemons of any host file. The
    first host runs rank 0 under either placement: it is ``MASTER_ADDR``, as a job script would export it.
    """
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots={count}\n" for host, count in slots.items()))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        find_mpirun(),
        *root,
        *("--mca", "plm_rsh_agent", str(RSH_AGENT), "--hostfile", str(hostfile)),
        *("-np", str(sum(slots.values())), "--map-by", map_by, "-x", f"MASTER_ADDR={next(iter(slots))}"),
        *command,
    ]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)


def _results(stdout: str) -> list[dict]:
    decoder = json.JSONDecoder()
    return sorted((decoder.raw_decode(part)[0] for part in stdout.split("RESULT ")[1:]), key=lambda r: r["global_rank"])


def assert_trained_as_one_process(results: list[dict], hosts: list[str], api: str) -> float:
    """Every rank's counts are the launch's, the batches are the reference's, the weights the reference's.

    Returns:
        The largest difference between any rank's weights and the single-process reference's.
    """
    world = len(hosts)
    assert [r["global_rank"] for r in results] == list(range(world))
    order = list(dict.fromkeys(hosts))  # nodes numbered by their lowest rank
    for r in results:
        rank = r["global_rank"]
        on_host = [other for other, host in enumerate(hosts) if host == hosts[rank]]
        assert r["api"] == api
        assert r["launcher_rank"] == rank  # the launcher's, not node rank x devices + local rank
        assert r["hostname"] == hosts[rank]
        assert (r["world_size"], r["num_nodes"]) == (world, len(order))
        assert r["num_devices"] == len(on_host)  # this node's ranks
        assert (r["node_rank"], r["local_rank"]) == (order.index(hosts[rank]), on_host.index(rank))
        # The sampler, as the job asserted it too: every rank an equal share of the padded data. Lightning's Trainer
        # shuffles the training data it deals (seeded); Fabric keeps the loader's shuffle=False.
        share = math.ceil(LENGTH / world)
        assert r["sampler"] == {
            "num_replicas": world,
            "rank": rank,
            "share": share,
            "shuffle": api == "Trainer",
            "seed": 0,
        }
        assert len(r["steps"]) == STEPS
    # The ranks' k-th batches together are the k-th batch of world x BATCH of one process.
    batches = results[0]["reference_batches"]
    assert len(batches) == STEPS
    for step in range(STEPS):
        together = sorted(index for r in results for index in r["steps"][step])
        assert together == sorted(batches[step])
        if api == "Fabric":  # no shuffle: the indices in order
            assert together == list(range(step * world * BATCH, (step + 1) * world * BATCH))
    taken = [index for batch in batches for index in batch]
    assert len(set(taken)) == len(taken) == STEPS * world * BATCH  # no sample twice: the padding is past the steps
    reference, initial = results[0]["reference"], results[0]["initial"]
    assert max(abs(a - b) for a, b in zip(reference, initial, strict=True)) > 1e-2  # training moved the weights
    difference = max(abs(a - b) for r in results for a, b in zip(r["weights"], reference, strict=True))
    assert difference < TOLERANCE, difference
    return difference


# --- zero config on an uneven launch, without a job ------------------------------------------------------------------

BUILT = """
import json, os, sys
os.environ.update(json.loads(sys.argv[1]))
import lightning_mpi_env
import {namespace} as L
runner = L.{entry}(strategy="ddp_mpi", accelerator="cpu"{logger})
strategy = runner.strategy
print(json.dumps({{"devices": len(strategy.parallel_devices), "num_nodes": strategy.num_nodes,
                   "world_size": strategy.world_size, "global_rank": strategy.global_rank,
                   "root_device": str(strategy.root_device), "sampler": strategy.distributed_sampler_kwargs}}))
"""

OPEN_MPI_3_1 = {
    # mpirun -np 4 --map-by slot over slots 3 + 1: rank 2 (the third on the node of 3), rank 3 (alone).
    2: {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
    3: {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
}
SLURM_2_1 = {
    # srun -N2 -n3 (2 + 1): task 2, alone on the second node.
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "3",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2,1",
}


def _built(namespace: str, entry: str, env: dict[str, str]) -> dict:
    code = BUILT.format(namespace=namespace, entry=entry, logger=", logger=False" if entry == "Trainer" else "")
    environment = {**env, "MASTER_ADDR": "nodea", "MASTER_PORT": "29611"}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(environment)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


NAMESPACES = [
    ("lightning.pytorch", "Trainer"),
    ("pytorch_lightning", "Trainer"),
    ("lightning.fabric", "Fabric"),
    ("lightning_fabric", "Fabric"),
]


@pytest.mark.parametrize(("namespace", "entry"), NAMESPACES)
def test_zero_config_on_the_node_of_three(namespace, entry):
    # Before the roll call no variable says how many nodes there are (Open MPI exports this node's count only): the
    # node count stays 1 until the roll call counts the hosts. Devices, ranks and sampler are the launch's already.
    shape = _built(namespace, entry, {"OMPI_COMM_WORLD_SIZE": "4", **OPEN_MPI_3_1[2]})
    assert shape == {
        "devices": 3,
        "num_nodes": 1,
        "world_size": 4,
        "global_rank": 2,
        "root_device": "cpu",
        "sampler": {"num_replicas": 4, "rank": 2},  # not num_nodes x devices (3 here, 1 on the other node)
    }


@pytest.mark.parametrize(("namespace", "entry"), NAMESPACES[::3])
def test_zero_config_on_the_lone_rank_of_an_uneven_slurm_step(namespace, entry):
    # SLURM_NTASKS_PER_NODE set here: without it Lightning's own SLURMEnvironment, made while the Trainer/Fabric is
    # built from a strategy's name, refuses `--ntasks` (a real `srun -N2 -n3 --ntasks-per-node=2` exports none, so
    # the srun jobs below pass the strategy object: docs/lightning.md).
    shape = _built(namespace, entry, {**SLURM_2_1, "SLURM_NTASKS_PER_NODE": "2"})
    assert shape == {
        "devices": 1,
        "num_nodes": 2,  # Slurm exports every node's count
        "world_size": 3,
        "global_rank": 2,
        "root_device": "cpu",
        "sampler": {"num_replicas": 3, "rank": 2},
    }


# --- real mpirun jobs on uneven host files -----------------------------------------------------------------------

CASES = [
    # (slots, placement, namespace, form): each host file, each placement, the Trainer and Fabric, the recommended
    # line (its module's MPIDDPStrategy()) and the name, each once. The assignment each rank gets in the other
    # placements is the roll call's, which tests/rollcall/test_rendezvous.py checks over a real store; what each rank
    # reads of an uneven launch, tests/core/test_placement.py checks over generated placements.
    ("3+1", "slot", "lightning.pytorch", "recommended"),
    ("2+1+1", "node", "lightning_fabric", "name"),
]


def assert_strategy(results: list[dict], namespace: str, form: str) -> None:
    """Every rank ran the package's ``MPIDDPStrategy``: from its recommended module, or picked by the name."""
    module = public_module(namespace)
    assert {r["strategy"] for r in results} == {f"{module}.MPIDDPStrategy"}, form


@pytest.mark.mpi
@pytest.mark.parametrize(("slots", "map_by", "namespace", "form"), CASES)
def test_mpirun_uneven_launch_trains_as_one_process(tmp_path, slots, map_by, namespace, form):
    command = [sys.executable, str(JOB), "--namespace", namespace, "--length", str(LENGTH)]
    command += ["--batch", str(BATCH), "--steps", str(STEPS), *(["--recommended"] if form == "recommended" else [])]
    result = _run(mpirun_uneven(tmp_path, SLOTS[slots], map_by, command))
    assert result.returncode == 0, result.stderr[-4000:]
    api = "Fabric" if "fabric" in namespace else "Trainer"
    results = _results(result.stdout)
    difference = assert_trained_as_one_process(results, PLACED[slots, map_by], api)
    assert_strategy(results, namespace, form)
    print(f"FIGURE {slots} --map-by {map_by} {namespace} ({form}): max |weights - reference| = {difference:.3g}")


@pytest.mark.mpi
@pytest.mark.parametrize(
    # Fabric's refusal is the same check (test_environment.py meets it in every namespace); srun's is below.
    ("slots", "map_by", "namespace"),
    [("3+1", "node", "lightning.pytorch")],
)
def test_mpirun_uneven_launch_with_the_plugin_names_ddp_mpi(tmp_path, slots, map_by, namespace):
    # Lightning's own DDPStrategy with MPIClusterEnvironment and no devices/num_nodes, as a user would try first: it
    # stops when fit()/launch() starts, before the roll call and before any step.
    command = [sys.executable, str(JOB), "--namespace", namespace, "--strategy", "plugin"]
    result = _run(mpirun_uneven(tmp_path, SLOTS[slots], map_by, command))
    assert result.returncode != 0
    assert "RESULT" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("LayoutError: rank ")]
    assert errors, result.stderr[-4000:]
    for line in errors:
        # Whichever rank reports first: a rank on a node of 2 or 3 knows the launch is uneven; a lone rank sees a
        # node of 1 (as in an even launch of 1 per node) and says its node count is a guess. Both name the fix.
        assert "ddp_mpi" in line, line
        assert "not started by one launch" not in line
        assert "-np 1 " not in line, line
        assert "ppr:1:node" not in line, line
    print("FIGURE plugin refusal: " + errors[0][:400])


@pytest.mark.mpi
def test_missing_rank_of_an_uneven_launch_is_named_without_a_guessed_node(tmp_path):
    # 2 + 1 + 1 slots, --map-by node: rank 3 runs beside rank 0 on host A. No rank can tell that from its launcher
    # (Open MPI exports this node's count only): rank 0 would guess 2 nodes of 2 (rank 3 on B's node), the lone
    # ranks 4 nodes of 1 (a node of its own). The line names the rank, and no node the claims refute.
    variables = {**start_gate(tmp_path / "gate", 3), "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": "20"}
    job = [sys.executable, str(TRAINER_JOB), "--strategy", "ddp_mpi", "--zero-config"]
    fault = [sys.executable, str(TAMPER), "--rank", "3", "--exit", "--", *job]
    command = ["env", *(f"{name}={value}" for name, value in variables.items()), *fault]
    result = _run(mpirun_uneven(tmp_path, SLOTS["2+1+1"], "node", command))
    assert result.returncode != 0
    assert "RESULT" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("RendezvousError: rank ")]
    assert lines, result.stdout[-2000:] + result.stderr[-4000:]
    for line in lines:
        assert "Rank 3 of 4 never arrived within the rendezvous timeout of 20 s. 3 rank(s) arrived." in line, line
        assert "expected on" not in line, line
    print("FIGURE missing rank on 2+1+1: " + lines[0][:400])


# --- the simulated Slurm cluster -----------------------------------------------------------------------------------


def _srun(cluster: SlurmCluster, out: Path, srun_args: list[str], command: list[str]) -> list[dict]:
    out.mkdir()
    completed = cluster.run(["srun", *srun_args, *probe_command(out, command)], timeout=JOB_TIMEOUT)
    records = read_probes(out)
    assert records, completed.stdout[-2000:] + completed.stderr[-4000:]
    return records


SRUN_CASES = [
    # (api and namespace, distribution): the recommended line, the Trainer and Fabric, block and cyclic, each once;
    # every namespace trains on an uneven launch under mpirun above.
    ("lightning.pytorch", "block"),
    ("lightning_fabric", "cyclic"),
]


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.parametrize(("namespace", "distribution"), SRUN_CASES)
def test_srun_three_tasks_on_two_nodes_train_as_one_process(slurm_cluster, tmp_path, namespace, distribution):
    # `srun --nodes=2 --ntasks=3` without --ntasks-per-node: Slurm exports no SLURM_NTASKS_PER_NODE. The recommended
    # line passes the strategy object, which brings its own cluster environment: Lightning makes no SLURMEnvironment,
    # which would refuse `--ntasks` while it is made (by name, `strategy="ddp_mpi"`, it does: docs/lightning.md).
    command = [sys.executable, str(JOB), "--namespace", namespace, "--length", str(LENGTH)]
    command += ["--batch", str(BATCH), "--steps", str(STEPS), "--recommended"]
    srun_args = ["--nodes=2", "--ntasks=3", f"--distribution={distribution}"]
    records = _srun(slurm_cluster, tmp_path / "probes", srun_args, command)
    for record in records:
        assert record["returncode"] == 0, record["stderr"][-4000:]
        assert record["launcher"]["SLURM_STEP_TASKS_PER_NODE"] == "2,1"
        assert "SLURM_NTASKS_PER_NODE" not in record["launcher"]
    results = sorted(printed_results(records), key=lambda r: r["global_rank"])
    first, second = slurm_cluster.hosts[:2]
    # block: ranks 0 and 1 on the first node; cyclic: dealt in turn, ranks 0 and 2 there.
    placed = [first, first, second] if distribution == "block" else [first, second, first]
    api = "Fabric" if "fabric" in namespace else "Trainer"
    difference = assert_trained_as_one_process(results, placed, api)
    assert_strategy(results, namespace, "recommended")
    print(f"FIGURE srun {' '.join(srun_args)} {namespace}: max |weights - reference| = {difference:.3g}")


@pytest.mark.mpi
@pytest.mark.slurm
def test_srun_heterogeneous_step_trains_as_one_process(slurm_cluster, tmp_path):
    # One step over both components of a heterogeneous job (https://slurm.schedmd.com/heterogeneous_jobs.html),
    # "combined into one MPI_COMM_WORLD with non-overlapping task IDs". Slurm exports the step's whole layout
    # (SLURM_PROCID 0-2, SLURM_NTASKS=3, SLURM_STEP_TASKS_PER_NODE) beside SLURM_HET_SIZE (Debian's Slurm also
    # SLURM_PACK_SIZE and SLURM_*_PACK_GROUP_<n>, the older names). `salloc -N1 -n2 -w node2 : -N1 -n1 -w node1 srun
    # --het-group=0,1 ...` asks for the allocation first, component 0 (ranks 0-1) on the second host: srun sorts the
    # step's nodes by name, so the first host it lists runs rank 2, and SLURM_NODEID counts component 0's node as 0.
    # (`srun -N1 -n2 ... : -N1 -n1 ...`, which makes the job and its step at once, exports the same variables.)
    out = tmp_path / "probes"
    out.mkdir()
    job = [sys.executable, str(JOB), "--length", str(LENGTH), "--batch", str(BATCH), "--steps", str(STEPS)]
    command = probe_command(out, [*job, "--recommended"])
    first, second = slurm_cluster.hosts[:2]
    heads = ["salloc", "-N1", "-n2", "-w", second, ":", "-N1", "-n1", "-w", first]
    argv, placed = [*heads, "srun", "--het-group=0,1", *command], [second, second, first]
    # The job script names rank 0's host, as the core requires of a heterogeneous step.
    completed = slurm_cluster.run(argv, timeout=JOB_TIMEOUT, env={"MASTER_ADDR": placed[0]})
    records = read_probes(out)
    assert len(records) == 3, completed.stdout[-2000:] + completed.stderr[-4000:]
    for record in records:
        assert record["returncode"] == 0, record["stderr"][-4000:]
        said = record["launcher"]
        assert (said["SLURM_HET_SIZE"], said["SLURM_NTASKS"]) == ("2", "3"), said
        # The step's counts, as srun lists them: by node name.
        assert said["SLURM_STEP_TASKS_PER_NODE"] == "1,2", said
    results = sorted(printed_results(records), key=lambda r: r["global_rank"])
    difference = assert_trained_as_one_process(results, placed, "Trainer")
    launch = " ".join(argv[: argv.index(command[0])])
    print(f"FIGURE {launch} (heterogeneous): max |weights - reference| = {difference:.3g}")


@pytest.mark.mpi
@pytest.mark.slurm
def test_srun_uneven_step_with_the_plugin_names_ddp_mpi_on_every_task(slurm_cluster, tmp_path):
    # srun waits for every task: each one stops by itself, with the same diagnosis (Slurm exports every node's count).
    command = [sys.executable, str(JOB), "--strategy", "plugin"]
    records = _srun(slurm_cluster, tmp_path / "probes", ["-N2", "-n3", "--ntasks-per-node=2"], command)
    assert len(records) == 3
    for record in records:
        assert record["returncode"] != 0
        assert "RESULT" not in record["stdout"]
        assert "Slurm srun placed ranks unevenly" in record["stderr"], record["stderr"][-3000:]
        assert 'Use strategy="ddp_mpi"' in record["stderr"]
        # Even launches that fit these 2 nodes, in srun's words.
        assert "`srun --ntasks=4 --ntasks-per-node=2` or `srun --ntasks=2 --ntasks-per-node=1`" in record["stderr"]
