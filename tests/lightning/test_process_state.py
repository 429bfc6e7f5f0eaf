"""What the package changes process-wide for a run, it puts back when the run ends: Trainers and Fabric in one process.

Each program runs in a fresh interpreter, with the real Trainer and Fabric on the CPU (gloo), as the one rank of an
Open MPI launch (``OMPI_COMM_WORLD_*``, as ``mpirun -np 1`` exports them) inside a PBS job (``PBS_JOBID``, so the
requeue handler goes in: PBS's warning signal is ``SIGUSR1``), with ``LIGHTNING_MPI_ENV_IFNAME=lo`` (so
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` are exported) and ``srun`` on ``PATH`` (so Lightning gives its srun
advice, which the filter silences under a launcher). The program takes a snapshot of the excepthook, the
warnings filters, every signal handler, ``os.environ``, the ``atexit`` callbacks and the threads before each run,
during it (to show the changes were made, so that the checks can fail) and after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_mpi_env.core.launchers import OPEN_MPI, SRUN
from tests.clusters.lightning_versions import INSTALLED
from tests.layouts import launcher_env

PROGRAM = r"""
import atexit, json, os, signal, socket, sys, tempfile, threading, warnings

# atexit lists nothing: a spy records what is registered and unregistered (and lets every call through).
REGISTERED = []
_register, _unregister = atexit.register, atexit.unregister


def spy_register(function, *args, **kwargs):
    REGISTERED.append(function)
    return _register(function, *args, **kwargs)


def spy_unregister(function):
    REGISTERED[:] = [registered for registered in REGISTERED if registered != function]
    return _unregister(function)


atexit.register, atexit.unregister = spy_register, spy_unregister
import torch
import torch.distributed as dist

PACKAGE = sys.argv[1]  # the Trainer's package
FABRIC = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}[PACKAGE]
import importlib
pl = importlib.import_module(PACKAGE)
fabric_module = importlib.import_module(FABRIC)
import lightning_mpi_env
from lightning_mpi_env import MPIClusterEnvironment, strategy_class

SIGNALS = [number for number in signal.valid_signals() if number not in (signal.SIGKILL, signal.SIGSTOP)]


# Set by Lightning and torch themselves in every DDP run, whoever the cluster environment is: Lightning's
# _init_dist_connection exports MASTER_ADDR/MASTER_PORT and its DDP strategies OMP_NUM_THREADS
# (_set_num_threads_if_needed); torch's init_process_group chains its own excepthook (_distributed_excepthook).
THEIRS = {"MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}
TORCH_HOOK = "torch.distributed.distributed_c10d.init_process_group.<locals>._distributed_excepthook"


def hook_name(hook):
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', type(hook).__qualname__)}"


def ours_at_exit():
    return sorted({hook_name(function) for function in REGISTERED if hook_name(function).startswith("lightning_mpi")})


def snapshot():
    return {
        "excepthook": sys.excepthook,
        "filters": list(warnings.filters),
        "handlers": {number: signal.getsignal(number) for number in SIGNALS},
        "environ": dict(os.environ),
        "threads": sorted(thread.name for thread in threading.enumerate() if thread.is_alive()),
    }


def changed(before, after):
    found = []
    if after["excepthook"] is not before["excepthook"] and hook_name(after["excepthook"]) != TORCH_HOOK:
        found.append(f"excepthook {hook_name(after['excepthook'])}")
    if after["filters"] != before["filters"]:
        found.append("filters")
    for number in SIGNALS:
        if after["handlers"][number] != before["handlers"][number]:
            found.append(f"handler {signal.Signals(number).name}")
    for name in sorted(set(before["environ"]) | set(after["environ"])):
        if before["environ"].get(name) != after["environ"].get(name) and name not in THEIRS:
            found.append(f"environ {name}")
    found.extend(f"thread {name}" for name in sorted(set(after["threads"]) - set(before["threads"])))
    return found


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch():
    return {
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "PBS_JOBID": "7.server", "LIGHTNING_MPI_ENV_IFNAME": "lo",
    }


report = {"runs": [], "during": {}}
DURING = []


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, index):
        DURING.append(snapshot())
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)


