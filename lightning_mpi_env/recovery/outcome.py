"""What a step that recovered in its processes leaves for ``lightning-mpi-env run``: a record that it finished.

The launcher's exit status counts the lost ranks' ends (srun's is not 0 once a task was killed), so ``run`` would
take the step for a failure and start it again. Once every rank of the last generation has returned from ``main``,
rank 0 writes a record of kind ``recovered`` into the state folder (``LIGHTNING_MPI_ENV_STATE_DIR``), naming the
lost ranks and their nodes, and ``run`` takes the step as done.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.recovery.worlds import World, prefix
from lightning_mpi_env.rollcall.claims import format_ranks

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

DONE_KEY = "done"
"""Under the last generation: how many of its ranks have returned from ``main``."""

POLL = 0.05


def finished(
    store: Store, world: World, rank: int, lost: Mapping[int, str], recorder: FailureRecorder | None, timeout: float
) -> None:
    """Say that this rank returned from ``main`` in ``world``; rank 0 waits for every rank's word, then the record.

    ``lost``: each lost launch rank's node (rank 0 knows them). Nothing outside ``run``'s state folder, or where no
    rank was lost.
    """
    from torch.distributed import DistError

    if recorder is None or world.number == 1:
        return
    key = prefix(world.number) + DONE_KEY
    deadline = time.monotonic() + timeout
    try:
        count = store.add(key, 1)
        while rank == 0 and count < world.world_size and time.monotonic() < deadline:
            time.sleep(POLL)
            count = store.add(key, 0)
    except DistError:  # rank 0 ended, or its store did: no record, so run takes the step for what its status says
        return
    if rank != 0 or count < world.world_size:
        return
    names = format_ranks(lost)
    problem = (
        f"{names} lost; the others went on in their processes through generation {world.number}, and all"
        f" {world.world_size} ranks finished"
    )
    nodes = tuple(dict.fromkeys(node for node in lost.values() if node))
    fault = Fault(FailureKind.RECOVERED, tuple(sorted(lost)), nodes)
    why = recorder.write(fault, problem=problem, written_by=0)
    if why is not None:
        print(why, file=sys.stderr, flush=True)
