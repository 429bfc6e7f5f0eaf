"""A real two-node Slurm cluster (``node1``, ``node2``) on this machine: ``srun``, and ``mpirun`` in a batch job.

Every task runs ``lightning-mpi-env show --json`` under a probe that records, beside its output, the task's own
variables and the host name it really ran on (:func:`tests.clusters.hydra.probe`): under ``srun``, Slurm's
``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID`` are the truth; under ``mpirun``, Open MPI's. The cluster starts
once per session (``slurm_cluster``, ~1 s; it installs Slurm and MUNGE with apt-get as root when they are missing).
Each task writes its own file: srun forwards task output in 1 KiB chunks, which interleave between tasks.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_mpi_env.core.ports import derive_port
from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.supervise.records import read_records
from lightning_mpi_env.tools.simcluster import find_mpirun, session_dir_arguments
from tests.clusters.fixtures import real_launch_lock
from tests.clusters.hydra import launcher_truth, printed_results, probe_command, read_probes, shown
from tests.clusters.lanes import SLURM_LANE
from tests.clusters.slurm import SlurmCluster
from tests.conftest import TRAINER_JOB
from tests.tools.test_simcluster import SAMPLES, assert_trained_as_one_job

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

CONSOLE_SCRIPT = Path(sys.executable).parent / "lightning-mpi-env"
SHOW = [str(CONSOLE_SCRIPT), "show", "--json"]
TIMEOUT = 120
LIGHTNING_TIMEOUT = 300  # four Lightning processes on two (maybe busy) cores
SRUN_TRUTH = {"rank": "SLURM_PROCID", "world_size": "SLURM_NTASKS", "local_rank": "SLURM_LOCALID"}
OPEN_MPI_TRUTH = {
    "rank": "OMPI_COMM_WORLD_RANK",
    "world_size": "OMPI_COMM_WORLD_SIZE",
    "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
}


def srun_probed(cluster: SlurmCluster, out: Path, srun_args: list[str], command: list[str], timeout: float) -> list:
    out.mkdir()
    completed = cluster.run(["srun", *srun_args, *probe_command(out, command)], timeout=timeout)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    records = read_probes(out)
    for record in records:
        assert record["returncode"] == 0, record["stderr"][-4000:]
    return records


def assert_resolved_as_launched(records: list[dict], truth: list[dict]) -> None:
    """Every rank resolved the launcher's truth, rank 0's host as the main address and one port on all ranks."""
    resolved = shown(records)
    assert [{name: row[name] for name in truth[0]} for row in resolved] == truth
    assert {row["main_address"] for row in resolved} == {truth[0]["host"]}
    assert len({row["main_port"] for row in resolved}) == 1


# --- srun ---------------------------------------------------------------------------------------------------------

PLACEMENTS = {
    "block": ["-N2", "--ntasks-per-node=2"],
    "cyclic": ["-N2", "--ntasks-per-node=2", "-m", "cyclic"],
    "uneven": ["-N2", "-n3"],
}


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_srun_show_resolves_what_slurm_says(slurm_cluster: SlurmCluster, placement: str, tmp_path: Path):
    records = srun_probed(slurm_cluster, tmp_path / "probes", PLACEMENTS[placement], SHOW, TIMEOUT)
    truth = launcher_truth(records, slurm_cluster.hosts, **SRUN_TRUTH)
    said = {int(record["launcher"]["SLURM_PROCID"]): record["launcher"] for record in records}
    # Slurm's node index is the host's place in the job's node list: both say the same.
    assert [int(said[row["global_rank"]]["SLURM_NODEID"]) for row in truth] == [row["node_rank"] for row in truth]
    # The launch is what the test claims (not asserting who reports first, only where each rank ran).
    expected_nodes = {"block": [0, 0, 1, 1], "cyclic": [0, 1, 0, 1], "uneven": [0, 0, 1]}[placement]
    assert [row["node_rank"] for row in truth] == expected_nodes
    assert_resolved_as_launched(records, truth)
    resolved = shown(records)
    assert {(row["launcher"], row["placement"]) for row in resolved} == {("slurm", "launcher")}
    step = said[0]["SLURM_JOB_ID"], said[0]["SLURM_STEP_ID"]
    assert {(row["main_port"], row["sources"]["main_port"]) for row in resolved} == {
        (derive_port("/".join(step)), "derived from SLURM_JOB_ID+SLURM_STEP_ID")
    }


def run_lightning_under_srun(
    cluster: SlurmCluster, out: Path, strategy: str, placement: str = "block"
) -> tuple[list[dict], list[dict]]:
    command = [sys.executable, str(TRAINER_JOB), "--samples", str(SAMPLES), "--strategy", strategy]
    if strategy == "ddp_mpi":
        command.append("--zero-config")  # no devices/num_nodes: ddp_mpi takes them from the step
    records = srun_probed(cluster, out, PLACEMENTS[placement], command, LIGHTNING_TIMEOUT)
    results = printed_results(records)
    return records, results


@pytest.mark.parametrize(
    ("strategy", "placement"),
    [("ddp", "block"), ("ddp_mpi", "block"), pytest.param("ddp_mpi", "cyclic", marks=pytest.mark.smoke)],
)
def test_srun_trains_lightning_on_two_nodes(slurm_cluster: SlurmCluster, strategy: str, placement: str, tmp_path: Path):
    # "ddp": DDPStrategy with MPIClusterEnvironment (devices=2, num_nodes=2); "ddp_mpi": the package's strategy with
    # its roll call and no devices/num_nodes at all. No MASTER_ADDR/MASTER_PORT: the step's nodes and job id give them.
    records, results = run_lightning_under_srun(slurm_cluster, tmp_path / "probes", strategy, placement)
    assert_trained_as_one_job(results, slurm_cluster, per_node=2)
    truth = launcher_truth(records, slurm_cluster.hosts, **SRUN_TRUTH)
    assert sorted((r["global_rank"], r["local_rank"], r["node_rank"], r["hostname"]) for r in results) == [
        (row["global_rank"], row["local_rank"], row["node_rank"], row["host"]) for row in truth
    ]
    expected = "MPIDDPStrategy" if strategy == "ddp_mpi" else "DDPStrategy"
    assert {r["strategy"] for r in results} == {expected}


# --- mpirun inside an allocation ----------------------------------------------------------------------------------


def mpirun_command(out: Path, command: list[str]) -> list[str]:
    """Open MPI's ``mpirun`` from this venv, with no host list: it takes the allocation's nodes from Slurm.

    Its session directories go to ``out`` rather than the simulated nodes' shared ``/tmp`` (see ``simcluster``).
    """
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [find_mpirun(), *root, *session_dir_arguments(out / "prte"), *probe_command(out, command)]


@pytest.fixture(scope="module")
def batch_job(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``sbatch -N2 --ntasks-per-node=2`` job: the batch script runs ``show`` and ``doctor`` itself, then
    ``mpirun`` runs ``show`` in 4 ranks. Its directory holds the records: ``script/``, ``doctor/``, ``ranks/``."""
    out = tmp_path_factory.mktemp("sbatch")
    for sub in ("script", "doctor", "ranks"):
        (out / sub).mkdir()
    lines = [
        probe_command(out / "script", SHOW),
        probe_command(out / "doctor", [str(CONSOLE_SCRIPT), "doctor"]),
        mpirun_command(out / "ranks", SHOW),
    ]
    script = "#!/bin/bash\nset -e\n" + "".join(" ".join(f"'{arg}'" for arg in line) + "\n" for line in lines)
    with real_launch_lock(SLURM_LANE):  # a module's fixture runs before the tests' own hold of the lock
        job = slurm_cluster.sbatch(script, ["--nodes=2", "--ntasks-per-node=2"])
        state = slurm_cluster.wait(job, timeout=TIMEOUT)
    assert state == "COMPLETED", slurm_cluster.output(job)[-4000:]
    return out


