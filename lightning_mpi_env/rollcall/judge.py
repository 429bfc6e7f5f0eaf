"""Rank 0's judgement of a full table of claims, as a pure function: a problem, or every rank's place."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.records import FailureKind, Fault
from lightning_mpi_env.rollcall.claims import Claim, assign_all, devices_of
from lightning_mpi_env.rollcall.errors import collisions, disagreement_message, expectation_mismatch


@dataclass(frozen=True)
class Met:
    """Every rank's place: its node assignment as stored under its key, and what rank 0 tells the user."""

    assignments: list[str]
    """By rank: ``[node rank, nodes, local rank, local size, device index or null]`` as JSON."""
    notes: list[str]


@dataclass(frozen=True)
class Refused:
    """What is wrong with the table, as every rank raises it, and the fault the failure record names."""

    problem: RendezvousError
    fault: Fault


def judge(claims: Sequence[Claim], differing: Iterable[int] | None = None) -> Met | Refused:
    """Judge the claims of every rank (by rank; ``claims[0]`` is rank 0's).

    ``differing``: the ranks whose shared fields (:data:`~lightning_mpi_env.rollcall.claims.SHARED_FIELDS`) were
    sent unlike rank 0's, the only ones that can disagree with it (``None``: compare every rank).
    """
    reference = claims[0]
    for rank in range(1, len(claims)) if differing is None else sorted(differing):
        other = claims[rank]
        problem = disagreement_message(reference, other)
        if problem is not None:
            return Refused(problem, Fault(FailureKind.MISMATCH, (other.rank,), (other.host,)))
    launch_wrong = Fault(FailureKind.MISMATCH)  # the launch as a whole is wrong: no rank or host to leave out
    collision = collisions(claims)
    if collision is not None:
        return Refused(collision, launch_wrong)
    try:
        assignments = assign_all([claim.host for claim in claims], any_layout=all(c.any_layout for c in claims))
        mismatch = expectation_mismatch(claims, assignments[0])
        if mismatch is not None:
            return Refused(mismatch, launch_wrong)
        devices, notes = devices_of(claims)
    except RendezvousError as error:
        return Refused(error, launch_wrong)
    encoded = [
        _encoded(a.node_rank, a.num_nodes, a.local_rank, a.local_size, devices.get(r))
        for r, a in enumerate(assignments)
    ]
    return Met(encoded, notes)


def _encoded(node_rank: int, num_nodes: int, local_rank: int, local_size: int, device: int | None) -> str:
    shown = "null" if device is None else str(device)
    return f"[{node_rank},{num_nodes},{local_rank},{local_size},{shown}]"
