"""The demo: a real `mpirun` job of 2 simulated nodes x 2 ranks training a small model on CPU, then its rank tables.

Run: python examples/demo.py   (the same as `lightning-mpi-env demo`; it needs `pip install "lightning-mpi-env[demo]"`)

The demo and its training job live in the package (`lightning_mpi_env/tools/demo.py`, `lightning_mpi_env/demo_job.py`,
which trains with `Trainer(strategy=MPIDDPStrategy())`), so that an installed wheel runs it too.
"""

import sys

from lightning_mpi_env.tools.demo import main

if __name__ == "__main__":
    sys.exit(main())
