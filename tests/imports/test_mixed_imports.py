"""Mixed-import guard: every scenario runs in a fresh interpreter, since it is all about ``sys.modules``."""

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_mpi_env import MixedImportError, MixedImportWarning
from lightning_mpi_env.core.namespaces import namespace_of, package_of
from lightning_mpi_env.imports.sites import MODE_VARIABLE, Mode, mode
from lightning_mpi_env.lightning.compat import SRUN_NOT_USED

TIMEOUT = 180

THIRD_PARTY = '''\
"""Stands for a library written against pytorch_lightning (NeMo-Aligner, PyG, ...)."""
import pytorch_lightning as pl
from pytorch_lightning.loggers import Logger


class ThirdPartyCallback(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        print("FOREIGN CALLBACK RAN", flush=True)


class ThirdPartyLogger(Logger):
    name = "third"
    version = 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class ThirdPartyData(pl.LightningDataModule):
    pass

'''

MODEL = """\
import torch


def make_model(namespace):
    class Model(namespace.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, index):
            print("TRAINING STEP", flush=True)
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)

    return Model()


def make_trainer(namespace, **kwargs):
    from lightning_mpi_env import MPIClusterEnvironment

    return namespace.Trainer(
        accelerator="cpu", devices=1, strategy="ddp", plugins=[MPIClusterEnvironment()], max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs
    )
"""