def trainer_run(name, strategy_of):
    before = snapshot()
    environment = MPIClusterEnvironment(launch())
    trainer = pl.Trainer(
        strategy=strategy_of(environment), accelerator="cpu", devices=1, max_steps=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(),
    )
    callbacks = [type(callback).__name__ for callback in trainer.callbacks]
    DURING.clear()
    trainer.fit(Model())
    report["during"][name] = changed(before, DURING[0])
    report["runs"].append({
        "name": name, "changed": changed(before, snapshot()), "callbacks": callbacks,
        "atexit": ours_at_exit(),
    })
    dist.destroy_process_group()  # the next run sets up its own


def fabric_run(name, end):
    before = snapshot()
    environment = MPIClusterEnvironment(launch())
    fabric = fabric_module.Fabric(strategy="ddp", accelerator="cpu", devices=1, plugins=[environment])
    fabric.launch()
    model, optimizer = fabric.setup(torch.nn.Linear(2, 1), torch.optim.SGD(torch.nn.Linear(2, 1).parameters()))
    for step in range(2):
        environment.progress(step)
        fabric.backward(model(torch.ones(2, 2)).sum())
        assert not environment.requeue_requested(fabric)
    report["during"][name] = changed(before, snapshot())
    if end == "teardown":
        dist.destroy_process_group()
        environment.teardown()  # the end of a Fabric run: Fabric itself calls no teardown
        left = changed(before, snapshot())
        report["runs"].append({"name": name, "changed": left, "atexit": ours_at_exit()})
    else:
        AT_EXIT.append(before)


AT_EXIT = []


def at_exit():
    # Registered first, so it runs last: after the package's own exit hooks.
    if AT_EXIT:
        print("AT EXIT " + json.dumps(changed(AT_EXIT[0], snapshot())), flush=True)


atexit.register(at_exit)
ddp = importlib.import_module(PACKAGE + ".strategies").DDPStrategy
# The plugin with Lightning's DDPStrategy (the roll call at the call order compat states), then our "ddp_mpi" (the
# roll call from its setup_environment), then a Fabric run ended by environment.teardown(), then one left to the exit.
trainer_run("trainer with the plugin", lambda environment: ddp(cluster_environment=environment))
trainer_run("trainer with ddp_mpi", lambda environment: strategy_class(PACKAGE)(cluster_environment=environment))
fabric_run("fabric ended by teardown", "teardown")
fabric_run("fabric ended by the exit", "exit")
print("PROBE " + json.dumps(report), flush=True)
"""


SETTLE = "lightning_mpi_env.lightning.compat._let_collective_workers_finish"


@pytest.fixture(scope="module")
def fake_srun(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding an executable ``srun`` (never run: Lightning only looks for it on ``PATH``)."""
    directory = tmp_path_factory.mktemp("fake-srun")
    srun = directory / "srun"
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(0o755)
    return directory


@pytest.mark.parametrize("package", ["lightning.pytorch", pytest.param("pytorch_lightning", marks=pytest.mark.slow)])
def test_two_trainers_and_fabric_runs_leave_the_process_as_they_found_it(package, fake_srun):
    env = INSTALLED.environ(
        {"PATH": f"{fake_srun}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PBS_JOBID": "7.server"}
    )
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, package], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    probe = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[6:])
    runs = {run["name"]: run for run in probe["runs"]}

    # During each run the changes are in place (so the checks below could fail): the srun filter (another launcher
    # than srun), the fabric's exports, the requeue handler (PBS: SIGUSR1) once training started, the watchdog.
    for name, during in probe["during"].items():
        assert "filters" in during, (name, during)
        assert {"environ GLOO_SOCKET_IFNAME", "environ NCCL_SOCKET_IFNAME", "handler SIGUSR1"} <= set(during), name
        assert any(item.startswith("thread ") for item in during), (name, during)

    # After each Trainer's fit() and after a Fabric run ended by environment.teardown(): nothing is left.
    for name in ("trainer with the plugin", "trainer with ddp_mpi"):
        assert runs[name]["changed"] == [], runs[name]
        assert "MPIEnvCallback" in runs[name]["callbacks"]  # the package is used: its callback is there
        # The exit hook that settles collectives stays while the process group Lightning left after fit() lives
        # (compat.release_collectives_at_exit); the one that ends the run is gone.
        assert runs[name]["atexit"] == [SETTLE], runs[name]
    fabric = runs["fabric ended by teardown"]
    assert fabric["changed"] == [], fabric
    assert fabric["atexit"] == [], fabric  # its group was destroyed before the end: no exit hook of ours is left

    # A Fabric run that is never ended explicitly is ended at the interpreter's exit.
    (at_exit,) = [line for line in done.stdout.splitlines() if line.startswith("AT EXIT ")]
    left = json.loads(at_exit[len("AT EXIT ") :])
    assert left == [], left


