"""The roll call's protocol on the ``torch.distributed.TCPStore`` that rank 0 serves on the main address and port.

Every process registers its claim; the last rank to arrive checks the whole table and writes every rank's node
assignment and the verdict; every rank reads its own. Rank 0 serves the store with ``multi_tenant=True``, so the
store that ``init_process_group(init_method="env://")`` then opens on the same port is this very server.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault
from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment, assign_all, devices_of, summary
from lightning_mpi_env.rollcall.errors import (
    collisions,
    disagreement_message,
    duplicate_message,
    expectation_mismatch,
    first_line,
    lost_store,
    serve_error,
    unreachable_error,
)
from lightning_mpi_env.rollcall.network_view import NetworkView
from lightning_mpi_env.rollcall.progress import ArrivalProgress
from lightning_mpi_env.rollcall.stall_verdict import step_end
from lightning_mpi_env.rollcall.store_values import RollCallVerdict, node_of, read
from lightning_mpi_env.rollcall.verdict import (
    ARRIVED,
    ARRIVED_RANKS,
    KEY_PREFIX,
    RANK_ZERO_VIEW,
    READ,
    REGISTERED,
    VERDICT,
    VERDICT_GRACE,
    VerdictKey,
    claim_key,
    record,
    wait_quietly,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

    from lightning_mpi_env.core.rank_layout import RankLayout


@dataclass
class RendezvousResult:
    """A roll call that everyone answered: the open store and this process's place."""

    store: TCPStore
    """The store; on rank 0 it serves the port until this object is dropped."""
    claim: Claim
    nodes: NodeAssignment
    summary: str = ""
    """One line saying who met where, for rank 0 to print."""
    device_index: int | None = None
    """This rank's device, as an index into the devices it sees, when its claim stated them (exact)."""
    notes: tuple[str, ...] = ()
    """What rank 0 tells the user besides the summary (per-task binding that costs peer-to-peer links)."""


def rendezvous(
    claim: Claim,
    *,
    timeout: float,
    expected_node: Callable[[int], int] | None = None,
    recorder: FailureRecorder | None = None,
    progress: ArrivalProgress | None = None,
    launch: RankLayout | None = None,
) -> RendezvousResult:
    """Meet every other rank in rank 0's store, or raise a named error within about ``timeout`` seconds.

    ``expected_node`` maps a rank to the node the launcher placed it on, to say where missing ranks were expected;
    ``recorder`` writes the failure record of a verdict this rank reaches; ``progress`` prints rank 0's lines while
    it waits (on stderr by default; other ranks print none). After a failure verdict, rank 0 ends ``launch``'s step
    where its launcher has a command for it (``srun``, which would wait for a rank that never came).

    Raises:
        RendezvousError: On a duplicate rank, a disagreement with rank 0, ranks that never arrived, an unreachable
            rank 0, two ranks on one GPU, or uneven ranks per host. Every process of the job raises, none waits on.
    """
    from torch.distributed import DistError

    start = time.monotonic()
    progress = (progress or ArrivalProgress(claim.world_size, timeout)) if claim.rank == 0 else None
    unreachable = Fault(FailureKind.STORE_UNREACHABLE, (0,), (claim.main_address,))
    try:
        store = _connect(claim, timeout)
    except RendezvousError as error:  # no store, so no verdict either: one rank per node that cannot reach it says so
        if claim.rank != 0 and claim.local_rank == 0:
            record(recorder, error, unreachable, claim.rank)
        raise
    roll_call = _RollCall(store, claim, start, timeout, expected_node, recorder, progress)
    try:
        nodes, line, device_index, notes = roll_call.run()
    except RendezvousError:
        roll_call.verdict.leave(*step_end(launch))
        raise
    except DistError as error:  # a wait ran out (DistStoreError), or rank 0 stopped, likely for a reason it printed
        lost = lost_store(claim, roll_call.rank_zero, error)
        if claim.local_rank == 0:
            record(recorder, lost, unreachable, claim.rank)
        raise lost from error
    return RendezvousResult(
        store=store, claim=claim, nodes=nodes, summary=line, device_index=device_index, notes=tuple(notes)
    )


def _connect(claim: Claim, timeout: float) -> TCPStore:
    import torch.distributed

    try:
        if claim.rank != 0:
            # TCPStore's own connect retries can overshoot its timeout twofold: wait for the port ourselves.
            _wait_for_port(claim.main_address, claim.main_port, time.monotonic() + timeout)
        store: TCPStore = torch.distributed.TCPStore(  # type: ignore[attr-defined]
            claim.main_address,
            claim.main_port,
            world_size=claim.world_size,
            is_master=claim.rank == 0,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except (RuntimeError, TimeoutError) as error:
        if claim.rank == 0:
            raise serve_error(claim, error) from error
        last = str(error) if isinstance(error, _Unreachable) else first_line(error)
        refused = isinstance(error, _Unreachable) and error.refused
        view = NetworkView.here(claim.main_address)
        raise unreachable_error(claim, timeout, error, view, last, refused=refused) from error
    if claim.rank == 0 and claim.world_size > 1:
        # What rank 0 sees of the network, for the verdict on ranks that never reach it (they cannot ask).
        store.set(RANK_ZERO_VIEW, NetworkView.here(claim.main_address).to_json())
    return store


class _Unreachable(TimeoutError):
    """Nothing accepted a connection at the main address before the deadline; the message is the last failure."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused
        """The host answered, refusing: nothing listened on the port (rather than a host or network that is down)."""


def _wait_for_port(host: str, port: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a connection; raise :class:`_Unreachable` at the deadline."""
    last, refused = "no attempt", False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Unreachable(f"connecting to {host}:{port}: {last}", refused=refused)
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 2.0)):
                return
        except OSError as error:
            last, refused = str(error) or type(error).__name__, isinstance(error, ConnectionRefusedError)
            time.sleep(min(0.2, max(remaining, 0.0)))


