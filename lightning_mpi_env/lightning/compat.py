"""Every private name of Lightning this package still relies on, in one place.

Lightning offers no public hook for what these functions do; each one names the Lightning internals it reads, and
``tests/test_compat.py`` fails when a supported Lightning version changes them. Nothing here imports Lightning or
torch at module level: they are only touched through objects the caller already has.

Call order relied on (checked by the tests against the real Trainer and Fabric of each namespace):

- ``Trainer(...)``/``Fabric(...)`` proposes ranks once while it is constructed (``_lazy_init_strategy`` calls
  ``set_world_ranks``): ``set_global_rank`` then ``set_world_size``.
- The launcher's ``launch()`` calls ``validate_settings(num_devices, num_nodes)`` in every process before anything
  else (``_SubprocessScriptLauncher``).
- Every strategy's ``setup_environment`` sets the device up, then proposes the ranks again (``set_world_ranks``:
  ``set_global_rank`` then ``set_world_size``), then reads ``main_address``/``main_port`` and calls
  ``init_process_group`` with ``init_method="env://"`` (DDP, FSDP and ModelParallel through
  ``_init_dist_connection``; DeepSpeed through ``deepspeed.init_distributed``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from enum import Enum
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The public torch.distributed.TCPStore, named where torch's type stubs define it.
    pass

from lightning_mpi_env.core.namespaces import package_of

TRAINER_ENTRY_POINTS = ("fit", "validate", "test", "predict")
"""The Trainer methods whose arguments (model, datamodule) the mixed-import guard checks before Lightning does."""

FABRIC_ENTRY_POINTS = ("launch", "setup", "setup_module")
"""The Fabric methods before which the guard checks the strategy (one of them starts any Fabric program)."""


def is_trainer(obj: object) -> bool:
    """Whether ``obj`` is a ``Trainer`` of either namespace (by its class, without importing Lightning)."""
    return any(
        base.__name__ == "Trainer" and package_of(base.__module__) in ("lightning.pytorch", "pytorch_lightning")
        for base in type(obj).__mro__
    )


def is_fabric(obj: object) -> bool:
    """Whether ``obj`` is a ``Fabric`` of either namespace (by its class, without importing Lightning)."""
    return any(
        base.__name__ == "Fabric" and package_of(base.__module__) in ("lightning.fabric", "lightning_fabric")
        for base in type(obj).__mro__
    )


SETTING_RANKS = ("set_world_ranks", "_set_world_ranks")
"""The strategy methods that propose ranks to the cluster environment (the Trainer's and Fabric's names)."""


class Proposal(Enum):
    """Where a rank proposal to the cluster environment comes from."""

    CONSTRUCTION = "a Trainer or Fabric being built"
    """``_lazy_init_strategy`` inside ``Trainer(...)``/``Fabric(...)``: the ranks are not set up yet."""
    SETUP = "a strategy about to call init_process_group"
    """``set_world_ranks`` in ``setup_distributed``, in every strategy: ``init_process_group`` comes next."""
    OTHER = "anything else"
    """A direct call (a test, user code): nothing follows from it."""


def proposal(start: FrameType | None = None, max_depth: int = 16) -> Proposal:
    """Where the current rank proposal to the cluster environment comes from.

    Lightning proposes ranks twice: while ``Trainer(...)``/``Fabric(...)`` is built, and in ``setup_distributed``
    right before ``init_process_group``. Only the second may start the roll call. No public hook tells them apart,
    and ``validate_settings`` is not called at all for FSDP and ModelParallel under an external launcher. Private:
    relies on the strategy methods named in :data:`SETTING_RANKS` and on ``Trainer.__init__``/``Fabric.__init__``.

    Args:
        start: The frame of the environment's setter; its caller's by default.
        max_depth: How many frames to look through.
    """
    frames = list(frames_above(start or sys._getframe(1), max_depth))
    for frame in frames:
        if frame.f_code.co_name == "__init__":
            candidate = frame.f_locals.get("self")
            if candidate is not None and (is_trainer(candidate) or is_fabric(candidate)):
                return Proposal.CONSTRUCTION
    # The caller is the first frame past the setter and any subclass overrides of it that called super().
    callers = [frame for frame in frames[1:] if frame.f_code.co_name not in _SETTERS]
    caller = callers[0] if callers else None
    if caller is not None and caller.f_code.co_name in SETTING_RANKS and "self" in caller.f_locals:
        return Proposal.SETUP
    return Proposal.OTHER


_SETTERS = frozenset({"set_global_rank", "set_world_size"})
"""The cluster environment's rank setters that Lightning calls (a user's subclass may override them)."""


def frames_above(frame: FrameType | None, max_depth: int) -> Iterator[FrameType]:
    """``frame`` and its callers, at most ``max_depth`` of them."""
    for _ in range(max_depth):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


def constructing_trainer(start: FrameType | None = None, max_depth: int = 12) -> object | None:
    """The Trainer whose ``__init__`` is on the stack, if any.

    Private: relies on ``Trainer.__init__`` (its ``self``) calling into the strategy and cluster environment while
    the Trainer is built. Lightning offers no hook that hands a plugin its Trainer before ``fit()``.
    """
    return _constructing(is_trainer, start or sys._getframe(1), max_depth)


def constructing_fabric(start: FrameType | None = None, max_depth: int = 16) -> object | None:
    """The Fabric whose ``__init__`` is on the stack, if any (as :func:`constructing_trainer`)."""
    return _constructing(is_fabric, start or sys._getframe(1), max_depth)


def _constructing(kind: Callable[[object], bool], start: FrameType, max_depth: int) -> object | None:
    """The ``self`` of the innermost ``__init__`` on the stack from ``start`` for which ``kind`` holds, if any."""
    for frame in frames_above(start, max_depth):
        if frame.f_code.co_name == "__init__":
            candidate: object = frame.f_locals.get("self")
            if candidate is not None and kind(candidate):
                return candidate
    return None


def arguments_given(start: FrameType | None = None, max_depth: int = 24) -> frozenset[str] | None:
    """Which of ``devices``/``num_nodes`` the user gave to the Trainer or Fabric being built; ``None``: unknown.

    Private: for the Trainer, the ``kwargs`` of ``insert_env_defaults``, Lightning's wrapper of
    ``Trainer.__init__`` (2.1+), hold exactly what was passed, ``PL_TRAINER_*`` defaults included. ``Fabric.__init__``
    keeps no such record: there a value other than the default (``"auto"``, ``1``) counts as given, and so does
    ``LT_DEVICES``/``LT_NUM_NODES``.
    """
    import os

    for frame in frames_above(start or sys._getframe(1), max_depth):
        local = frame.f_locals
        if frame.f_code.co_name == "insert_env_defaults" and is_trainer(local.get("self")):
            kwargs = local.get("kwargs")
            if isinstance(kwargs, dict):
                return frozenset(name for name in ("devices", "num_nodes") if name in kwargs)
        if frame.f_code.co_name == "__init__" and is_fabric(local.get("self")):
            given = set()
            if local.get("devices", "auto") != "auto" or os.environ.get("LT_DEVICES"):
                given.add("devices")
            if local.get("num_nodes", 1) != 1 or os.environ.get("LT_NUM_NODES"):
                given.add("num_nodes")
            return frozenset(given)
    return None


def launching_trainer(start: FrameType | None = None, max_depth: int = 40) -> tuple[object | None, list[object]]:
    """The Trainer being launched, and the positional arguments of the function launched (model, data, ...).

    Private: relies on the local names ``trainer`` and ``args`` of the launcher's ``launch(function, *args,
    trainer=...)``, which calls ``ClusterEnvironment.validate_settings`` before the first step. Under Fabric there is
    no Trainer: ``(None, [])``.
    """
    for frame in frames_above(start or sys._getframe(1), max_depth):
        local = frame.f_locals
        candidate = local.get("trainer")
        if candidate is not None and is_trainer(candidate):
            arguments = local.get("args")
            extra = []
            if frame.f_code.co_name == "launch" and isinstance(arguments, tuple):
                extra = [argument for argument in arguments if argument is not None]
            return candidate, extra
    return None, []


def strategy_model(strategy: object) -> object | None:
    """The LightningModule the strategy holds (private ``Strategy._lightning_module``), or ``None``."""
    return _safe_getattr(strategy, "_lightning_module")


def strategy_checkpoint_io(strategy: object) -> object | None:
    """The checkpoint IO plugin the strategy holds (private ``Strategy._checkpoint_io``), or ``None``."""
    return _safe_getattr(strategy, "_checkpoint_io")


def strategy_registry(strategies: ModuleType) -> Any:
    """The strategy registry of a ``strategies`` package.

    ``StrategyRegistry`` in the Trainer's, ``STRATEGY_REGISTRY`` in Fabric's; both have
    ``register(name, cls, description=..., override=...)``.
    """
    registry = getattr(strategies, "StrategyRegistry", None)
    return registry if registry is not None else strategies.STRATEGY_REGISTRY


SRUN_NOT_USED = "The `srun` command is available on your system but is not used"
"""The start of Lightning's warning from ``SLURMEnvironment._validate_srun_used`` (private text, Lightning 2.1+)."""


