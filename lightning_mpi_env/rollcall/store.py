"""The roll call's protocol on the ``torch.distributed.TCPStore`` that rank 0 serves on the main address and port.

One client a rank, two requests a rank other than 0 on the way to a verdict:

1. the claim, by ``compare_set`` under the rank's key: a second claimant of a rank gets the first claim back, and
   ends the roll call at once;
2. one ``multi_get`` of the verdict and this rank's node assignment, which the server holds until rank 0 has
   written both.

Rank 0 waits until every claim is in (asking about the batches not yet complete), judges the table
(:func:`~lightning_mpi_env.rollcall.errors.judge`), and writes the verdict and every assignment. What only a failure
needs costs the happy path nothing: rank 0 names missing ranks at the deadline from the claim keys, and a
disagreement from the table. Rank 0 serves with ``multi_tenant=True``, and ``"ddp_mpi"`` opens the process group
on this same client (``init_process_group(store=...)``).
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
from lightning_mpi_env.rollcall.batches import Arrivals, multi_get, multi_set
from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment, summary
from lightning_mpi_env.rollcall.errors import (
    Refused,
    disagreement_message,
    duplicate_message,
    first_line,
    judge,
    lost_store,
    serve_error,
    unreachable_error,
)
from lightning_mpi_env.rollcall.network_view import NetworkView
from lightning_mpi_env.rollcall.progress import ArrivalProgress
from lightning_mpi_env.rollcall.stall_verdict import step_end
from lightning_mpi_env.rollcall.store_values import node_of, read, read_raw, wire_claim
from lightning_mpi_env.rollcall.verdict import (
    RANK_ZERO_VIEW,
    VERDICT,
    VERDICT_GRACE,
    VerdictKey,
    claim_key,
    node_key,
    record,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

    from lightning_mpi_env.core.rank_layout import RankLayout

POLL_CAP = 0.01
"""The longest rank 0 waits between two looks at the claims not yet in (from 5 ms, doubling): one `check` of at most
1,024 keys, a fraction of a millisecond of the server's time."""


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
    judged_in: float | None = None
    """On rank 0, the seconds it took to judge the table of claims; ``None`` on the other ranks."""

    def client(self, timeout: float) -> TCPStore:
        """A client of its own to the same server, for another thread, whose requests wait ``timeout`` seconds each.

        A request pending on :attr:`store` (a collective's first ``get``) never holds it up.
        """
        return client_of(self.store, timeout)


def client_of(store: TCPStore, timeout: float) -> TCPStore:
    """A client of its own to ``store``'s server, whose requests wait ``timeout`` seconds each."""
    import torch.distributed

    if hasattr(store, "clone"):  # torch 2.8 and newer
        client: TCPStore = store.clone()
    else:
        client = torch.distributed.TCPStore(  # type: ignore[attr-defined]
            store.host, store.port, is_master=False, timeout=timedelta(seconds=timeout)
        )
    client.set_timeout(timedelta(seconds=timeout))
    return client


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
        result = roll_call.run()
    except RendezvousError:
        roll_call.verdict.leave(*step_end(launch))
        raise
    except DistError as error:  # rank 0 stopped, or never answered by its deadline
        lost, fault = roll_call.lost(error, unreachable)
        if claim.local_rank == 0:
            record(recorder, lost, fault, claim.rank)
        raise lost from error
    store.set_timeout(timedelta(seconds=timeout))
    return result


def _connect(claim: Claim, timeout: float) -> TCPStore:
    import torch.distributed

    try:
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
        # Only now, on the way to an error: did the host refuse (nothing listens), or not answer at all?
        last, refused = _try_once(claim.main_address, claim.main_port)
        view = NetworkView.here(claim.main_address)
        raise unreachable_error(claim, timeout, error, view, last or first_line(error), refused=refused) from error
    if claim.rank == 0 and claim.world_size > 1:
        # What rank 0 sees of the network, for the verdict on ranks that never reach it (they cannot ask).
        store.set(RANK_ZERO_VIEW, NetworkView.here(claim.main_address).to_json())
    return store