def test_batch_script_is_not_a_launch(batch_job: Path):
    [record] = read_probes(batch_job / "script")
    # The batch script inherits SLURM_PROCID=0 of a 4-task job, but no job step: it is one process.
    assert (record["launcher"]["SLURM_PROCID"], record["launcher"]["SLURM_NTASKS"]) == ("0", "4")
    assert "SLURM_STEP_ID" not in record["launcher"]
    [row] = shown([record])
    assert (row["launcher"], row["placement"], row["world_size"], row["global_rank"]) == (None, "single", 1, 0)
    assert row["host"] == "node1"


def test_doctor_in_batch_script_names_the_inherited_rank_variables(batch_job: Path):
    [record] = read_probes(batch_job / "doctor")
    assert record["returncode"] == 0, record["stdout"] + record["stderr"]
    assert "[info] launcher: no launcher detected: this is a single process." in record["stdout"]
    inherited = "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID alone is inherited from a batch script"
    assert inherited in " ".join(record["stdout"].split())  # a finding over 120 characters goes on in its next lines


def assert_open_mpi_resolved_as_launched(records: list[dict], cluster: SlurmCluster) -> None:
    """Open MPI's truth on every rank; the job's first node and one port, from mpirun's PMIx namespace, on all."""
    truth = launcher_truth(records, cluster.hosts, **OPEN_MPI_TRUTH)
    assert [row["global_rank"] for row in truth] == [0, 1, 2, 3]
    assert_resolved_as_launched(records, truth)
    resolved = shown(records)
    assert {(row["launcher"], row["main_address"]) for row in resolved} == {("openmpi", cluster.hosts[0])}
    [namespace] = {record["launcher"]["PMIX_NAMESPACE"] for record in records}
    assert {row["main_port"] for row in resolved} == {derive_port(namespace)}


