"""Every contract with Lightning's internals this package relies on, in one place.

The Lightning layer extends Lightning through its public hooks only: ``ClusterEnvironment`` methods, the
``"ddp_mpi"`` strategy's public ``num_nodes``/``parallel_devices`` setters, callbacks added through Lightning's
``callbacks_factory`` entry points, Lightning's own HPC checkpoint resume, and public Trainer/Fabric properties.
What remains here is what no public hook says; ``tests/lightning/test_compat.py`` checks each item against the real
Trainer and Fabric of both namespaces on the oldest (2.1) and newest supported Lightning. Nothing here imports
Lightning or torch at module level.

**Call order relied on** (no name is read; the order of public calls is):

- ``Trainer(...)``/``Fabric(...)`` proposes ranks to the cluster environment once while it is built
  (``set_global_rank`` then ``set_world_size``).
- Every strategy's ``setup_environment`` proposes them again right before ``init_process_group``, then reads
  ``main_address`` and ``main_port`` (DDP, FSDP and ModelParallel through ``_init_dist_connection``, DeepSpeed
  through its ``_set_node_environment_variables``). A process that starts Lightning's own workers
  (``_SubprocessScriptLauncher``, ``ddp_spawn``) also reads them once before, after the first proposal only, to
  start them. So the roll call runs at the first read of the address after the second proposal.

**Names relied on:**

- :func:`strategy_registry`: ``StrategyRegistry`` (Trainer) and ``STRATEGY_REGISTRY`` (Fabric) in each
  ``strategies`` package, with ``register(name, cls, description=..., override=...)``: Lightning registers its own
  strategies there and offers no entry point for a package's.
- :data:`HPC_CHECKPOINT`: the file names of Lightning's HPC checkpoints (``hpc_ckpt_<n>.ckpt`` in
  ``default_root_dir``), from which Lightning resumes by itself under Slurm (``SLURMEnvironment.detect()`` in the
  checkpoint connector) and which :func:`~lightning_mpi_env.hpc_checkpoint` finds on every scheduler.
- :data:`SRUN_NOT_USED`: the text of Lightning's "`srun` is available but not used" warning, which has no class of
  its own to filter by.

**Torch behaviour worked around:** :func:`settle_collectives_at_exit`.
"""

from __future__ import annotations

import atexit
import re
import sys
import time
import warnings
from types import ModuleType
from typing import Any

HPC_CHECKPOINT = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")
"""Lightning's names for HPC checkpoints (``CheckpointConnector.hpc_save``/``_hpc_resume_path``)."""

SRUN_NOT_USED = "The `srun` command is available on your system but is not used"
"""The start of Lightning's warning from ``SLURMEnvironment._validate_srun_used`` (Lightning 2.1+)."""


def strategy_registry(strategies: ModuleType) -> Any:
    """The strategy registry of a ``strategies`` package.

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


def silence_srun_not_used() -> None:
    """Ignore Lightning's "`srun` is available but not used" warning in this process (and only it).

    Lightning gives it whenever ``srun`` is on ``PATH`` and the process was not started by ``srun``: on every HPC
    login node, and for every rank ``mpirun`` starts. Called when an ``MPIClusterEnvironment`` is made under another
    launcher (never by an import): the ranks come from the launcher that did start them, so the advice to prepend
    ``srun`` is wrong. The warning has no class of its own (``PossibleUserWarning`` is shared), so the filter
    matches its text.
    """
    warnings.filterwarnings("ignore", message=f"^{re.escape(SRUN_NOT_USED)}", category=UserWarning)


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
    a thread taking the GIL then is unwound through C++ frames: "terminate called without an active exception",
    status 134, for a rank that finished its work (pytorch/pytorch#190489; an ``atexit`` fix in torch,
    pytorch/pytorch#179291, was abandoned). ``destroy_process_group()`` at the end of the program does not prevent
    it; giving up the GIL before finalization does. Called once the roll call's hook runs, right before
    ``init_process_group``: never by an import. Registered once per process.
    """
    atexit.unregister(_let_collective_workers_finish)
    atexit.register(_let_collective_workers_finish)


__all__ = [
    "HPC_CHECKPOINT",
    "SETTLE_SECONDS",
    "SRUN_NOT_USED",
    "hpc_checkpoint_name",
    "settle_collectives_at_exit",
    "silence_srun_not_used",
    "strategy_registry",
]
