"""The callback Lightning adds to each Trainer through the ``callbacks_factory`` entry points, where it has work.

Under ``restartable``, it also keeps the Trainer's state in memory for the next generation
(:mod:`lightning_mpi_env.recovery.trainer_state`).
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Any

from lightning_mpi_env.checks.findings import Writers, go_on_warning, stop_error
from lightning_mpi_env.checks.node_check import TIMEOUT as NODE_CHECK_TIMEOUT
from lightning_mpi_env.checks.node_check import Place, local_findings, run_node_check
from lightning_mpi_env.core.errors import LayoutError, MixedImportError, MixedImportWarning
from lightning_mpi_env.core.namespaces import STANDALONE, UNIFIED
from lightning_mpi_env.core.report import shows_errors_briefly
from lightning_mpi_env.core.settings import MixedImportMode
from lightning_mpi_env.imports.class_check import check_roles
from lightning_mpi_env.imports.sites import both_namespaces_loaded, mode
from lightning_mpi_env.lightning.compat import record_sigterm_without_collective
from lightning_mpi_env.lightning.entry_point import needed
from lightning_mpi_env.lightning.environment import MPIClusterEnvironment
from lightning_mpi_env.lightning.periodic import FitProgress
from lightning_mpi_env.lightning.requeue import checkpoint_and_requeue, refuse_another_jobs_resume
from lightning_mpi_env.recovery.trainer_state import FitPosition, keep_at_failure, note
from lightning_mpi_env.rollcall.sigterm import SIGTERM_STATUS
from lightning_mpi_env.rollcall.stall import BEFORE_THE_FIRST_STEP, IN_VALIDATION, PAST_VALIDATION

_CLASSES: dict[str, type] = {}


def callback_class(package: str) -> type:
    """``MPIEnvCallback`` for the Trainer package ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``)."""
    cls = _CLASSES.get(package)
    if cls is not None:
        return cls
    base: Any = importlib.import_module(f"{package}.callbacks").Callback

    sigterm_exception: type[BaseException] = importlib.import_module(f"{package}.utilities.exceptions").SIGTERMException

    class MPIEnvCallback(base):  # type: ignore[misc]
        """Checks the Trainer at ``setup``, marks progress, checkpoints and requeues, and gives SIGTERM status 143."""

        def __init__(self) -> None:
            super().__init__()
            self._finished = 0  # training batches finished: a count every rank shares, for the requeue agreement
            self._fit: FitProgress | None = None  # periodic checkpoints and the first-step record, per fit
            self._position: FitPosition | None = None  # under restartable: where the state kept on a failure stands

        def __reduce__(self) -> tuple[Any, tuple[str]]:
            # The class is made per namespace: ddp_spawn pickles the Trainer, and it, by the namespace's name.
            return _new_callback, (package,)

        @shows_errors_briefly
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """The node check (``"ddp_mpi"`` ran it already); objects of the other namespace (warn, or refuse)."""
            environment = _environment(trainer)
            if environment is not None and not environment.any_layout:
                check_nodes(trainer.strategy, package, trainer)
            if not both_namespaces_loaded():
                return
            current = mode()  # a bad LIGHTNING_MPI_ENV_MIXED_IMPORTS is a SettingError here, where it is used
            if current is MixedImportMode.IGNORE:
                return
            try:
                check_roles(trainer, [("model", pl_module)])
            except MixedImportError as error:
                if current is MixedImportMode.ERROR:
                    raise
                # Attributed to Lightning's hook call: the decorator's frame comes between.
                warnings.warn(MixedImportWarning(error.problem, error.hint), stacklevel=3)

        def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
            """The requeue handler; ``SIGTERM`` without a collective (Lightning registered its handlers by now)."""
            _start_training(trainer)

        @shows_errors_briefly
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            """As :meth:`on_sanity_check_start`, when no sanity check ran before; this fit's progress to keep."""
            _start_training(trainer)
            environment = _environment(trainer)
            self._fit = None if environment is None else FitProgress.start(trainer, environment.settings, os.environ)
            if environment is not None and environment.generation is not None:
                if shards_the_state(trainer.strategy, package):  # rank 0's state dictionary is its shard alone
                    environment.generation.keep_none(f"{type(trainer.strategy).__name__} {SHARDS}")
                else:
                    self._position = note(trainer, batch_ended=False)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """Put back what the environment changed process-wide (after Lightning put back its signal handlers)."""
            self._fit = self._position = None  # the fit is over: nothing more to save or record for it
            environment = _environment(trainer)
            if environment is not None:
                environment.between_steps(None)
                environment.teardown()
                if environment.requeue is not None:  # Lightning put back the handlers it found, ours among them
                    environment.requeue.restore()

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            """Progress before the first step: the model is set up, past DDP's first broadcast of the weights.

            A rank stuck after that broadcast and before this hook is behind the others, which wait in Lightning's
            barrier before the sanity check.
            """
            _mark(trainer, BEFORE_THE_FIRST_STEP)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            """Progress: a validation after a step started (every rank validates at the same steps)."""
            if not trainer.sanity_checking:
                _mark(trainer, IN_VALIDATION)

        def on_validation_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress before the first step: a sanity check batch came (a later validation's batches are no marks).

            Every rank runs as many sanity check batches; a rank whose batch never comes is behind the others, which
            wait in the next collective (the step's, the metrics' sync, the training data's length check).
            """
            if trainer.sanity_checking:
                _mark(trainer, BEFORE_THE_FIRST_STEP)
            _watch_worker_ends(trainer)

        def on_validation_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress before the first step: a sanity check batch ran (a rank stuck in its step is behind).

            After it, work that is no mark: ranks may have uneven validation batches, and one still validating while
            the others wait for it is working, not stalled.
            """
            if trainer.sanity_checking:
                _mark(trainer, BEFORE_THE_FIRST_STEP)
            else:
                _busy(trainer)

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            """Progress: this rank's validation batches are done; before the metrics' sync and the module's hook.

            A rank stuck in validation is behind the others, which wait in a collective after it (the sync,
            ``ModelCheckpoint``'s barrier, the next step).
            """
            if not trainer.sanity_checking:
                _mark(trainer, PAST_VALIDATION)

        def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
            """Progress before the first step: the sanity check ended (a rank stuck at its end is behind)."""
            _mark(trainer, BEFORE_THE_FIRST_STEP)

        def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: the step started (no longer between steps)."""
            _mark(trainer, 1)
            _watch_worker_ends(trainer)
            _between_steps(trainer, None)

        def on_before_backward(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: backward (and its collectives) next."""
            _mark(trainer, 2)

        def on_after_backward(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress for the stall watchdog: past backward."""
            _mark(trainer, 3)

        @shows_errors_briefly
        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            """Progress; checkpoint and requeue when any rank got the requeue signal, else a periodic save where due.

            After a periodic save, the step ends where ``run --leave-out-stragglers`` asked to leave stragglers out.
            """
            _mark(trainer, 0)
            self._finished += 1
            environment = _environment(trainer)
            if environment is None:
                return
            if self._position is not None:  # before the collectives below: a lost peer fails those
                self._position = note(trainer, batch_ended=True)
            if environment.requeue is not None and environment.requeue_due(
                self._finished, trainer.strategy.reduce_boolean_decision
            ):
                checkpoint_and_requeue(trainer, environment.requeue, environment.settings.max_requeues)
            self._stop_if_sigterm_due(trainer, environment)
            if self._fit is not None:
                progress, self._fit = self._fit, self._fit.after_batch(trainer)
                if self._fit.last_saved > progress.last_saved:  # every rank saved a periodic checkpoint just now
                    step, broadcast = trainer.global_step, trainer.strategy.broadcast
                    environment.leave_out_stragglers(trainer.global_rank, step, broadcast)
            # Validation, the epoch's end, the next batch: a SIGTERM there is decided in its handler, as here.
            environment.between_steps(lambda: self._stop_if_sigterm_due(trainer, environment))

        def _stop_if_sigterm_due(self, trainer: Any, environment: MPIClusterEnvironment) -> None:
            """After a ``SIGTERM`` to any rank, every rank stops at one step: time limit, requeue; else exit 143."""
            if environment.sigterm_due(self._finished):
                if environment.requeue_at_time_limit(trainer.global_rank, trainer.strategy.reduce_boolean_decision):
                    assert environment.requeue is not None
                    limit = "SIGTERM at the time limit"
                    checkpoint_and_requeue(trainer, environment.requeue, environment.settings.max_requeues, limit)
                _stop_on_sigterm(trainer, environment, sigterm_exception)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            """``SIGTERMException`` exits 0; make it 143: the job did not finish (a script's ``&&`` stops).

            Where the ranks agree on a step after a ``SIGTERM`` to any of them (``rollcall/sigterm.py``), the callback
            raises it itself, with 143, at that step on every rank. Under ``restartable``, it keeps the state the next
            generation resumes from (:func:`keep_at_failure`).
            """
            environment = _environment(trainer)
            if environment is not None and environment.generation is not None:
                keep_at_failure(trainer, environment.generation, self._position)
            if (
                environment is not None
                and isinstance(exception, sigterm_exception)
                and isinstance(exception, SystemExit)
                and not exception.code
            ):
                exception.code = SIGTERM_STATUS

    MPIEnvCallback.__module__ = __name__
    MPIEnvCallback.__qualname__ = "MPIEnvCallback"
    _CLASSES[package] = MPIEnvCallback
    return MPIEnvCallback


def _environment(trainer: Any) -> MPIClusterEnvironment | None:
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return environment if isinstance(environment, MPIClusterEnvironment) else None


def _start_training(trainer: Any) -> None:
    environment = _environment(trainer)
    if environment is not None:
        _record_sigterm(trainer, environment)
        environment.watch_requeue_signal()  # chained to the SIGTERM handler when the requeue signal is SIGTERM
        if environment.requeue is not None:
            refuse_another_jobs_resume(trainer, environment.requeue)  # Lightning's own Slurm resume takes any job's


def _record_sigterm(trainer: Any, environment: MPIClusterEnvironment) -> None:
    """``SIGTERM`` noted for the ranks' stop agreement where there is one, else recorded as Lightning 2.1 does."""
    stop = environment.sigterm_stop
    if stop is None:
        record_sigterm_without_collective(trainer)
    else:
        record_sigterm_without_collective(trainer, stop.note, stop.stop_between_steps)


def _stop_on_sigterm(trainer: Any, environment: MPIClusterEnvironment, exception: type[BaseException]) -> None:
    """Lightning's own ``SIGTERMException`` (``exception``), with status 143, at the step every rank stops at."""
    stop = environment.sigterm_stop
    if stop is not None:
        stop.say(int(trainer.global_step))
    raise exception(SIGTERM_STATUS)


def _busy(trainer: Any) -> None:
    environment = _environment(trainer)
    if environment is not None:
        environment.mark_busy()


def _between_steps(trainer: Any, stop: Any) -> None:
    environment = _environment(trainer)
    if environment is not None:
        environment.between_steps(stop)


def _watch_worker_ends(trainer: Any) -> None:
    """Once the loader's workers started (their batch came): a worker ended by ``SIGTERM`` counts as the rank's."""
    environment = _environment(trainer)
    if environment is not None:
        environment.watch_worker_ends()


def _mark(trainer: Any, phase: int) -> None:
    environment = _environment(trainer)
    if environment is not None:
        environment.mark_progress(trainer.global_step, phase)


SHARDED_STRATEGIES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy")
"""Lightning's strategies whose checkpoints every rank writes a part of (FSDP's full state dict too: it is private)."""


SHARDS = "shards the model and optimizer state over the ranks: no rank holds all of it to hand over"
"""Why ``restartable`` keeps no Trainer state in memory under a sharded strategy (after the strategy's name)."""


def shards_the_state(strategy: Any, package: str) -> bool:
    """Whether ``strategy`` (of Lightning's ``package``) shards the model and optimizer state over the ranks."""
    module = importlib.import_module(f"{package}.strategies")
    return isinstance(strategy, tuple(getattr(module, name) for name in SHARDED_STRATEGIES if hasattr(module, name)))


def check_nodes(strategy: Any, package: str, trainer: Any = None) -> None:
    """The node check, on every rank once the process group is open and before the model is built.

    ``strategy`` is of ``package``; a fitting ``trainer``'s checkpoint folders are checked (Fabric names none). Raises
    a ``NodeCheckError`` where the job stops; rank 0 warns where it goes on. Without the roll call, nothing runs.
    """
    environment = getattr(strategy, "cluster_environment", None)
    if not isinstance(environment, MPIClusterEnvironment) or environment.met is None:
        return
    met = environment.met
    import torch.distributed

    if not torch.distributed.is_initialized():
        return
    place = Place(
        environment.global_rank(),
        environment.world_size(),
        met.claim.host,
        met.nodes.node_rank,
        met.nodes.local_rank == 0,
    )
    device = strategy.root_device
    choice = None
    if device.type == "cuda":
        try:
            choice = environment.device_for("cuda")
        except LayoutError:
            choice = None  # the launch gave this rank no known device: nothing to compare
    found = local_findings(place, _checkpoint_folders(trainer, environment), choice)
    nccl = device.type == "cuda" and "nccl" in str(torch.distributed.get_backend())
    writers = Writers.EVERY_RANK if shards_the_state(strategy, package) else Writers.RANK_ZERO
    # A job the roll call allows this long to meet gets as long for its first collective (NCCL's set-up at scale).
    bound = max(NODE_CHECK_TIMEOUT, environment.rendezvous_timeout)
    outcome = run_node_check(met.store, place, found, writers=writers, device=device if nccl else "cpu", timeout=bound)
    if outcome.stop:
        raise stop_error(outcome.findings, outcome.unnamed, writers)
    if outcome.findings:
        warnings.warn(go_on_warning(outcome.findings, outcome.unnamed, writers), stacklevel=4)  # Lightning's call


def _checkpoint_folders(trainer: Any, environment: MPIClusterEnvironment) -> list[str]:
    """Where a fitting Trainer saves: each checkpoint callback's folder, and the requeue's (``default_root_dir``)."""
    if trainer is None or getattr(trainer.state.fn, "value", None) != "fit":
        return []
    root = str(trainer.default_root_dir)
    folders = [str(callback.dirpath or root) for callback in trainer.checkpoint_callbacks]
    return [*folders, root] if environment.requeue is not None else folders


def _new_callback(package: str) -> Any:
    return callback_class(package)()


def attach(trainer: Any, package: str) -> None:
    """Give ``trainer`` the callback where no entry point did (``"ddp_mpi"``), before its first checkpoint callback."""
    cls = callback_class(package)
    callbacks = trainer.callbacks
    if any(isinstance(callback, cls) for callback in callbacks) or not needed(os.environ):
        return
    checkpoint: type = importlib.import_module(f"{package}.callbacks").Checkpoint
    first = next((index for index, callback in enumerate(callbacks) if isinstance(callback, checkpoint)), None)
    callbacks.insert(len(callbacks) if first is None else first, cls())


def unified_callbacks() -> list[Any]:
    """The ``lightning.pytorch.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(UNIFIED.trainer)()] if needed(os.environ) else []


def standalone_callbacks() -> list[Any]:
    """The ``pytorch_lightning.callbacks_factory`` entry point: one ``MPIEnvCallback`` per Trainer, when needed."""
    return [callback_class(STANDALONE.trainer)()] if needed(os.environ) else []