def test_mpirun_in_sbatch_ignores_the_inherited_slurm_variables(slurm_cluster: SlurmCluster, batch_job: Path):
    records = read_probes(batch_job / "ranks")
    # The trap: node1's ranks inherit the batch script's SLURM_PROCID=0 (no step); node2's the job step of the daemon
    # srun started there: SLURM_PROCID=0 again, a SLURM_STEP_ID and a node2-only SLURM_STEP_NODELIST.
    said = [record["launcher"] for record in records]
    assert {(env["hostname"], env["SLURM_PROCID"], env.get("SLURM_STEP_NODELIST")) for env in said} == {
        ("node1", "0", None),
        ("node2", "0", "node2"),
    }
    assert_open_mpi_resolved_as_launched(records, slurm_cluster)


def test_mpirun_in_salloc_ignores_the_inherited_slurm_variables(slurm_cluster: SlurmCluster, tmp_path: Path):
    out = tmp_path / "ranks"
    out.mkdir()
    # salloc runs mpirun here, outside the allocation's nodes: Open MPI starts its daemons on both with srun.
    completed = slurm_cluster.run(["salloc", "-N2", "--ntasks-per-node=2", *mpirun_command(out, SHOW)], timeout=TIMEOUT)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    records = read_probes(out)
    # Every rank inherits the job step of the daemon srun started on its node: SLURM_PROCID 0 on node1, 1 on node2.
    said = [record["launcher"] for record in records]
    assert {(env["hostname"], env["SLURM_PROCID"], env["SLURM_NTASKS"], env["SLURM_STEP_ID"]) for env in said} == {
        ("node1", "0", "2", "0"),
        ("node2", "1", "2", "0"),
    }
    assert_open_mpi_resolved_as_launched(records, slurm_cluster)


# --- a frozen rank under srun's defaults ----------------------------------------------------------------------------

FABRIC_FREEZE = Path(__file__).parent / "jobs" / "fabric_freeze.py"
STALL_TIMEOUT = 10


@dataclasses.dataclass(frozen=True)
class FreezeRun:
    """One ``srun`` of :data:`FABRIC_FREEZE` on two nodes whose rank 3 froze, and what it printed."""

    done: subprocess.CompletedProcess[str]
    tag: str
    frozen_at: float
    ended: float
    job_id: str
    shown_lines: list[str]

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr


