"""Fail fast on every launch path: real mpirun jobs on two simulated nodes, with a fault injected into one rank.

Trainer and Fabric, each with ``plugins=[MPIClusterEnvironment()]`` (strategy ``ddp``) and with ``strategy="ddp_mpi"``:
a missing, a duplicate or a disagreeing rank ends the whole job with the named error on the first screen, one line
per process, no traceback. Ranks race to report: no assertion depends on which rank or host reports first.
"""

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from lightning_mpi_env.core.records import FailureKind
from lightning_mpi_env.supervise.records import read_records
from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.conftest import INSTRUMENTED, JOBS, TAMPER, TRAINER_JOB, start_gate

FABRIC_JOB = INSTRUMENTED / "fabric_job.py"
HOSTS = ("127.0.0.2", "127.0.0.3")
BLOCK = {0: HOSTS[0], 1: HOSTS[0], 2: HOSTS[1], 3: HOSTS[1]}  # mpirun --map-by slot, 2 slots per host
SAMPLES = 64
ROLL_CALL_TIMEOUT = 20
"""A missing rank's case waits this long. The ranks start their fit together (``start_gate``): their imports alone
ended up to 23 s apart on a loaded machine, and a rank then named rank 0 as never answering."""
JOB_TIMEOUT = ROLL_CALL_TIMEOUT + 130  # the only time bound: the start of 4 ranks on a loaded machine takes most
FIRST_SCREEN = 30
PACKAGE_FRAME = re.compile(r'File "[^"]*lightning_mpi_env/')
OPEN_MPI_NOISE = re.compile(r"^\[[^\]]+:\d+\] plm:")  # "[vm:1307] plm:ssh: Warning: setpgid(...)", now and then

# The four launch paths: (job, strategy, who the messages say takes devices/num_nodes). "ddp":
# plugins=[MPIClusterEnvironment()], which is never told whether a Trainer or a Fabric holds it.
PATHS = {
    "trainer-plugin": (TRAINER_JOB, "ddp", "Trainer/Fabric"),
    "fabric-plugin": (FABRIC_JOB, "ddp", "Trainer/Fabric"),
    "trainer-ddp_mpi": (TRAINER_JOB, "ddp_mpi", "Trainer"),
    "fabric-ddp_mpi": (FABRIC_JOB, "ddp_mpi", "Fabric"),
}
# Rank 3 is tampered with (tamper.py). Each fault: tamper.py's option, the error's class, and pieces of the error that
# hold whichever rank reports it. With the plugin, a rank that claims another world size stops by itself before the
# roll call, as devices x num_nodes cannot fit it; under "ddp_mpi" the roll call names it (DDP_MPI_FAULTS).
FAULTS = {
    "missing": (
        ["--exit"],
        "RendezvousError",
        [
            # Rank 3 is named on every line. On a loaded machine a rank still importing torch when the timeout ends
            # is named beside it ("Ranks 1, 3 of 4 ... they were expected on node 0 (host 127.0.0.2): rank 1; on
            # node 1 ..."): true of it too, and not what this test is about.
            re.compile(
                rf"Ranks? (\d+, )*3 of 4 never arrived within the rendezvous timeout of {ROLL_CALL_TIMEOUT} s; "
                r"(it was|they were) expected on (.*; on )?node 1 \(host 127\.0\.0\.3\)"
            ),
            "HINT: Likely causes: MASTER_ADDR/MASTER_PORT differ",
        ],
    ),
    "duplicate": (
        ["--claim", "1"],
        "RendezvousError",
        ["Duplicate rank 1: it is claimed by host 127.0.0.", "HINT: The launcher's rank variables were overridden"],
    ),
    "world-size": (
        ["--world-size", "5"],
        "LayoutError",
        [
            "LayoutError: rank 3 on 127.0.0.3: ",
            "this node runs OMPI_COMM_WORLD_LOCAL_SIZE=2 of 5 ranks",
            "{owner}(devices=2, num_nodes=2)",
            'HINT: Use strategy="ddp_mpi"',
        ],
    ),
}
# "ddp_mpi" takes any layout, so a rank that claims another world size is no uneven launch to it: the roll call,
# which compares every rank's claim with rank 0's, names the disagreement on every rank.
DDP_MPI_FAULTS = {
    "world-size": (
        "RendezvousError",
        [
            "Rank 3 on host 127.0.0.3",
            "expects world size 5 (rank 0 says 4)",
            "HINT: Start every rank with one launcher command",
        ],
    ),
}


