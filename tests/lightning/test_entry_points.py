"""Installed but unused is inert: a program that never imports ``lightning_mpi_env`` gets exactly Lightning.

Lightning calls every installed ``callbacks_factory`` entry point in every ``Trainer(...)`` (its
``_configure_external_callbacks``, which logs "Adding N callbacks from entry point ..."); this package's name the
top-level module ``_lightning_mpi_env_entry``. Each program below runs in a fresh interpreter of this environment,
where the package is installed (its entry points registered), builds a plain Trainer and ``fit()``s it, builds a
Fabric, and reports what it saw. The same program with ``import lightning_mpi_env`` at the top is the control: the
checks see the package there, so they can fail.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import _lightning_mpi_env_entry as entry
from tests.clusters.lightning_versions import INSTALLED

PROGRAM = """
import importlib, json, sys
IMPORT_PACKAGE, PACKAGE, BOTH = sys.argv[1] == "import", sys.argv[2], sys.argv[3] == "both"
if IMPORT_PACKAGE:
    import lightning_mpi_env  # noqa: F401  (the control: a program that uses the package)
FABRIC = {"lightning.pytorch": "lightning.fabric", "pytorch_lightning": "lightning_fabric"}[PACKAGE]
if BOTH:  # both namespaces imported, no object mixed: the Trainer's objects all come from PACKAGE
    import lightning.pytorch, pytorch_lightning  # noqa: F401
import torch
pl = importlib.import_module(PACKAGE)


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


trainer = pl.Trainer(max_steps=2, accelerator="cpu", enable_progress_bar=False)
trainer.fit(Model())
fabric = importlib.import_module(FABRIC).Fabric(accelerator="cpu", devices=1)
registry = importlib.import_module(FABRIC + ".strategies").STRATEGY_REGISTRY
print("PROBE " + json.dumps({
    "callbacks": [type(callback).__name__ for callback in trainer.callbacks],
    "fabric_ddp_mpi": "ddp_mpi" in registry,
    "package_loaded": sorted(name for name in sys.modules if name.startswith("lightning_mpi_env")),
}), flush=True)
"""

SETTINGS = {
    "no launcher": {},
    "Slurm job": {"SLURM_JOB_ID": "4242"},  # any sbatch job: Slurm's job id (slurm.schedmd.com/sbatch.html)
    "torchrun": {"TORCHELASTIC_RUN_ID": "none"},  # torchrun exports it to every worker (pytorch.org/docs: elastic run)
    "bad mixed-import mode": {"LIGHTNING_MPI_ENV_MIXED_IMPORTS": "bogus"},
    "bad requeue setting in a Slurm job": {"LIGHTNING_MPI_ENV_REQUEUE": "maybe", "SLURM_JOB_ID": "4242"},
}

OURS = ("lightning_mpi_env", "lightning-mpi-env", "MPIEnvCallback", "callbacks from entry point")
"""What would show that something of ours ran: our names, and Lightning's line for an entry point's callbacks."""


def _run(tmp_path: Path, package: str, settings: dict[str, str], *, use: bool = False, both: bool = False) -> dict:
    env = INSTALLED.environ({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **settings})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM), "import" if use else "no", package, "both" if both else "one"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    probe = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0, output[-5000:]
    assert probe, output[-5000:]
    found: dict = json.loads(probe[0][len("PROBE ") :])
    found["ours"] = [word for word in OURS if word in output.replace(probe[0], "")]
    return found


@pytest.mark.parametrize(
    # The standalone namespace's entry point, the same factory under its own name: in the whole suite only.
    "package",
    ["lightning.pytorch", pytest.param("pytorch_lightning", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_program_that_never_imports_the_package_gets_exactly_lightning(tmp_path, package, setting):
    found = _run(tmp_path, package, SETTINGS[setting])
    assert found == {"callbacks": found["callbacks"], "fabric_ddp_mpi": False, "package_loaded": [], "ours": []}
    assert "MPIEnvCallback" not in found["callbacks"]


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_both_namespaces_imported_with_nothing_mixed_is_inert_too(tmp_path, package):
    found = _run(tmp_path, package, {"SLURM_JOB_ID": "4242"}, both=True)
    assert (found["fabric_ddp_mpi"], found["package_loaded"], found["ours"]) == (False, [], [])
    assert "MPIEnvCallback" not in found["callbacks"]


def test_the_control_a_program_that_imports_the_package_gets_its_callback(tmp_path):
    # The same program, importing the package, in a Slurm job: the checks above would see it.
    found = _run(tmp_path, "lightning.pytorch", {"SLURM_JOB_ID": "4242"}, use=True)
    assert "MPIEnvCallback" in found["callbacks"]
    assert found["fabric_ddp_mpi"] is True
    assert "lightning_mpi_env" in found["package_loaded"]
    assert "callbacks from entry point" in found["ours"]


def test_a_used_package_with_a_bad_setting_raises_where_the_setting_is_used(tmp_path):
    # Imported, with a bad requeue setting in a Slurm job: the import and the plain Trainer are fine (the factory reads
    # no setting); making the environment, which reads it, is one SettingError naming the variable.
    program = (
        "import lightning_mpi_env, lightning.pytorch as pl\n"
        "pl.Trainer(accelerator='cpu', logger=False)\n"
        "print('TRAINER OK', flush=True)\n"
        "try:\n"
        "    lightning_mpi_env.MPIClusterEnvironment()\n"
        "except lightning_mpi_env.LayoutError as error:\n"
        "    print(type(error).__name__, error.variable, flush=True)\n"
    )
    env = INSTALLED.environ(
        {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "4242", "LIGHTNING_MPI_ENV_REQUEUE": "maybe"}
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["TRAINER OK", "SettingError LIGHTNING_MPI_ENV_REQUEUE"]


def test_the_entry_points_name_the_top_level_module():
    # What Lightning loads: the installed metadata of this checkout names the module outside the package.
    for group, name in (
        ("lightning.pytorch.callbacks_factory", "unified_callbacks"),
        ("pytorch_lightning.callbacks_factory", "standalone_callbacks"),
    ):
        (point,) = [
            point for point in importlib.metadata.entry_points(group=group) if point.name == "lightning_mpi_env"
        ]
        assert point.value == f"{entry.__name__}:{name}"


def test_the_factories_return_nothing_and_import_nothing_until_the_package_is_imported():
    # In a fresh interpreter: the entry module imports nothing of the package; once it is imported, they delegate.
    program = (
        "import sys, _lightning_mpi_env_entry as entry\n"
        "print(entry.unified_callbacks(), entry.standalone_callbacks(), 'lightning_mpi_env' in sys.modules)\n"
        "import lightning_mpi_env, lightning.pytorch, pytorch_lightning\n"
        "print([type(c).__name__ for c in entry.unified_callbacks() + entry.standalone_callbacks()])\n"
    )
    env = {**os.environ, "LIGHTNING_MPI_ENV_MIXED_IMPORTS": "ignore"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["[] [] False", "['MPIEnvCallback', 'MPIEnvCallback']"]