def run_freeze(cluster: SlurmCluster, tmp_path: Path, variables: dict[str, str]) -> FreezeRun:
    """Rank 3 of 4 (node2) freezes at step 10 under ``srun``'s defaults; the job ended, every rank named rank 3."""
    tag = f"freeze-{tmp_path.name}"
    command = [sys.executable, str(FABRIC_FREEZE), "--strategy", "ddp_mpi", "--freeze", "3:10", "--tag", tag]
    variables = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT), **variables}
    done = cluster.run(["srun", *PLACEMENTS["block"], *command], timeout=LIGHTNING_TIMEOUT, env=variables)
    ended = time.time()
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "DONE rank=" not in output, output[-4000:]
    (frozen_at,) = [float(line.rsplit("time=", 1)[1]) for line in done.stdout.splitlines() if "FREEZE rank=3" in line]
    shown_lines = [line for line in done.stderr.splitlines() if line.startswith("StallError: rank ")]
    assert shown_lines, output[-4000:]
    for line in shown_lines:
        assert "Rank 3 stalled: " in line, output[-4000:]
        assert "rank 3 on node2, frozen: its watchdog last reported " in line, output[-4000:]
    assert "lightning-mpi-env: rank 0 ends the job step: scancel --signal=KILL " in done.stderr, output[-4000:]
    (step,) = [line.split("id=", 1)[1] for line in done.stdout.splitlines() if line.startswith("JOB id=")]
    return FreezeRun(done, tag, frozen_at, ended, step.split(".")[0], shown_lines)


def test_srun_ends_a_job_with_a_frozen_rank(slurm_cluster: SlurmCluster, tmp_path: Path):
    # srun waits for every task by default (--kill-on-bad-exit=0): the ranks that name the frozen one exit 1, and
    # srun would wait for it until the time limit. Rank 0 ends the step with `scancel --signal=KILL JOB.STEP` once
    # every rank showed the verdict: the job ends non-zero, and no process of it is left. With a state folder (as
    # `lightning-mpi-env run` gives its step), rank 0 records the frozen rank by Slurm's node name, which the
    # relaunch's `srun --exclude` takes.
    state = tmp_path / "state"
    run = run_freeze(slurm_cluster, tmp_path, {"LIGHTNING_MPI_ENV_STATE_DIR": str(state)})
    assert "could not end the job step" not in run.output, run.output[-4000:]
    # Nothing of the job is left: no process with its tag, and Slurm holds no running step of it.
    left = subprocess.run(["pgrep", "-f", run.tag], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    # srun's own allocation ends with it (COMPLETING a moment, while slurmd runs its epilog).
    assert slurm_cluster.wait(run.job_id, timeout=60) in ("FAILED", "CANCELLED", "COMPLETED")
    (record,) = read_records(str(state))
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.FROZEN, (3,), ("node2",)), record
    assert record.job_id == run.job_id, record  # SLURM_JOB_ID: the state folder's key
    assert record.launcher == "Slurm srun", record
    assert record.written_by == 0, record
    took = run.ended - run.frozen_at
    print(f"FIGURE srun, ddp_mpi, timeout {STALL_TIMEOUT} s: srun returned {took:.1f} s after the freeze")
    print(f"VERDICT {run.shown_lines[0][:500]}")


def scancel_stand_in(directory: Path, calls: Path, real: str) -> Path:
    """A ``scancel`` that loses the first request to end the step, and kills the rank that sent it.

    It stands in for the field failure: rank 0 ran ``scancel --signal=KILL JOB.STEP`` and was killed by it (its own
    node got the ``KILL``) while node2's slurmd lost the message, so the frozen task lived and ``srun`` waited for
    it. The first call passes nothing on and sends its caller ``SIGKILL``; every later one runs ``real``. Each call
    adds a line to ``calls``: ``dropped`` or ``real``, and the caller's rank, host and process id.
    """
    directory.mkdir()
    script = directory / "scancel"
    script.write_text(
        "#!/bin/sh\n"
        f"calls='{calls}'\n"
        'who="rank=$SLURM_PROCID host=$(hostname) caller=$PPID"\n'
        'if mkdir "$calls.first" 2>/dev/null; then\n'  # atomic: one call only is the first
        '    echo "dropped $who" >> "$calls"\n'
        "    kill -KILL $PPID\n"
        "    exit 0\n"
        "fi\n"
        'echo "real $who" >> "$calls"\n'
        f"exec '{real}' \"$@\"\n"
    )
    script.chmod(0o755)
    return directory


