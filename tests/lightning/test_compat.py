"""Every private name of Lightning in ``lightning_mpi_env.lightning.compat``, checked against the real objects.

Each check runs a program in a fresh interpreter (import order and namespace matter), once on the installed
Lightning and once on the oldest supported one (2.1.4, :mod:`tests.clusters.lightning_versions`; there in one Trainer
and one Fabric namespace), so a supported version that changes a name or the call order fails here, naming what
changed. Nothing of ours is mocked: the
programs spy on Lightning's calls from a subclass of the environment (the rank proposals, ``validate_settings``,
the reads of ``main_address``; the spies read the stack to *report* who called, which the package never does) and
on torch's own ``init_process_group``, and let every call through.

FSDP and DeepSpeed refuse the CPU in Lightning (FSDP by its flag or class check, DeepSpeed by
``isinstance(accelerator, CUDAAccelerator)``), and this machine has no GPU. Their programs therefore register a
CPU-backed subclass of Lightning's ``CUDAAccelerator`` under the name ``"cuda"`` (Lightning's accelerator registry):
the strategy is then exactly Lightning's class, built by Lightning's own ``Trainer``/``Fabric`` from its registered
name, and everything from ``fit()``/``launch()`` down to ``init_process_group`` is Lightning's code (in DeepSpeed's
case through its CUDA check and ``setup_distributed``), rather than a call to ``setup_distributed()`` by hand.
ModelParallel runs on Lightning's CPU accelerator as it is. DeepSpeed is the real one, ``deepspeed`` 0.19.8 from
PyPI, in a venv of its own over this venv's torch and Lightning (it is no dependency of this package:
:mod:`tests.clusters.deepspeed_venv`); its program runs on that venv's Python, and a spy on
``deepspeed.init_distributed`` records where the roll call stood when Lightning called it.
"""

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

import tests.lightning.test_device_id as device_id  # device_id: Lightning's own from 2.5.5, "ddp_mpi" on every one
import tests.recovery.test_groups as groups  # torch's reconfigure API: 2.14.1 takes it, the installed 2.13 does not
from lightning_mpi_env.lightning import compat
from tests.clusters.deepspeed_venv import DeepSpeed
from tests.clusters.lightning_versions import (  # noqa: F401  (oldest_lightning: a fixture, requested by name)
    INSTALLED,
    OLDEST,
    Lightning,
    in_each_namespace,
    oldest_lightning,
)

TRAINER_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
FABRIC_PACKAGES = ("lightning.fabric", "lightning_fabric")