def silence_srun_not_used() -> None:
    """Ignore Lightning's "`srun` is available but not used" warning in this process.

    Lightning gives it whenever ``srun`` is on ``PATH`` and the process was not started by ``srun``: on every HPC
    login node, and for every rank ``mpirun`` starts. With this package's environment the ranks come from the
    launcher that did start them, so the advice to prepend ``srun`` is wrong. Lightning's class for it
    (``PossibleUserWarning``) is not ours to change: the filter matches its text, and only that.
    """
    import warnings

    warnings.filterwarnings("ignore", message=f"^{SRUN_NOT_USED}", category=UserWarning)


def _safe_getattr(obj: object, name: str) -> object | None:
    try:
        value: object | None = getattr(obj, name, None)
        return value
    except Exception:  # noqa: BLE001 - a property that cannot answer yet holds nothing to check
        return None


__all__ = [
    "FABRIC_ENTRY_POINTS",
    "SETTING_RANKS",
    "SRUN_NOT_USED",
    "TRAINER_ENTRY_POINTS",
    "Proposal",
    "arguments_given",
    "constructing_fabric",
    "constructing_trainer",
    "frames_above",
    "is_fabric",
    "is_trainer",
    "launching_trainer",
    "proposal",
    "silence_srun_not_used",
    "strategy_checkpoint_io",
    "strategy_model",
    "strategy_registry",
]
