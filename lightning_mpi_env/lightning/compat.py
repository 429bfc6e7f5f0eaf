"""Every contract with Lightning's and torch's internals this package relies on, each docstring naming the one it uses.

**Call order relied on** by the plugin under Lightning's own strategies: ``Trainer``/``Fabric`` proposes ranks once
while it is built; every strategy's ``setup_environment`` proposes them again right before ``init_process_group``,
then reads ``main_address`` (as a process starting Lightning's own workers does after the first proposal only). So
the roll call runs at the first read of the address after the second proposal.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, cast

from lightning_mpi_env.gpu.nccl import version_numbers

HPC_CHECKPOINT = re.compile(r"^hpc_ckpt_([0-9]+)\.ckpt$")
"""Lightning's HPC checkpoint names (``hpc_save``/``_hpc_resume_path``); ASCII digits: ``\\d`` takes other digits."""

SRUN_NOT_USED = "The `srun` command is available on your system but is not used"
"""The start of Lightning's warning from ``SLURMEnvironment._validate_srun_used`` (Lightning 2.1+)."""


ENTRY_POINT_LOGGERS = ("lightning.fabric.utilities.registry", "lightning_fabric.utilities.registry")
"""The loggers of Lightning's ``_load_external_callbacks`` (2.1+), which logs ``Adding N callbacks from entry point
'NAME': ...`` at INFO in every Trainer a ``callbacks_factory`` entry point adds callbacks to."""

ENTRY_POINT_NAME = "lightning_mpi_env"
"""This package's ``callbacks_factory`` entry points' name (``pyproject.toml``), as that line quotes it."""