@dataclass(frozen=True)
class Job:
    """A finished mpirun job: its exit status and its output lines, stdout and stderr in the order they came."""

    returncode: int
    lines: tuple[tuple[float, str, str], ...]
    """``(seconds since the start, stream, line)``; ``stream`` is ``"stdout"`` or ``"stderr"``."""

    @property
    def output(self) -> list[str]:
        """Both streams together, as a terminal shows them."""
        return [line for _, _, line in self.lines]

    @property
    def stderr(self) -> list[str]:
        return [line for _, stream, line in self.lines if stream == "stderr"]

    @property
    def text(self) -> str:
        return "".join(self.output)

    def tail(self) -> str:
        """The end of the output, each line with its time and stream: what a failed assertion shows."""
        return "".join(f"{seconds:6.1f} {stream[3:]} {line[:400]}" for seconds, stream, line in self.lines[-40:])


def _run(cluster: SimulatedCluster, command: list[str], limit: float = JOB_TIMEOUT, **variables: str) -> Job:
    """Run ``python command`` on 4 ranks (2 per host); past ``limit`` seconds, end every process and fail the test.

    A job that sleeps on purpose (slow work) adds those seconds to the limit: the limit only ends a hang.
    """
    export = {
        **cluster.job_environment(),
        # A gate of its own per run (a test may run two jobs on one cluster); rank 3 exits before it with --exit.
        **start_gate(cluster.workdir / f"gate-{uuid.uuid4().hex[:8]}", 3 if "--exit" in command else 4),
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(ROLL_CALL_TIMEOUT),
    }
    process = subprocess.Popen(
        cluster.mpirun([sys.executable, *command], export={**export, **variables}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def read(stream: str) -> None:
        for line in getattr(process, stream):
            with lock:
                lines.append((time.monotonic() - start, stream, line))

    # One reader per stream, appending whole lines as they come: the order a terminal would show them in.
    readers = [threading.Thread(target=read, args=(stream,), daemon=True) for stream in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=limit)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        hung = True
    for reader in readers:
        reader.join(timeout=30)
    job = Job(process.returncode, tuple(lines))
    if hung:
        pytest.fail(f"the job still ran after {limit:g} s:\n{job.tail()}")
    return job


def _command(path: str, *options: str, fault: list[str] | None = None, rank: int = 3) -> list[str]:
    job, strategy, _ = PATHS[path]
    command = [str(job), "--strategy", strategy, "--samples", str(SAMPLES), *options]
    return [str(TAMPER), "--rank", str(rank), *fault, "--", sys.executable, *command] if fault else command


def _results(job: Job) -> list[dict]:
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in job.text.split("RESULT ")[1:]]


def _holds(text: str | re.Pattern[str], line: str) -> bool:
    return text.search(line) is not None if isinstance(text, re.Pattern) else text in line


def _assert_cause_on_first_screen(job: Job, kind: str, expected: list[str | re.Pattern[str]]) -> None:
    """The job failed with ``kind`` named in the first screen, one line per process, without a traceback."""
    assert job.returncode != 0, job.tail()
    assert "RESULT" not in job.text
    # Under a launcher an error of this package is one stderr line, "LayoutError: rank 1 on 127.0.0.3: ...".
    shown = [line for line in job.stderr if line.startswith(f"{kind}: rank ")]
    assert shown, job.tail()
    senders = collections.Counter(line.split(":", 2)[1] for line in shown)  # " rank 1 on 127.0.0.3"
    assert max(senders.values()) == 1, job.tail()  # a duplicate rank 1 runs on both hosts: both may print
    assert len(shown) <= 4, job.tail()
    first = min(job.output.index(line) for line in shown)
    assert first < FIRST_SCREEN, job.tail()
    for text in expected:
        # Every process stops for the same reason.
        assert all(_holds(text, line) for line in shown), f"{text!r} is not in every {kind} line:\n{job.tail()}"
    assert "Traceback (most recent call last)" not in job.text, job.tail()
    assert not PACKAGE_FRAME.search(job.text), job.tail()
    # torch's store client logs two lines each time a wait of its times out: the roll call must not add them.
    assert not [line for line in job.output if "[c10d]" in line], job.tail()


# Each fault on a plugin path and on a ddp_mpi path, each path at least once: the faults differ only in the roll
# call, which tests/rollcall/test_rendezvous.py checks over a real store for every fault; a disagreeing world size
# differs between the plugin (LayoutError before the roll call) and ddp_mpi (the roll call names it).
FAULT_CASES = [
    ("trainer-plugin", "missing"),
    pytest.param("trainer-ddp_mpi", "duplicate", marks=pytest.mark.smoke),
    ("fabric-plugin", "duplicate"),
    ("trainer-plugin", "world-size"),
    ("fabric-ddp_mpi", "world-size"),
]


@pytest.mark.mpi
@pytest.mark.parametrize(("path", "fault"), FAULT_CASES)
def test_fault_ends_the_job_with_the_cause_on_the_first_screen(cluster, path, fault, tmp_path):
    option, kind, expected = FAULTS[fault]
    if PATHS[path][1] == "ddp_mpi" and fault in DDP_MPI_FAULTS:
        kind, expected = DDP_MPI_FAULTS[fault]
    owner = PATHS[path][2]
    # With a state folder (as a supervisor sets it for its step), the rank whose verdict stands records it.
    state = tmp_path / "state"
    job = _run(cluster, _command(path, fault=option), LIGHTNING_MPI_ENV_STATE_DIR=str(state))
    pieces = [text if isinstance(text, re.Pattern) else text.format(owner=owner) for text in expected]
    _assert_cause_on_first_screen(job, kind, pieces)
    if fault == "missing":
        (record,) = read_records(str(state))  # one record, however many ranks reached the verdict
        assert record.kind is FailureKind.MISSING, record
        # On a loaded machine a rank still importing torch may be named beside rank 3 (see FAULTS).
        assert 3 in record.ranks, record
        assert "127.0.0.3" in record.hosts, record
        assert record.blames_hosts
        assert record.launcher == "Open MPI", record
        assert record.step is None  # before training
        assert f"RendezvousError: rank {record.written_by} on " in job.text, job.tail()
        assert record.problem in job.text.replace("\n", " "), job.tail()
    if fault == "duplicate":
        # Both claimants are named, in whichever order they registered.
        pattern = r"claimed by host (\S+) \(pid \d+, local rank 1\) and by host (\S+) \(pid"
        claimants = re.findall(pattern, "".join(job.stderr))
        assert claimants, job.tail()
        assert {frozenset(pair) for pair in claimants} == {frozenset(HOSTS)}


STALL_TIMEOUT = 10
"""The stall watchdog's timeout in these jobs: ten of its report intervals (1 s). A healthy rank behind the others is
seen to move again within one or two, however loaded the machine; only the stalled rank stays behind this long."""


@pytest.mark.mpi
@pytest.mark.parametrize(
    # Each path once; a blocked and a frozen rank each on a plugin and a ddp_mpi path, in the Trainer and in Fabric;
    # each namespace once. The Trainer's progress marks come from the callback of Lightning's `callbacks_factory`
    # entry point (in `pytorch_lightning`, that package's own), Fabric's from the loop.
    ("path", "how", "namespace"),
    [
        ("trainer-plugin", "block", "pytorch_lightning"),
        ("fabric-plugin", "freeze", "lightning_fabric"),
        ("trainer-ddp_mpi", "freeze", "lightning.pytorch"),
        ("fabric-ddp_mpi", "block", "lightning.fabric"),
    ],
)
def test_a_stalled_rank_is_named_while_the_job_runs(cluster, path, how, namespace, tmp_path):
    # Rank 3 stalls in its third training step, alive (it sleeps) or frozen (SIGSTOP); the others wait for it in
    # backward. Every waiting rank names it, with its host and step, and the job ends non-zero; rank 0's watchdog,
    # which judges, records it in the state folder.
    state = tmp_path / "state"
    users = ("--workers", "2", "--validate") if path.startswith("trainer") else ()  # as users write a Trainer job
    job = _run(
        cluster,
        _command(path, "--namespace", namespace, *users, fault=["--stall", f"2:{how}"]),
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
        LIGHTNING_MPI_ENV_STATE_DIR=str(state),
    )
    assert job.returncode != 0, job.tail()
    if how == "freeze":
        (record,) = read_records(str(state))
        assert (record.kind, record.ranks, record.hosts) == (FailureKind.FROZEN, (3,), ("127.0.0.3",)), record
        assert record.step == 2, record  # where ranks 0-2 wait for it
        assert record.written_by == 0, record
        assert "Rank 3 stalled: " in record.problem
    assert "RESULT" not in job.text
    assert f"STALL: rank 3 {'blocks' if how == 'block' else 'freezes'} at step 2\n" in job.output, job.tail()
    shown = [line for line in job.stderr if line.startswith("StallError: rank ")]
    assert shown, job.tail()
    senders = {line.split(":", 2)[1] for line in shown}
    assert senders - {" rank 3 on 127.0.0.3"}, job.tail()  # a waiting rank says it, not only the stalled one
    for line in shown:
        assert "Rank 3 stalled: " in line, job.tail()
        if how == "freeze":  # either rule may see it first: no progress anywhere, or a heartbeat that stopped
            assert "while ranks 0-2 wait for it at step " in line or "while ranks 0-2 still report" in line
            assert "rank 3 on 127.0.0.3, frozen: its watchdog last reported " in line, job.tail()
        else:
            assert f"no rank made progress for {STALL_TIMEOUT} s while ranks 0-2 wait for it at step " in line, (
                job.tail()
            )
            assert "rank 3 on 127.0.0.3 at step " in line, job.tail()
            assert "alive, main thread at " in line, job.tail()
        if how == "block":
            assert "tamper.py:" in line, job.tail()  # where its main thread sleeps, in stall_here()
        assert "HINT: Look at the stalled rank's host" in line
    # A frozen rank is woken by the launcher's SIGTERM once the others ended; in a Trainer, Lightning's own SIGTERM
    # handler then runs a broadcast that finds them gone, and its traceback follows the named error. The waiting
    # ranks, which print the line, print nothing else.
    others = "".join(line for line in job.output if not (how == "freeze" and line.startswith("[rank3]:")))
    assert "Traceback (most recent call last)" not in others, job.tail()
    traceback_at = job.text.find("Traceback")
    assert traceback_at == -1 or job.text.index("StallError: rank ") < traceback_at, job.tail()


FABRIC_BLOCKED = JOBS / "fabric_blocked.py"
# A rank that blocks before its first step, while the others wait for it in a collective after marks it never made.
# The Trainer as users write it (data loader workers, a validation loop, a ModelCheckpoint): rank 3's first batch,
# the sanity check's, never comes; the others mark the sanity check's batches and its end, then wait in Lightning's
# check of the training data loader's length on every rank. Fabric under "ddp_mpi": rank 3 blocks before
# fabric.setup(), the others mark the setup and wait in DDP's first broadcast of the weights. Fabric with the plugin
# marks nothing before its loop's first environment.progress(): that case stays unnamed (docs/roll-call.md).
BLOCKED_JOBS = {
    "trainer-plugin": (["--workers", "2", "--validate"], "loader"),
    "fabric-ddp_mpi": ([str(FABRIC_BLOCKED), "--strategy", "ddp_mpi"], "setup"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("path", list(BLOCKED_JOBS))
def test_a_rank_blocked_before_its_first_step_is_named(cluster, path, tmp_path):
    # Ranks 0-2 made more marks before the first step than rank 3 and wait for it: every rank names rank 3, alive,
    # with its host, and the job ends non-zero; rank 0 records it.
    options, place = BLOCKED_JOBS[path]
    tampered = [str(TAMPER), "--rank", "3", "--block", place, "--", sys.executable]
    if path.startswith("trainer"):
        command = [*tampered, *_command(path, *options, "--root-dir", str(tmp_path))]
    else:
        command = [*tampered, *options]
    state = tmp_path / "state"
    job = _run(
        cluster,
        command,
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
        LIGHTNING_MPI_ENV_STATE_DIR=str(state),
    )
    assert job.returncode != 0, job.tail()
    assert "RESULT" not in job.text, job.tail()
    assert "DONE rank=" not in job.text, job.tail()
    blocked = [seconds for seconds, _, line in job.lines if line.startswith(f"BLOCK: rank 3 blocks in {place} ")]
    assert blocked, job.tail()
    shown = [(seconds, line) for seconds, _, line in job.lines if line.startswith("StallError: rank ")]
    assert shown, job.tail()
    assert {line.split(":", 2)[1] for _, line in shown} - {" rank 3 on 127.0.0.3"}, job.tail()
    for _, line in shown:
        assert f": Rank 3 stalled: no rank made progress for {STALL_TIMEOUT} s while ranks 0-2 wait for it " in line
        assert " wait for it before the first step. " in line, job.tail()
        assert "rank 3 on 127.0.0.3 at no step yet (before its first step), alive, main thread at " in line, job.tail()
        assert "HINT: Look at the stalled rank's host" in line
    (record,) = read_records(str(state))
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.STALLED, (3,), ("127.0.0.3",)), record
    assert record.step is None, record  # no rank made a step
    assert record.written_by == 0, record
    named_after = min(seconds for seconds, _ in shown) - min(blocked)
    print(f"FIGURE {path}, timeout {STALL_TIMEOUT} s: rank 3 named {named_after:.1f} s after it blocked")


@pytest.mark.mpi
def test_a_rank_blocked_in_validation_is_named(cluster, tmp_path):
    # The Trainer as users write it; rank 3's validation step after the first epoch blocks (a data loader worker or
    # file system that hangs in validation). Ranks 0-2 end their validation batches and wait for it in
    # ModelCheckpoint's barrier. Each rank marks its validation's start and the end of its batches, so rank 3 is
    # behind: every rank names it at step 4 (64 samples, 4 ranks, batches of 4), in validation.
    options = ["--workers", "2", "--validate", "--root-dir", str(tmp_path)]
    tampered = [str(TAMPER), "--rank", "3", "--block", "validation", "--", sys.executable]
    state = tmp_path / "state"
    job = _run(
        cluster,
        [*tampered, *_command("trainer-ddp_mpi", *options)],
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
        LIGHTNING_MPI_ENV_STATE_DIR=str(state),
    )
    assert job.returncode != 0, job.tail()
    assert "DONE rank=" not in job.text, job.tail()
    assert any(line.startswith("BLOCK: rank 3 blocks in validation ") for _, _, line in job.lines), job.tail()
    shown = [line for _, _, line in job.lines if line.startswith("StallError: rank ")]
    assert shown, job.tail()
    for line in shown:
        assert f": Rank 3 stalled: no rank made progress for {STALL_TIMEOUT} s while ranks 0-2 wait for it " in line
        assert " wait for it at step 4. " in line, job.tail()
        assert "rank 3 on 127.0.0.3 at step 4 (in validation), alive, main thread at " in line, job.tail()
        assert "tamper.py:" in line, job.tail()  # where its main thread sleeps, in block_here()
    (record,) = read_records(str(state))
    assert (record.kind, record.ranks, record.hosts, record.step) == (FailureKind.STALLED, (3,), ("127.0.0.3",), 4)


FABRIC_FREEZE = JOBS / "fabric_freeze.py"


@pytest.mark.mpi
def test_a_frozen_rank_is_named_in_a_fabric_loop_that_marks_no_progress(cluster):
    # Fabric with the plugin, and a loop that never calls environment.progress(step): the ranks stand level at no
    # mark for ever. Rank 3 freezes at step 10; its heartbeat stops while the others' go on, so it is named frozen.
    job = _run(
        cluster,
        [str(FABRIC_FREEZE), "--strategy", "ddp", "--freeze", "3:10"],
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
    )
    assert job.returncode != 0, job.tail()
    assert "DONE rank=" not in job.text, job.tail()
    (frozen_at,) = [seconds for seconds, _, line in job.lines if line.startswith("FREEZE rank=3 step=10 ")]
    shown = [(seconds, line) for seconds, stream, line in job.lines if line.startswith("StallError: rank ")]
    assert shown, job.tail()
    assert {line.split(":", 2)[1] for _, line in shown} - {" rank 3 on 127.0.0.3"}, job.tail()
    for _, line in shown:
        assert "Rank 3 stalled: its watchdog fell silent " in line, job.tail()
        assert "while ranks 0-2 still report." in line, job.tail()
        assert "rank 3 on 127.0.0.3, frozen: its watchdog last reported " in line, job.tail()
        assert "at no step (the loop marks no progress)" in line, job.tail()
    named_after = min(seconds for seconds, _ in shown) - frozen_at
    ended_after = job.lines[-1][0] - frozen_at
    print(f"FIGURE fabric-plugin, no marks: named {named_after:.1f} s, output ended {ended_after:.1f} s after freeze")


@pytest.mark.mpi
def test_a_frozen_rank_zero_is_named_by_the_others(cluster):
    # Rank 0 hosts the store the watchdogs report to; frozen, it answers no request (the client's own timeout does
    # not end them), so each other rank names the silence after the timeout, and the job ends non-zero.
    job = _run(
        cluster,
        _command("trainer-ddp_mpi", fault=["--stall", "2:freeze"], rank=0),
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
    )
    assert job.returncode != 0, job.tail()
    assert "RESULT" not in job.text
    assert "STALL: rank 0 freezes at step 2\n" in job.output, job.tail()
    shown = [line for line in job.stderr if line.startswith("StallError: rank ")]
    assert shown, job.tail()
    for line in shown:
        assert "Rank 0's store (the main address) has not answered this rank's watchdog for " in line, job.tail()
        assert "HINT: Look at rank 0's host." in line


@pytest.mark.mpi
def test_work_slow_for_every_rank_is_not_a_stall(cluster, tmp_path):
    # Longer than the watchdog's timeout, but for every rank: the Trainer validates after each of 2 epochs (every
    # rank sleeps there) and checkpoints (rank 0 writes slowly while the others wait in Lightning's barrier). The
    # ranks stay level, so the job trains to the end. Each slow part lasts three report intervals past the timeout:
    # a watchdog that did not ask whether the ranks are level would stop the job there. Ranks that reach a slow part
    # apart (a loaded machine) are seen level within an interval or two, a tenth of the timeout (STALL_TIMEOUT).
    # Level ranks in a loop of their own are the same rule, over a real store: test_watchdog.py's
    # test_a_healthy_job_that_pauses_level_never_trips.
    slow = STALL_TIMEOUT + 3
    options = ["--slow-eval", str(slow), "--epochs", "2", "--root-dir", str(tmp_path)]
    sleeps = 5 * slow  # a sanity check, then per epoch a validation and a checkpoint
    job = _run(
        cluster,
        _command("trainer-plugin", "--samples", "32", *options),
        limit=JOB_TIMEOUT + sleeps,
        LIGHTNING_MPI_ENV_STALL_TIMEOUT=str(STALL_TIMEOUT),
    )
    assert job.returncode == 0, job.tail()
    assert len(_results(job)) == 4, job.tail()
    assert "StallError" not in job.text, job.tail()
    # The slow parts did run: a checkpoint per epoch, and validation (+ the sanity check).
    assert job.text.count(f"CHECKPOINT rank=0 for {slow}.0 s") == 2, job.tail()
    assert job.text.count(f"VALIDATE rank=3 for {slow}.0 s") == 3, job.tail()


SAME_RANK_WRAPPER = (
    "import os, sys; os.environ['OMPI_COMM_WORLD_RANK'] = '1'; "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""A wrapper that exports one rank to every process (as ``export OMPI_COMM_WORLD_RANK=1`` in a script would)."""


@pytest.mark.mpi
@pytest.mark.parametrize("path", ["trainer-ddp_mpi", "fabric-plugin"])
def test_every_rank_forced_to_one_rank_is_named_at_once(cluster, path):
    # No process claims rank 0, so none would serve the roll call: each stops before it, naming the override.
    job = _run(cluster, ["-c", SAME_RANK_WRAPPER, *_command(path)])
    assert job.returncode != 0, job.tail()
    assert "RESULT" not in job.text
    shown = [line for line in job.stderr if line.startswith("LayoutError: rank 1 on 127.0.0.")]
    assert 1 <= len(shown) <= 4, job.tail()
    for line in shown:
        assert "OMPI_COMM_WORLD_RANK=1 but PMIX_RANK='" in line, job.tail()
        assert "HINT: A wrapper or job script that exports a rank gives every process the same one" in line
        assert "Do not set OMPI_COMM_WORLD_RANK (or PMIX_RANK) in a wrapper or job script." in line
    assert "never answered" not in job.text, job.tail()
    assert "arrived" not in job.text, job.tail()
    assert "Traceback (most recent call last)" not in job.text, job.tail()


@pytest.mark.mpi
def test_debug_shows_the_traceback(cluster):
    # LIGHTNING_MPI_ENV_DEBUG=1: Python's own traceback, through this package's frames, with the full message.
    job = _run(cluster, _command("trainer-ddp_mpi", fault=["--claim", "1"]), LIGHTNING_MPI_ENV_DEBUG="1")
    assert job.returncode != 0
    assert "RESULT" not in job.text
    assert "Traceback (most recent call last)" in job.text, job.tail()
    assert PACKAGE_FRAME.search(job.text), job.tail()
    assert "lightning_mpi_env.core.errors.RendezvousError: Duplicate rank 1: it is claimed by host" in job.text
    assert not [line for line in job.stderr if line.startswith("RendezvousError: rank ")]


@pytest.mark.mpi
def test_wrong_trainer_devices_is_one_line_per_rank(cluster):
    # 2 nodes x 2 ranks launched, Trainer(devices=4, num_nodes=1): every rank stops when fit() starts. (This job
    # also carries what tests/tools/test_simcluster.py's test_trainer_settings_that_do_not_match_the_launch_fail_at_once
    # checked with the same job: the launch, the Trainer's settings and the fix, naming both Trainer and Fabric.)
    job = _run(cluster, _command("trainer-plugin", "--devices", "4", "--num-nodes", "1"))
    _assert_cause_on_first_screen(
        job,
        "LayoutError",
        [
            "Open MPI launched 4 ranks, 2 per node (2 node(s)",
            "but Trainer/Fabric(devices=4, num_nodes=1) expects 4 ranks, 4 per node.",
            "HINT: If nodes run different numbers of ranks (an uneven launch), no devices/num_nodes fits: use "
            'strategy="ddp_mpi"',
            "If every node runs 2: Trainer/Fabric(devices=2, num_nodes=2)",
        ],
    )


def _assert_fabric_trained(job: Job, path: str, namespace: str) -> None:
    assert job.returncode == 0, job.tail()
    results = _results(job)
    assert sorted(r["global_rank"] for r in results) == [0, 1, 2, 3], job.tail()
    for r in results:
        assert r["world_size"] == 4
        assert r["hostname"] == BLOCK[r["global_rank"]]
        assert r["node_rank"] == HOSTS.index(r["hostname"])
        assert r["local_rank"] == r["global_rank"] % 2
        assert r["rank_sum"] == 0 + 1 + 2 + 3  # all_reduce over the 4 ranks
        assert r["strategy"] == ("MPIDDPStrategy" if path == "fabric-ddp_mpi" else "DDPStrategy")
        assert r["ddp_module"] == f"{namespace}.strategies.ddp"
    # Disjoint shards that cover the data; DDP kept the replicas identical.
    seen = [index for r in results for index in r["seen"]]
    assert sorted(seen) == list(range(SAMPLES))
    assert len({tuple(r["weights"]) for r in results}) == 1


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("path", "namespace"),
    # The fourth, fabric-ddp_mpi in lightning.fabric, trains in test_roll_call_adds_one_line_to_a_healthy_job.
    [
        ("fabric-plugin", "lightning.fabric"),
        ("fabric-plugin", "lightning_fabric"),
        ("fabric-ddp_mpi", "lightning_fabric"),
    ],
)
def test_fabric_trains(cluster, path, namespace):
    _assert_fabric_trained(_run(cluster, _command(path, "--namespace", namespace)), path, namespace)


@pytest.mark.mpi
def test_roll_call_adds_one_line_to_a_healthy_job(cluster, tmp_path):
    # The same job with the roll call off and on: the roll call adds one summary line, on rank 0's stderr.
    # With a state folder, a healthy job writes no failure record.
    state = tmp_path / "state"
    jobs = {
        roll_call: _run(
            cluster,
            _command("fabric-ddp_mpi"),
            LIGHTNING_MPI_ENV_ROLL_CALL=roll_call,
            LIGHTNING_MPI_ENV_STATE_DIR=str(state),
        )
        for roll_call in ("0", "1")
    }
    assert not state.exists()
    for job in jobs.values():
        _assert_fabric_trained(job, "fabric-ddp_mpi", "lightning.fabric")
    lines = {key: [line for line in job.output if not OPEN_MPI_NOISE.match(line)] for key, job in jobs.items()}
    assert len(lines["1"]) <= len(lines["0"]) + 1, (lines["0"], lines["1"])
    added = [line for line in lines["1"] if "roll call" in line]
    summary = "lightning-mpi-env: roll call: all 4 ranks met on 2 host(s) (127.0.0.2: ranks 0-1; 127.0.0.3: ranks 2-3)"
    assert [line.startswith(summary) for line in added] == [True], added
    assert added[0] in jobs["1"].stderr
    assert not [line for line in lines["0"] if "roll call" in line]
