"""The Lightning adapter: the cluster environment, the ``ddp_mpi`` strategy, callbacks, requeue, and compat."""