def test_srun_ends_a_job_whose_kill_was_lost_and_whose_sender_it_killed(slurm_cluster: SlurmCluster, tmp_path: Path):
    # Rank 0's request to end the step kills rank 0 and reaches no other node. The ranks still alive ask again (each
    # after a wait that a KILL delivered would never let it live to see), and the step ends within the bound.
    real = shutil.which("scancel", path=slurm_cluster.env["PATH"])
    assert real is not None
    calls = tmp_path / "calls"
    stand_in = scancel_stand_in(tmp_path / "bin", calls, real)
    path = f"{stand_in}{os.pathsep}{slurm_cluster.env['PATH']}"  # first on PATH, passed to every task by srun
    run = run_freeze(slurm_cluster, tmp_path, {"PATH": path})
    lines = calls.read_text().splitlines()
    dropped, *later = (dict(part.split("=", 1) for part in line.split()[1:]) for line in lines)
    assert lines[0].startswith("dropped "), lines
    assert dropped["rank"] == "0", lines
    assert all(line.startswith("real ") for line in lines[1:]), lines
    assert any(call["rank"] != "0" and call["caller"] != dropped["caller"] for call in later), lines
    assert _gone(run.tag), subprocess.run(["pgrep", "-af", run.tag], capture_output=True, text=True).stdout
    assert slurm_cluster.wait(run.job_id, timeout=60) in ("FAILED", "CANCELLED", "COMPLETED")
    assert "the job step still runs " not in run.output, run.output[-4000:]
    took = run.ended - run.frozen_at
    assert took <= STALL_TIMEOUT + 30, (took, lines, run.output[-4000:])  # the verdict, then 30 s at most
    print(
        f"FIGURE srun, ddp_mpi, timeout {STALL_TIMEOUT} s, the first scancel lost and its sender killed: srun "
        f"returned {took:.1f} s after the freeze; requests: {', '.join(line.split(' host=')[0] for line in lines)}"
    )


# --- a rank that blocks before its first step, a rank that never starts --------------------------------------------

TAMPER = TRAINER_JOB.parent / "tamper.py"
ROLL_CALL_TIMEOUT = 20
GONE_LIMIT = 60
"""Seconds a test waits at most for the processes of an ended step to go (a bound on a hang, not a guess)."""


def _gone(tag: str) -> bool:
    """Whether every process whose command line holds ``tag`` is gone, waiting for it up to :data:`GONE_LIMIT`."""
    deadline = time.monotonic() + GONE_LIMIT
    while subprocess.run(["pgrep", "-f", tag], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_srun_names_a_rank_blocked_before_its_first_step_and_ends_the_step(slurm_cluster: SlurmCluster, tmp_path: Path):
    # The Trainer as users write it (data loader workers, a validation loop, a ModelCheckpoint): rank 3's first batch
    # never comes, and the others wait for it in a collective after the sanity check, with more progress marks
    # than rank 3. Every rank names rank 3 with its host, and rank 0 ends the step srun would keep up for it.
    tag = f"blocked-{tmp_path.name}"
    job = [str(TRAINER_JOB), "--samples", str(SAMPLES), "--workers", "2", "--validate", "--root-dir", str(tmp_path)]
    command = [sys.executable, str(TAMPER), "--rank", "3", "--block", "loader", "--", sys.executable, *job]
    variables = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT)}
    started = time.time()
    done = slurm_cluster.run(
        ["srun", *PLACEMENTS["block"], *command, "--tag", tag], timeout=LIGHTNING_TIMEOUT, env=variables
    )
    ended = time.time()
    took = ended - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "RESULT" not in output, output[-4000:]
    assert "BLOCK: rank 3 blocks in loader " in done.stdout, output[-4000:]
    shown_lines = [line for line in done.stderr.splitlines() if line.startswith("StallError: rank ")]
    assert shown_lines, output[-4000:]
    for line in shown_lines:
        assert f"Rank 3 stalled: no rank made progress for {STALL_TIMEOUT} s while ranks 0-2 wait for it " in line
        assert " wait for it before the first step. " in line, output[-4000:]
        assert "rank 3 on node2 at no step yet (before its first step), alive, main thread at " in line, output[-4000:]
    assert "lightning-mpi-env: rank 0 ends the job step: scancel --signal=KILL " in done.stderr, output[-4000:]
    # Not asserted here: that no process is left. Rank 3's data loader worker, blocked too and orphaned when the
    # step's SIGKILL ends its rank, outlived srun by a minute on this cluster (proctrack/linuxproc).
    blocked_at = min(
        float(line.rsplit("time=", 1)[1]) for line in done.stdout.splitlines() if line.startswith("BLOCK: rank 3 ")
    )
    print(
        f"FIGURE srun, trainer, block before the first step, timeout {STALL_TIMEOUT} s: srun returned {took:.1f} s "
        f"after its start, {ended - blocked_at:.1f} s after the block"
    )
    print(f"VERDICT {shown_lines[0][:600]}")


