"""How the mixed-import guard names an importer, in process: the stack walk, the guess from module globals, the line.

Only names are read here (a module's ``__name__``, a class's ``__module__``), so the objects below carry Lightning's
module names without being Lightning's modules. Each import order in a fresh interpreter, where these meet the real
namespaces, is ``test_mixed_imports.py``'s.
"""

import sys
import types

import pytest

from lightning_mpi_env.core.namespaces import STANDALONE, UNIFIED
from lightning_mpi_env.imports.sites import ImportSite, _first_import_line, _first_reference, _importer_frame


def _module(name: str, **values: object) -> types.ModuleType:
    module = types.ModuleType(name)
    vars(module).update(values)
    return module


def _class_of(module_name: str) -> type:
    return type("Callback", (), {"__module__": module_name})


def test_a_module_that_holds_a_namespace_module_class_or_function_refers_to_it():
    def trainer_factory() -> None:
        pass

    trainer_factory.__module__ = "lightning.pytorch.trainer.trainer"
    held = {
        "module": _module("user", np=types.ModuleType("numpy"), pl=types.ModuleType("pytorch_lightning")),
        "class": _module("user", Callback=_class_of("pytorch_lightning.callbacks.callback")),
        "function": _module("user", make=trainer_factory),
    }
    assert _first_reference(held["module"], STANDALONE.key) == "pytorch_lightning"
    assert _first_reference(held["module"], UNIFIED.key) is None
    assert _first_reference(held["class"], STANDALONE.key) == "pytorch_lightning.callbacks.callback"
    assert _first_reference(held["function"], UNIFIED.key) == "lightning.pytorch.trainer.trainer"
    assert _first_reference(held["function"], STANDALONE.key) is None


def test_values_that_are_not_modules_classes_or_functions_refer_to_nothing():
    names = _module("user", text="pytorch_lightning", number=3, instance=_class_of("pytorch_lightning.core")())
    assert _first_reference(names, STANDALONE.key) is None
    # The package's own modules are no Lightning namespace.
    assert _first_reference(_module("user", env=types.ModuleType("lightning_mpi_env")), UNIFIED.key) is None


@pytest.mark.parametrize(
    ("source", "key", "line"),
    [
        ("import os\nimport pytorch_lightning as pl\n", STANDALONE.key, 2),
        ("x = 1\n\n    from lightning_fabric.utilities import seed\n", STANDALONE.key, 3),
        ("import pytorch_lightning_extras\nimport pytorch_lightning\n", STANDALONE.key, 2),
        ("from lightning.pytorch import Trainer\n", UNIFIED.key, 1),
        ("import lightning_utilities\nimport lightningx\nimport lightning\n", UNIFIED.key, 3),
        ("import lightning.fabric, os\n", UNIFIED.key, 1),
        ("import lightning_mpi_env\n", UNIFIED.key, None),
        ("import lightning.pytorch\n", STANDALONE.key, None),
    ],
)
def test_the_first_line_that_imports_the_namespace_is_the_importer_s_line(tmp_path, source, key, line):
    path = tmp_path / "user.py"
    path.write_text(source)
    assert _first_import_line(str(path), key) == line


def test_a_module_without_a_file_has_no_line():
    assert _first_import_line(None, UNIFIED.key) is None


def test_a_site_says_whether_it_was_seen_or_guessed():
    assert str(ImportSite("pytorch_lightning", "main.py", 3, exact=True)) == "main.py:3 (imports `pytorch_lightning`)"
    assert str(ImportSite("lightning.pytorch", "lib.py", 2, exact=False)) == "lib.py:2 (refers to `lightning.pytorch`)"
    assert str(ImportSite("lightning", None, None, exact=True)) == "unknown file (imports `lightning`)"
    assert str(ImportSite("lightning", "tp.py", None, exact=False)) == "tp.py (refers to `lightning`)"


def _called_from(module_name: str) -> tuple[types.FrameType | None, str | None]:
    """``_importer_frame`` called from code whose module is ``module_name``, called from this test file."""
    space = {"__name__": module_name, "walk": _importer_frame, "sys": sys}
    exec(compile("found = walk(sys._getframe())", f"<{module_name}>", "exec"), space)
    return space["found"]


def test_the_importer_is_the_first_frame_outside_lightning_and_this_package():
    # Lightning importing its own modules is no importer: the walk goes on to the code that imported Lightning, and
    # names the outermost Lightning module it passed.
    frame, imported = _called_from("pytorch_lightning.callbacks")
    assert frame is not None
    assert frame.f_code is _called_from.__code__
    assert imported == "pytorch_lightning.callbacks"
    frame, imported = _called_from("lightning_mpi_env.imports.unify")
    assert frame is not None
    assert frame.f_code is _called_from.__code__
    assert imported is None  # this package is no importer, and no namespace either


def test_code_outside_lightning_is_its_own_importer():
    frame, imported = _called_from("thirdparty")
    assert frame is not None
    assert frame.f_globals["__name__"] == "thirdparty"
    assert imported is None


def test_no_frame_outside_lightning_is_no_importer():
    assert _importer_frame(None) == (None, None)