@pytest.fixture(
    params=["installed", pytest.param("oldest", marks=pytest.mark.slow)],
    ids=[f"lightning-{INSTALLED.version}", f"lightning-{OLDEST}"],
)
def lightning(request: pytest.FixtureRequest) -> Lightning:
    """The installed Lightning, and the oldest supported one (an overlay, installed on first use)."""
    if request.param == "installed":
        return INSTALLED
    oldest: Lightning = request.getfixturevalue("oldest_lightning")
    return oldest


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def _probe(
    lightning: Lightning,
    program: str,
    *args: str,
    path: tuple[Path, ...] = (),
    python: str = sys.executable,
    variables: Mapping[str, str] | None = None,
) -> dict:
    """Run ``program`` on ``lightning`` in a fresh interpreter; return what it printed after ``PROBE``."""
    base = {
        "PATH": os.pathsep.join([*map(str, path), "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        **(variables or {}),
    }
    env = lightning.environ(base)
    result = subprocess.run(
        [python, "-c", textwrap.dedent(program), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    probes = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    output = f"{lightning}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert result.returncode == 0, output
    assert probes, output
    found: dict = json.loads(probes[-1].split(" ", 1)[1])
    return found


# What every probe program starts with: a one-rank Open MPI launch on a free port, and the spies.
SPIES = """
import importlib, json, logging, os, socket, sys, warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import lightning_mpi_env.lightning.environment as environment
from lightning_mpi_env.lightning import compat
from lightning_mpi_env.rollcall.verdict import KEY_PREFIX

VERDICT = KEY_PREFIX + "verdict"
events, facts, seen = [], {}, {}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(port):
    # What Open MPI exports to the one rank of `mpirun -np 1`, and the main address and port of a job script.
    return {
        "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }


def listening_ports():
    # The TCP ports this process listens on (Linux): to show that init_process_group opens no store of its own.
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def callers(frame):
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


real_init = dist.init_process_group


def spy_init(*args, **kwargs):
    # torch's own init_process_group: was the roll call's verdict already in the store on MASTER_PORT?
    listening = listening_ports()
    verdict = False
    if PORT in listening:  # else no roll call ran: torch is about to serve the port itself
        client = dist.TCPStore("127.0.0.1", PORT, is_master=False, timeout=timedelta(seconds=60))
        verdict = client.check([VERDICT])
        del client
    events.append({
        "event": "init_process_group", "stage": ENV.stage.name, "verdict": verdict,
        "caller": sys._getframe(1).f_code.co_name, "module": sys._getframe(1).f_globals["__name__"],
        "listening": listening,
    })
    result = real_init(*args, **kwargs)
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # PrefixStore("0/") -> PrefixStore("default_pg") -> TCPStore
        store = store.underlying_store
    events.append({
        "event": "default_store", "type": type(store).__name__, "port": store.port, "verdict": store.check([VERDICT]),
    })
    return result


dist.init_process_group = spy_init


class Spy(environment.MPIClusterEnvironment):
    def set_world_size(self, size):
        before, stack = self.stage.name, callers(sys._getframe(1))
        super().set_world_size(size)
        events.append({
            "event": "proposal", "before": before, "after": self.stage.name,
            "constructing": "_lazy_init_strategy" in stack,
            "setting_up": any(name in stack for name in ("setup_environment", "_setup_distributed")),
        })

    @property
    def main_address(self):
        before, caller = self.stage.name, sys._getframe(1).f_code.co_name
        address = environment.MPIClusterEnvironment.main_address.fget(self)
        events.append({"event": "main_address", "caller": caller, "before": before, "after": self.stage.name})
        return address

    def validate_settings(self, num_devices, num_nodes):
        caller = sys._getframe(1)
        events.append({
            "event": "validate_settings", "caller": caller.f_code.co_name, "module": caller.f_globals["__name__"],
            "stage": self.stage.name,
        })
        super().validate_settings(num_devices, num_nodes)


OWNER = [None]
"""


DDP_PROGRAM = (
    SPIES
    + """
PACKAGE = sys.argv[1]
TRAINER = PACKAGE in ("lightning.pytorch", "pytorch_lightning")
FABRIC_OF = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}
FABRIC_PACKAGE = FABRIC_OF.get(PACKAGE, PACKAGE)


def srun_warnings(silenced):
    # Lightning's advice to use srun, given when `srun` is on PATH (a fake one is) outside a Slurm step.
    slurm = importlib.import_module(FABRIC_PACKAGE + ".plugins.environments").SLURMEnvironment
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not silenced:
            slurm.detect()
            return [str(warning.message) for warning in caught], []
        restore = compat.silence_srun_not_used()
        slurm.detect()
        during = [str(warning.message) for warning in caught]
        restore()  # the end of the run: the advice is shown again
        slurm.detect()
        return during, [str(warning.message) for warning in caught[len(during):]]


facts["srun"] = srun_warnings(silenced=False)[0]  # before anything of ours silences it
facts["srun_silenced"], facts["srun_restored"] = srun_warnings(silenced=True)

PORT = free_port()
ENV = Spy(launch(PORT))
pl = importlib.import_module(PACKAGE)
checkpoint_io = importlib.import_module(PACKAGE + ".plugins").TorchCheckpointIO()
if TRAINER:
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

    import tempfile

    from lightning_mpi_env.lightning import requeue

    root = tempfile.mkdtemp()
    for number in (1, 3):  # HPC_CHECKPOINT: the names Lightning's own HPC resume looks for
        open(os.path.join(root, compat.hpc_checkpoint_name(number)), "w").close()
    os.environ["PBS_JOBID"] = "7.server"  # a job that can requeue: Lightning adds our callback (callbacks_factory)
    owner = OWNER[0] = pl.Trainer(
        strategy="ddp", accelerator="cpu", devices=1, plugins=[ENV, checkpoint_io], max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )
    del os.environ["PBS_JOBID"]
    facts["callbacks"] = [type(callback).__name__ for callback in owner.callbacks]

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    def entry_point_lines(quiet):
        # ENTRY_POINT_LOGGERS/NAME: where Lightning says it added our callbacks, which the filter then leaves out.
        lines, loggers = Lines(), [logging.getLogger(name) for name in compat.ENTRY_POINT_LOGGERS]
        for logger in loggers:
            logger.addHandler(lines)
        restore = compat.quiet_entry_point_line() if quiet else (lambda: None)
        os.environ["PBS_JOBID"] = "7.server"
        pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
        del os.environ["PBS_JOBID"]
        restore()
        for logger in loggers:
            logger.removeHandler(lines)
        return [line for line in lines.lines if "from entry point" in line]

    facts["entry_line"] = entry_point_lines(quiet=False)
    facts["entry_line_quiet"] = entry_point_lines(quiet=True)
    facts["entry_line_restored"] = entry_point_lines(quiet=False)
    facts["hpc"] = [owner._checkpoint_connector._hpc_resume_path, requeue.newest_checkpoint(root)]
    for number in (1, 3):
        os.remove(os.path.join(root, compat.hpc_checkpoint_name(number)))
    owner.fit(Model())
else:
    owner = OWNER[0] = pl.Fabric(strategy="ddp", accelerator="cpu", devices=1, plugins=[ENV, checkpoint_io])
    owner.launch()

strategies = importlib.import_module(PACKAGE + ".strategies")
registry = compat.strategy_registry(strategies)
facts.update({
    "registry": [
        name for name in ("StrategyRegistry", "STRATEGY_REGISTRY") if getattr(strategies, name, None) is registry
    ],
    "registered": sorted(name for name in ("ddp", "ddp_mpi") if name in registry),
})
print("PROBE " + json.dumps({"events": events, "facts": facts, "port": PORT}))
"""
)


@pytest.fixture(scope="module")
def fake_srun(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding an executable ``srun`` (never run: Lightning only looks for it on ``PATH``)."""
    directory = tmp_path_factory.mktemp("fake-srun")
    srun = directory / "srun"
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(0o755)
    return directory


def _index(events: list[dict], kind: str) -> list[int]:
    return [index for index, event in enumerate(events) if event["event"] == kind]


@pytest.mark.parametrize(
    ("lightning", "package"), in_each_namespace((*TRAINER_PACKAGES, *FABRIC_PACKAGES)), indirect=["lightning"]
)
def test_ddp_meets_in_the_roll_call_before_init_process_group(lightning, package, fake_srun):
    trainer = package in TRAINER_PACKAGES
    found = _probe(lightning, DDP_PROGRAM, package, path=(fake_srun,))
    events, facts, port = found["events"], found["facts"], found["port"]

    # Lightning proposes ranks while it builds the Trainer/Fabric, then again in setup_environment: the stages
    # follow that order with no frame read by the package (the spy reads the stack only to check it).
    proposals = [event for event in events if event["event"] == "proposal"]
    construction = [event for event in proposals if event["constructing"]]
    setup = [event for event in proposals if event["setting_up"]]
    assert len(construction) + len(setup) == len(proposals), proposals
    assert construction, proposals
    assert setup, proposals
    assert (construction[0]["before"], construction[0]["after"]) == ("CONFIGURED", "PROPOSED"), proposals
    assert (setup[0]["before"], setup[0]["after"]) == ("PROPOSED", "SETTING_UP"), proposals
    assert max(events.index(event) for event in construction) < min(events.index(event) for event in setup)

    # The launcher validates the settings between the two proposals.
    (validate,) = [events[index] for index in _index(events, "validate_settings")]
    assert validate["caller"] == "launch"
    assert validate["module"] == f"{package}.strategies.launchers.subprocess_script"
    assert max(events.index(event) for event in construction) < events.index(validate)
    assert events.index(validate) < min(events.index(event) for event in setup)

    # The first read of main_address after the setup proposal runs the roll call, right before init_process_group.
    reads = [events[index] for index in _index(events, "main_address")]
    meeting = next(event for event in reads if event["before"] == "SETTING_UP")
    assert (meeting["after"], meeting["caller"]) == ("MET", "_init_dist_connection"), reads
    assert events.index(meeting) > max(events.index(event) for event in setup)

    # torch's init_process_group runs once, after the roll call, and its store is the roll call's: one port.
    (init,) = [events[index] for index in _index(events, "init_process_group")]
    assert events.index(init) > events.index(meeting)
    assert init["caller"] == "_init_dist_connection"
    assert (init["stage"], init["verdict"], init["listening"]) == ("MET", True, [port])
    (store,) = [events[index] for index in _index(events, "default_store")]
    assert store == {"event": "default_store", "type": "TCPStore", "port": port, "verdict": True}

    if trainer:
        # The callbacks_factory entry point: Lightning adds the callback to a Trainer of a job that can requeue.
        assert "MPIEnvCallback" in facts["callbacks"], facts["callbacks"]
        said = f"Adding 1 callbacks from entry point '{compat.ENTRY_POINT_NAME}': MPIEnvCallback"
        assert facts["entry_line"] == [said] == facts["entry_line_restored"], facts
        assert facts["entry_line_quiet"] == [], facts
        # HPC_CHECKPOINT: Lightning's own HPC resume picks the file our requeue names and finds.
        assert facts["hpc"][0] == facts["hpc"][1], facts["hpc"]
        assert facts["hpc"][1].endswith("hpc_ckpt_3.ckpt"), facts["hpc"]
    assert facts["registry"] == ["StrategyRegistry" if trainer else "STRATEGY_REGISTRY"]
    assert facts["registered"] == ["ddp", "ddp_mpi"]
    # SRUN_NOT_USED: the start of Lightning's own warning text, which the filter then silences.
    assert [message for message in facts["srun"] if message.startswith(compat.SRUN_NOT_USED)], facts["srun"]
    assert not [message for message in facts["srun_silenced"] if message.startswith(compat.SRUN_NOT_USED)]
    assert [message for message in facts["srun_restored"] if message.startswith(compat.SRUN_NOT_USED)]


SHARDED_PROGRAM = (
    SPIES
    + """
PACKAGE, WANTED = sys.argv[1], sys.argv[2].split(",")
TRAINER = PACKAGE in ("lightning.pytorch", "pytorch_lightning")
pl = importlib.import_module(PACKAGE)
strategies = importlib.import_module(PACKAGE + ".strategies")
accelerators = importlib.import_module(PACKAGE + ".accelerators")
registry = accelerators.AcceleratorRegistry if TRAINER else accelerators.ACCELERATOR_REGISTRY

sys.path.insert(0, __JOBS__)
from cpu_as_cuda import cpu_as_cuda  # Lightning's CUDA accelerator on the CPU: FSDP and DeepSpeed take no other

CPUAsCUDA = cpu_as_cuda(PACKAGE)
registry.register("cuda", CPUAsCUDA, override=True)
deepspeed_calls = []
if "deepspeed" in WANTED:
    import deepspeed

    real_init_distributed = deepspeed.init_distributed

    def spy_init_distributed(dist_backend=None, *rest, **keywords):
        # DeepSpeed's own entry point, as Lightning calls it: was the roll call's verdict in the store by then?
        client = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
        )
        deepspeed_calls.append({
            "backend": dist_backend, "distributed_port": keywords.get("distributed_port"),
            "roll_call_done": client.check([VERDICT]), "stage": ENV.stage.name,
            "environ": {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK")},
        })
        del client
        return real_init_distributed(dist_backend, *rest, **keywords)

    deepspeed.init_distributed = spy_init_distributed


if TRAINER:
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


runs = {}
for name in WANTED:
    if name == "model_parallel":
        if not hasattr(strategies, "ModelParallelStrategy"):
            runs[name] = None  # Lightning 2.3+
            continue
        kwargs = {} if TRAINER else {"parallelize_fn": lambda module, mesh: module}
        strategy, accelerator = strategies.ModelParallelStrategy(**kwargs), "cpu"  # not registered by name
    else:
        strategy, accelerator = name, "cuda"  # by name: Lightning builds its own FSDPStrategy / DeepSpeedStrategy
    events.clear()
    PORT = free_port()
    ENV = Spy(launch(PORT))
    try:
        if TRAINER:
            owner = OWNER[0] = pl.Trainer(
                strategy=strategy, accelerator=accelerator, devices=1, plugins=[ENV], max_steps=1, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            )
            built = type(owner.strategy)
            owner.fit(Model())
        else:
            owner = OWNER[0] = pl.Fabric(strategy=strategy, accelerator=accelerator, devices=1, plugins=[ENV])
            built = type(owner.strategy)
            owner.launch()
    except Exception as error:  # on the CPU, FSDP gives up after init_process_group
        events.append({"event": "raised", "error": f"{type(error).__name__}: {error}"[:300]})
    runs[name] = {
        "strategy": f"{built.__module__}.{built.__qualname__}", "events": list(events), "port": PORT,
        "deepspeed": list(deepspeed_calls),
    }
    deepspeed_calls.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
print("PROBE " + json.dumps(runs))
""".replace("__JOBS__", repr(str(Path(__file__).parents[1] / "jobs")))
)

EXPECTED_CLASSES = {
    "fsdp": "fsdp.FSDPStrategy",
    "model_parallel": "model_parallel.ModelParallelStrategy",
    "deepspeed": "deepspeed.DeepSpeedStrategy",
}


def _assert_met_before_init(name: str, run: dict, package: str, lightning: Lightning) -> None:
    """Lightning's own ``name`` strategy met in the roll call, then called ``init_process_group`` on its store."""
    events, port = run["events"], run["port"]
    context = f"{name} on {lightning}: {events}"
    assert run["strategy"] == f"{package}.strategies.{EXPECTED_CLASSES[name]}", context  # Lightning's own class
    setup = [event for event in events if event["event"] == "proposal" and event["after"] == "SETTING_UP"]
    assert setup, context
    assert all(event["setting_up"] for event in setup), context
    meeting = [event for event in events if event["event"] == "main_address" and event["before"] == "SETTING_UP"]
    assert meeting, context
    assert meeting[0]["after"] == "MET", context
    (init,) = [events[index] for index in _index(events, "init_process_group")]
    assert (init["stage"], init["verdict"]) == ("MET", True), context
    assert events.index(init) > max(events.index(event) for event in setup), context
    (store,) = [events[index] for index in _index(events, "default_store")]
    assert (store["port"], store["verdict"]) == (port, True), context
    for index in _index(events, "raised"):  # on the CPU they may give up, but only after the process group
        assert index > events.index(init), context
    if name == "deepspeed":
        # DeepSpeed's init_distributed, called by Lightning, opened the process group through its TorchBackend.
        assert (init["module"], init["caller"]) == ("deepspeed.comm.torch", "init_process_group"), context
        assert not _index(events, "raised"), context  # the real DeepSpeed trains (Trainer) or launches (Fabric)
        (call,) = run["deepspeed"]
        assert (call["roll_call_done"], call["stage"]) == (True, "MET"), call
        assert call["distributed_port"] == port, call
        assert call["backend"] == "gloo", call
        assert call["environ"] == {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(port), "LOCAL_RANK": "0"}
    else:
        assert init["caller"] == "_init_dist_connection", context
        assert not run["deepspeed"], context


@pytest.mark.parametrize(
    ("lightning", "package"), in_each_namespace((*TRAINER_PACKAGES, *FABRIC_PACKAGES)), indirect=["lightning"]
)
def test_sharded_strategies_meet_in_the_roll_call_before_init_process_group(lightning, package):
    runs = _probe(lightning, SHARDED_PROGRAM, package, "fsdp,model_parallel")
    assert (runs["model_parallel"] is None) == (_version(lightning.version) < (2, 3)), "ModelParallel: 2.3+"
    for name, run in runs.items():
        if run is not None:
            _assert_met_before_init(name, run, package, lightning)


@pytest.mark.parametrize(
    ("lightning", "package"), in_each_namespace((*TRAINER_PACKAGES, *FABRIC_PACKAGES)), indirect=["lightning"]
)
def test_real_deepspeed_meets_in_the_roll_call_before_init_distributed(lightning, package, deepspeed: DeepSpeed):
    # The real deepspeed, on its venv's Python: Lightning's DeepSpeedStrategy calls deepspeed.init_distributed,
    # which starts the process group itself (env://), on the roll call's store.
    runs = _probe(
        lightning, SHARDED_PROGRAM, package, "deepspeed", python=str(deepspeed.python), variables=deepspeed.environ({})
    )
    _assert_met_before_init("deepspeed", runs["deepspeed"], package, lightning)


SUBCLASS_PROGRAM = (
    SPIES
    + """
import lightning.pytorch as pl


class Logged(environment.MPIClusterEnvironment):
    # A user's subclass that logs Lightning's proposals and keeps the behaviour: super() does the rest.
    def set_global_rank(self, rank):
        super().set_global_rank(rank)

    def set_world_size(self, size):
        super().set_world_size(size)


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


PORT = free_port()
ENV = Logged(launch(PORT))
trainer = pl.Trainer(
    strategy="ddp", accelerator="cpu", devices=1, plugins=[ENV], max_steps=1, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Model())
print("PROBE " + json.dumps({"events": events}))
"""
)


def test_setup_proposal_through_a_subclass_that_overrides_the_setters():
    # A user's subclass that overrides the setters and calls super() keeps the order the stages follow.
    events = _probe(INSTALLED, SUBCLASS_PROGRAM)["events"]
    (init,) = [events[index] for index in _index(events, "init_process_group")]
    assert (init["stage"], init["verdict"]) == ("MET", True), events


def test_hpc_checkpoint_name_is_lightnings():
    assert compat.HPC_CHECKPOINT.match(compat.hpc_checkpoint_name(12)).group(1) == "12"
    assert compat.HPC_CHECKPOINT.match("hpc_ckpt_x.ckpt") is None


# At exit the main thread gives up the GIL once, only while a process group is alive, however often it was asked.
SETTLE_PROGRAM = """
import sys, types
import torch, torch.distributed as dist
from lightning_mpi_env.lightning import compat

compat.time = types.SimpleNamespace(sleep=lambda seconds: print(f"SETTLED {seconds}", flush=True))
compat.settle_collectives_at_exit()
compat.settle_collectives_at_exit()
if sys.argv[1] == "initialized":
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    dist.all_reduce(torch.ones(2))
# The end of a run: the hook stays while a process group lives, and goes when none does.
print("RELEASED", compat.release_collectives_at_exit(), flush=True)
if sys.argv[1] == "never initialized":  # a group the program makes after the run: the hook is gone, none settles
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    dist.all_reduce(torch.ones(2))
"""


@pytest.mark.parametrize("state", ["initialized", "never initialized"])
def test_collectives_settle_once_at_exit_while_a_process_group_is_alive(state):
    done = subprocess.run([sys.executable, "-c", SETTLE_PROGRAM, state], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if state == "initialized":
        assert done.stdout.splitlines() == ["RELEASED False", f"SETTLED {compat.SETTLE_SECONDS}"]
    else:  # released at the end of the run: nothing runs at exit, though a group is alive then
        assert done.stdout.splitlines() == ["RELEASED True"]


# Which test checks each name of compat (a name added to compat without a test here fails this test).
SIGTERM_PROGRAM = """
import os, signal, socket, sys
import torch
PACKAGE = sys.argv[1]
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
os.environ.update({  # a one-rank Open MPI launch
    "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
})
import importlib
pl = importlib.import_module(PACKAGE)
import lightning_mpi_env  # noqa: F401

# The program's own SIGTERM handler: Lightning composes it with its own, and it must still run.
signal.signal(signal.SIGTERM, lambda signum, frame: print("USER HANDLER", flush=True))


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            handler = signal.getsignal(signal.SIGTERM)
            print("HANDLER", getattr(handler, "__qualname__", type(handler).__qualname__), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # scancel, or the step's time limit
        return self.layer(batch).sum()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(40, 2), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = pl.Trainer(strategy="ddp_mpi", accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model())
print("FINISHED")  # not reached: SIGTERM ends fit()
"""


@pytest.mark.parametrize(("lightning", "package"), in_each_namespace(TRAINER_PACKAGES), indirect=["lightning"])
def test_a_trainer_ended_by_sigterm_exits_143(lightning, package):
    # Lightning (2.1 to 2.6) ends fit() on SIGTERM with SIGTERMException, a SystemExit of status 0; the callback from
    # the callbacks_factory entry point gives it status 143 in on_exception (docs/preemption.md, "Exit status").
    env = lightning.environ({"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})
    result = subprocess.run(
        [sys.executable, "-c", SIGTERM_PROGRAM, package], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 143, f"{lightning}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "FINISHED" not in result.stdout
    # During training the handler is this package's on every version: it notes the signal for the ranks' stop
    # agreement, carried by the watchdog's thread, with no collective (Lightning 2.5.2+'s own broadcasts: a collective
    # inside a signal handler hangs ranks signalled a moment apart, SIGTERM_COLLECTIVE_SINCE), and every rank stops
    # at the agreed step. The program's own handler still runs, once.
    runs_collective = _version(lightning.version) >= compat.SIGTERM_COLLECTIVE_SINCE
    assert runs_collective == (lightning is INSTALLED), "2.6.6 broadcasts in its handler, 2.1.4 does not"
    assert "HANDLER record_sigterm_without_collective.<locals>.record_sigterm\n" in result.stdout, result.stdout
    assert result.stdout.count("USER HANDLER\n") == 1, result.stdout
    assert "lightning-mpi-env: SIGTERM: rank 0 stops after step " in result.stderr, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]


HPC_RESUME_PROGRAM = """
import importlib, os, sys, tempfile
from lightning_mpi_env.lightning import compat

pl = importlib.import_module(sys.argv[1])
root = tempfile.mkdtemp()
for name in ("hpc_ckpt_1.ckpt", "hpc_ckpt_3.ckpt"):
    open(os.path.join(root, name), "w").close()
trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=root)
outside = compat.hpc_resume_path(trainer)
os.environ.update(SLURM_NTASKS="1", SLURM_JOB_NAME="train")  # SLURMEnvironment.detect(): a Slurm job
print("PICKED", os.path.basename(compat.hpc_resume_path(trainer)), outside, flush=True)
open(os.path.join(root, "hpc_ckpt_" + chr(0x663) + ".ckpt"), "w").close()  # an Arabic-Indic 3
try:
    compat.hpc_resume_path(trainer)
except ValueError as error:
    print("UNREADABLE", type(error).__name__, flush=True)
"""


@pytest.mark.parametrize(("lightning", "package"), in_each_namespace(TRAINER_PACKAGES), indirect=["lightning"])
def test_hpc_resume_path_is_the_file_lightning_resumes_by_itself(lightning, package):
    # Lightning's _CheckpointConnector._hpc_resume_path under SLURMEnvironment.detect(): the highest number among the
    # names holding hpc_ckpt_, outside Slurm none; a name with no ASCII digit after it fails Lightning's own reading.
    env = lightning.environ({"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})
    result = subprocess.run(
        [sys.executable, "-c", HPC_RESUME_PROGRAM, package], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, f"{lightning}: {result.stderr[-4000:]}"
    assert "PICKED hpc_ckpt_3.ckpt None\n" in result.stdout, result.stdout
    assert "UNREADABLE ValueError\n" in result.stdout, result.stdout


KEPT_FIT_PROGRAM = """
import importlib, os, sys, tempfile, torch
from torch.utils.data import DataLoader, TensorDataset
from lightning_mpi_env.recovery.trainer_state import keep_at_failure, note
from lightning_mpi_env.recovery.restart import Generation

pl = importlib.import_module(sys.argv[1])
FAIL_AT = 4  # the step whose training_step fails (before its optimizer step), 4 done before it
x = torch.linspace(-1, 1, 32, dtype=torch.float64).reshape(16, 2)
data = TensorDataset(x, torch.ones(16, 1, dtype=torch.float64))

class Net(pl.LightningModule):
    def __init__(self, fail):
        super().__init__()
        torch.manual_seed(0)
        self.layer, self.fail, self.seen = torch.nn.Linear(2, 1, dtype=torch.float64), fail, []
    def training_step(self, batch, batch_idx):
        self.seen.append((batch_idx, self.trainer.global_step))
        if self.fail and self.trainer.global_step == FAIL_AT:
            raise RuntimeError("a peer was lost")
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

class Keep(pl.Callback):  # what the package's callback does under restartable
    position = None
    def __init__(self, generation):
        self.generation = generation
    def on_train_start(self, trainer, module):
        self.position = note(trainer, batch_ended=False)
    def on_train_batch_end(self, trainer, *rest):
        self.position = note(trainer, batch_ended=True)
    def on_exception(self, trainer, module, exception):
        keep_at_failure(trainer, self.generation, self.position)

def fit(net, callbacks=(), ckpt_path=None, items=data):
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))
    trainer.fit(net, DataLoader(items, batch_size=2), ckpt_path=ckpt_path)
    return [float(v) for v in torch.cat([p.detach().flatten() for p in net.parameters()])]

# A plain DataLoader starts the epoch's data again on a resume: batches 0 to 3, then 0 to 3 again.
whole = fit(Net(False), items=torch.utils.data.Subset(data, range(8)))
generation = Generation(1, 0, 1)
try:
    fit(Net(True), [Keep(generation)])
except RuntimeError:
    pass
kept = generation.kept
assert set(kept) >= {"state_dict", "optimizer_states", "loops", "global_step"}, sorted(kept)
path = os.path.join(tempfile.mkdtemp(), "kept.ckpt")
torch.save(kept, path)  # the hand-over's bytes, through Lightning's own file loading
resumed = Net(False)
weights = fit(resumed, ckpt_path=path)
print("PROBE", json.dumps({"kept_step": kept["global_step"], "first": resumed.seen[0],
      "steps": len(resumed.seen), "equal": max(abs(a - b) for a, b in zip(weights, whole)) < 1e-12}))
""".replace("import importlib,", "import importlib, json,")


@pytest.mark.parametrize(("lightning", "package"), in_each_namespace(TRAINER_PACKAGES), indirect=["lightning"])
def test_the_kept_state_resumes_at_the_failed_step(lightning, package):
    # dump_checkpoint (Trainer._checkpoint_connector.dump_checkpoint) and fit_loop_state (trainer.fit_loop's state)
    # as the callback's keep_at_failure uses them: step 4 fails in training_step, before its optimizer step, after 4
    # steps; Lightning resumes the kept state (from a file here) at global step 4, with the momentum of 4 steps.
    probe = _probe(lightning, KEPT_FIT_PROGRAM, package)
    # Lightning 2.6's loop goes on at batch index 4; 2.1's counts from 3 again (the index of the last batch done): its
    # own mid-epoch resume. In both, a plain DataLoader gives the epoch's first batches again.
    first = [4, 4] if lightning is INSTALLED else [3, 4]
    assert probe == {"kept_step": 4, "first": first, "steps": 4, "equal": True}, f"{lightning}: {probe}"


CHECKED_BY = {
    "can_reconfigure": groups.test_the_installed_torch_opens_each_generations_group_anew,
    "init_reconfigurable_group": groups.test_torch_2_14_reconfigures_the_one_group_in_place,
    "reconfigure": groups.test_torch_2_14_reconfigures_the_one_group_in_place,
    "reconfigure_handle": groups.test_torch_2_14_reconfigures_the_one_group_in_place,
    "dump_checkpoint": test_the_kept_state_resumes_at_the_failed_step,
    "fit_loop_state": test_the_kept_state_resumes_at_the_failed_step,
    "DEVICE_ID_SINCE": device_id.test_ddp_mpi_passes_its_device_as_device_id,
    "init_dist_connection": device_id.test_lightning_s_own_call_finds_the_group_already_open,
    "package_version": device_id.test_ddp_mpi_passes_its_device_as_device_id,
    "passes_device_id": device_id.test_the_plugin_with_lightnings_ddp_passes_lightnings_device_from_2_5_5_only,
    "HPC_CHECKPOINT": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "SETTLE_SECONDS": test_collectives_settle_once_at_exit_while_a_process_group_is_alive,
    "SIGTERM_COLLECTIVE_SINCE": test_a_trainer_ended_by_sigterm_exits_143,
    "lightning_version": test_a_trainer_ended_by_sigterm_exits_143,
    "release_collectives_at_exit": test_collectives_settle_once_at_exit_while_a_process_group_is_alive,
    "sigterm_handler_runs_collective": test_a_trainer_ended_by_sigterm_exits_143,
    "SRUN_NOT_USED": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "ENTRY_POINT_LOGGERS": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "ENTRY_POINT_NAME": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "quiet_entry_point_line": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "hpc_checkpoint_name": test_hpc_checkpoint_name_is_lightnings,
    "record_sigterm_without_collective": test_a_trainer_ended_by_sigterm_exits_143,
    "settle_collectives_at_exit": test_collectives_settle_once_at_exit_while_a_process_group_is_alive,
    "silence_srun_not_used": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "strategy_registry": test_ddp_meets_in_the_roll_call_before_init_process_group,
    "hpc_resume_path": test_hpc_resume_path_is_the_file_lightning_resumes_by_itself,
}


def test_every_name_of_compat_is_checked_here():
    assert set(compat.__all__) == set(CHECKED_BY)
