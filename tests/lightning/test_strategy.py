"""MPIDDPStrategy: registration in both namespaces (in subprocesses) and real mpirun jobs on two simulated nodes."""

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_mpi_env.tools.simcluster import SimulatedCluster, processes_with
from tests.clusters.children import wait_until_none
from tests.clusters.hydra import free_port
from tests.clusters.lightning_versions import INSTALLED, in_each_namespace
from tests.clusters.lightning_versions import oldest_lightning as oldest_lightning  # a fixture, requested by name
from tests.conftest import TAMPER as TAMPER_PATH
from tests.conftest import TRAINER_JOB

JOB = str(TRAINER_JOB)
TAMPER = str(TAMPER_PATH)
SAMPLES = 64


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_import_registers_nothing_and_imports_neither_namespace_nor_torch():
    result = _python(
        """
        import sys
        import lightning_mpi_env
        assert not {"torch", "lightning", "pytorch_lightning"} & set(sys.modules), sorted(sys.modules)
        try:
            lightning_mpi_env.MPIDDPStrategy
        except ImportError as error:
            assert "neither lightning.pytorch nor pytorch_lightning is imported" in str(error), error
        else:
            raise AssertionError("no error")
        print("OK")
        """
    )
    assert result.stdout.strip() == "OK", result.stderr


@pytest.mark.parametrize("order", ["plugin first", "lightning first"])
def test_ddp_mpi_in_both_namespaces(order):
    imports = (
        "import lightning_mpi_env\nimport lightning.pytorch as L"
        if order == "plugin first"
        else "import lightning.pytorch as L\nimport lightning_mpi_env"
    )
    result = _python(
        imports
        + """
from datetime import timedelta
import sys
from lightning_mpi_env.lightning.strategy import strategy_class
from lightning_mpi_env import MPIClusterEnvironment
assert "pytorch_lightning" not in sys.modules
Lcls = lightning_mpi_env.MPIDDPStrategy  # only lightning.pytorch is loaded: unambiguous
assert issubclass(Lcls, L.strategies.DDPStrategy)
trainer = L.Trainer(strategy="ddp_mpi", accelerator="cpu", devices=2, num_nodes=1, logger=False)
assert type(trainer.strategy) is Lcls
assert isinstance(trainer.strategy.cluster_environment, MPIClusterEnvironment)
assert trainer.strategy.rendezvous_timeout == 20.0  # from LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT

import pytorch_lightning as pl
PLcls = strategy_class("pytorch_lightning")
assert issubclass(PLcls, pl.strategies.DDPStrategy) and not issubclass(PLcls, L.strategies.DDPStrategy)
trainer = pl.Trainer(strategy="ddp_mpi", accelerator="cpu", devices=2, logger=False)
assert type(trainer.strategy) is PLcls
strategy = PLcls(timeout=timedelta(seconds=7), find_unused_parameters=True, process_group_backend="gloo",
                 rendezvous_timeout=3)
assert strategy._timeout == timedelta(seconds=7)
assert strategy._ddp_kwargs == {"find_unused_parameters": True}
assert strategy._process_group_backend == "gloo" and strategy.rendezvous_timeout == 3.0
try:
    lightning_mpi_env.MPIDDPStrategy
except ImportError as error:
    assert "ambiguous" in str(error)
else:
    raise AssertionError("no error")
print("OK")
""",
        LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT="20",
    )
    assert result.stdout.strip().endswith("OK"), result.stderr[-3000:]


# --- real mpirun jobs on two simulated nodes ----------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    return SimulatedCluster(tmp_path)


def _results(stdout: str) -> list[dict]:
    # Workers that Lightning starts share mpirun's pipe with their parent, so lines may run into each other.
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in stdout.split("RESULT ")[1:]]


