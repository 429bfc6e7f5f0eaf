"""JAX under mpirun/mpiexec/srun: `jax.distributed.initialize` from the launcher's own variables.

    mpirun -np 8 --map-by ppr:4:node python examples/jax_distributed.py

JAX's built-in cluster detection misses Open MPI 5 and scheduler host lists; `jax_distributed_kwargs()` resolves
them like the Lightning plugin does. Each process then adds its number across all processes, to show that they
met. Without JAX installed this prints the arguments it would pass and exits 0.
"""

import importlib.util
import json
import socket

from lightning_mpi_env import jax_distributed_kwargs

kwargs = jax_distributed_kwargs()
if importlib.util.find_spec("jax") is None:
    print(
        "JAX is not installed; jax.distributed.initialize would get: " + json.dumps(kwargs) + "\n", end="", flush=True
    )
    raise SystemExit(0)

import jax  # noqa: E402  (optional dependency, imported only when present)
from jax.experimental import multihost_utils  # noqa: E402

jax.distributed.initialize(**kwargs)
# Every process contributes process_index + 1: with n processes the sum is n(n+1)/2 on each of them.
mine = jax.numpy.array([jax.process_index() + 1.0])
total = float(multihost_utils.process_allgather(mine).sum())
print(
    f"process {jax.process_index()}/{jax.process_count()} on {socket.gethostname()}: "
    f"{jax.local_device_count()} local device(s), {jax.device_count()} in all; sum over processes {total:g}\n",
    end="",
    flush=True,
)
