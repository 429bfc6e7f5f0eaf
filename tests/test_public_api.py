"""The recommended imports: one module per Lightning package, with real classes for the type checker.

``from lightning_mpi_env.pytorch import MPIDDPStrategy`` (``.fabric``, ``.pytorch_lightning``, ``.lightning_fabric``)
gives the class ``strategy="ddp_mpi"`` gives in that package; mypy sees a subclass of the package's
``DDPStrategy`` with the real keyword arguments, not ``Any``. ``import lightning_mpi_env`` stays light.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from lightning_mpi_env.lightning.strategy import public_module

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "lightning_mpi_env"

MODULES = {
    # module: (its Lightning package, the entry point it serves, its namespace's fabric package)
    "lightning_mpi_env.pytorch": ("lightning.pytorch", "Trainer", "lightning.fabric"),
    "lightning_mpi_env.fabric": ("lightning.fabric", "Fabric", "lightning.fabric"),
    "lightning_mpi_env.pytorch_lightning": ("pytorch_lightning", "Trainer", "lightning_fabric"),
    "lightning_mpi_env.lightning_fabric": ("lightning_fabric", "Fabric", "lightning_fabric"),
}

CHECK = """
import importlib, json, pickle, sys
import lightning_mpi_env
for module_name, (package, entry, fabric) in json.loads(sys.argv[1]).items():
    module = importlib.import_module(module_name)
    cls = module.MPIDDPStrategy
    assert package in sys.modules  # asking for the class imports its package
    lightning_package = importlib.import_module(package)
    strategies = importlib.import_module(package + ".strategies")
    environments = importlib.import_module(fabric + ".plugins.environments")
    assert issubclass(cls, strategies.DDPStrategy), cls.__mro__
    assert cls.__module__ == module_name and cls.__qualname__ == "MPIDDPStrategy"  # pickled by this reference
    assert pickle.loads(pickle.dumps(cls)) is cls  # Fabric's class too, with both Trainer and Fabric loaded
    assert module.MPIClusterEnvironment is lightning_mpi_env.MPIClusterEnvironment
    assert isinstance(module.MPIClusterEnvironment(), environments.ClusterEnvironment)
    exported = ["MPIClusterEnvironment", "MPIDDPStrategy", *(["hpc_checkpoint"] if entry == "Trainer" else [])]
    assert sorted(module.__all__) == exported and all(hasattr(module, name) for name in exported)
    quiet = {"logger": False} if entry == "Trainer" else {}
    made = getattr(lightning_package, entry)(strategy=cls(), accelerator="cpu", **quiet)
    assert type(made.strategy) is cls
    by_name = getattr(lightning_package, entry)(strategy="ddp_mpi", accelerator="cpu", **quiet)
    assert type(by_name.strategy) is cls  # the name and the import give one class
    print("OK", module_name)
"""


@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
def test_each_module_gives_its_packages_class(namespace):
    # One process per namespace, Trainer first: the Fabric module still gives Fabric's class, which Fabric accepts
    # (in the unified namespace after `import lightning`, which loads lightning.pytorch and lightning.fabric).
    modules = {
        module: row
        for module, row in MODULES.items()
        if (row[0].startswith("lightning.")) == (namespace == "lightning")
    }
    code = ("import lightning\n" if namespace == "lightning" else "") + textwrap.dedent(CHECK)
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(modules)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[-2:] == [f"OK {module}" for module in modules]


def test_public_module_names_each_module():
    assert {public_module(package) for package, _, _ in MODULES.values()} == set(MODULES)
    assert all((PACKAGE_DIR / f"{module.rpartition('.')[2]}.py").is_file() for module in MODULES)


def test_the_imports_stay_light_and_the_old_name_points_to_the_new_import():
    # The four modules too, until their strategy is asked for: a tool that imports every module loads no Lightning.
    heavy = ["torch", "lightning", "pytorch_lightning", "lightning_fabric"]
    program = (
        "import sys, lightning_mpi_env\n"
        f"assert not set({[*heavy, *MODULES]!r}) & set(sys.modules)\n"
        f"import {', '.join(MODULES)}\n"
        f"assert not set({heavy!r}) & set(sys.modules), sorted(set({heavy!r}) & set(sys.modules))\n"
        "try:\n"
        "    lightning_mpi_env.MPIDDPStrategy\n"
        "except ImportError as error:\n"
        "    print(error.hint)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "`from lightning_mpi_env.pytorch import MPIDDPStrategy`" in done.stdout
    assert "`lightning_mpi_env.fabric` for Fabric" in done.stdout


def _renamed(text: str, module: str, other: str) -> str:
    """The unified module's text as the standalone module's: the module and the Lightning packages renamed."""
    text = text.replace(f"lightning_mpi_env.{module} ", f"lightning_mpi_env.{other} ")
    return text.replace("lightning.pytorch", "pytorch_lightning").replace("lightning.fabric", "lightning_fabric")


@pytest.mark.parametrize(("unified", "standalone"), [("pytorch", "pytorch_lightning"), ("fabric", "lightning_fabric")])
def test_the_standalone_modules_are_the_unified_ones_renamed(unified, standalone):
    # One text per kind of module: the typed signature cannot drift between the namespaces.
    text = (PACKAGE_DIR / f"{unified}.py").read_text()
    assert (PACKAGE_DIR / f"{standalone}.py").read_text() == _renamed(text, unified, standalone)


def test_the_modules_import_only_the_adapter_and_their_lightning():
    allowed = {"__future__", "typing", "collections", "datetime", "torch"}
    for module, (package, _, fabric) in MODULES.items():
        tree = ast.parse((PACKAGE_DIR / f"{module.rpartition('.')[2]}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                name = node.module
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            top = name.partition(".")[0]
            ours = name.startswith("lightning_mpi_env.lightning")
            lightning = name.startswith((f"{package}.", f"{fabric}."))
            assert ours or lightning or top in allowed, f"{module} imports {name}"


SNIPPET = """
from lightning.fabric import Fabric
from lightning.pytorch import Trainer
from lightning_fabric import Fabric as StandaloneFabric
from pytorch_lightning import Trainer as StandaloneTrainer