def _try_once(host: str, port: int) -> tuple[str, bool]:
    """One more connection to ``host:port``: why it failed (``""``: it did not), and whether the host refused it."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return "", False
    except OSError as error:
        return f"connecting to {host}:{port}: {error}", isinstance(error, ConnectionRefusedError)


class _RollCall:
    """One rank's part in one roll call: claim, then wait for the verdict (rank 0: judge the table and write it)."""

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
        self.connected = time.monotonic()  # made right after the store connected
        self.judged_in: float | None = None

    def run(self) -> RendezvousResult:
        self._claim()
        raw_verdict, raw_node = self._judge() if self.claim.rank == 0 else self._await_verdict()
        verdict = self.verdict.parse(raw_verdict)
        if verdict.problem:
            self.verdict.raise_stored(verdict)
        # Every rank checks its own assignment: a forged node index or device is refused, never taken.
        nodes, device = read(node_key(self.claim.rank), raw_node, node_of(self.claim))
        return RendezvousResult(
            self.store, self.claim, nodes, verdict.summary, device, verdict.notes, judged_in=self.judged_in
        )

    def _claim(self) -> None:
        """Claim this rank; a second claimant sees the first claim come back, and ends the roll call for all."""
        rank, mine = self.claim.rank, self.claim.to_wire()
        stored = self.store.compare_set(claim_key(rank), "", mine)
        if stored != mine.encode():
            first = self.verdict.claim_of(rank, stored)
            fault = Fault(FailureKind.DUPLICATE, (rank,), (first.host, self.claim.host))
            self.verdict.conclude(duplicate_message(first, self.claim), fault)

    def _await_verdict(self) -> tuple[bytes, bytes]:
        """The verdict and this rank's assignment, in one request the server answers once rank 0 wrote both.

        Rank 0 served before this rank connected, so its deadline is at most the timeout after that: a rank that
        started long before rank 0 (a slow import there) still waits for rank 0's verdict on missing ranks.
        """
        left = self.connected + self.verdict.timeout - time.monotonic()
        self.store.set_timeout(timedelta(seconds=max(left, 0.0) + VERDICT_GRACE))
        raw_verdict, raw_node = self.store.multi_get([VERDICT, node_key(self.claim.rank)])
        return raw_verdict, raw_node

    def _judge(self) -> tuple[bytes, bytes]:
        """Rank 0: wait for every claim, judge them, write the verdict and every assignment (or the failure)."""
        world_size, verdict = self.claim.world_size, self.verdict
        keys = [claim_key(rank) for rank in range(world_size)]
        arrivals, interval = Arrivals(self.store, keys), 0.005

        def arrived() -> set[int]:
            return {int(key.rsplit("/", 1)[1]) for key in arrivals.present()}

        while not arrivals.all_in():
            if self.store.check([VERDICT]):  # another rank's verdict stands: a duplicate, or a forged one
                return self.store.get(VERDICT), self._unwritten_place()
            if time.monotonic() >= verdict.deadline:
                missing = verdict.missing(arrived())
                if missing is not None:
                    verdict.conclude(*missing)
                break  # the last claims came in at the deadline
            if self.progress is not None:
                self.progress.poll(arrived)
            time.sleep(interval)
            interval = min(2 * interval, POLL_CAP)
        differing: list[int] = []
        reference = self.claim  # rank 0's: a claim that sent its digest is parsed for its own fields only
        raws = multi_get(self.store, keys)
        began = time.monotonic()  # judging: parsing every claim, checking them, placing and encoding every rank
        claims = [verdict.claim_of(rank, raw, reference, differing) for rank, raw in enumerate(raws)]
        judged = judge(claims, differing)
        self.judged_in = time.monotonic() - began
        if isinstance(judged, Refused):
            verdict.conclude(judged.problem, judged.fault)
        payload = json.dumps({"summary": summary(claims, time.monotonic() - self.start), "notes": judged.notes})
        stored = self.store.compare_set(VERDICT, "", payload)
        if stored != payload.encode():  # another rank's verdict stands: a late duplicate, or a forged one
            return stored, self._unwritten_place()
        multi_set(self.store, [node_key(rank) for rank in range(world_size)], judged.assignments)
        return stored, judged.assignments[0].encode()

    def _unwritten_place(self) -> bytes:
        """Rank 0's assignment under a verdict it did not write, as stored beside it; else none, for any rank."""
        until = time.monotonic() + VERDICT_GRACE  # whoever wrote that verdict writes the assignments next
        while not self.store.check([node_key(0)]):
            if time.monotonic() > until:
                self.verdict.release()
                break
            time.sleep(0.05)
        value: bytes = self.store.get(node_key(0))
        return value

    def lost(self, error: BaseException, unreachable: Fault) -> tuple[RendezvousError, Fault]:
        """Why this rank got no verdict, and the fault: rank 0 stopped, or never waited for this rank's claim.

        Rank 0 waits for the claims of its own world: a rank that claims a rank past it disagrees with rank 0.
        """
        rank_zero = None
        try:
            self.store.set_timeout(timedelta(seconds=VERDICT_GRACE))
            if self.claim.rank != 0 and self.store.check([claim_key(0)]):
                rank_zero = read_raw(claim_key(0), self.store.get(claim_key(0)), wire_claim(0))
        except (RuntimeError, RendezvousError):
            pass  # the store is gone, or holds no claim of rank 0 worth comparing with
        problem = None if rank_zero is None else disagreement_message(rank_zero, self.claim)
        if problem is not None:
            return problem, Fault(FailureKind.MISMATCH, (self.claim.rank,), (self.claim.host,))
        return lost_store(self.claim, rank_zero, error), unreachable