class _OwnEntryPointLine(logging.Filter):
    """Drops the line that says Lightning added this package's callbacks, and no other."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f" from entry point '{ENTRY_POINT_NAME}'" not in record.getMessage()


def quiet_entry_point_line() -> Callable[[], None]:
    """Leave out Lightning's line about this package's entry point until the returned call (a rank other than 0's).

    Each rank's Trainer logs it, and Lightning knows no rank yet when it does: under ``mpirun`` every rank says it.
    """
    quiet = _OwnEntryPointLine()
    loggers = [logging.getLogger(name) for name in ENTRY_POINT_LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)

    def restore() -> None:
        for logger in loggers:
            logger.removeFilter(quiet)

    return restore


def strategy_registry(strategies: ModuleType) -> Any:
    """A ``strategies`` package's registry: ``StrategyRegistry`` (Trainer) or ``STRATEGY_REGISTRY`` (Fabric)."""
    registry = getattr(strategies, "StrategyRegistry", None)
    return registry if registry is not None else strategies.STRATEGY_REGISTRY


def hpc_checkpoint_name(number: int) -> str:
    """The file name of Lightning's HPC checkpoint number ``number``."""
    return f"hpc_ckpt_{number}.ckpt"


_srun_silencers = 0
_srun_filter: tuple[Any, ...] | None = None
_srun_lock = threading.Lock()


def silence_srun_not_used() -> Callable[[], None]:
    """Ignore Lightning's "`srun` ... not used" advice until the returned call: wrong for any launched rank.

    Under another launcher srun is not needed; under srun in an allocation whose job name is ``interactive`` or
    ``bash`` (``salloc``'s own), ``SLURMEnvironment.detect()`` takes the step for an interactive session and gives
    the advice to a program that srun started. ``detect()`` runs in every ``fit()`` without ``ckpt_path`` and in
    :func:`hpc_resume_path`; while a Trainer or Fabric is made, only where no cluster environment was given.
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
    """At interpreter exit, while a process group is alive, give its worker threads the GIL once.

    Else a Gloo worker freeing a finished collective's work is unwound at finalization: "terminate called without an
    active exception", status 134 (pytorch/pytorch#190489). Registered right before ``init_process_group``.
    """
    atexit.unregister(_let_collective_workers_finish)
    atexit.register(_let_collective_workers_finish)


def release_collectives_at_exit() -> bool:
    """Unregister :func:`settle_collectives_at_exit`'s hook unless a process group is still alive; whether it did."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return False
    atexit.unregister(_let_collective_workers_finish)
    return True


SIGTERM_COLLECTIVE_SINCE = (2, 5, 2)
"""The first Lightning whose ``_sigterm_notifier_fn`` broadcasts from rank 0 (Lightning-AI/pytorch-lightning#20825)."""


def lightning_version(trainer: Any) -> tuple[int, ...]:
    """The version of the Trainer's package (``lightning`` or ``pytorch_lightning``) as numbers, e.g. ``(2, 6, 6)``.

    >>> import types
    >>> lightning_version(types.SimpleNamespace())
    ()
    """
    return package_version(type(trainer).__module__)


DEVICE_ID_SINCE = (2, 5, 5)
"""The first Lightning whose DDP and FSDP pass ``device_id`` on a GPU (Lightning-AI/pytorch-lightning#21105)."""


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
    """Lightning's ``_init_dist_connection`` with ``kwargs``; the strategy's own call after it then returns at once."""
    distributed: Any = importlib.import_module(f"{fabric_package}.utilities.distributed")
    distributed._init_dist_connection(cluster_environment, backend, **kwargs)


def sigterm_handler_runs_collective(trainer: Any) -> bool:
    """Whether the Trainer's ``SIGTERM`` handler broadcasts (Lightning 2.5.2+: :data:`SIGTERM_COLLECTIVE_SINCE`)."""
    return lightning_version(trainer) >= SIGTERM_COLLECTIVE_SINCE


def record_sigterm_without_collective(
    trainer: Any, note: Callable[[], None] | None = None, after: Callable[[], None] | None = None
) -> bool:
    """For this ``fit``, a ``SIGTERM`` handler in the place of Lightning's ``_sigterm_notifier_fn``, with no collective.

    Lightning's (:data:`SIGTERM_COLLECTIVE_SINCE`) broadcasts wherever the main thread is: ranks signalled a moment
    apart enter it at different points and hang. Without ``note`` (Lightning 2.5.2+ only) the handler sets
    ``received_sigterm`` as Lightning 2.1's does: the loop stops this rank after its step, and broadcasts rank 0's flag
    each step. With ``note`` (every version) it calls ``note`` instead and leaves ``received_sigterm`` unset, so that no
    rank stops by itself: the caller stops every rank at one step. Either way it kills the workers Lightning started
    itself, as Lightning's does, and Lightning's other handlers still run. Call from the main thread once Lightning
    registered its handlers; whether the handler went in. ``after``: called last, once the other handlers ran.
    """
    if note is None and not sigterm_handler_runs_collective(trainer):
        return False
    connector: Any = getattr(trainer, "_signal_connector", None)
    notifier = getattr(connector, "_sigterm_notifier_fn", None)
    composed = getattr(signal.getsignal(signal.SIGTERM), "signal_handlers", None)
    if notifier is None or not isinstance(composed, list) or notifier not in composed:
        return False
    others = [handler for handler in composed if handler != notifier and callable(handler)]
    signalled = False

    def record_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal signalled
        if not signalled and not connector.received_sigterm:
            launcher = trainer.strategy.launcher
            if launcher is not None:  # workers Lightning started itself get the signal too
                launcher.kill(signum)
        signalled = True
        if note is None:
            connector.received_sigterm = True
        else:
            note()
        for handler in others:
            handler(signum, frame)
        if after is not None:
            after()

    signal.signal(signal.SIGTERM, record_sigterm)
    return True


def hpc_resume_path(trainer: Any) -> str | None:
    """What ``fit(model)`` resumes by itself under Slurm (``_hpc_resume_path``), or ``None``; raises as ``fit()``."""
    package = type(trainer).__module__.split(".trainer", 1)[0]  # "lightning.pytorch" or "pytorch_lightning"
    environments: Any = importlib.import_module(f"{package}.plugins.environments")
    if not environments.SLURMEnvironment.detect():
        return None
    path = trainer._checkpoint_connector._hpc_resume_path
    return None if path is None else str(path)


def dump_checkpoint(trainer: Any) -> dict[str, Any]:
    """Lightning's checkpoint dictionary of ``trainer`` now, as ``save_checkpoint`` writes it, without its barriers.

    ``_checkpoint_connector.dump_checkpoint()`` (2.1+): ``trainer.save_checkpoint`` is this between two barriers, and a
    barrier is what a failed collective left no way to pass. The tensors are the live ones (no copy).
    """
    checkpoint: dict[str, Any] = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    return checkpoint


def fit_loop_state(trainer: Any) -> dict[str, Any]:
    """The fit loop's position now, as ``dump_checkpoint`` puts it under ``checkpoint["loops"]["fit_loop"]`` (2.1+).

    Taken at a batch's end, it is what Lightning's own ``ModelCheckpoint`` saves mid-epoch, loader state included.
    """
    state: dict[str, Any] = trainer.fit_loop.state_dict()
    return state


def can_reconfigure() -> bool:
    """Whether the installed torch's ``init_process_group`` takes ``enable_reconfigure`` (torch 2.14+).

    pytorch/pytorch#186298 added the API (private, experimental); #187381 implemented it for gloo.
    """
    import inspect

    import torch.distributed as dist

    return "enable_reconfigure" in inspect.signature(dist.init_process_group).parameters


def init_reconfigurable_group(backend: str | None, **kwargs: Any) -> bool:
    """``init_process_group(backend, enable_reconfigure=True, **kwargs)``, where :func:`can_reconfigure`.

    The group's communicator then opens only at :func:`reconfigure`, which is called again, on the same group, with
    each new set of peers. Returns whether the group opened so (``_supports_reconfigure``): a backend that does not
    take the API ignores the flag, and its group is an ordinary one, open already.
    """
    import torch.distributed as dist

    init: Any = dist.init_process_group
    init(backend, enable_reconfigure=True, **kwargs)
    c10d: Any = dist.distributed_c10d
    return bool(c10d._supports_reconfigure())


def reconfigure_handle() -> str:
    """What peers must know of this process to reconfigure the default group with it (``_get_reconfigure_handle``).

    Opaque; a new one after each reconfiguration.
    """
    import torch.distributed as dist

    c10d: Any = dist.distributed_c10d
    return str(c10d._get_reconfigure_handle())


def reconfigure(number: int, handles: list[str], timeout: float) -> None:
    """Open the default group's communicator anew over ``handles`` (their order is the ranks'), waiting for it.

    ``number`` names the reconfiguration (torch's ``uuid``): a number not used before on the group's store, under
    which its keys live there. Raises what torch raises when a peer does not come within ``timeout`` seconds.
    """
    from datetime import timedelta

    import torch.distributed as dist

    c10d: Any = dist.distributed_c10d
    c10d._reconfigure(uuid=number, handles=handles, timeout=timedelta(seconds=timeout)).wait()


__all__ = [
    "DEVICE_ID_SINCE",
    "ENTRY_POINT_LOGGERS",
    "ENTRY_POINT_NAME",
    "HPC_CHECKPOINT",
    "SETTLE_SECONDS",
    "SIGTERM_COLLECTIVE_SINCE",
    "SRUN_NOT_USED",
    "can_reconfigure",
    "dump_checkpoint",
    "fit_loop_state",
    "hpc_checkpoint_name",
    "init_dist_connection",
    "init_reconfigurable_group",
    "lightning_version",
    "package_version",
    "passes_device_id",
    "quiet_entry_point_line",
    "reconfigure",
    "reconfigure_handle",
    "record_sigterm_without_collective",
    "release_collectives_at_exit",
    "settle_collectives_at_exit",
    "sigterm_handler_runs_collective",
    "silence_srun_not_used",
    "strategy_registry",
    "hpc_resume_path",
]
