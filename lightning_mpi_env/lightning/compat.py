"""Every contract with Lightning's internals this package relies on, in one place.

The Lightning layer extends Lightning through its public hooks only: ``ClusterEnvironment`` methods, the
``"ddp_mpi"`` strategy's public ``setup_environment``, ``num_nodes`` and ``parallel_devices``, callbacks added through
Lightning's ``callbacks_factory`` entry points, Lightning's own HPC checkpoint resume, and public Trainer/Fabric
properties. What remains is here, each name's docstring saying which private name or behaviour of Lightning (2.1
to 2.6) it relies on; ``tests/lightning/test_compat.py`` checks each against the real Trainer and Fabric of both
namespaces (``CHECKED_BY`` there names the test of each). Nothing here imports Lightning or torch at module level.

**Call order relied on** (no name is read; the order of public calls is), for ``MPIClusterEnvironment`` as a plugin
of Lightning's own strategies only (``"ddp_mpi"`` runs the roll call from its own ``setup_environment``):

- ``Trainer(...)``/``Fabric(...)`` proposes ranks to the cluster environment once while it is built
  (``set_global_rank`` then ``set_world_size``).
- Every strategy's ``setup_environment`` proposes them again right before ``init_process_group``, then reads
  ``main_address`` and ``main_port`` (DDP, FSDP and ModelParallel through ``_init_dist_connection``, DeepSpeed
  through its ``_set_node_environment_variables``). A process that starts Lightning's own workers
  (``_SubprocessScriptLauncher``, ``ddp_spawn``) also reads them once before, after the first proposal only, to
  start them. So the roll call runs at the first read of the address after the second proposal.

**Torch behaviour worked around:** :func:`settle_collectives_at_exit`.
"""

from __future__ import annotations

import atexit
import importlib
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, cast

from lightning_mpi_env.core.nccl import version_numbers

HPC_CHECKPOINT = re.compile(r"^hpc_ckpt_([0-9]+)\.ckpt$")
"""Lightning's names for HPC checkpoints (``CheckpointConnector.hpc_save``/``_hpc_resume_path``); ASCII digits only
(``\\d`` would take ``hpc_ckpt_\u0663.ckpt`` for number 3, a file that does not exist)."""

SRUN_NOT_USED = "The `srun` command is available on your system but is not used"
"""The start of Lightning's warning from ``SLURMEnvironment._validate_srun_used`` (Lightning 2.1+)."""


def strategy_registry(strategies: ModuleType) -> Any:
    """The strategy registry of a ``strategies`` package (Lightning offers no entry point for a package's strategy).

    ``StrategyRegistry`` in the Trainer's, ``STRATEGY_REGISTRY`` in Fabric's; both have
    ``register(name, cls, description=..., override=...)``.
    """
    registry = getattr(strategies, "StrategyRegistry", None)
    return registry if registry is not None else strategies.STRATEGY_REGISTRY


def hpc_checkpoint_name(number: int) -> str:
    """The file name of Lightning's HPC checkpoint number ``number``.

    >>> hpc_checkpoint_name(3)
    'hpc_ckpt_3.ckpt'
    """
    return f"hpc_ckpt_{number}.ckpt"


_srun_silencers = 0
_srun_filter: tuple[Any, ...] | None = None
_srun_lock = threading.Lock()


def silence_srun_not_used() -> Callable[[], None]:
    """Ignore Lightning's "`srun` is available but not used" warning until the returned function is called.

    Lightning gives it whenever ``srun`` is on ``PATH`` and the process was not started by ``srun``. For ranks
    another launcher started the advice to prepend ``srun`` is wrong, so an ``MPIClusterEnvironment`` made under
    such a launcher calls this (not without a launcher, where the advice may be right). The warning has no class of
    its own (``PossibleUserWarning`` is shared), so the filter matches its text. Several callers share one filter,
    removed when the last one is done.

    Returns:
        The function that takes the filter out again (idempotent).
    """
    global _srun_silencers, _srun_filter
    with _srun_lock:
        if _srun_silencers == 0 or _srun_filter not in warnings.filters:
            warnings.filterwarnings("ignore", message=f"^{re.escape(SRUN_NOT_USED)}", category=UserWarning)
            _srun_filter = warnings.filters[0]
        _srun_silencers += 1
    done = False

    def restore() -> None:
        global _srun_silencers, _srun_filter
        nonlocal done
        with _srun_lock:
            if done:
                return
            done = True
            _srun_silencers -= 1
            if _srun_silencers == 0 and _srun_filter in warnings.filters:
                # An "ignore" entry leaves nothing in the warning registries: removing it is the whole undo.
                cast("list[Any]", warnings.filters).remove(_srun_filter)
                _srun_filter = None

    return restore


