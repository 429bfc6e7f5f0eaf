"""The roll call: every rank checks in on one store before ``init_process_group``.

A missing, duplicate or disagreeing rank stops every process with one error naming it.

- :mod:`~lightning_mpi_env.rollcall.verdicts`: claims and the errors they add up to (standard library only);
- :mod:`~lightning_mpi_env.rollcall.facts`: what this process says about its software and device (torch);
- :mod:`~lightning_mpi_env.rollcall.store`: the protocol on ``torch.distributed.TCPStore``;
- :mod:`~lightning_mpi_env.rollcall.progress`: rank 0's lines while it waits for the ranks.
"""
