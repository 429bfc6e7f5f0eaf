"""Installed or imported from a source tree, a Trainer that uses the package's strategy gets its callback, once.

Lightning adds the callback through the ``callbacks_factory`` entry points that ``pip install`` registers. A program
that imports the package from a checkout on ``PYTHONPATH`` has none: here that is a fresh ``python -S`` whose
``sys.path`` is this checkout's package (a link to it) and a copy of the venv's ``site-packages`` made of links,
without this package's ``dist-info`` and editable finder: Lightning, torch and the rest as installed, the package
not. ``"ddp_mpi"`` then adds the callback from its ``setup_environment`` (``Trainer._run`` calls it before the first
callback hook of the run); the plugin with Lightning's own strategy, which never hands it the Trainer, says so once.
The same program in the venv itself, where the package is installed, is the control: one callback, the entry
point's, and no warning.

``SLURM_JOB_ID`` makes the callback needed (a job that can requeue) without a launcher: one process, one device,
the recommended line as a user types it on a workstation.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.clusters.lightning_versions import (  # noqa: F401  (oldest_lightning: a fixture, requested by name)
    INSTALLED,
    Lightning,
    oldest_lightning,
)
from tests.conftest import python_path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import importlib, importlib.metadata, json, os, sys, warnings
import torch
PACKAGE = sys.argv[1]
MODULE = {"lightning.pytorch": "lightning_mpi_env.pytorch", "pytorch_lightning": "lightning_mpi_env.pytorch_lightning"}
recommended = importlib.import_module(MODULE[PACKAGE])  # the recommended line: from ... import MPIDDPStrategy
pl = importlib.import_module(PACKAGE)
from lightning_mpi_env.lightning.callbacks import callback_class
from lightning_mpi_env.lightning.entry_point import CallbackWarning

HOOKS = ("setup", "on_sanity_check_start", "on_train_start", "on_train_batch_start", "on_before_backward",
         "on_after_backward", "on_train_batch_end", "teardown", "on_exception")
calls = []
cls = callback_class(PACKAGE)
for name in HOOKS:  # record each hook Lightning calls on the package's callback, then run it
    def recorded(self, *args, _name=name, _original=getattr(cls, name), **kwargs):
        calls.append(_name)
        return _original(self, *args, **kwargs)
    setattr(cls, name, recorded)


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


def names(trainer):
    return [type(callback).__name__ for callback in trainer.callbacks]


QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
report = {
    "version": pl.__version__,
    "package_file": importlib.import_module("lightning_mpi_env").__file__,
    "entry_points": [p.value for p in importlib.metadata.entry_points(group=PACKAGE + ".callbacks_factory")],
}


PORTS = sys.argv[2:]  # one for each roll call: a process group set up again meets again


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for port in PORTS[:2]:  # the plugin with Lightning's own strategy, twice in one process
        os.environ["MASTER_PORT"] = port
        plugin = pl.Trainer(
            strategy="ddp", devices=1, plugins=[recommended.MPIClusterEnvironment()], max_steps=1,
            enable_checkpointing=False, **QUIET
        )
        plugin.fit(Model())
        torch.distributed.destroy_process_group()  # so that the next Trainer sets one up through its environment
report["plugin"], report["plugin_calls"] = names(plugin), calls[:]
report["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CallbackWarning)]
calls.clear()

os.environ["MASTER_PORT"] = PORTS[2]
trainer = pl.Trainer(strategy=recommended.MPIDDPStrategy(), max_steps=2, **QUIET)
report["made"] = names(trainer)
trainer.fit(Model())
report["first_fit"], report["first_calls"] = names(trainer), calls[:]
calls.clear()
trainer.fit_loop.epoch_loop.max_steps = 4  # two more steps
trainer.fit(Model())  # a second run of the same Trainer: still one callback
report["second_fit"], report["second_calls"] = names(trainer), calls[:]
print("REPORT " + json.dumps(report), flush=True)
"""

