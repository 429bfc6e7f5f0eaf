"""The roll call as ``MPIClusterEnvironment`` runs it: this rank's claim in, one :class:`Meeting` record out.

The environment decides when (:class:`~lightning_mpi_env.lightning.launch.Stage`); this module builds the claim and
meets every rank on the store (:func:`lightning_mpi_env.rollcall.store.rendezvous`). It sets no attribute of the
environment.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_mpi_env.core.devices import DeviceBasis, DeviceChoice
from lightning_mpi_env.core.layout import Placement, RankLayout

if TYPE_CHECKING:
    from lightning_mpi_env.core.failures import FailureRecorder
    from lightning_mpi_env.lightning.requeue import Requeue
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import Watchdog


@dataclass(frozen=True)
class Meeting:
    """What one roll call found, for the environment to take as a whole."""

    result: RendezvousResult
    """The roll call's result; holding it keeps rank 0's store serving until ``init_process_group``."""
    device: DeviceChoice | None
    """The device the roll call chose for this rank, where the rank's variables did not say."""
    watchdog: Watchdog | None
    """The stall watchdog, started when a stall timeout or a requeue plan asks for it."""


def expected_node(
    layout: RankLayout, *, managed_by_lightning: bool, world_size: int, num_nodes: int | None
) -> Callable[[int], int] | None:
    """Where the launcher put each rank, to say where missing ranks were expected; ``None`` when unknown."""
    if managed_by_lightning:
        per_node = max(1, world_size // max(1, num_nodes or 1))
        return lambda rank: rank // per_node
    if not layout.is_even:
        return None  # nodes of different sizes: neither rule below holds
    if layout.placement is Placement.BLOCK:
        return lambda rank: rank // layout.local_size
    if layout.placement is Placement.ROUND_ROBIN and layout.num_nodes:
        nodes = layout.num_nodes
        return lambda rank: rank % nodes
    return None


def meet(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    main_address: str,
    main_port: int,
    expected: tuple[int, int] | None,
    backend: str | None,
    accelerator: str,
    device: DeviceChoice | None,
    visible_env: Mapping[str, str],
    timeout: float,
    expected_node: Callable[[int], int] | None,
    stall_timeout: float,
    requeue: Requeue | None,
    stall_soft_timeout: float = 0.0,
    launch: RankLayout,
    any_layout: bool = False,
    local_size: int | None = None,
    recorder: FailureRecorder | None = None,
) -> Meeting:
    """Meet every rank in the roll call; rank 0 prints the one-line summary on stderr.

    ``launch`` is the layout read once: the watchdog takes the launcher and the command that ends its step from it.
    ``any_layout``: the strategy takes any layout the launch gives (``"ddp_mpi"``), so nodes may differ in size.
    ``local_size``: this node's rank count as the launcher says it, ``None`` where Lightning laid out the ranks.
    ``recorder``: writes the failure record of a verdict this rank reaches (``LIGHTNING_MPI_ENV_STATE_DIR`` is set).

    Raises:
        RendezvousError: A missing, duplicate or disagreeing rank, named.
    """
    from lightning_mpi_env.rollcall import facts, store, verdicts, watchdog

    claim = verdicts.Claim.here(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        main_address=main_address,
        main_port=main_port,
        expected=expected,
        any_layout=any_layout,
        local_size=local_size,
        **facts.local_facts(
            backend,
            accelerator=accelerator,
            device_index=None if device is None else device.index,
            environ=visible_env,
        ),
    )
    result = store.rendezvous(claim, timeout=timeout, expected_node=expected_node, recorder=recorder)
    chosen = None
    if result.device_index is not None and (device is None or device.index is None):
        visible = claim.visible_set or ()
        chosen = DeviceChoice(result.device_index, DeviceBasis.ROLL_CALL, visible, claim.visible_variable)
    stall_watchdog = None
    if stall_timeout > 0 or requeue is not None:
        signalled = None if requeue is None else (lambda: requeue.requested)
        stall_watchdog = watchdog.watch(result, stall_timeout, signalled, launch, recorder, stall_soft_timeout)
    if claim.rank == 0 and result.summary:
        # One line per job, on stderr with the other diagnostics: stdout stays the program's.
        print(result.summary, file=sys.stderr, flush=True)
        for note in result.notes:
            print(f"lightning-mpi-env: roll call: note: {note}", file=sys.stderr, flush=True)
    return Meeting(result, chosen, stall_watchdog)


__all__ = ["Meeting", "expected_node", "meet"]
