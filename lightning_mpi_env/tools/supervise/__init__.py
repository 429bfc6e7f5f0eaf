"""``lightning-mpi-env run``: a supervisor that relaunches a failed job step inside its allocation.

The loop is :mod:`.loop`; the launcher line it relaunches, whichever launcher, is :mod:`.lines`.
"""