def run_never_started(
    slurm_cluster: SlurmCluster, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[str, str, float]:
    """A 4-rank ``srun`` job whose rank 3 never starts its program: its output, its tag, and srun's time.

    Every rank that came names rank 3 and rank 0 ends the step, which srun would otherwise hold for rank 3.
    """
    tag = f"never-{tmp_path.name}"
    job = [str(TRAINER_JOB), "--samples", str(SAMPLES), "--strategy", "ddp_mpi", "--zero-config", "--tag", tag]
    command = [sys.executable, str(TAMPER), "--rank", "3", "--never-start", "--", sys.executable, *job]
    variables = {"LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(ROLL_CALL_TIMEOUT), **(env or {})}
    started = time.time()
    done = slurm_cluster.run(["srun", *PLACEMENTS["block"], *command], timeout=LIGHTNING_TIMEOUT, env=variables)
    took = time.time() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "TAMPER: rank 3 never starts its program" in done.stdout, output[-4000:]
    shown_lines = [line for line in done.stderr.splitlines() if line.startswith("RendezvousError: rank ")]
    assert shown_lines, output[-4000:]
    for line in shown_lines:
        assert f"Rank 3 of 4 never arrived within the rendezvous timeout of {ROLL_CALL_TIMEOUT} s" in line, output[
            -4000:
        ]
    assert "lightning-mpi-env: rank 0 ends the job step: scancel --signal=KILL " in done.stderr, output[-4000:]
    assert _gone(tag), subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True).stdout
    return output, tag, took


def test_srun_ends_the_step_after_the_roll_call_names_a_rank_that_never_started(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    # srun waits for every task by default: a rank that never started its program (here: tamper.py stops it before
    # it starts) is named by the roll call on every rank that came, and rank 0 then ends the step.
    output, _, took = run_never_started(slurm_cluster, tmp_path)
    assert "could not end the job step" not in output, output[-4000:]
    print(f"FIGURE srun, a rank that never starts, roll call timeout {ROLL_CALL_TIMEOUT} s: srun returned {took:.1f} s")


def test_srun_ends_the_step_after_a_failed_roll_call_whose_kill_was_lost_and_whose_sender_it_killed(
    slurm_cluster: SlurmCluster, tmp_path: Path
):
    # Rank 0's request to end the step kills rank 0 and reaches no other node: the ranks that came, still alive at
    # their exit, ask again, and the step ends instead of waiting for rank 3 until its time limit.
    real = shutil.which("scancel", path=slurm_cluster.env["PATH"])
    assert real is not None
    calls = tmp_path / "calls"
    stand_in = scancel_stand_in(tmp_path / "bin", calls, real)
    output, _, took = run_never_started(
        slurm_cluster, tmp_path, {"PATH": f"{stand_in}{os.pathsep}{slurm_cluster.env['PATH']}"}
    )
    lines = calls.read_text().splitlines()
    dropped, *later = (dict(part.split("=", 1) for part in line.split()[1:]) for line in lines)
    assert lines[0].startswith("dropped "), lines
    assert dropped["rank"] == "0", lines
    assert later, lines
    assert all(line.startswith("real ") for line in lines[1:]), lines
    assert any(call["rank"] != "0" for call in later), lines
    assert "the job step still runs " not in output, output[-4000:]
    print(
        f"FIGURE srun, a rank that never starts, the first scancel lost and its sender killed: srun returned "
        f"{took:.1f} s; requests: {', '.join(line.split(' host=')[0] for line in lines)}"
    )