STEP = ["on_train_batch_start", "on_before_backward", "on_after_backward", "on_train_batch_end"]
FIT_HOOKS = ["setup", "on_train_start", *STEP, *STEP, "teardown"]
"""The callback's hooks Lightning calls in a fit of two steps without validation, in order."""


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``sys.path`` of a Python with Lightning installed and this package only as a source tree: ``[src, site]``."""
    root = tmp_path_factory.mktemp("source-tree")
    src, site = root / "src", root / "site"
    src.mkdir()
    site.mkdir()
    (src / "lightning_mpi_env").symlink_to(REPO / "lightning_mpi_env")
    installed = Path(sysconfig.get_paths()["purelib"])
    for entry in installed.iterdir():
        name = entry.name
        ours = name.startswith(("lightning_mpi_env", "__editable__", "_lightning_mpi_env_entry"))
        if not ours and not name.endswith(".pth"):  # .pth files: the editable finder is one
            (site / name).symlink_to(entry)
    return [str(src), str(site)]


def free_ports(count: int) -> list[str]:
    """``count`` ports free now, distinct (each held until all are found)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [str(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _run(tmp_path: Path, package: str, path: list[str] | None, lightning: Lightning = INSTALLED) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "4242"}
    # Ports of its own: the job id would derive one port for every test that runs with it.
    argv = [sys.executable, "-c", textwrap.dedent(PROGRAM), package, *free_ports(3)]
    overlay = [] if lightning.overlay is None else [str(lightning.overlay)]
    if path is None:  # the venv, where the package is installed
        env["PYTHONPATH"] = python_path(*map(Path, overlay))
    else:  # no site: sys.path is the source tree, then the installed packages without this one
        env["PYTHONPATH"] = os.pathsep.join([path[0], *overlay, *path[1:]])
        argv.insert(1, "-S")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert reports, output[-5000:]
    report: dict = json.loads(reports[0][len("REPORT ") :])
    return report


@pytest.mark.parametrize("package", ["lightning.pytorch", pytest.param("pytorch_lightning", marks=pytest.mark.slow)])
def test_from_a_source_tree_the_strategy_adds_its_callback_and_the_plugin_says_so_once(tmp_path, source_tree, package):
    report = _run(tmp_path, package, source_tree)
    assert report["package_file"] == str(Path(source_tree[0]) / "lightning_mpi_env" / "__init__.py")
    assert not any("lightning_mpi_env" in value for value in report["entry_points"])  # not installed
    assert "MPIEnvCallback" not in report["made"]  # Lightning added nothing
    # The strategy added it at the start of the run, before the checkpoint callback, and Lightning called its hooks.
    assert report["first_fit"][-2:] == ["MPIEnvCallback", "ModelCheckpoint"]
    assert report["first_fit"].count("MPIEnvCallback") == 1
    assert report["first_calls"] == FIT_HOOKS
    assert report["second_fit"] == report["first_fit"]
    assert report["second_calls"] == FIT_HOOKS
    # The plugin with Lightning's own strategy cannot get it: one warning for the two Trainers, naming the fix.
    assert "MPIEnvCallback" not in report["plugin"]
    [warning] = report["warnings"]
    assert "imported from a source tree, not installed" in warning
    assert "HINT: Install the package (`pip install -e <checkout>`)" in warning
    assert "from lightning_mpi_env.pytorch import MPIDDPStrategy" in warning


@pytest.mark.parametrize("package", ["lightning.pytorch", pytest.param("pytorch_lightning", marks=pytest.mark.slow)])
def test_installed_the_entry_point_adds_the_callback_and_the_strategy_adds_none(tmp_path, package):
    report = _run(tmp_path, package, None)
    assert (
        f"_lightning_mpi_env_entry:{'unified' if package == 'lightning.pytorch' else 'standalone'}_callbacks"
        in (report["entry_points"])
    )
    assert report["made"].count("MPIEnvCallback") == 1  # the entry point's, when the Trainer was made
    assert report["first_fit"] == report["second_fit"] == report["made"]  # never a second one
    assert report["first_calls"] == report["second_calls"] == FIT_HOOKS  # each hook once
    assert report["plugin"].count("MPIEnvCallback") == 1
    assert report["plugin_calls"] == ["setup", "on_train_start", *STEP, "teardown"] * 2
    assert report["warnings"] == []


@pytest.mark.slow  # installs Lightning 2.1.4 on first use
def test_the_same_on_the_oldest_lightning(tmp_path, source_tree, request):
    # Lightning 2.1's Trainer._run calls setup_environment before the first callback hook too.
    oldest: Lightning = request.getfixturevalue("oldest_lightning")
    for run in ("tree", "installed"):
        (tmp_path / run).mkdir()
    tree = _run(tmp_path / "tree", "lightning.pytorch", source_tree, oldest)
    installed = _run(tmp_path / "installed", "lightning.pytorch", None, oldest)
    assert tree["version"] == installed["version"] == oldest.version
    assert tree["first_calls"] == tree["second_calls"] == installed["first_calls"] == FIT_HOOKS
    assert tree["first_fit"][-2:] == installed["made"][-2:] == ["MPIEnvCallback", "ModelCheckpoint"]
    assert (len(tree["warnings"]), installed["warnings"]) == (1, [])