SETTLE_SECONDS = 0.05
"""How long the main thread gives up the GIL at exit while a process group is alive."""


def _let_collective_workers_finish() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        time.sleep(SETTLE_SECONDS)


def settle_collectives_at_exit() -> None:
    """At interpreter exit, while a process group is alive, give its worker threads the GIL once (50 ms).

    A Gloo worker thread frees each finished collective's work object, whose thread-local state holds a Python
    object: freeing it needs the GIL. When the main thread ends right after its last collective (Fabric programs
    do; nothing in Lightning destroys the process group), that worker waits for the GIL until Python finalizes, and
    is then unwound through C++ frames: "terminate called without an active exception", status 134, for a rank that
    finished its work (pytorch/pytorch#190489). ``destroy_process_group()`` does not prevent it; giving up the GIL
    before finalization does. Registered once per process, right before ``init_process_group`` (never by an
    import); see :func:`release_collectives_at_exit`.
    """
    atexit.unregister(_let_collective_workers_finish)
    atexit.register(_let_collective_workers_finish)


def release_collectives_at_exit() -> bool:
    """At the end of a run: unregister :func:`settle_collectives_at_exit`'s hook, unless a process group is alive.

    Neither Lightning nor Fabric destroys the process group at the end of a run: while it lives, the hook keeps the
    interpreter's exit from crashing, so it stays (and does nothing once the group is destroyed).

    Returns:
        Whether the hook was unregistered.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return False
    atexit.unregister(_let_collective_workers_finish)
    return True


SIGTERM_COLLECTIVE_SINCE = (2, 5, 2)
"""The first Lightning whose ``SIGTERM`` handler runs a collective: ``_sigterm_notifier_fn`` broadcasts from rank 0
(Lightning-AI/pytorch-lightning#20825)."""


def lightning_version(trainer: Any) -> tuple[int, ...]:
    """The version of the Trainer's package (``lightning`` or ``pytorch_lightning``) as numbers, e.g. ``(2, 6, 6)``.

    >>> import types
    >>> lightning_version(types.SimpleNamespace())
    ()
    """
    return package_version(type(trainer).__module__)


DEVICE_ID_SINCE = (2, 5, 5)
"""The first Lightning whose DDP and FSDP strategies (Trainer and Fabric) pass ``device_id=root_device`` to
``init_process_group`` on a GPU (Lightning-AI/pytorch-lightning#21105)."""


def package_version(package: str) -> tuple[int, ...]:
    """The ``__version__`` of an imported Lightning package (``"lightning.fabric"``, ``"lightning_fabric"``) as numbers.

    >>> package_version("no_such_package")
    ()
    """
    return version_numbers(str(getattr(sys.modules.get(package.partition(".")[0]), "__version__", "")))


def passes_device_id(package: str) -> bool:
    """Whether ``package``'s DDP and FSDP strategies pass ``device_id`` to ``init_process_group`` (2.5.5+)."""
    return package_version(package) >= DEVICE_ID_SINCE


def init_dist_connection(fabric_package: str, cluster_environment: Any, backend: str, **kwargs: Any) -> None:
    """Lightning's own ``_init_dist_connection`` of ``fabric_package``, with ``kwargs`` for ``init_process_group``.

    Exactly the strategy's own call (``MASTER_ADDR``/``MASTER_PORT``, ``init_process_group``, the NCCL group's
    destruction at exit); it does nothing once ``torch.distributed`` is initialized, so the strategy's own call
    after it returns at once (``lightning.fabric.utilities.distributed``, 2.1 to 2.6).
    """
    distributed: Any = importlib.import_module(f"{fabric_package}.utilities.distributed")
    distributed._init_dist_connection(cluster_environment, backend, **kwargs)


def sigterm_handler_runs_collective(trainer: Any) -> bool:
    """Whether the Trainer's ``SIGTERM`` handler broadcasts (Lightning 2.5.2+: :data:`SIGTERM_COLLECTIVE_SINCE`)."""
    return lightning_version(trainer) >= SIGTERM_COLLECTIVE_SINCE


def record_sigterm_without_collective(trainer: Any) -> bool:
    """For this ``fit``, a ``SIGTERM`` handler that records the signal as Lightning 2.1's does, with no collective.

    Only where Lightning's handler broadcasts from rank 0 (:data:`SIGTERM_COLLECTIVE_SINCE`). A handler runs
    wherever the main thread is when the signal comes, so ranks signalled a moment apart (``scancel``) enter that
    broadcast at different points, one in its step, the others in DDP's gradient all-reduce, and the job hangs until
    the collective's timeout (30 min). The loop itself broadcasts rank 0's ``received_sigterm`` at the start of every
    step (same versions), so every rank still stops at the same step. The other handlers Lightning composed for
    ``SIGTERM`` (``_HandlersCompose``) still run, in order; Lightning's signal connector puts back the handlers from
    before ``fit`` at its teardown, which runs after the strategy's. Call it from the main thread once Lightning
    registered its handlers.

    Returns:
        Whether the handler was replaced: not before :data:`SIGTERM_COLLECTIVE_SINCE`, and not when the one in place
        is not the connector's (already replaced, or another program's).
    """
    if not sigterm_handler_runs_collective(trainer):
        return False
    connector: Any = getattr(trainer, "_signal_connector", None)
    notifier = getattr(connector, "_sigterm_notifier_fn", None)
    composed = getattr(signal.getsignal(signal.SIGTERM), "signal_handlers", None)
    if notifier is None or not isinstance(composed, list) or notifier not in composed:
        return False
    others = [handler for handler in composed if handler != notifier and callable(handler)]

    def record_sigterm(signum: int, frame: FrameType | None) -> None:
        if not connector.received_sigterm:
            launcher = trainer.strategy.launcher
            if launcher is not None:  # workers Lightning started itself get the signal too
                launcher.kill(signum)
        connector.received_sigterm = True
        for handler in others:
            handler(signum, frame)

    signal.signal(signal.SIGTERM, record_sigterm)
    return True


def hpc_resume_path(trainer: Any) -> str | None:
    """The HPC checkpoint ``trainer.fit(model)`` resumes from by itself (no ``ckpt_path``); ``None``: none.

    Lightning does so under Slurm only (``SLURMEnvironment.detect()``: ``SLURM_NTASKS`` set, outside an interactive
    job), from the highest number in the names holding ``hpc_ckpt_`` in ``default_root_dir``, whatever job saved it
    (``_CheckpointConnector._hpc_resume_path``, 2.1 to 2.6).

    Raises:
        ValueError: Where Lightning's own reading of the names fails, as ``fit()`` would (a name holding
            ``hpc_ckpt_`` and no ASCII digit after it).
    """
    package = type(trainer).__module__.split(".trainer", 1)[0]  # "lightning.pytorch" or "pytorch_lightning"
    environments: Any = importlib.import_module(f"{package}.plugins.environments")
    if not environments.SLURMEnvironment.detect():
        return None
    path = trainer._checkpoint_connector._hpc_resume_path
    return None if path is None else str(path)


__all__ = [
    "DEVICE_ID_SINCE",
    "HPC_CHECKPOINT",
    "SETTLE_SECONDS",
    "SIGTERM_COLLECTIVE_SINCE",
    "SRUN_NOT_USED",
    "hpc_checkpoint_name",
    "init_dist_connection",
    "lightning_version",
    "package_version",
    "passes_device_id",
    "record_sigterm_without_collective",
    "release_collectives_at_exit",
    "settle_collectives_at_exit",
    "sigterm_handler_runs_collective",
    "silence_srun_not_used",
    "strategy_registry",
    "hpc_resume_path",
]
