"""JAX under mpirun/mpiexec/srun: `jax.distributed.initialize` from the launcher's own variables.

    mpirun -np 8 --map-by ppr:4:node python examples/jax_distributed.py

JAX's built-in cluster detection misses Open MPI 5 and scheduler host lists; `jax_distributed_kwargs()` resolves
them like the Lightning plugin does. Without JAX installed this prints the arguments it would pass and exits 0.
"""

import importlib.util
import json

from lightning_mpi_env import jax_distributed_kwargs

kwargs = jax_distributed_kwargs()
if importlib.util.find_spec("jax") is None:
    print(
        "JAX is not installed; jax.distributed.initialize would get: " + json.dumps(kwargs) + "\n", end="", flush=True
    )
    raise SystemExit(0)

import jax  # noqa: E402  (optional dependency, imported only when present)

jax.distributed.initialize(**kwargs)
print(
    f"process {jax.process_index()}/{jax.process_count()}: {jax.local_device_count()} local device(s), "
    f"{jax.device_count()} in all\n",
    end="",
    flush=True,
)