class _RollCall:
    """One rank's part in one roll call: register, compare with rank 0, arrive, read the verdict."""

    def __init__(
        self,
        store: TCPStore,
        claim: Claim,
        start: float,
        timeout: float,
        expected_node: Callable[[int], int] | None,
        recorder: FailureRecorder | None = None,
        progress: ArrivalProgress | None = None,
    ) -> None:
        self.store, self.claim, self.start, self.progress = store, claim, start, progress
        self.verdict = VerdictKey(store, claim, start + timeout, timeout, expected_node, recorder)
        self.rank_zero: Claim | None = None

    def run(self) -> tuple[NodeAssignment, str, int | None, list[str]]:
        self._register()
        if self.claim.rank != 0:
            self._compare_with_rank_zero()
        self._arrive()
        verdict = self._await_verdict()
        if verdict.problem:
            self.verdict.raise_stored(verdict)
        self.store.add(READ, 1)
        node_key = f"{KEY_PREFIX}node/{self.claim.rank}"
        # Every rank checks its own assignment: a forged node index or device is refused, never taken.
        nodes, device = read(node_key, self.store.get(node_key), node_of(self.claim))
        return nodes, verdict.summary, device, list(verdict.notes)

    def _register(self) -> None:
        rank = self.claim.rank
        self.store.add(REGISTERED, 1)  # from now on rank 0 keeps the store up until this rank read the verdict
        order = self.store.add(f"{KEY_PREFIX}claims/{rank}", 1)
        self.store.set(claim_key(rank, order), self.claim.to_json())
        if order > 1:
            # The second claimant knows at once; the first learns it from the verdict.
            first = self.verdict.claim_of(rank, self.verdict.get(claim_key(rank)))
            fault = Fault(FailureKind.DUPLICATE, (rank,), (first.host, self.claim.host))
            self.verdict.conclude(duplicate_message(first, self.claim), fault)

    def _compare_with_rank_zero(self) -> None:
        self.rank_zero = self.verdict.claim_of(0, self.verdict.get(claim_key(0)))
        problem = disagreement_message(self.rank_zero, self.claim)
        if problem is not None:
            self.verdict.conclude(problem, Fault(FailureKind.MISMATCH, (self.claim.rank,), (self.claim.host,)))

    def _arrive(self) -> None:
        self.store.append(ARRIVED_RANKS, f"{self.claim.rank},")  # type: ignore[attr-defined]  # public, not in stubs
        if self.store.add(ARRIVED, 1) == self.claim.world_size:
            self._finalize()

    def _finalize(self) -> None:
        world_size, conclude = self.claim.world_size, self.verdict.conclude
        raw = self.store.multi_get([claim_key(rank) for rank in range(world_size)])
        claims = [self.verdict.claim_of(rank, value) for rank, value in enumerate(raw)]
        for other in claims[1:]:
            problem = disagreement_message(claims[0], other)
            if problem is not None:
                conclude(problem, Fault(FailureKind.MISMATCH, (other.rank,), (other.host,)))
        launch_wrong = Fault(FailureKind.MISMATCH)  # the launch as a whole is wrong: no rank or host to leave out
        collision = collisions(claims)
        if collision is not None:
            conclude(collision, launch_wrong)
        hosts = [claim.host for claim in claims]
        try:
            assignments = assign_all(hosts, any_layout=all(claim.any_layout for claim in claims))
        except RendezvousError as error:
            conclude(error, launch_wrong)
        mismatch = expectation_mismatch(claims, assignments[0])
        if mismatch is not None:
            conclude(mismatch, launch_wrong)
        try:
            devices, notes = devices_of(claims)
        except RendezvousError as error:
            conclude(error, launch_wrong)
        self.store.multi_set(  # type: ignore[attr-defined]  # public, but not in torch's type stubs
            [f"{KEY_PREFIX}node/{rank}" for rank in range(world_size)],
            [
                json.dumps([a.node_rank, a.num_nodes, a.local_rank, a.local_size, devices.get(rank)])
                for rank, a in enumerate(assignments)
            ],
        )
        self.store.set(KEY_PREFIX + "hosts", json.dumps(hosts))
        line = summary(claims, time.monotonic() - self.start)
        self.store.compare_set(VERDICT, "", json.dumps({"summary": line, "notes": notes}))

    def _await_verdict(self) -> RollCallVerdict:
        progress, verdict = self.progress, self.verdict
        tick = None if progress is None else (lambda: progress.poll(verdict.arrived))
        if wait_quietly(self.store, VERDICT, verdict.deadline, self.claim.world_size, tick):
            return verdict.parse(self.store.get(VERDICT))
        missing = verdict.missing()
        if missing is not None:
            verdict.conclude(*missing)
        # Everyone arrived just now: the last rank is writing the verdict.
        if not wait_quietly(self.store, VERDICT, time.monotonic() + VERDICT_GRACE, self.claim.world_size):
            verdict.conclude(*verdict.never_received(VERDICT))
        return verdict.parse(self.store.get(VERDICT))
