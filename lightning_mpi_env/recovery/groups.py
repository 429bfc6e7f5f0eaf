"""This process's default process group across generations: reconfigured in place where torch can, else opened anew.

Where torch has the reconfigure API (2.14+, gloo: ``lightning/compat.py``), a process opens one
group for its life. Each generation opens the group's communicator over its members' handles, posted under the
generation's keys, and is numbered by the generation: the reconfiguration's own keys in the store live under that
number, so a late request of an older generation lands where no member of a newer one reads. A process leaving a
generation keeps the group.

Elsewhere (torch before 2.14, or a backend that does not take the API) a process leaving a generation destroys its
group, and the next generation opens a new one on the same store under its own keys.
"""

from __future__ import annotations

import gc
import re
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.lightning.compat import (
    can_reconfigure,
    init_reconfigurable_group,
    reconfigure,
    reconfigure_handle,
)
from lightning_mpi_env.recovery.connections import GroupConnections
from lightning_mpi_env.recovery.worlds import FOREIGN_WRITE, KEY, World, prefix

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

RECONFIGURED_KEY = KEY + "reconfigured/"
"""The store of a group that is reconfigured: one for every generation, whose reconfigurations number its keys."""

HANDLE_KEY = "handle/"
"""Under a generation's keys: each member's reconfigure handle, by its rank in the generation."""

HANDLE = re.compile(r"[!-~]{1,1024}")
"""A reconfigure handle as torch writes one: printable ASCII, no space, at most 1,024 characters."""


@dataclass
class Group:
    """The default process group of this process, generation after generation, on the job's ``store``."""

    store: Store
    backend: str | None
    timeout: float
    """The group's timeout, in seconds: how long a collective waits for a frozen peer; the handles' wait too."""
    reconfigurable: bool | None = None
    """Whether the group is reconfigured in place; ``None`` until it first opens."""

    def open(self, world: World, rank: int) -> None:
        """Open ``world``'s group here as its ``rank``: reconfigure the group, or open one under ``world``'s keys.

        Raises:
            RecoveryError: A later generation's group did not open (another rank was lost on the way), or a
                member's handle in the store is not one torch writes.
        """
        try:
            self._open(world, rank)
        except (RuntimeError, TimeoutError) as error:  # torch's DistError is a RuntimeError
            if world.number == 1:
                raise
            raise RecoveryError(
                f"generation {world.number} of {world.world_size} ranks could not open its process group on rank"
                f" {rank}: {error}",
                "another rank was lost while the ranks recovered: start the job again (`lightning-mpi-env run` does)",
            ) from error

    def _open(self, world: World, rank: int) -> None:
        import torch.distributed as dist

        timeout = timedelta(seconds=self.timeout)
        if not dist.is_initialized():
            if self.reconfigurable is None:
                self.reconfigurable = _tested_backend(self.backend) and can_reconfigure()
                if self.reconfigurable:
                    store = dist.PrefixStore(RECONFIGURED_KEY, self.store)  # type: ignore[attr-defined]
                    self.reconfigurable = init_reconfigurable_group(
                        self.backend, store=store, rank=rank, world_size=world.world_size, timeout=timeout
                    )
                    if not self.reconfigurable:  # an ordinary group: open one under the generation's keys instead
                        dist.destroy_process_group()
            if not self.reconfigurable:
                dist.init_process_group(
                    self.backend,
                    store=dist.PrefixStore(prefix(world.number) + "group/", self.store),  # type: ignore[attr-defined]
                    rank=rank,
                    world_size=world.world_size,
                    timeout=timeout,
                )
        if self.reconfigurable:
            key = prefix(world.number) + HANDLE_KEY
            self.store.set(f"{key}{rank}", reconfigure_handle())
            reconfigure(world.number, read_handles(self.store, key, world.world_size, self.timeout), self.timeout)

    def leave(self, error: BaseException, connections: GroupConnections) -> None:
        """Leave this generation's group, so that peers inside a collective with it fail at once rather than wait.

        Its connections are shut down first: torch keeps a group that ``DistributedDataParallel`` used after it is
        destroyed, connections open. Then ``main``'s frames, kept alive by ``error``'s traceback, let go of what
        they held (the traceback keeps its lines), and the group is destroyed, unless it is reconfigured in place.
        """
        import torch.distributed as dist

        connections.shut()
        traceback.clear_frames(error.__traceback__)
        if not self.reconfigurable and dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()

    def close(self) -> None:
        """Destroy the group, if it is open (the end of ``restartable``)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _tested_backend(backend: str | None) -> bool:
    """Whether ``backend`` is gloo (torch's default without a GPU): the one whose reconfiguration is tested.

    torch 2.15's ``nccl2`` takes the API too, but cannot be tested without a GPU: its groups are opened anew, as
    every group is on a torch before 2.14.
    """
    import torch

    return backend == "gloo" or (backend is None and not torch.cuda.is_available())


def read_handles(store: Store, key: str, size: int, timeout: float) -> list[str]:
    """The ``size`` members' handles under ``key``, in rank order, once all are there (waiting at most ``timeout`` s).

    Raises:
        RecoveryError: One is not a handle as torch writes it, naming its key and value.
        RuntimeError: Not all came in time (torch's ``DistStoreError``).
    """
    keys = [f"{key}{number}" for number in range(size)]
    store.wait(keys, timedelta(seconds=timeout))
    handles = []
    for name in keys:
        raw = store.get(name)
        text = raw[:1100].decode("ascii", "replace")
        if len(raw) > 1024 or not HANDLE.fullmatch(text):
            raise RecoveryError(
                f"the reconfigure handle under {name} in the job's store is {text[:200]!r}, not one torch writes",
                FOREIGN_WRITE,
                variable=name,
                value=text[:200],
            )
        handles.append(text)
    return handles