def _check_training(results: list[dict], namespace: str, hosts: dict[int, str]) -> None:
    assert sorted(r["global_rank"] for r in results) == [0, 1, 2, 3]
    assert {r["strategy"] for r in results} == {"MPIDDPStrategy"}
    assert {r["strategy_module"] for r in results} == {f"{namespace}.strategies.ddp"}
    for r in results:
        assert r["world_size"] == 4
        assert r["hostname"] == hosts[r["global_rank"]]
        assert r["node_rank"] == ["127.0.0.2", "127.0.0.3"].index(r["hostname"])
    # Local ranks are unique per host; data shards are disjoint and cover the data; weights agree.
    assert len({(r["hostname"], r["local_rank"]) for r in results}) == 4
    seen = [index for r in results for index in r["seen"]]
    assert sorted(seen) == list(range(SAMPLES))
    assert len({tuple(r["weights"]) for r in results}) == 1


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("map_by", "namespace", "hosts"),
    [
        pytest.param(
            "slot",
            "lightning.pytorch",
            {0: "127.0.0.2", 1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.3"},
            marks=pytest.mark.smoke,
        ),
        ("node", "pytorch_lightning", {0: "127.0.0.2", 1: "127.0.0.3", 2: "127.0.0.2", 3: "127.0.0.3"}),
    ],
)
def test_mpirun_ddp_mpi_trains(cluster, map_by, namespace, hosts):
    result = cluster.run(
        # --zero-config: no devices/num_nodes, ddp_mpi takes both from the launch (exact under either placement).
        [
            sys.executable,
            JOB,
            "--strategy",
            "ddp_mpi",
            "--zero-config",
            "--namespace",
            namespace,
            "--samples",
            str(SAMPLES),
        ],
        timeout=180,
        map_by=map_by,
        export=cluster.job_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check_training(_results(result.stdout), namespace, hosts)
    # Lightning says it added the package's callback once, on rank 0, not on every rank.
    assert (result.stdout + result.stderr).count("from entry point 'lightning_mpi_env'") == 1, result.stderr[-3000:]


@pytest.mark.mpi
def test_mpirun_one_process_per_node(cluster):
    # 2 launcher ranks, one per node; Lightning starts the 2 local workers on each node itself.
    result = cluster.run(
        [sys.executable, JOB, "--strategy", "ddp_mpi", "--samples", str(SAMPLES)],
        timeout=180,
        np=2,
        map_by="node",
        export=cluster.job_environment(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check_training(
        _results(result.stdout),
        "lightning.pytorch",
        {0: "127.0.0.2", 1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.3"},
    )


@pytest.mark.mpi
def test_mpirun_rank_that_dies_in_training_ends_the_job(cluster):
    # Rank 3 exits with status 0 (which mpirun alone would not treat as a failure) at its second step.
    result = cluster.run(
        [sys.executable, JOB, "--strategy", "ddp_mpi", "--vanish-rank", "3", "--samples", str(SAMPLES)],
        timeout=150,
        export=cluster.job_environment(),
    )
    assert "VANISH: rank 3 exits" in result.stdout, result.stderr[-3000:]
    assert result.returncode != 0
    assert "RESULT" not in result.stdout
    assert "Connection closed by peer" in result.stderr, result.stderr[-3000:]


HANG_LIMIT = 120
"""Seconds a step of the interrupted job may take (to start, to reach the store, to end): only a hang takes longer."""


def _hang_report(
    tag: str, process: subprocess.Popen[str], reader: threading.Thread, lines: queue.Queue[str], output: list[str]
) -> str:
    """Where a hung job's processes are: their states and kernel waits, each rank's Python stacks, the output."""
    listing = subprocess.run(
        ["ps", "-ww", "-eo", "pid,stat,wchan:24,etime,args"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    states = [line for line in listing if tag in line and "ps -ww" not in line]
    for line in states:
        pid, args = int(line.split()[0]), line.split(None, 4)[4]
        if args.startswith(sys.executable):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)  # faulthandler prints the stacks on the job's output, then the rank ends
    # Every rank printed its stacks once it ended; then mpirun's output ends with the job, or when it is killed.
    wait_until_none(lambda: [line for line in processes_with(tag) if line.split(None, 1)[1].startswith(sys.executable)])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    reader.join(HANG_LIMIT)
    while not lines.empty():
        output.append(lines.get_nowait())
    report = f"the job still ran {HANG_LIMIT} s after the signal. Processes:\n" + "\n".join(states)
    return report + "\n" + "".join(output)


def _store_holders(pids: list[int], port: int) -> set[int]:
    """Which of ``pids`` hold a TCP socket of ``port`` (rank 0's store: listening on it, or connected to it)."""
    inodes = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for row in table.read_text().splitlines()[1:] if table.exists() else []:
            local, remote, state, inode = row.split()[1:4] + row.split()[9:10]
            listening = state == "0A" and int(local.rsplit(":", 1)[1], 16) == port
            if listening or (state == "01" and int(remote.rsplit(":", 1)[1], 16) == port):
                inodes.add(f"socket:[{inode}]")
    holders = set()
    for pid in pids:
        with contextlib.suppress(OSError):  # a rank that ended holds nothing
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                holders.add(pid)
    return holders


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("phase", "signum", "target"),
    [
        ("rendezvous", signal.SIGTERM, "mpirun"),  # a scheduler ends a job that waits for a missing rank
        ("training", signal.SIGINT, "mpirun"),  # ctrl-C
        ("training", signal.SIGTERM, "ranks"),  # Slurm's scancel: SIGTERM to every process of the step
    ],
)
def test_mpirun_interrupted_job_leaves_no_process(cluster, phase, signum, target):
    tag = f"interrupt-{uuid.uuid4().hex[:10]}"
    job = [sys.executable, JOB, "--strategy", "ddp_mpi", "--tag", tag, "--step-seconds", "1", "--samples", "400"]
    if phase == "rendezvous":  # rank 3 never arrives; the others wait (timeout 120 s) in the rendezvous
        job = [sys.executable, TAMPER, "--rank", "3", "--exit", "--", *job]
    # PYTHONFAULTHANDLER: a rank sent SIGABRT prints every thread's Python stack, for the report of a hang.
    # MASTER_PORT: the port of rank 0's store, to see the ranks there.
    port = free_port()
    environment = {
        **cluster.job_environment(),
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": "120",
        "PYTHONFAULTHANDLER": "1",
        "MASTER_PORT": str(port),
    }
    process = subprocess.Popen(
        cluster.mpirun(job, export=environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    output: list[str] = []

    def wait_for(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + HANG_LIMIT
        while not done():
            try:
                output.append(lines.get(timeout=0.1))
            except queue.Empty:
                if time.monotonic() > deadline:
                    left = "\n".join(processes_with(tag))
                    pytest.fail(f"not {what} within {HANG_LIMIT} s. Processes:\n{left}\n" + "".join(output))

    try:
        if phase == "rendezvous":
            # Inside fit(), waiting for rank 3: each other rank printed FIT, then reached rank 0's store.
            wait_for("3 ranks at fit()", lambda: "".join(output).count("FIT pid=") == 3)
            pids = [int(pid) for pid in re.findall(r"FIT pid=(\d+)", "".join(output))]
            wait_for("3 ranks at rank 0's store", lambda: _store_holders(pids, port) == set(pids))
        else:  # inside fit(), training: every rank started its first step (each takes a second)
            wait_for("4 ranks training", lambda: "".join(output).count("FIRST_STEP") == 4)
        if target == "mpirun":
            process.send_signal(signum)
        else:
            ranks = [int(line.split()[0]) for line in processes_with(tag) if line.split()[1] == sys.executable]
            assert len(ranks) == (3 if phase == "rendezvous" else 4), processes_with(tag)
            # A moment apart, as a scheduler's signal reaches the processes of a step: ranks handle it at different
            # points of their step (Lightning 2.5+ broadcast inside its handler, and such a job hung:
            # compat.record_sigterm_without_collective). Nothing waits on this spread, and no outcome depends on it.
            for index, pid in enumerate(ranks):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    # The ranks signalled first may have stopped the job already, at the step they agreed on (seen
                    # under load); a rank that ended with it needs no signal. The first one must still be running.
                    if index == 0:
                        raise
                time.sleep(0.4)
        try:
            process.wait(timeout=HANG_LIMIT)  # a hang fails the test here, saying where each rank is
        except subprocess.TimeoutExpired:
            pytest.fail(_hang_report(tag, process, reader, lines, output))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(HANG_LIMIT)  # mpirun ended: the rest of its output is in the pipe
    while not lines.empty():
        output.append(lines.get_nowait())
    # mpirun ends its ranks before it exits; a rank a killed daemon left behind would end a moment later.
    assert wait_until_none(lambda: processes_with(tag)) == [], "".join(output)
    assert "RESULT" not in "".join(output)
    # Never 0: Lightning ends a Trainer on SIGTERM with a SystemExit of status 0, which the callback makes 143
    # (docs/preemption.md, "Exit status"), so a job script's `&&` does not go on as if training had finished.
    assert process.returncode != 0, "".join(output)


def test_no_launcher_lightning_starts_the_workers(tmp_path):
    # `python train.py` on a workstation: one node, Lightning starts the second worker itself.
    result = subprocess.run(
        [sys.executable, JOB, "--strategy", "ddp_mpi", "--devices", "2", "--num-nodes", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = _results(result.stdout)
    assert sorted((r["global_rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in results) == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    assert sorted(index for r in results for index in r["seen"]) == list(range(SAMPLES))


def test_ddp_mpi_does_not_warn_about_approximate_node_ranks():
    # A rankfile placement that fits neither block nor round-robin: the core warns, but ddp_mpi resolves it exactly.
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "nodea",
    }
    result = _python(
        """
        import warnings
        import lightning.pytorch as L
        import lightning_mpi_env
        from lightning_mpi_env.core.errors import LayoutWarning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lightning_mpi_env.MPIClusterEnvironment(roll_call=False)
            assert any("approximate" in str(w.message) for w in caught), "the core should warn"
            caught.clear()
            L.Trainer(strategy="ddp_mpi", accelerator="cpu", devices=2, num_nodes=2, logger=False)
        assert not [w for w in caught if issubclass(w.category, LayoutWarning)], [str(w.message) for w in caught]
        print("OK")
        """,
        **env,
    )
    assert result.stdout.strip().endswith("OK"), result.stderr[-3000:]


# --- zero config: ddp_mpi takes devices and num_nodes from the launch when they are left out ---------------------

ZERO_CONFIG_PROGRAM = """
import json, os
os.environ.update({env})
import lightning_mpi_env
import {namespace} as L


def report(runner):
    strategy = runner.strategy
    print(json.dumps({{"devices": len(strategy.parallel_devices), "num_nodes": strategy.num_nodes,
                       "world_size": strategy.world_size, "global_rank": strategy.global_rank}}))

"""
ZERO_CONFIG_RUNNER = 'report(L.{entry}(strategy="ddp_mpi", accelerator="cpu"{arguments}{logger}))\n'


def _open_mpi(rank, world_size, local_size):
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "MASTER_ADDR": "nodea",
        "MASTER_PORT": "29611",
    }


def _built_each(namespace, entry, cases, env):
    """What ``ddp_mpi`` resolved for each of ``cases`` (the Trainer's or Fabric's arguments), built in one process."""
    code = ZERO_CONFIG_PROGRAM.format(env=repr(env), namespace=namespace)
    logger = ", logger=False" if entry == "Trainer" else ""
    for arguments in cases:
        code += ZERO_CONFIG_RUNNER.format(entry=entry, arguments=f", {arguments}" if arguments else "", logger=logger)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()[-len(cases) :]
    return [json.loads(line) for line in lines]


def _built(namespace, entry, arguments, env):
    return _built_each(namespace, entry, [arguments], env)[0]


@pytest.mark.parametrize(
    ("namespace", "entry"),
    [
        ("lightning.pytorch", "Trainer"),
        ("pytorch_lightning", "Trainer"),
        ("lightning.fabric", "Fabric"),
        ("lightning_fabric", "Fabric"),
    ],
)
def test_zero_config_left_out_values_come_from_the_launch(namespace, entry):
    # Both from the launch (6 ranks, 3 per node), num_nodes from the launch, devices from the launch: in one process.
    cases = ["", "devices=3", "num_nodes=2"]
    shapes = _built_each(namespace, entry, cases, _open_mpi(rank=4, world_size=6, local_size=3))
    expected = {"devices": 3, "num_nodes": 2, "world_size": 6, "global_rank": 4}
    assert dict(zip(cases, shapes, strict=True)) == dict.fromkeys(cases, expected)


def test_zero_config_given_values_stay_and_the_launch_check_still_refuses_them():
    # Given and wrong: kept as given, so that the settings check names the mismatch at launch (as before).
    given, default = _built_each(
        "lightning.pytorch",
        "Trainer",
        ["devices=6, num_nodes=3", "num_nodes=1"],
        _open_mpi(rank=4, world_size=6, local_size=3),
    )
    assert (given["devices"], given["num_nodes"]) == (6, 3)
    # Lightning's setters keep no record of what was typed: the defaults' values count as left out (docs/lightning.md).
    assert (default["devices"], default["num_nodes"]) == (3, 2)


def test_zero_config_without_a_launcher_lightning_decides_as_usual():
    shape = _built("lightning.pytorch", "Trainer", "", {})
    assert (shape["devices"], shape["num_nodes"], shape["world_size"]) == (1, 1, 1)


def test_zero_config_one_launcher_process_per_node_keeps_lightning_s_devices():
    # 2 nodes, one launcher process each: devices says how many workers Lightning starts on each node.
    shape = _built("lightning.pytorch", "Trainer", "devices=2", _open_mpi(rank=1, world_size=2, local_size=1))
    assert (shape["devices"], shape["num_nodes"]) == (2, 2)


# --- the device under per-task GPU binding (no GPU here: the device count is injected, no CUDA is set up) ----------

BOUND_DEVICES = """
import json, socket, sys, threading
import torch
import lightning.pytorch as L
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning_mpi_env import LayoutError, MPIClusterEnvironment
from lightning_mpi_env.lightning.strategy import strategy_class

class TwoVisibleGPUs(CUDAAccelerator):
    # The injected probe: what torch.cuda.device_count() says in a task that sees two GPUs.
    @staticmethod
    def auto_device_count():
        return 2

lists, roll_call, after = json.loads(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:] == ["after"]
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = str(probe.getsockname()[1])
strategies = []
for rank, listed in enumerate(lists):
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(len(lists)),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(lists)),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": listed,
    }
    environment = MPIClusterEnvironment(env, roll_call=roll_call, rendezvous_timeout=30, stall_timeout=0)
    strategy = strategy_class("lightning.pytorch")(cluster_environment=environment)
    strategy.accelerator = TwoVisibleGPUs()
    strategy.parallel_devices = [torch.device("cuda", 0), torch.device("cuda", 1)]  # what devices="auto" gives
    strategies.append(strategy)
found = {}

def root_device(rank):
    try:
        if after:  # Lightning 2.1: init_process_group (and the roll call) before the device is set up
            environment = strategies[rank].cluster_environment
            environment.set_world_size(len(lists))  # the proposal while the Trainer is built
            environment.set_world_size(len(lists))  # the one right before init_process_group
            environment.main_address  # the roll call
        found[rank] = str(strategies[rank].root_device)
    except LayoutError as error:
        found[rank] = error.one_line()

threads = [threading.Thread(target=root_device, args=(rank,)) for rank in range(len(lists))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
print(json.dumps({"devices": found, "parallel": [len(s.parallel_devices) for s in strategies]}))
"""


def _bound_devices(lists, roll_call=True, after=False):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            BOUND_DEVICES,
            json.dumps(lists),
            "1" if roll_call else "0",
            *(["after"] if after else []),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


def test_root_device_under_closest_binding_comes_from_the_roll_call():
    # srun --gpu-bind=closest, 4 ranks, 2 GPUs per socket (cited in tests/gpu/test_devices.py): Lightning's
    # cuda:<local rank> would be cuda:2 and cuda:3 for ranks 2 and 3, which see two GPUs each.
    found, stderr = _bound_devices(["0,1", "0,1", "2,3", "2,3"])
    assert found["devices"] == {"0": "cuda:0", "1": "cuda:1", "2": "cuda:0", "3": "cuda:1"}
    assert found["parallel"] == [4, 4, 4, 4]  # devices="auto" still means the 4 ranks of the node
    assert "roll call: note: ranks 0,1 and 2,3 on host" in stderr
    assert "see disjoint GPUs" in stderr


def test_root_device_read_after_the_roll_call_takes_its_answer():
    # Lightning 2.1 sets the device up after init_process_group: the roll call, told by the strategy's devices that
    # the job drives CUDA, has found each rank's device by then.
    found, _ = _bound_devices(["0,1", "2,3", "0,1", "2,3"], after=True)
    assert found["devices"] == {"0": "cuda:0", "1": "cuda:0", "2": "cuda:1", "3": "cuda:1"}


def test_root_device_with_one_gpu_per_task_needs_no_roll_call():
    # srun --gpus-per-task=1: each task sees one GPU, its device 0, whatever its local rank.
    found, _ = _bound_devices(["0", "1", "2", "3"], roll_call=False)
    assert found["devices"] == {"0": "cuda:0", "1": "cuda:0", "2": "cuda:0", "3": "cuda:0"}


def test_root_device_under_closest_binding_without_roll_call_is_refused():
    found, _ = _bound_devices(["0,1", "0,1", "2,3", "2,3"], roll_call=False)
    for line in found["devices"].values():
        assert "CUDA_VISIBLE_DEVICES=" in line
        assert "cannot be known from its own variables" in line
        assert "LIGHTNING_MPI_ENV_ROLL_CALL" in line


def test_two_ranks_on_one_gpu_are_refused_before_setup():
    # srun --gpu-bind=single:2: two tasks per GPU; every rank stops naming both ranks
    found, _ = _bound_devices(["0,1", "0,1", "0,1"])
    for line in found["devices"].values():
        assert "Ranks 0 and 2 on host" in line
        assert "would both drive device '0'" in line


BOUND_JOB = str(Path(__file__).parents[1] / "jobs" / "bound_device.py")


@pytest.mark.mpi
def test_mpirun_closest_binding_gives_each_rank_its_own_device(tmp_path):
    # srun --gpu-bind=closest with 3 tasks per node and 2 GPUs per socket (https://slurm.schedmd.com/srun.html):
    # local ranks 0 and 1 see socket 0's GPUs, local rank 2 socket 1's. Real mpirun on two simulated nodes.
    cluster = SimulatedCluster.of(tmp_path, nodes=2, per_node=3)
    result = cluster.run(
        [sys.executable, BOUND_JOB, "0,1", "0,1", "2,3"], timeout=240, export=cluster.job_environment()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(found) == 6
    for outcome in found:
        assert outcome["device"] == ["cuda:0", "cuda:1", "cuda:0"][outcome["local_rank"]], outcome
        assert outcome["devices"] == 3  # devices="auto" is the node's 3 ranks, not the 2 GPUs a task sees
    assert "roll call: all 6 ranks met on 2 host(s)" in result.stderr
    assert result.stderr.count("see disjoint GPUs") == 2  # one note per host, from rank 0


# "ddp_mpi" runs the roll call from its own setup_environment (MPIClusterEnvironment.meet_now), not at the call order
# compat states for Lightning's own strategies: no read of main_address ever sees the SETTING_UP stage. On the newest
# and the oldest supported Lightning, Trainer and Fabric of both namespaces, as the one rank of `mpirun -np 1`.
SETUP_PROGRAM = """
import importlib, json, socket, sys
import torch
import lightning_mpi_env.lightning.environment as environment
from lightning_mpi_env import strategy_class

PACKAGE = sys.argv[1]
events = []


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Spy(environment.MPIClusterEnvironment):
    def meet_now(self):
        events.append({"event": "meet_now", "caller": sys._getframe(1).f_code.co_name, "before": self.stage.name})
        super().meet_now()

    @property
    def main_address(self):
        events.append({"event": "main_address", "before": self.stage.name})
        return environment.MPIClusterEnvironment.main_address.fget(self)


ENV = Spy({
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
})
pl = importlib.import_module(PACKAGE)
strategy = strategy_class(PACKAGE)(cluster_environment=ENV)
if PACKAGE in ("lightning.pytorch", "pytorch_lightning"):
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, index):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

    pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False).fit(Model())
else:
    pl.Fabric(strategy=strategy, accelerator="cpu", devices=1).launch()
print("PROBE " + json.dumps({"events": events, "stage": ENV.stage.name}), flush=True)
"""


@pytest.mark.parametrize(
    ("version", "package"),
    in_each_namespace(("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric")),
)
def test_ddp_mpi_meets_in_its_own_setup_environment(request, version, package):
    lightning = INSTALLED if version == "installed" else request.getfixturevalue("oldest_lightning")
    env = lightning.environ({"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})
    done = subprocess.run(
        [sys.executable, "-c", SETUP_PROGRAM, package], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, f"{lightning}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    probe = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[6:])
    events = probe["events"]
    meetings = [event for event in events if event["event"] == "meet_now"]
    assert meetings[0] == {"event": "meet_now", "caller": "setup_environment", "before": "SETTING_UP"}, events
    assert probe["stage"] == "MET"
    # The call-order trigger never fires: no read of the address happens between the proposal and the roll call.
    assert not [event for event in events if event["event"] == "main_address" and event["before"] == "SETTING_UP"]
    assert [event for event in events if event["event"] == "main_address" and event["before"] == "MET"], events


def test_the_trainer_s_class_given_to_fabric_names_the_import_in_lightning_s_own_error():
    """Lightning refuses another package's strategy with its repr: ours names the import that fits (and vice versa)."""
    result = _python(
        """
from lightning.fabric import Fabric
from lightning.pytorch import Trainer
from lightning_mpi_env.pytorch import MPIDDPStrategy as ForTrainer
from lightning_mpi_env.fabric import MPIDDPStrategy as ForFabric
for make, strategy in ((Fabric, ForTrainer()), (Trainer, ForFabric())):
    try:
        make(strategy=strategy, accelerator="cpu")
    except ValueError as error:
        print(str(error).partition(". It must be")[0])
"""
    )
    assert result.stdout.splitlines() == [
        "You selected an invalid strategy name: `strategy=<MPIDDPStrategy of lightning_mpi_env.pytorch, for the "
        "Trainer; Fabric takes lightning_mpi_env.fabric.MPIDDPStrategy>`",
        "You selected an invalid strategy name: `strategy=<MPIDDPStrategy of lightning_mpi_env.fabric, for Fabric; "
        "the Trainer takes lightning_mpi_env.pytorch.MPIDDPStrategy>`",
    ], result.stderr[-3000:]


STORE_CONNECTIONS = Path(__file__).parents[1] / "jobs" / "store_connections.py"


@pytest.mark.mpi
@pytest.mark.parametrize("stall_timeout", ["0", "300"], ids=["no-watchdog", "watchdog"])
def test_ddp_mpi_holds_one_store_connection_a_rank_through_the_start(cluster, stall_timeout):
    # "ddp_mpi" opens the process group on the roll call's client (init_process_group(store=...)): one connection a
    # rank on rank 0's server once the group is open; the watchdog's thread (stall watch and requeue) then opens one
    # more, its own. Without either, no thread: what is left is the start's.
    watchdog = {"LIGHTNING_MPI_ENV_STALL_TIMEOUT": stall_timeout}
    if stall_timeout == "0":
        watchdog["LIGHTNING_MPI_ENV_REQUEUE"] = "0"
    result = cluster.run(
        [sys.executable, str(STORE_CONNECTIONS)], timeout=180, export={**cluster.job_environment(), **watchdog}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("CONNECTIONS ")]
    counts = dict(item.split("=") for item in line.split()[1:])
    world = int(counts["world"])
    assert world == 4, line
    # The watchdogs may connect before rank 0 counts: with them, "start" is at most one more a rank.
    assert int(counts["start"]) == world if stall_timeout == "0" else world <= int(counts["start"]) <= 2 * world
    assert int(counts["training"]) == (world if stall_timeout == "0" else 2 * world), line
    assert result.stdout.count("DONE rank=") == world, result.stdout


def test_bind_device_of_1_0_warns_and_leaves_the_group_to_setup_environment():
    import torch

    from lightning_mpi_env.pytorch import MPIDDPStrategy

    strategy = MPIDDPStrategy()
    strategy.parallel_devices = [torch.device("cpu")]
    with pytest.warns(DeprecationWarning, match=r"bind_device\(\) is deprecated: setup_environment\(\) opens"):
        strategy.bind_device()  # on the CPU, before any roll call: nothing to open, Lightning opens the group
    import torch.distributed

    assert not torch.distributed.is_initialized()
