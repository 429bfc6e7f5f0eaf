"""Start PyTorch Lightning, plain PyTorch DDP, torchrun and JAX correctly under MPI, or fail fast saying why."""

from lightning_mpi_env.environment import MPIClusterEnvironment as MPIClusterEnvironment
from lightning_mpi_env.errors import LayoutError as LayoutError
from lightning_mpi_env.interop import jax_distributed_kwargs as jax_distributed_kwargs
from lightning_mpi_env.interop import torch_env as torch_env
from lightning_mpi_env.layout import Placement as Placement
from lightning_mpi_env.layout import RankLayout as RankLayout
from lightning_mpi_env.layout import from_env as from_env

__version__ = "0.1.0"

__all__ = [
    "LayoutError",
    "MPIClusterEnvironment",
    "Placement",
    "RankLayout",
    "__version__",
    "from_env",
    "jax_distributed_kwargs",
    "torch_env",
]
