"""The roll call's errors: a duplicate, missing, disagreeing or unreachable rank, named with its host and the fix.

Rank 0's judgement of a full table of claims (:func:`judge`) is a pure function of them: a problem, or every rank's
place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.network import describe_interfaces
from lightning_mpi_env.core.records import FailureKind, Fault
from lightning_mpi_env.core.settings import VARIABLE
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.gpu.devices import BINDING_HINT
from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment, assign_all, devices_of, format_ranks
from lightning_mpi_env.rollcall.network_view import NetworkView

FABRIC_HINT = (
    f"On nodes with several networks, choose the fabric: {VARIABLE['main_host']}='{{host}}i' (or your site's "
    f"pattern) for the main host's name on it, or MASTER_ADDR=<rank 0's address on it>, and {VARIABLE['ifname']}="
    "<its interface> for gloo and NCCL (docs/troubleshooting.md)."
)

MISSING_CAUSES = (
    "Likely causes: MASTER_ADDR/MASTER_PORT differ between nodes or point at the wrong host, a firewall blocks the "
    "port between nodes, or a node failed to start its ranks (check the launcher's and the scheduler's logs)."
)


def duplicate_message(first: Claim, second: Claim) -> RendezvousError:
    """The error for a rank claimed twice, naming both claimants."""
    return RendezvousError(
        f"Duplicate rank {first.rank}: it is claimed by {first.describe()} and by {second.describe()}. Two "
        "processes with one rank would deadlock or corrupt training, so every rank stops.",
        "The launcher's rank variables were overridden or copied: a wrapper script or job script that exports "
        "OMPI_COMM_WORLD_RANK/PMI_RANK/SLURM_PROCID/RANK by hand, two launches sharing one MASTER_ADDR and "
        "MASTER_PORT, or a job started twice. Let the launcher set the ranks and give each job its own port.",
        value=str(first.rank),
    )


def disagreement_message(reference: Claim, other: Claim) -> RendezvousError | None:
    """The error when ``other`` disagrees with rank 0 on the job, else ``None``; values not known are not compared."""
    expects, runs, uses = [], [], []
    if other.world_size != reference.world_size:
        expects.append(f"world size {other.world_size} (rank 0 says {reference.world_size})")
    if other.main_port != reference.main_port:
        expects.append(f"main port {other.main_port} (rank 0 says {reference.main_port})")
    settings_only = not expects
    if other.expected is not None and reference.expected is not None and other.expected != reference.expected:
        expects.append(
            f"Trainer(devices={other.expected[0]}, num_nodes={other.expected[1]}) (rank 0 has "
            f"devices={reference.expected[0]}, num_nodes={reference.expected[1]})"
        )
    for name in sorted(set(other.versions) & set(reference.versions)):
        if other.versions[name] != reference.versions[name]:
            runs.append(f"{name} {other.versions[name]} (rank 0 runs {reference.versions[name]})")
    if other.backend and reference.backend and other.backend != reference.backend:
        uses.append(
            f"the {other.backend} backend on {other.device or 'an unknown device'} (rank 0 uses "
            f"{reference.backend} on {reference.device or 'an unknown device'})"
        )
    gpus = "nccl" in (other.backend, reference.backend)
    known = other.visible_devices is not None and reference.visible_devices is not None
    if gpus and known and other.visible_devices != reference.visible_devices:
        uses.append(f"{other.visible_devices} visible GPU(s) (rank 0 sees {reference.visible_devices})")
    if other.any_layout != reference.any_layout:
        theirs, ours = (_strategy_kind(claim) for claim in (other, reference))
        uses.append(f"{theirs} (rank 0 uses {ours})")
    phrases = [
        f"{verb} {' and '.join(items)}"
        for verb, items in (("expects", expects), ("runs", runs), ("uses", uses))
        if items
    ]
    if not phrases:
        return None
    where = f"Rank {other.rank} on {other.describe()} {'; it '.join(phrases)}; rank 0 runs on {reference.describe()}."
    if settings_only and not runs and not uses:
        return RendezvousError(
            f"{where} The ranks were given different devices/num_nodes: a script that computes them from its own "
            "node (e.g. its launcher's local size) gets different values on nodes that run different numbers of "
            "ranks.",
            "Pass the same devices/num_nodes to every rank. Where nodes run different numbers of ranks, no "
            'devices/num_nodes fits: use strategy="ddp_mpi" and pass neither; it takes them from the launch.',
        )
    return RendezvousError(
        f"{where} The processes were not started by one launch with one environment.",
        "Start every rank with one launcher command and one software environment (the same Python, torch and "
        "Lightning on every node), and pass the same WORLD_SIZE/MASTER_PORT (or none) and the same Trainer "
        "arguments to all of them.",
    )


def _strategy_kind(claim: Claim) -> str:
    return 'strategy="ddp_mpi"' if claim.any_layout else 'a strategy other than "ddp_mpi"'


def missing_message(
    missing: Sequence[int],
    arrived: Mapping[int, Claim],
    world_size: int,
    timeout: float,
    expected_node: Callable[[int], int] | None,
    *,
    arrived_count: int | None = None,
) -> RendezvousError:
    """The error for ranks that never arrived, saying where they were expected (``expected_node``, when known).

    ``arrived`` names the host of each such node; ``arrived_count`` is how many arrived (``len(arrived)``).
    """
    where = ""
    if expected_node is not None:
        hosts_of_node: dict[int, set[str]] = {}
        for rank, claim in arrived.items():
            hosts_of_node.setdefault(expected_node(rank), set()).add(claim.host)
        places = []
        for node in sorted({expected_node(rank) for rank in missing}):
            ranks = format_ranks(rank for rank in missing if expected_node(rank) == node)
            hosts = sorted(hosts_of_node.get(node, ()))
            on = f"host {', '.join(hosts)}" if hosts else "a node from which no rank arrived at all"
            places.append(f"on node {node} ({on}): {ranks}" if len(missing) > 1 else f"on node {node} ({on})")
        where = f"; {'they were' if len(missing) > 1 else 'it was'} expected {'; '.join(places)}"
    count = len(arrived) if arrived_count is None else arrived_count
    return RendezvousError(
        f"{format_ranks(missing).capitalize()} of {world_size} never arrived within the rendezvous timeout of "
        f"{timeout:g} s{where}. {count} rank(s) arrived.",
        f"{MISSING_CAUSES} To wait longer, raise {VARIABLE['rendezvous_timeout']} or "
        "MPIClusterEnvironment(rendezvous_timeout=...).",
        value=format_ranks(missing),
    )


def device_collision(first: Claim, second: Claim) -> RendezvousError:
    """The error for two ranks on one host that would drive the same accelerator."""
    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {first.host} would both drive {first.device} "
        f"(accelerator {first.device_id}): rank {first.rank} is {first.describe()}, rank {second.rank} is "
        f"{second.describe()}. Two processes on one GPU run out of memory or deadlock in NCCL.",
        f"{BINDING_HINT} Keep the launcher's local ranks as it set them.",
        value=first.device_id,
    )


def local_rank_collision(first: Claim, second: Claim) -> RendezvousError:
    """The error for two ranks on one host with the same local rank."""
    return RendezvousError(
        f"Ranks {first.rank} and {second.rank} on host {first.host} both claim local rank {first.local_rank} "
        f"(pids {first.pid} and {second.pid}): they would use the same device and the same data shard slot.",
        "The launcher's local-rank variables were overridden or copied (a wrapper script exporting "
        "OMPI_COMM_WORLD_LOCAL_RANK/MPI_LOCALRANKID/SLURM_LOCALID/LOCAL_RANK by hand). Let the launcher set them.",
        value=str(first.local_rank),
    )


def expectation_mismatch(claims: Sequence[Claim], nodes: NodeAssignment) -> RendezvousError | None:
    """The error when the hosts do not match ``Trainer(devices, num_nodes)``, or ``None``."""
    expected = claims[0].expected
    if expected is None or (nodes.local_size, nodes.num_nodes) == expected:
        return None
    devices, num_nodes = expected
    hosts = ", ".join(dict.fromkeys(claim.host for claim in claims))
    return RendezvousError(
        f"The host names of the {len(claims)} ranks name {nodes.num_nodes} host(s) with {nodes.local_size} rank(s) "
        f"each ({hosts}), but Trainer(devices={devices}, num_nodes={num_nodes}) expects {num_nodes} node(s) with "
        f"{devices} each.",
        "Make Trainer(devices=..., num_nodes=...) match the launch; if different nodes report the same host "
        "name (containers), give each node its own host name.",
    )


def collisions(claims: Sequence[Claim]) -> RendezvousError | None:
    """Two ranks on one host driving one GPU, or claiming one local rank; ``None`` when there are none."""
    by_device: dict[tuple[str, str], Claim] = {}
    by_local_rank: dict[tuple[str, int], Claim] = {}
    for claim in claims:
        if claim.device_id:
            first = by_device.setdefault((claim.host, claim.device_id), claim)
            if first is not claim:
                return device_collision(first, claim)
        first = by_local_rank.setdefault((claim.host, claim.local_rank), claim)
        if first is not claim:
            return local_rank_collision(first, claim)
    return None


def unreachable_error(
    claim: Claim, timeout: float, error: BaseException, view: NetworkView, last_attempt: str, *, refused: bool = False
) -> RendezvousError:
    """A rank other than 0 never reached rank 0's store: what it resolved, what it tried, its interfaces.

    ``refused``: the main host answered, but nothing listened on the port, so rank 0 never served there; the hint then
    leads with the causes that are not the network.
    """
    address = f"{claim.main_address}:{claim.main_port}"
    tried = f"; the last attempt failed: {last_attempt}" if last_attempt else ""
    kind = "TimeoutError" if isinstance(error, TimeoutError) else type(error).__name__
    no_rank_zero = ""
    if refused:
        no_rank_zero = (
            f"Nothing listens at {address}: rank 0 never served the roll call there. Either it failed before "
            "(its own error says why), or no process claims rank 0: a wrapper or job script that exports one rank "
            "to every process (compare the launcher's rank variable in two ranks: `env | grep RANK`). Else, "
        )
    return RendezvousError(
        f"Rank {claim.rank} on {claim.describe()}: rank 0 never answered at the main address {address} within "
        f"the rendezvous timeout of {timeout:g} s ({kind}). On this node {view.resolved()}{tried}. "
        f"This node's interfaces: {describe_interfaces(view.interfaces)}.",
        f"{no_rank_zero}{'r' if refused else 'R'}ank 0 or its node failed to start, MASTER_ADDR/MASTER_PORT "
        f"({address} here) point at the wrong host "
        f"or differ between nodes, the main host's name resolves to another network here than on rank 0's node "
        f"(rank 0's own error lists what it resolved and its interfaces), or a firewall blocks the port. "
        f"{FABRIC_HINT} To wait longer, raise {VARIABLE['rendezvous_timeout']}.",
        variable=TORCH.master_addr,
        value=claim.main_address,
    )


def port_in_use(error: BaseException) -> bool:
    """Whether rank 0's store failed because its port is taken (torch says ``EADDRINUSE``)."""
    text = str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def serve_error(claim: Claim, error: BaseException) -> RendezvousError:
    """Rank 0 cannot serve the store: the port, the host and the fix (the port in use named as such)."""
    port = claim.main_port
    if port_in_use(error):
        return RendezvousError(
            f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {port}: port {port} is already in "
            f"use on host {claim.host}, by another program or by a second process that also claims rank 0 here "
            f"({type(error).__name__}: {first_line(error)}).",
            f"Give this job its own port: export MASTER_PORT=<a free port> to every rank, or unset MASTER_PORT to "
            f"derive one from the job id. `ss -ltnp 'sport = :{port}'` on {claim.host} shows which program holds it.",
            variable=TORCH.master_port,
            value=str(port),
        )
    return RendezvousError(
        f"Rank 0 on {claim.describe()} could not serve the rendezvous on port {port} "
        f"({type(error).__name__}: {first_line(error)}).",
        "The port is taken: by another job on this host (give each job its own MASTER_PORT, or unset it to "
        "derive one from the job id), or by a second process that also claims rank 0 here.",
        variable=TORCH.master_port,
        value=str(port),
    )


