"""``python -m lightning_mpi_env``: the ``lightning-mpi-env`` command line."""

from lightning_mpi_env.cli import main

raise SystemExit(main())
