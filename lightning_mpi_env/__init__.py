"""Start PyTorch Lightning, plain PyTorch DDP, torchrun and JAX correctly under MPI, or fail fast saying why."""

from lightning_mpi_env.environment import MPIClusterEnvironment as MPIClusterEnvironment
from lightning_mpi_env.errors import LayoutError as LayoutError
from lightning_mpi_env.interop import jax_distributed_kwargs as jax_distributed_kwargs
from lightning_mpi_env.interop import torch_env as torch_env
from lightning_mpi_env.layout import Placement as Placement
from lightning_mpi_env.layout import RankLayout as RankLayout
from lightning_mpi_env.layout import from_env as from_env
from lightning_mpi_env.mixed_imports import MixedImportError as MixedImportError
from lightning_mpi_env.mixed_imports import MixedImportWarning as MixedImportWarning
from lightning_mpi_env.mixed_imports import check_mixed_imports as check_mixed_imports
from lightning_mpi_env.mixed_imports import unify_imports as unify_imports

__version__ = "0.1.0"

# MPIDDPStrategy ("ddp_mpi"): registered in each Lightning namespace as it is imported; imports neither itself.
import lightning_mpi_env.strategy as _strategy  # noqa: E402
from lightning_mpi_env.strategy import strategy_class as strategy_class  # noqa: E402

__all__ = [
    "LayoutError",
    "MPIClusterEnvironment",
    "MixedImportError",
    "MixedImportWarning",
    "Placement",
    "RankLayout",
    "__version__",
    "check_mixed_imports",
    "from_env",
    "jax_distributed_kwargs",
    "strategy_class",
    "torch_env",
    "unify_imports",
]


def __getattr__(name: str) -> type:
    """``MPIDDPStrategy``: the class of the one Lightning namespace imported (see :mod:`lightning_mpi_env.strategy`)."""
    if name == "MPIDDPStrategy":
        return _strategy.loaded_strategy_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
