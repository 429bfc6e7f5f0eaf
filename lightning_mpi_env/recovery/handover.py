"""The state a generation goes on from: one rank's, sent to every rank of the new process group, with no file."""

from __future__ import annotations

import io
from typing import Any

from lightning_mpi_env.core.errors import RecoveryError

MAX_STATE_BYTES = 1 << 40
"""The largest state a rank accepts (1 TiB): what it is told to expect is read before it allocates it."""


def hand_over(state: Any, source: int) -> Any:
    """``source``'s ``state`` on every rank of the default process group (``None`` where ``source`` kept none).

    Saved in torch's format on ``source`` and loaded with ``weights_only=True`` on every rank (the bytes come over
    the network): tensors, numbers, strings and containers of them, as state dictionaries hold.

    Raises:
        RecoveryError: The size announced is not one a rank accepts, or the bytes do not load.
    """
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    payload = b""
    if rank == source and state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, source)
    announced = int(size.item())
    if not 0 <= announced <= MAX_STATE_BYTES:
        raise RecoveryError(
            f"rank {source} announced a state of {announced} bytes to hand over, not 0 to {MAX_STATE_BYTES}",
            "the ranks of one job run the same program and the same torch; start the job again",
            value=str(announced),
        )
    if announced == 0:
        return None
    data = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if rank == source
        else torch.empty(announced, dtype=torch.uint8)
    )
    dist.broadcast(data, source)
    if rank == source:
        return state
    try:
        return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
    except Exception as error:  # torch.load raises what its unpickler meets
        raise RecoveryError(
            f"the state rank {source} handed over does not load on rank {rank}: {error}",
            "keep only tensors, numbers, strings and containers of them (state dictionaries), and run the same"
            " torch on every rank",
        ) from error