from lightning_mpi_env import fabric, lightning_fabric, pytorch, pytorch_lightning
from lightning_mpi_env.pytorch import hpc_checkpoint

reveal_type(pytorch.MPIDDPStrategy())
reveal_type(fabric.MPIDDPStrategy())
reveal_type(pytorch_lightning.MPIDDPStrategy())
reveal_type(lightning_fabric.MPIDDPStrategy())
reveal_type(pytorch.MPIClusterEnvironment().main_address)

trainer = Trainer(strategy=pytorch.MPIDDPStrategy(rendezvous_timeout=60, process_group_backend="gloo"))
Trainer(plugins=[pytorch.MPIClusterEnvironment()])
Fabric(strategy=fabric.MPIDDPStrategy(), plugins=[fabric.MPIClusterEnvironment()])
StandaloneTrainer(strategy=pytorch_lightning.MPIDDPStrategy(), plugins=[pytorch_lightning.MPIClusterEnvironment()])
StandaloneFabric(strategy=lightning_fabric.MPIDDPStrategy())
path: str | None = hpc_checkpoint(trainer)

pytorch.MPIDDPStrategy(rendezvous_timeout="soon")  # line 22: a wrong type
fabric.MPIDDPStrategy(60)  # line 23: positional
Fabric(strategy=pytorch.MPIDDPStrategy())  # line 24: the Trainer's class, which Fabric refuses
"""


def test_mypy_sees_each_class_and_catches_a_wrong_argument(tmp_path):
    snippet = tmp_path / "public_api_snippet.py"  # a module name of its own in the shared cache
    snippet.write_text(textwrap.dedent(SNIPPET).lstrip())
    stdout, stderr, status = mypy_api.run(
        # The project's cache, which its own mypy run (tests/test_project.py) fills with Lightning's and torch's types
        ["--strict", "--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache"), str(snippet)]
    )
    # By the file's name: for a module unchanged since a run from another folder, the cache gives that run's path.
    lines = [line.split(":", 1)[1] for line in stdout.splitlines() if line.split(":", 1)[0].endswith(snippet.name)]
    revealed = [line for line in lines if "Revealed type" in line]
    assert [line.replace("builtins.", "") for line in revealed] == [  # mypy < 2 spells it "builtins.str"
        '9: note: Revealed type is "lightning_mpi_env.pytorch.MPIDDPStrategy"',
        '10: note: Revealed type is "lightning_mpi_env.fabric.MPIDDPStrategy"',
        '11: note: Revealed type is "lightning_mpi_env.pytorch_lightning.MPIDDPStrategy"',
        '12: note: Revealed type is "lightning_mpi_env.lightning_fabric.MPIDDPStrategy"',
        '13: note: Revealed type is "str"',
    ], stdout + stderr
    errors = sorted({int(line.split(":")[0]) for line in lines if ": error:" in line})
    assert errors == [22, 23, 24], stdout + stderr
    assert status == 1
