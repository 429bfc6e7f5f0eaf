"""The roll call's failure path: one verdict under one key, raised by every rank, recorded once, served until read."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from lightning_mpi_env.core.errors import MpiEnvError, RendezvousError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder, Fault, hosts_of
from lightning_mpi_env.rollcall.batches import multi_set, present
from lightning_mpi_env.rollcall.claims import Claim, placement_holds
from lightning_mpi_env.rollcall.errors import missing_message, with_rank_zero_view
from lightning_mpi_env.rollcall.stall_verdict import END_STEP_RETRIES, ask_on_plan, end_step_now, ending_line, say
from lightning_mpi_env.rollcall.store_values import (
    RollCallVerdict,
    network_view,
    read,
    read_raw,
    roll_call_verdict,
    wire_claim,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # the public torch.distributed.TCPStore

VERDICT_GRACE = 5.0
"""Seconds past rank 0's deadline that another rank waits for the verdict rank 0 is writing."""

KEY_PREFIX = "lightning_mpi_env/"
"""Prefix of every key the roll call writes, apart from those of ``init_process_group``."""
VERDICT = KEY_PREFIX + "verdict"
READ = KEY_PREFIX + "verdict_read"
RECORDED = KEY_PREFIX + "failure_recorded"
RANK_ZERO_VIEW = KEY_PREFIX + "network/0"
NO_PLACE = ""
"""What a failure verdict leaves under every node key, so that no rank waits for its assignment."""


def claim_key(rank: int) -> str:
    """The key of ``rank``'s claim (the first claimant's: a second one is a duplicate)."""
    return f"{KEY_PREFIX}claim/{rank}"


def node_key(rank: int) -> str:
    """The key of ``rank``'s node assignment, written by rank 0 with the verdict."""
    return f"{KEY_PREFIX}node/{rank}"


def record(recorder: FailureRecorder | None, error: MpiEnvError, fault: Fault, rank: int) -> None:
    """Write the failure record of ``fault``, where the state folder is set; say it on stderr when that fails."""
    if recorder is not None:
        failed = recorder.write(fault, problem=error.problem, written_by=rank)
        if failed is not None:
            print(failed, file=sys.stderr, flush=True)


