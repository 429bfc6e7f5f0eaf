"""``lightning-mpi-env run``: a supervisor that relaunches a failed job step inside its allocation."""