# The brief display of an error of ours is there only while such an error is on its way out.
BAD_LAYOUT = """
import sys
from lightning_mpi_env import LayoutError, MPIClusterEnvironment

ORIGINAL = sys.excepthook
BAD = {"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
print("MADE", sys.excepthook is ORIGINAL, flush=True)
if sys.argv[1] == "caught":
    try:
        MPIClusterEnvironment(BAD)
    except LayoutError:
        print("CAUGHT", sys.excepthook is ORIGINAL, flush=True)  # kept while the program may still let it out
    MPIClusterEnvironment({}).teardown()  # the end of a later run
    print("AFTER", sys.excepthook is ORIGINAL, flush=True)
else:
    MPIClusterEnvironment(BAD)
"""


def test_an_uncaught_error_of_ours_is_one_line_and_a_caught_one_leaves_the_hook_alone(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    uncaught = subprocess.run(
        [sys.executable, "-c", BAD_LAYOUT, "uncaught"], capture_output=True, text=True, timeout=120, env=env
    )
    assert uncaught.returncode == 1
    assert uncaught.stdout == "MADE True\n"  # nothing installed before the error
    assert uncaught.stderr.startswith("LayoutError: rank 3 on "), uncaught.stderr
    assert uncaught.stderr.count("\n") == 1, uncaught.stderr  # one line, no traceback
    caught = subprocess.run(
        [sys.executable, "-c", BAD_LAYOUT, "caught"], capture_output=True, text=True, timeout=120, env=env
    )
    assert caught.returncode == 0, caught.stderr[-3000:]
    assert caught.stdout.splitlines() == ["MADE True", "CAUGHT False", "AFTER True"]


def _one_rank(launcher):
    return launcher_env(launcher, rank=0, world_size=1, local_rank=0, local_size=1, node=0, num_nodes=1)


@pytest.mark.parametrize(
    ("launch", "filtered"),
    [(_one_rank(OPEN_MPI), True), (_one_rank(SRUN), True), ({}, False)],
    ids=["mpirun", "srun", "no launcher"],
)
def test_the_srun_advice_is_silenced_only_under_a_launcher_and_until_the_end(launch, filtered):
    # Under a launcher the advice is wrong (under srun too: salloc's job name hides the step from Lightning); without
    # one it may be right: no filter there. In a fresh interpreter: environments made and never ended elsewhere would
    # hold the shared filter.
    program = (
        "import json, sys, warnings\n"
        "from lightning_mpi_env import MPIClusterEnvironment\n"
        "from lightning_mpi_env.lightning.process_state import Change\n"
        "before = list(warnings.filters)\n"
        "environment = MPIClusterEnvironment(json.loads(sys.argv[1]))\n"
        "print(Change.SRUN_FILTER in environment.changes, list(warnings.filters) != before)\n"
        "environment.teardown()\n"
        "print(list(warnings.filters) == before)\n"
    )
    launch = {**launch, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    done = subprocess.run(
        [sys.executable, "-c", program, json.dumps(launch)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [f"{filtered} {filtered}", "True"]


def test_a_copy_in_another_process_carries_no_changes():
    # ddp_spawn pickles the environment into its workers: what this process changed stays this process's to undo.
    import pickle

    from lightning_mpi_env.lightning.process_state import Change, ProcessChanges

    changes = ProcessChanges()
    undone = []
    changes.add(Change.FABRIC_EXPORTS, lambda: undone.append("exports"))
    copy = pickle.loads(pickle.dumps(changes))
    assert (copy.made, changes.made) == ([], [Change.FABRIC_EXPORTS])
    copy.undo()
    assert undone == []
    changes.undo()
    assert (undone, changes.made) == (["exports"], [])