class VerdictKey:
    """One rank's side of the verdict key in one roll call."""

    def __init__(
        self,
        store: TCPStore,
        claim: Claim,
        deadline: float,
        timeout: float,
        expected_node: Callable[[int], int] | None,
        recorder: FailureRecorder | None,
    ) -> None:
        self.store, self.claim, self.recorder = store, claim, recorder
        self.deadline, self.timeout, self.expected_node = deadline, timeout, expected_node

    def conclude(self, problem: RendezvousError, fault: Fault) -> NoReturn:
        """Write ``problem`` as the verdict unless another rank wrote one first; raise the verdict that stands.

        The first write wins (``compare_set``); the rank whose verdict stands releases every rank waiting for its
        assignment (:data:`NO_PLACE`) and writes the one failure record.
        """
        payload = json.dumps({"problem": problem.problem, "hint": problem.hint, "value": problem.value})
        stored = self.store.compare_set(VERDICT, "", payload)
        current = self.parse(stored)
        if current.problem and stored != payload.encode():
            self.raise_stored(current)
        if stored == payload.encode():
            self.release()
        if current.problem and self.recorder is not None and self.store.add(RECORDED, 1) == 1:
            record(self.recorder, problem, fault, self.claim.rank)
        self.store.add(READ, 1)
        raise problem  # the others already met (a late duplicate): this process still must not go on

    def raise_stored(self, verdict: RollCallVerdict) -> NoReturn:
        """Raise the verdict another rank (or this one) wrote, telling rank 0 it was read."""
        self.store.add(READ, 1)
        raise verdict.error()

    def parse(self, raw: bytes) -> RollCallVerdict:
        """The stored verdict; a malformed one is this rank's error (it cannot be replaced: first write wins)."""
        try:
            return read(VERDICT, raw, roll_call_verdict)
        except RendezvousError:
            self.store.add(READ, 1)
            raise

    def release(self) -> None:
        """Leave :data:`NO_PLACE` under every node key: the ranks waiting for the verdict and their place return."""
        world_size = self.claim.world_size
        multi_set(self.store, [node_key(rank) for rank in range(world_size)], [NO_PLACE] * world_size)

    def claim_of(
        self, rank: int, raw: bytes, reference: Claim | None = None, differing: list[int] | None = None
    ) -> Claim:
        """The claim stored for ``rank``; a malformed one ends the roll call for every rank, naming its key.

        ``reference`` and ``differing``: see :func:`~lightning_mpi_env.rollcall.store_values.wire_claim`.
        """
        try:
            return read_raw(claim_key(rank), raw, wire_claim(rank, reference, differing))
        except RendezvousError as error:
            self.conclude(error, Fault(FailureKind.MISMATCH, (rank,)))

    def arrived(self) -> set[int]:
        """The ranks whose claims are in the store so far."""
        keys = [claim_key(rank) for rank in range(self.claim.world_size)]
        return {int(key.rsplit("/", 1)[1]) for key in present(self.store, keys)}

    def missing(self, arrived: set[int] | None = None) -> tuple[RendezvousError, Fault] | None:
        """Who never arrived, and the hosts of their nodes where known; ``arrived``: the ranks known to have.

        Any rank can say it: without ``arrived``, the claims in the store say who arrived.
        """
        world_size = self.claim.world_size
        arrived = self.arrived() if arrived is None else arrived
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
                    examples[rank] = self.claim_of(rank, self.store.get(claim_key(rank)))
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
        if whole_node and self.store.check([RANK_ZERO_VIEW]):
            view = read(RANK_ZERO_VIEW, self.store.get(RANK_ZERO_VIEW), network_view)
            return with_rank_zero_view(problem, view), fault
        return problem, fault

    def leave(self, end_step: Sequence[str] = (), end_hint: str = "") -> None:
        """At interpreter exit, help the job's launcher end the step after this failed roll call.

        Rank 0 keeps serving the verdict until every rank read it or the deadline passed: ranks still starting
        connect later, and without the store they would wait out the timeout and blame rank 0. Then it runs
        ``end_step``, the scheduler's command that ends the step (``end_hint``: what ends it where the command does
        not): a launcher that waits for every rank (``srun``) would wait for a rank that never came, alive, until
        the step's time limit. Every other rank, while it lives on, asks again (:func:`ask_on_plan`): the scheduler
        may have lost rank 0's request for its node.
        """
        if self.claim.world_size == 1:
            return
        import atexit

        if self.claim.rank == 0:
            deadline = max(self.deadline, time.monotonic())
            atexit.register(serve_verdict, self.store, self.claim.world_size, deadline, tuple(end_step), end_hint)
        elif end_step:
            claim = self.claim
            atexit.register(
                ask_on_plan, tuple(end_step), end_hint, rank=claim.rank, host=claim.host, world_size=claim.world_size
            )


def serve_verdict(
    store: TCPStore,
    world_size: int,
    deadline: float,
    end_step: tuple[str, ...] = (),
    end_hint: str = "",
    retries: int = END_STEP_RETRIES,
) -> None:
    """Keep ``store`` (and the server in it) alive until every rank read the verdict, or the deadline passed.

    Then run ``end_step``, if any, the scheduler's command that ends the step, asking ``retries`` times more while
    this process lives on (:func:`~lightning_mpi_env.rollcall.stall_verdict.end_step_now`).
    """
    _serve(store, world_size, deadline)
    if end_step:
        say(ending_line(0, end_step).rstrip())
        end_step_now(end_step, -1, retries=retries, hint=end_hint)


def _serve(store: TCPStore, world_size: int, deadline: float) -> None:
    minimum = time.monotonic() + 3.0  # ranks that registered read the verdict within milliseconds
    try:
        while True:
            now = time.monotonic()
            if store.add(READ, 0) >= world_size or now > max(minimum, deadline + VERDICT_GRACE):
                return
            time.sleep(0.1)
    except RuntimeError:  # the store is gone already
        return
