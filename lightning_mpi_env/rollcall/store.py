"""The roll call's protocol on the ``torch.distributed.TCPStore`` that rank 0 serves on the main address and port.

Every process registers its :class:`~lightning_mpi_env.rollcall.verdicts.Claim`; the rank that sees a problem
first writes it under one key as the verdict, and every rank raises it. Rank 0 serves the store with
``multi_tenant=True``, so the store that ``init_process_group(init_method="env://")`` then opens on the same port is
this very server: no second port. This module needs torch (imported when a roll call runs), not Lightning.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.failures import FailureKind, FailureRecorder, Fault, hosts_of
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.rollcall.progress import ArrivalProgress
from lightning_mpi_env.rollcall.reach import NetworkView, serve_error, unreachable_error, with_rank_zero_view
from lightning_mpi_env.rollcall.verdicts import (
    MISSING_CAUSES,
    Claim,
    NodeAssignment,
    assign_all,
    collisions,
    devices_of,
    disagreement_message,
    duplicate_message,
    expectation_mismatch,
    missing_message,
    placement_holds,
    summary,
)
from lightning_mpi_env.rollcall.wire import (
    RollCallVerdict,
    arrived_ranks,
    claim_of,
    network_view,
    node_of,
    read,
    read_raw,
    roll_call_verdict,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

VERDICT_GRACE = 5.0
"""Seconds past the timeout to wait for a verdict another rank is writing (everyone arrived just in time)."""

KEY_PREFIX = "lightning_mpi_env/"
"""Prefix of every key the roll call writes, apart from those of ``init_process_group``."""

_REGISTERED = KEY_PREFIX + "registered"
_ARRIVED = KEY_PREFIX + "arrived"
_ARRIVED_RANKS = KEY_PREFIX + "arrived_ranks"
_VERDICT = KEY_PREFIX + "verdict"
_READ = KEY_PREFIX + "verdict_read"
_RECORDED = KEY_PREFIX + "failure_recorded"
_RANK_ZERO_VIEW = KEY_PREFIX + "network/0"


def store_append(store: TCPStore, key: str, value: str) -> None:
    """``TCPStore.append`` (public, but not in torch's type stubs)."""
    store.append(key, value)  # type: ignore[attr-defined]


def store_multi_set(store: TCPStore, keys: list[str], values: list[str]) -> None:
    """``TCPStore.multi_set`` (public, but not in torch's type stubs)."""
    store.multi_set(keys, values)  # type: ignore[attr-defined]


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


# --- the roll call ---------------------------------------------------------------------------------------------------


def rendezvous(
    claim: Claim,
    *,
    timeout: float,
    expected_node: Callable[[int], int] | None = None,
    recorder: FailureRecorder | None = None,
    progress: ArrivalProgress | None = None,
) -> RendezvousResult:
    """Meet every other rank in rank 0's store, or raise a named error within about ``timeout`` seconds.

    Args:
        claim: This process's claim (see :meth:`Claim.here`).
        timeout: Seconds to wait for every rank (and, for ranks other than 0, for rank 0's store to answer).
        expected_node: Maps a rank to the node the launcher placed it on, to say where missing ranks were expected.
        recorder: Writes the failure record of a verdict this rank reaches (the state folder is set).
        progress: Rank 0's lines while it waits (:mod:`.progress`, on stderr by default); other ranks print none.

    Returns:
        The open store and this process's node assignment.

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
            _record(recorder, error, unreachable, claim.rank)
        raise
    meeting = _Meeting(store, claim, start, timeout, expected_node, recorder, progress)
    try:
        nodes, line, device_index, notes = meeting.run()
    except RendezvousError:
        meeting.leave()
        raise
    except DistError as error:  # a wait ran out (DistStoreError), or rank 0 stopped, likely for a reason it printed
        lost = meeting.lost_store(error)
        if claim.local_rank == 0:
            _record(recorder, lost, unreachable, claim.rank)
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
            # init_process_group's env:// store on rank 0 then shares this server (keyed by port): no second port.
            multi_tenant=True,
        )
    except (RuntimeError, TimeoutError) as error:
        if claim.rank == 0:
            raise serve_error(claim, error) from error
        last = str(error) if isinstance(error, _Unreachable) else _first_line(error)
        raise unreachable_error(claim, timeout, error, NetworkView.here(claim.main_address), last) from error
    if claim.rank == 0 and claim.world_size > 1:
        # What rank 0 sees of the network, for the verdict on ranks that never reach it (they cannot ask).
        store.set(_RANK_ZERO_VIEW, NetworkView.here(claim.main_address).to_json())
    return store


def _record(recorder: FailureRecorder | None, error: RendezvousError, fault: Fault, rank: int) -> None:
    """Write the failure record of ``fault``, where the state folder is set; say it on stderr when that fails."""
    if recorder is not None:
        failed = recorder.write(fault, problem=error.problem, written_by=rank)
        if failed is not None:
            print(failed, file=sys.stderr, flush=True)


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


class _Unreachable(TimeoutError):
    """Nothing accepted a connection at the main address before the deadline; the message is the last failure."""


def _wait_for_port(host: str, port: int, deadline: float) -> None:
    """Return once ``host:port`` accepts a connection; raise :class:`_Unreachable` at the deadline."""
    last = "no attempt"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Unreachable(f"connecting to {host}:{port}: {last}")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 2.0)):
                return
        except OSError as error:
            last = str(error) or type(error).__name__
            time.sleep(min(0.2, max(remaining, 0.0)))


class _Meeting:
    """One rank's part in one roll call; the first rank to reach a verdict writes it for all."""

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
        self.store, self.recorder, self.progress = store, recorder, progress
        self.claim = claim
        self.start = start
        self.deadline = start + timeout
        self.timeout = timeout
        self.expected_node = expected_node
        self.rank_zero: Claim | None = None

    def run(self) -> tuple[NodeAssignment, str, int | None, list[str]]:
        self._register()
        if self.claim.rank != 0:
            self._compare_with_rank_zero()
        self._arrive()
        verdict = self._await_verdict()
        if verdict.problem:
            self._raise(verdict)
        self.store.add(_READ, 1)
        node_key = f"{KEY_PREFIX}node/{self.claim.rank}"
        # Every rank checks its own assignment: a forged node index or device is refused, never taken.
        nodes, device = read(node_key, self.store.get(node_key), node_of(self.claim))
        return nodes, verdict.summary, device, list(verdict.notes)

    # --- steps ---------------------------------------------------------------------------------------------------

    def _register(self) -> None:
        rank = self.claim.rank
        self.store.add(_REGISTERED, 1)  # from now on rank 0 keeps the store up until this rank read the verdict
        order = self.store.add(f"{KEY_PREFIX}claims/{rank}", 1)
        self.store.set(f"{KEY_PREFIX}claim/{rank}/{order}", self.claim.to_json())
        if order > 1:
            # The second claimant knows at once; the first learns it from the verdict.
            first = self._claim(rank, self._get(f"{KEY_PREFIX}claim/{rank}/1"))
            fault = Fault(FailureKind.DUPLICATE, (rank,), (first.host, self.claim.host))
            self._conclude(duplicate_message(first, self.claim), fault)

    def _compare_with_rank_zero(self) -> None:
        self.rank_zero = self._claim(0, self._get(f"{KEY_PREFIX}claim/0/1"))
        problem = disagreement_message(self.rank_zero, self.claim)
        if problem is not None:
            self._conclude(problem, Fault(FailureKind.MISMATCH, (self.claim.rank,), (self.claim.host,)))

    def _arrive(self) -> None:
        store_append(self.store, _ARRIVED_RANKS, f"{self.claim.rank},")
        if self.store.add(_ARRIVED, 1) == self.claim.world_size:
            self._finalize()

    def _finalize(self) -> None:
        """The last rank to arrive checks the whole table and writes everyone's node assignment."""
        world_size = self.claim.world_size
        keys = [f"{KEY_PREFIX}claim/{rank}/1" for rank in range(world_size)]
        claims = [self._claim(rank, raw) for rank, raw in enumerate(self.store.multi_get(keys))]
        for other in claims[1:]:
            problem = disagreement_message(claims[0], other)
            if problem is not None:
                self._conclude(problem, Fault(FailureKind.MISMATCH, (other.rank,), (other.host,)))
        launch_wrong = Fault(FailureKind.MISMATCH)  # the launch as a whole is wrong: no rank or host to leave out
        collision = collisions(claims)
        if collision is not None:
            self._conclude(collision, launch_wrong)
        hosts = [claim.host for claim in claims]
        try:
            assignments = assign_all(hosts, any_layout=all(claim.any_layout for claim in claims))
        except RendezvousError as error:
            self._conclude(error, launch_wrong)
        mismatch = expectation_mismatch(claims, assignments[0])
        if mismatch is not None:
            self._conclude(mismatch, launch_wrong)
        try:
            devices, notes = devices_of(claims)
        except RendezvousError as error:
            self._conclude(error, launch_wrong)
        store_multi_set(
            self.store,
            [f"{KEY_PREFIX}node/{rank}" for rank in range(world_size)],
            [
                json.dumps([a.node_rank, a.num_nodes, a.local_rank, a.local_size, devices.get(rank)])
                for rank, a in enumerate(assignments)
            ],
        )
        self.store.set(KEY_PREFIX + "hosts", json.dumps(hosts))
        line = summary(claims, time.monotonic() - self.start)
        self.store.compare_set(_VERDICT, "", json.dumps({"summary": line, "notes": notes}))

    def _await_verdict(self) -> RollCallVerdict:
        progress = self.progress
        tick = None if progress is None else (lambda: progress.poll(self._arrived))
        if _wait_quietly(self.store, _VERDICT, self.deadline, self.claim.world_size, tick):
            return self._verdict(self.store.get(_VERDICT))
        missing = self._missing()
        if missing is not None:
            self._conclude(*missing)
        # Everyone arrived just now: the last rank is writing the verdict.
        if not _wait_quietly(self.store, _VERDICT, time.monotonic() + VERDICT_GRACE, self.claim.world_size):
            self._conclude(*self._never_received(_VERDICT))
        return self._verdict(self.store.get(_VERDICT))

    def leave(self) -> None:
        """On rank 0, keep serving the verdict at interpreter exit, until every rank read it or the deadline passed.

        Ranks still starting connect after the verdict; without the store they would wait out the timeout and blame
        rank 0.
        """
        if self.claim.rank != 0 or self.claim.world_size == 1:
            return
        import atexit

        atexit.register(_serve_verdict, self.store, self.claim.world_size, max(self.deadline, time.monotonic()))

    def lost_store(self, error: BaseException) -> RendezvousError:
        address = f"{self.claim.main_address}:{self.claim.main_port}"
        who = f"rank 0 on {self.rank_zero.describe()}" if self.rank_zero is not None else "rank 0"
        return RendezvousError(
            f"Rank {self.claim.rank} on {self.claim.describe()} lost the rendezvous store at {address}, which "
            f"{who} serves ({type(error).__name__}: {_first_line(error)}).",
            "Rank 0 stopped: look for its error above (a duplicate or missing rank, or a crash). " + MISSING_CAUSES,
            variable=TORCH.master_addr,
            value=address,
        )

    # --- helpers -------------------------------------------------------------------------------------------------

    def _conclude(self, problem: RendezvousError, fault: Fault) -> NoReturn:
        """Write ``problem`` as the verdict unless another rank wrote one first; raise the verdict that stands.

        The first rank whose verdict stands writes the job's one failure record, where the state folder is set.
        """
        payload = json.dumps({"problem": problem.problem, "hint": problem.hint, "value": problem.value})
        stored = self.store.compare_set(_VERDICT, "", payload)
        current = self._verdict(stored)
        if current.problem and stored != payload.encode():
            self._raise(current)
        # This rank's verdict stands (others may have reached the same one): the first of them writes the record.
        if current.problem and self.recorder is not None and self.store.add(_RECORDED, 1) == 1:
            _record(self.recorder, problem, fault, self.claim.rank)
        self.store.add(_READ, 1)
        raise problem  # the others already met (a late duplicate): this process still must not go on

    def _raise(self, verdict: RollCallVerdict) -> NoReturn:
        """Raise the verdict another rank (or this one) wrote, telling rank 0 it was read."""
        self.store.add(_READ, 1)
        raise verdict.error()

    def _missing(self) -> tuple[RendezvousError, Fault] | None:
        """Who never arrived, read from the store: any rank can say it, not only rank 0.

        The fault names the hosts of the nodes the missing ranks were expected on, where a rank of that node
        arrived; a node from which none arrived is known by its index only, which names no host.
        """
        world_size = self.claim.world_size
        arrived = self._arrived()
        missing = sorted(set(range(world_size)) - arrived)
        if not missing:
            return None
        examples: dict[int, Claim] = {}
        wanted: set[int] = set()
        expected_node = self.expected_node
        if expected_node is not None:
            wanted = {expected_node(rank) for rank in missing}
            for rank in sorted(arrived):
                node = expected_node(rank)
                if node in wanted or rank == 0:  # rank 0's claim tests the placement too (placement_holds)
                    examples[rank] = self._claim(rank, self.store.get(f"{KEY_PREFIX}claim/{rank}/1"))
                    wanted.discard(node)
            if not placement_holds(examples.values(), expected_node, world_size):
                expected_node, examples = None, {}  # an uneven launch: no rule says where the missing ranks were
        problem = missing_message(
            missing, examples, world_size, self.timeout, expected_node, arrived_count=len(arrived)
        )
        host_of: dict[int, str] = {}
        if expected_node is not None:
            node_host = {expected_node(rank): claim.host for rank, claim in examples.items()}
            host_of = {rank: node_host[expected_node(rank)] for rank in missing if expected_node(rank) in node_host}
        fault = Fault(FailureKind.MISSING, tuple(missing), hosts_of(missing, host_of))
        whole_node = expected_node is None or bool(wanted)  # a node none of whose ranks reached rank 0
        if whole_node and self.store.check([_RANK_ZERO_VIEW]):
            view = read(_RANK_ZERO_VIEW, self.store.get(_RANK_ZERO_VIEW), network_view)
            return with_rank_zero_view(problem, view), fault
        return problem, fault

    def _arrived(self) -> set[int]:
        text = self.store.get(_ARRIVED_RANKS) if self.store.check([_ARRIVED_RANKS]) else b""
        return read_raw(_ARRIVED_RANKS, text, arrived_ranks(self.claim.world_size))

    def _get(self, key: str) -> bytes:
        """The value of ``key`` once set, giving up at the deadline (then: who is missing)."""
        if not _wait_quietly(self.store, key, self.deadline, self.claim.world_size):
            if self.store.check([_VERDICT]):
                verdict = self._verdict(self.store.get(_VERDICT))
                if verdict.problem:
                    self._raise(verdict)
            self._conclude(*(self._missing() or self._never_received(key)))
        value: bytes = self.store.get(key)
        return value

    def _claim(self, rank: int, raw: bytes) -> Claim:
        """The claim stored for ``rank``; a malformed one ends the roll call for every rank, naming its key."""
        key = f"{KEY_PREFIX}claim/{rank}/1"
        try:
            return read(key, raw, claim_of(rank))
        except RendezvousError as error:
            self._conclude(error, Fault(FailureKind.MISMATCH, (rank,)))

    def _verdict(self, raw: bytes) -> RollCallVerdict:
        """The stored verdict; a malformed one is this rank's error (it cannot be replaced: first write wins)."""
        try:
            return read(_VERDICT, raw, roll_call_verdict)
        except RendezvousError:
            self.store.add(_READ, 1)
            raise

    def _never_received(self, key: str) -> tuple[RendezvousError, Fault]:
        error = RendezvousError(
            f"Rank {self.claim.rank} on {self.claim.describe()}: the rendezvous store never received {key!r} "
            f"within the rendezvous timeout of {self.timeout:g} s.",
            f"Rank 0 stopped or is overloaded. {MISSING_CAUSES}",
        )
        return error, Fault(FailureKind.STORE_UNREACHABLE, (0,), (self.claim.main_address,))


def _wait_quietly(
    store: TCPStore, key: str, deadline: float, world_size: int, tick: Callable[[], object] | None = None
) -> bool:
    """Whether ``key`` is set before ``deadline``, asking the store with ``check`` (which never blocks).

    ``tick`` runs between two checks (rank 0's progress lines). Not ``TCPStore.wait``: each wait that runs out makes
    torch's C++ client log ``[c10d] waitForInput ... timed out`` on every rank. The interval's cap grows with the
    job, so the server answers a bounded number of checks per second however many ranks wait.
    """
    interval, cap = 0.005, max(0.25, world_size / 4096)
    while not store.check([key]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if tick is not None:
            tick()
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, cap)
    return True


def _serve_verdict(store: TCPStore, world_size: int, deadline: float) -> None:
    """Keep ``store`` (and the server in it) alive until every rank read the verdict, or the deadline passed."""
    minimum = time.monotonic() + 3.0  # ranks that registered read the verdict within milliseconds
    try:
        while True:
            read, registered = store.add(_READ, 0), store.add(_REGISTERED, 0)
            now = time.monotonic()
            if read >= world_size or (now > minimum and now > deadline + VERDICT_GRACE and read >= registered):
                return
            if now > max(minimum, deadline + VERDICT_GRACE):
                return
            time.sleep(0.1)
    except RuntimeError:  # the store is gone already
        return


__all__ = ["KEY_PREFIX", "VERDICT_GRACE", "RendezvousResult", "rendezvous"]