def with_rank_zero_view(problem: RendezvousError, view: NetworkView) -> RendezvousError:
    """``problem`` (ranks missing from a whole node) with what rank 0 resolved the main host to and its interfaces."""
    host = view.resolution.host
    return RendezvousError(
        f"{problem.problem} Rank 0's node {view.host}: {view.resolved()}; its interfaces: "
        f"{describe_interfaces(view.interfaces)}. Ranks that resolve {host} to an address none of these reach "
        "never arrive (their own errors say what they resolved).",
        f"{problem.hint} {FABRIC_HINT}",
        variable=problem.variable,
        value=problem.value,
        launcher=problem.launcher,
    )


def lost_store(claim: Claim, rank_zero: Claim | None, error: BaseException) -> RendezvousError:
    """A rank lost rank 0's store during the roll call (a wait ran out, or rank 0 stopped)."""
    address = f"{claim.main_address}:{claim.main_port}"
    who = f"rank 0 on {rank_zero.describe()}" if rank_zero is not None else "rank 0"
    return RendezvousError(
        f"Rank {claim.rank} on {claim.describe()} lost the rendezvous store at {address}, which "
        f"{who} serves ({type(error).__name__}: {first_line(error)}).",
        "Rank 0 stopped: look for its error above (a duplicate or missing rank, or a crash). " + MISSING_CAUSES,
        variable=TORCH.master_addr,
        value=address,
    )


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, for a message of ours."""
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


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