def run(tmp_path, code, mode_value=None, flags=(), how="file"):
    """Run ``code`` in a fresh interpreter, next to the helper modules: as ``main.py``, or by ``-c``."""
    (tmp_path / "thirdparty.py").write_text(THIRD_PARTY)
    (tmp_path / "models.py").write_text(MODEL)
    code = textwrap.dedent(code)
    (tmp_path / "main.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "LIGHTNING_MPI_ENV"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    if mode_value is not None:
        env[MODE_VARIABLE] = mode_value
    program = {"file": ["main.py"], "-c": ["-c", code]}[how]
    return subprocess.run(
        [sys.executable, *flags, *program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def warnings_of(result):
    return result.stderr.count("MixedImportWarning:")


# --- import order -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    # One order per path to the warning; how the importer is found or guessed, for any order: test_sites.py.
    ("code", "warned_at", "standalone", "unified"),
    [
        # Ours first: exact importer of both namespaces, warning at the second import.
        (
            "import lightning_mpi_env\nimport lightning\nimport pytorch_lightning\n",
            "main.py:3",
            "main.py:3 (imports `pytorch_lightning`)",
            "main.py:2 (imports `lightning`)",
        ),
        (
            "import lightning_mpi_env\nimport lightning_fabric\nimport lightning.fabric\n",
            "main.py:3",
            "main.py:2 (imports `lightning_fabric`)",
            "main.py:3 (imports `lightning`)",
        ),
        # Both before ours: warning at our import, importers guessed from module globals.
        (
            "import pytorch_lightning\nfrom lightning.pytorch import Trainer\nimport lightning_mpi_env\n",
            "main.py:3",
            "main.py:1 (refers to `pytorch_lightning`)",
            "main.py:2 (refers to `lightning.pytorch",
        ),
        # One before ours, one after.
        (
            "import pytorch_lightning\nimport lightning_mpi_env\nimport lightning\n",
            "main.py:3",
            "main.py:1 (refers to `pytorch_lightning`)",
            "main.py:3 (imports `lightning`)",
        ),
    ],
)
def test_every_import_order_warns_once_naming_both_importers(tmp_path, code, warned_at, standalone, unified):
    result = run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert warnings_of(result) == 1, result.stderr
    assert f"{warned_at}: MixedImportWarning: Both Lightning namespaces are imported" in result.stderr
    assert "pytorch_lightning / lightning_fabric: " in result.stderr
    for site in (standalone, unified):
        assert site in result.stderr, result.stderr
    assert "HINT: Import one namespace only" in result.stderr
    assert "unify_imports()" in result.stderr


def test_warns_in_a_program_without_a_source_file(tmp_path):
    # ``python -c`` (and ``python - < script``) run __main__ from no file (BuiltinImporter as loader);
    # the warning must still be shown instead of failing the import.
    code = "import lightning_mpi_env\nimport lightning.pytorch\nimport pytorch_lightning\nprint('OK')\n"
    result = run(tmp_path, code, how="-c")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"
    assert warnings_of(result) == 1, result.stderr
    assert ":3: MixedImportWarning: Both Lightning namespaces are imported" in result.stderr


def test_late_import_in_third_party_function_is_named(tmp_path):
    (tmp_path / "tp_lazy.py").write_text("def load():\n    x = 1\n    import pytorch_lightning\n    return x\n")
    result = run(tmp_path, "import lightning_mpi_env\nimport lightning.pytorch\nimport tp_lazy\ntp_lazy.load()\n")
    assert result.returncode == 0, result.stderr
    assert "tp_lazy.py:3: MixedImportWarning" in result.stderr
    assert "tp_lazy.py:3 (imports `pytorch_lightning`)" in result.stderr
    assert "main.py:2 (imports `lightning`)" in result.stderr


def test_guess_names_third_party_module_that_imported_before_us(tmp_path):
    result = run(tmp_path, "import lightning\nimport thirdparty\nimport lightning_mpi_env\n")
    assert warnings_of(result) == 1, result.stderr
    assert "thirdparty.py:2 (refers to `pytorch_lightning`)" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        # Each namespace, before and after the package, each of its roots.
        "import lightning_mpi_env\nimport lightning\nimport lightning.pytorch, lightning.fabric\n",
        "import pytorch_lightning\nimport lightning_mpi_env\n",
        "import lightning_fabric\nimport lightning_mpi_env\nimport pytorch_lightning\n",
    ],
)
def test_one_namespace_program_emits_no_warning_at_all(tmp_path, code):
    result = run(tmp_path, code, flags=("-W", "error"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_importing_the_package_imports_neither_torch_nor_lightning(tmp_path):
    result = run(
        tmp_path,
        """\
        import sys
        import lightning_mpi_env
        print(sorted(m for m in ("torch", "lightning", "pytorch_lightning", "lightning_fabric") if m in sys.modules))
        """,
    )
    assert result.stdout.strip() == "[]", result.stderr


# --- modes --------------------------------------------------------------------------------------------------------


def test_error_mode_raises_at_the_second_import(tmp_path):
    result = run(tmp_path, "import lightning_mpi_env\nimport lightning\nimport pytorch_lightning\n", mode_value="error")
    assert result.returncode == 1
    assert 'File "main.py", line 3' in result.stderr or 'main.py", line 3' in result.stderr
    assert "lightning_mpi_env.core.errors.MixedImportError: Both Lightning namespaces are imported" in result.stderr
    assert "main.py:2 (imports `lightning`)" in result.stderr


def test_error_mode_raises_at_our_import_when_both_are_loaded(tmp_path):
    result = run(tmp_path, "import lightning\nimport pytorch_lightning\nimport lightning_mpi_env\n", mode_value="error")
    assert result.returncode == 1
    assert "MixedImportError: Both Lightning namespaces are imported" in result.stderr


def test_ignore_mode_is_silent(tmp_path):
    # The mode is read where the guard acts, the same for either order (the error mode above meets both).
    code = "import lightning\nimport pytorch_lightning\nimport lightning_mpi_env\n"
    result = run(tmp_path, code, mode_value="ignore", flags=("-W", "error"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_invalid_mode_is_a_clear_error_where_the_guard_acts_never_at_import(tmp_path):
    # Importing the package reads no setting (issue 23): a program with one namespace never meets the bad value.
    quiet = run(tmp_path, "import lightning_mpi_env\nimport lightning\nprint('OK')\n", mode_value="loud")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "OK\n", "")
    # The guard reads it when it sees a mix: one SettingError (a ValueError, a LayoutError), named in the last line.
    result = run(tmp_path, "import lightning_mpi_env\nimport lightning\nimport pytorch_lightning\n", mode_value="loud")
    assert result.returncode == 1
    assert "SettingError: LIGHTNING_MPI_ENV_MIXED_IMPORTS='loud' is not one of warn, error, ignore." in result.stderr
    assert "HINT:" in result.stderr


@pytest.mark.parametrize(("raw", "expected"), [("", Mode.WARN), (" Error ", Mode.ERROR), ("IGNORE", Mode.IGNORE)])
def test_mode_parsing(raw, expected):
    assert mode({MODE_VARIABLE: raw}) is expected
    assert mode({}) is Mode.WARN


@given(st.text(max_size=12).filter(lambda s: s.strip().lower() not in ("", "warn", "error", "ignore")))
def test_any_other_mode_value_is_refused(raw):
    with pytest.raises(ValueError, match=r"LIGHTNING_MPI_ENV_MIXED_IMPORTS=.* is not one of warn, error, ignore"):
        mode({MODE_VARIABLE: raw})


@given(st.lists(st.sampled_from(["pytorch", "fabric", "core", "x1", "utilities"]), max_size=3))
def test_namespace_of_submodules(parts):
    suffix = "".join(f".{p}" for p in parts)
    assert namespace_of("pytorch_lightning" + suffix) == "pytorch_lightning"
    assert namespace_of("lightning_fabric" + suffix) == "pytorch_lightning"
    assert namespace_of("lightning" + suffix) == "lightning"
    assert namespace_of("lightning_mpi_env" + suffix) is None
    assert package_of("lightning_utilities" + suffix) is None


def test_public_names():
    assert issubclass(MixedImportWarning, UserWarning)
    assert issubclass(MixedImportError, TypeError)


# --- check_mixed_imports ------------------------------------------------------------------------------------------


def test_check_lists_every_offender_with_class_namespace_file_and_fix(tmp_path):
    result = run(
        tmp_path,
        """\
        import warnings
        warnings.simplefilter("ignore", UserWarning)
        import lightning.pytorch as L
        import lightning_mpi_env
        from thirdparty import ThirdPartyCallback, ThirdPartyData, ThirdPartyLogger
        import pytorch_lightning as pl

        class UserCallback(pl.Callback):
            pass

        trainer = L.Trainer(logger=False, callbacks=[ThirdPartyCallback(), UserCallback(), L.Callback()])
        try:
            lightning_mpi_env.check_mixed_imports(ThirdPartyData(), ThirdPartyLogger(), trainer=trainer)
        except lightning_mpi_env.MixedImportError as error:
            print(error)
        """,
    )
    out = result.stdout
    assert (
        "4 object(s) are built on the other Lightning namespace than the Trainer's namespace `lightning.pytorch`" in out
    )
    third = str(tmp_path / "thirdparty.py")
    main = str(tmp_path / "main.py")
    assert (
        f"callback `ThirdPartyCallback` inherits `pytorch_lightning.callbacks.callback.Callback` "
        f"(namespace `pytorch_lightning`, not the Trainer's `lightning.pytorch`), defined in {third}:6. "
        f"Fix: in {third}, import from `lightning.pytorch` instead of `pytorch_lightning`" in out
    ), out
    assert "callback `UserCallback` inherits `pytorch_lightning.callbacks.callback.Callback`" in out
    assert f"defined in {main}:8" in out
    assert "object `ThirdPartyData` inherits `pytorch_lightning.core.datamodule.LightningDataModule`" in out
    assert "object `ThirdPartyLogger` inherits `pytorch_lightning.loggers.logger.Logger`" in out
    assert out.count("unify_imports()") == 4
    # The Trainer's own callbacks and the lightning.pytorch one are not listed.
    assert "ModelSummary" not in out
    assert "`Callback`" not in out


def test_check_returns_none_on_a_clean_program_in_either_namespace(tmp_path):
    result = run(
        tmp_path,
        """\
        import warnings
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", DeprecationWarning)
        import sys
        import lightning_mpi_env
        from lightning_mpi_env import MPIClusterEnvironment, check_mixed_imports
        namespace = __import__(sys.argv[1] if len(sys.argv) > 1 else "lightning.pytorch", fromlist=["x"])
        from models import make_model

        class MyCallback(namespace.Callback):
            pass

        class MyEnv(MPIClusterEnvironment):
            pass

        trainer = namespace.Trainer(logger=False, plugins=[MPIClusterEnvironment()], callbacks=[MyCallback()])
        print(check_mixed_imports(make_model(namespace), MyEnv(), MPIClusterEnvironment, object(), trainer=trainer))
        print(check_mixed_imports(make_model(namespace), MyCallback()))
        print(check_mixed_imports())
        """,
    )
    assert result.stdout.split() == ["None", "None", "None"], result.stderr
    (tmp_path / "main.py").write_text(
        (tmp_path / "main.py").read_text().replace('"lightning.pytorch"', '"pytorch_lightning"')
    )
    again = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert again.stdout.split() == ["None", "None", "None"], again.stderr


def test_check_without_trainer_takes_the_first_object_as_reference(tmp_path):
    result = run(
        tmp_path,
        """\
        import lightning_mpi_env
        import lightning.pytorch as L
        import pytorch_lightning as pl
        try:
            environment = lightning_mpi_env.MPIClusterEnvironment()
            lightning_mpi_env.check_mixed_imports(pl.Callback(), L.Callback(), environment)
        except TypeError as error:
            print(error)
        """,
    )
    assert (
        "1 object(s) are built on the other Lightning namespace than the namespace `pytorch_lightning` of the first "
        "object, `Callback`" in result.stdout
    ), result.stderr
    assert "object `Callback` inherits `lightning.pytorch.callbacks.callback.Callback`" in result.stdout
    assert "import from `pytorch_lightning` instead of `lightning.pytorch`" in result.stdout


def test_check_flags_a_lightning_pytorch_object_in_a_pytorch_lightning_trainer(tmp_path):
    result = run(
        tmp_path,
        """\
        import warnings
        warnings.simplefilter("ignore", UserWarning)
        import lightning_mpi_env
        import pytorch_lightning as pl
        import lightning.pytorch as L
        from models import make_model
        try:
            lightning_mpi_env.check_mixed_imports(make_model(L), trainer=pl.Trainer(logger=False))
        except lightning_mpi_env.MixedImportError as error:
            print(error)
        """,
    )
    assert (
        "object `make_model.<locals>.Model` inherits `lightning.pytorch.core.module.LightningModule`" in result.stdout
    )
    assert "not the Trainer's `pytorch_lightning`" in result.stdout, result.stdout + result.stderr


# --- automatic check at fit time ----------------------------------------------------------------------------------

FIT = """\
import warnings
warnings.simplefilter("ignore", UserWarning)
import lightning_mpi_env
import lightning.pytorch as L
from models import make_model, make_trainer
import thirdparty
{body}
print("FIT DONE", flush=True)
"""


def test_fit_names_a_foreign_callback_before_the_first_step_warning_in_warn_mode(tmp_path):
    # Mode warn (the default) warns and never raises (issue 23): the warning names the callback, and fit() goes on.
    body = (
        "warnings.simplefilter('always', lightning_mpi_env.MixedImportWarning)\n"
        "make_trainer(L, callbacks=[thirdparty.ThirdPartyCallback()]).fit(make_model(L))"
    )
    result = run(tmp_path, FIT.format(body=body))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FIT DONE" in result.stdout
    # Lightning formats warnings without their class; the text is the MixedImportWarning's.
    assert "1 object(s) are built on the other Lightning namespace" in result.stderr, result.stderr[-3000:]
    assert "callback `ThirdPartyCallback` inherits `pytorch_lightning.callbacks.callback.Callback`" in result.stderr
    assert str(tmp_path / "thirdparty.py") in result.stderr
    assert "MixedImportError" not in result.stderr


def test_a_foreign_model_or_datamodule_is_named_by_the_explicit_check(tmp_path):
    # Lightning rejects a foreign model or datamodule inside fit() before any callback runs ("`model` must be a
    # `LightningModule`"), so the automatic check cannot see them (docs/mixed-imports.md): the explicit call does.
    body = (
        "import pytorch_lightning as pl\n"
        "lightning_mpi_env.check_mixed_imports(make_model(pl), thirdparty.ThirdPartyData(), trainer=make_trainer(L))"
    )
    result = run(tmp_path, FIT.format(body=body))
    assert result.returncode == 1
    assert "MixedImportError: 2 object(s)" in result.stderr, result.stderr[-3000:]
    assert "`make_model.<locals>.Model` inherits `pytorch_lightning.core.module.LightningModule`" in result.stderr
    assert "`ThirdPartyData` inherits `pytorch_lightning.core.datamodule.LightningDataModule`" in result.stderr


def test_fit_runs_clean_program_and_ignore_mode_skips_the_check(tmp_path):
    clean = run(tmp_path, FIT.format(body="make_trainer(L).fit(make_model(L))").replace("import thirdparty\n", ""))
    assert "TRAINING STEP" in clean.stdout, clean.stderr
    assert "FIT DONE" in clean.stdout
    assert "MixedImport" not in clean.stderr
    body = "make_trainer(L, callbacks=[thirdparty.ThirdPartyCallback()]).fit(make_model(L))"
    ignored = run(tmp_path, FIT.format(body=body), mode_value="ignore")
    assert "FIT DONE" in ignored.stdout, ignored.stderr
    assert "MixedImport" not in ignored.stderr


# --- unify_imports ------------------------------------------------------------------------------------------------


def test_unify_before_imports_gives_the_same_module_objects(tmp_path):
    result = run(
        tmp_path,
        """\
        import sys
        import lightning_mpi_env
        lightning_mpi_env.unify_imports()
        lightning_mpi_env.unify_imports()  # twice is harmless
        import pytorch_lightning as pl
        import pytorch_lightning.callbacks.early_stopping as early
        from lightning_fabric.plugins.environments import ClusterEnvironment
        import lightning.pytorch as L
        import lightning.fabric as F
        import thirdparty
        assert pl is L
        assert early is sys.modules["lightning.pytorch.callbacks.early_stopping"]
        assert ClusterEnvironment is F.plugins.environments.ClusterEnvironment
        assert L.__spec__.name == "lightning.pytorch"
        assert not [k for k, m in sys.modules.items() if getattr(m, "__name__", "").startswith("pytorch_lightning")]
        callback = thirdparty.ThirdPartyCallback()
        assert isinstance(callback, L.Callback)
        trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
        lightning_mpi_env.check_mixed_imports(thirdparty.ThirdPartyData(), trainer=trainer)
        print("UNIFIED")
        """,
        # Lightning's own srun advice comes wherever `srun` is on PATH (every HPC login node): not ours to judge here.
        flags=("-W", "error", "-W", "ignore::UserWarning:lightning", "-W", f"ignore:{SRUN_NOT_USED}:UserWarning"),
    )
    assert "UNIFIED" in result.stdout, result.stderr
    assert "MixedImport" not in result.stderr


def test_unify_after_lightning_is_fine(tmp_path):
    result = run(
        tmp_path,
        """\
        import lightning.pytorch as L
        import lightning_mpi_env
        lightning_mpi_env.unify_imports()
        import pytorch_lightning
        print(pytorch_lightning is L)
        """,
        flags=("-W", "error"),
    )
    assert result.stdout.strip() == "True", result.stderr


@pytest.mark.parametrize(
    ("before", "match"),
    [
        ("import pytorch_lightning\n", "unify_imports() was called after `pytorch_lightning`, `lightning_fabric` had"),
        ("import lightning_fabric\n", "unify_imports() was called after `lightning_fabric` had been imported"),
        ("import pytorch_lightning, lightning\n", "and `lightning.pytorch`/`lightning.fabric` had been imported"),
    ],
)
def test_unify_refuses_after_the_old_namespace_is_imported(tmp_path, before, match):
    code = before + "import lightning_mpi_env\ntry:\n    lightning_mpi_env.unify_imports()\nexcept TypeError as e:\n"
    code += "    print(e)\n"
    result = run(tmp_path, code, mode_value="ignore")
    assert match in result.stdout, result.stdout + result.stderr
    assert "HINT: Call `lightning_mpi_env.unify_imports()` at the very top" in result.stdout


@pytest.mark.parametrize(
    ("versions", "match"),
    [
        ({"lightning": None}, "needs the unified `lightning` package, which is not installed"),
        (
            {"lightning": "2.6.6", "pytorch-lightning": "2.5.0"},
            r"installed lightning==2.6.6 but pytorch-lightning==2.5.0",
        ),
        ({"lightning": "2.6.6", "pytorch-lightning": None, "lightning-fabric": "2.4.0"}, "lightning-fabric==2.4.0"),
    ],
)
def test_unify_refuses_missing_or_different_versions(tmp_path, versions, match):
    code = f"""\
        import lightning_mpi_env
        from lightning_mpi_env.imports import unify
        unify._installed_version = {versions!r}.get
        try:
            lightning_mpi_env.unify_imports()
        except lightning_mpi_env.MixedImportError as error:
            print(error)
        import sys
        print("pytorch_lightning" in sys.modules)
        """
    result = run(tmp_path, code)
    assert match in result.stdout, result.stdout + result.stderr
    assert result.stdout.strip().endswith("False")


def test_validate_settings_outside_a_trainer_checks_nothing():
    from lightning_mpi_env import MPIClusterEnvironment

    trainer = "not a Trainer"  # a local of that name, as the launcher has, but no Trainer
    assert MPIClusterEnvironment(environ={}).validate_settings(1, 1) is None
    assert trainer == "not a Trainer"
