"""``python -m lightning_mpi_env``: the ``lightning-mpi-env`` command line."""

from lightning_mpi_env.tools.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
