"""The roll call as ``MPIClusterEnvironment`` runs it, right before ``init_process_group``, setting nothing on it."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_mpi_env.core.placement import Placement
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.gpu.devices import DeviceBasis, DeviceChoice
from lightning_mpi_env.lightning.compat import release_collectives_at_exit, settle_collectives_at_exit
from lightning_mpi_env.lightning.launch import Ranks
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.rollcall.claims import Claim
from lightning_mpi_env.rollcall.network_view import NetworkView, off_fabric
from lightning_mpi_env.rollcall.process_info import process_info
from lightning_mpi_env.rollcall.store import RendezvousResult, rendezvous
from lightning_mpi_env.rollcall.watchdog import Watchdog, watch

if TYPE_CHECKING:
    from lightning_mpi_env.core.records import FailureRecorder
    from lightning_mpi_env.lightning.requeue import Requeue


@dataclass(frozen=True)
class RollCallOutcome:
    """What one roll call found, for the environment to take as a whole."""

    result: RendezvousResult
    """The roll call's result; holding it keeps rank 0's store serving until ``init_process_group``."""
    device: DeviceChoice | None
    watchdog: Watchdog | None


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


def before_init_process_group(
    changes: ProcessChanges, exports: Mapping[str, str], ifname: str, main_address: str, *, rank_zero: bool
) -> None:
    """Settle collectives at exit, export the socket variables (gloo and NCCL read no other); rank 0 checks ifname."""
    settle_collectives_at_exit()
    changes.add(Change.SETTLE_AT_EXIT, release_collectives_at_exit)
    previous = {name: os.environ.get(name) for name in exports}
    os.environ.update(exports)
    changes.add(Change.FABRIC_EXPORTS, lambda: _restore_environment(previous))
    if ifname and rank_zero:
        warning = off_fabric(ifname, NetworkView.here(main_address))
        if warning is not None:
            warnings.warn(warning, stacklevel=3)


def _restore_environment(previous: Mapping[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_roll_call(
    layout: RankLayout,
    settings: Settings,
    ranks: Ranks,
    *,
    main_port: int,
    managed_by_lightning: bool,
    expected: tuple[int, int] | None,
    any_layout: bool,
    backend: str | None,
    accelerator: str,
    device: DeviceChoice | None,
    visible_env: Mapping[str, str],
    requeue: Requeue | None,
    recorder: FailureRecorder | None,
    init_on_store: bool = False,
) -> RollCallOutcome:
    """Meet every rank (a ``RendezvousError`` names one missing, duplicate or disagreeing); rank 0 prints a summary.

    The watchdog carries the stop agreements: the requeue's, and the one after a ``SIGTERM`` to any rank. It starts
    at once on the roll call's client, which the roll call is done with; with ``init_on_store`` (``"ddp_mpi"`` opens
    the process group on that client), it is returned unstarted, for the caller to start once the group is open, on
    a client of its own.
    """
    world_size = ranks.world_size
    claim = Claim.here(
        rank=ranks.global_rank,
        world_size=world_size,
        local_rank=ranks.local_rank or 0,
        main_address=layout.main_address,
        main_port=main_port,
        expected=expected,
        any_layout=any_layout,
        # This node's rank count as the launcher says it; Lightning's own layout is no launcher's.
        local_size=None if managed_by_lightning else layout.local_size,
        **process_info(
            backend,
            accelerator=accelerator,
            device_index=None if device is None else device.index,
            environ=visible_env,
        ),
    )
    placed = expected_node(
        layout, managed_by_lightning=managed_by_lightning, world_size=world_size, num_nodes=ranks.num_nodes
    )
    result = rendezvous(
        claim, timeout=settings.rendezvous_timeout, expected_node=placed, recorder=recorder, launch=layout
    )
    chosen = None
    if result.device_index is not None and (device is None or device.index is None):
        visible = claim.visible_set or ()
        chosen = DeviceChoice(result.device_index, DeviceBasis.ROLL_CALL, visible, claim.visible_variable)
    stall_watchdog = None
    if settings.stall_timeout > 0 or requeue is not None:
        signalled = None if requeue is None else (lambda: requeue.requested)
        stall_watchdog = watch(
            result,
            settings.stall_timeout,
            signalled,
            layout,
            recorder,
            settings.stall_soft_timeout,
            sigterm=True,
            own_client=init_on_store,
            stragglers=(settings.straggler_factor, settings.straggler_window if settings.stragglers else 0),
        )
    if claim.rank == 0 and result.summary:
        # One line per job, on stderr with the other diagnostics: stdout stays the program's.
        print(result.summary, file=sys.stderr, flush=True)
        for note in result.notes:
            print(f"lightning-mpi-env: roll call: note: {note}", file=sys.stderr, flush=True)
    return RollCallOutcome(result, chosen, stall_watchdog)
