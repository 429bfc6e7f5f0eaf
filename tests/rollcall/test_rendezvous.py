import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_mpi_env import LayoutError
from lightning_mpi_env.core.errors import RendezvousError
from lightning_mpi_env.core.records import FailureKind, FailureRecorder
from lightning_mpi_env.core.settings import DEFAULT_RENDEZVOUS_TIMEOUT, Settings
from lightning_mpi_env.gpu.devices import BINDING_HINT
from lightning_mpi_env.rollcall.claims import Claim, NodeAssignment, assign_all, format_ranks, placement_holds
from lightning_mpi_env.rollcall.errors import collisions, disagreement_message, duplicate_message, missing_message
from lightning_mpi_env.rollcall.store import RendezvousResult, rendezvous
from lightning_mpi_env.rollcall.store_values import claim_of, read
from lightning_mpi_env.rollcall.verdict import claim_key
from lightning_mpi_env.supervise.records import read_records
from tests.clusters.children import process_tree
from tests.clusters.hydra import free_port
from tests.conftest import start_gate

# --- pure helpers -------------------------------------------------------------------------------------------------


def test_two_ranks_set_up_on_one_gpu_are_named_with_the_binding_fix():
    # After Lightning set the devices up (2.2+), the claims carry each GPU's UUID: ranks 0 and 1 of host a drive the
    # same GPU. The hint is the one the per-task binding rule gives (gpu/devices.py), not a second wording of it.
    claims = [
        Claim(rank, 4, "a", rank, 100 + rank, "main", 29500, device="cuda:0", device_id="GPU-1234") for rank in range(2)
    ]
    problem = collisions(claims)
    assert problem is not None
    assert "Ranks 0 and 1 on host a would both drive cuda:0 (accelerator GPU-1234)" in problem.problem
    assert problem.hint.startswith(BINDING_HINT)
    assert problem.value == "GPU-1234"


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([8, 9, 10, 11, 12, 13, 14, 15], "ranks 8-15"), ([1, 3, 4], "ranks 1, 3-4"), ([2, 2], "rank 2")],
)
def test_format_ranks(ranks, text):
    assert format_ranks(ranks) == text


@given(st.sets(st.integers(0, 200), min_size=1))
def test_format_ranks_names_every_rank_once(ranks):
    named: set[int] = set()
    for part in format_ranks(ranks).split(" ", 1)[1].split(", "):
        start, _, end = part.partition("-")
        named.update(range(int(start), int(end or start) + 1))
    assert named == ranks


def test_resolve_timeout_precedence():
    env = {"LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": "20"}
    assert Settings.from_env(env).with_arguments(rendezvous_timeout=5).rendezvous_timeout == 5.0
    assert Settings.from_env(env).rendezvous_timeout == 20.0
    assert Settings.from_env({}).rendezvous_timeout == DEFAULT_RENDEZVOUS_TIMEOUT == 120.0


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_resolve_timeout_rejects_bad_values(value):
    with pytest.raises(LayoutError, match=rf"(?s)_RENDEZVOUS_TIMEOUT=.{value}. is not a positive.*HINT"):
        Settings.from_env({"LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": value})


def test_resolve_timeout_rejects_bad_argument():
    with pytest.raises(LayoutError, match="rendezvous_timeout='0' is not a positive"):
        Settings().with_arguments(rendezvous_timeout=0)


@pytest.mark.parametrize(
    ("hosts", "rank", "expected"),
    [
        (["a", "a", "b", "b"], 2, NodeAssignment(node_rank=1, num_nodes=2, local_rank=0, local_size=2)),
        (["a", "b", "a", "b"], 2, NodeAssignment(node_rank=0, num_nodes=2, local_rank=1, local_size=2)),
        # A rankfile that puts rank 0 on the second host listed: node 0 is always rank 0's host.
        (["z", "y", "y", "z"], 1, NodeAssignment(node_rank=1, num_nodes=2, local_rank=0, local_size=2)),
        (["a"], 0, NodeAssignment(node_rank=0, num_nodes=1, local_rank=0, local_size=1)),
    ],
)
def test_assign_all(hosts, rank, expected):
    assert assign_all(hosts)[rank] == expected


@given(st.integers(1, 5), st.integers(1, 5), st.booleans())
def test_assign_all_gives_every_rank_a_unique_place(num_nodes, per_node, round_robin):
    world = num_nodes * per_node
    hosts = [f"n{rank % num_nodes if round_robin else rank // per_node}" for rank in range(world)]
    places = assign_all(hosts)
    assert {(p.node_rank, p.local_rank) for p in places} == {
        (n, lr) for n in range(num_nodes) for lr in range(per_node)
    }
    assert places[0].node_rank == 0
    assert all(p.num_nodes == num_nodes and p.local_size == per_node for p in places)


def test_assign_all_refuses_uneven_hosts_naming_ddp_mpi():
    # Lightning's own strategies take devices x num_nodes: the launch is named as one launch, and the fix is
    # "ddp_mpi" (never "not started by one launch", never a rank count that does not fit).
    with pytest.raises(
        RendezvousError,
        match=r"(?s)placed 4 ranks unevenly over 2 hosts \(a: ranks 0-2, b: rank 3\): one launch.*"
        r'HINT: Use strategy="ddp_mpi" with no devices/num_nodes.*FSDP hybrid sharding, ModelParallel',
    ):
        assign_all(["a", "a", "a", "b"])


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        # 3 + 1 slots, block (mpirun --map-by slot) and round-robin (--map-by node).
        ("aaab", [(0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 1)]),
        ("abaa", [(0, 0, 3), (1, 0, 1), (0, 1, 3), (0, 2, 3)]),
        # 2 + 1 + 1 slots, block and round-robin.
        ("aabc", [(0, 0, 2), (0, 1, 2), (1, 0, 1), (2, 0, 1)]),
        ("abca", [(0, 0, 2), (1, 0, 1), (2, 0, 1), (0, 1, 2)]),
    ],
)
def test_assign_all_under_ddp_mpi_takes_uneven_hosts(hosts, expected):
    # Under "ddp_mpi" every node keeps its own count: local_size is this host's, num_nodes the hosts met.
    places = assign_all(list(hosts), any_layout=True)
    assert [(p.node_rank, p.local_rank, p.local_size) for p in places] == expected
    assert {p.num_nodes for p in places} == {len(set(hosts))}


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=40))
def test_assign_all_under_ddp_mpi_places_every_rank_once(hosts):
    places = assign_all(hosts, any_layout=True)
    # Every (node, local rank) once; each node's local ranks are 0..its size-1; node 0 holds rank 0.
    assert len({(p.node_rank, p.local_rank) for p in places}) == len(hosts)
    for place in places:
        assert 0 <= place.local_rank < place.local_size == hosts.count(hosts[places.index(place)])
    assert places[0].node_rank == 0


def _claim(rank, *, host="a", pid=100, world_size=4, port=29500):
    return Claim(rank, world_size, host, 0, pid, "main", port)


def test_duplicate_message_names_rank_hosts_pids_and_cause():
    text = str(duplicate_message(_claim(1, host="a", pid=11), _claim(1, host="b", pid=22)))
    assert "Duplicate rank 1" in text
    assert "host a (pid 11" in text
    assert "host b (pid 22" in text
    assert "HINT: The launcher's rank variables were overridden" in text


def test_disagreement_message():
    assert disagreement_message(_claim(0), _claim(2)) is None
    error = disagreement_message(_claim(0), _claim(2, world_size=8, port=1234))
    assert error is not None
    text = str(error)
    assert "expects world size 8 (rank 0 says 4) and main port 1234 (rank 0 says 29500)" in text


def test_missing_message_says_where_ranks_were_expected():
    arrived = {rank: _claim(rank, host="nodea" if rank < 4 else "nodeb") for rank in (0, 1, 2, 3, 4, 5)}
    text = str(missing_message([6, 7, 8, 9, 10, 11], arrived, 12, 20, lambda rank: rank // 4))
    assert text.startswith("Ranks 6-11 of 12 never arrived within the rendezvous timeout of 20 s")
    assert "on node 1 (host nodeb): ranks 6-7" in text
    assert "on node 2 (a node from which no rank arrived at all): ranks 8-11" in text
    assert "MASTER_ADDR" in text
    assert "firewall" in text
    assert "failed to start" in text


# --- real TCPStores, one thread per rank ----------------------------------------------------------------------------


def _free_port() -> int:
    return free_port("127.0.0.1")  # outside the ephemeral range: no test's connection takes it before rank 0 binds


# A roll call that some ranks never join ends when the rank that judges it, rank 0, has waited out this timeout. Rank 0
# starts only once every other present rank has registered (_meet_without), so a present rank's slow start (a store
# client once took over 2 s to connect on a loaded machine) never counts against it: after rank 0's claim the others
# read it and arrive, at their next check of the store (0.25 s apart at most), far inside this.
ABSENT_TIMEOUT = 6
HANG = 120.0
"""The present ranks' own timeout while rank 0 judges: it only ends a hang."""


def _rank(
    results: dict[int, object],
    index: int,
    claim: Claim,
    timeout: float,
    expected_node: Callable[[int], int],
    recorder: FailureRecorder | None,
) -> threading.Thread:
    """A thread that runs one rank's rendezvous and leaves its result (or error) in ``results[index]``."""

    def run() -> None:
        try:
            results[index] = rendezvous(claim, timeout=timeout, expected_node=expected_node, recorder=recorder)
        except Exception as error:  # noqa: BLE001  (the test inspects it)
            results[index] = error

    return threading.Thread(target=run)


def _join(threads: Sequence[threading.Thread], timeout: float) -> None:
    for thread in threads:
        thread.join(timeout + 30)
    assert not any(thread.is_alive() for thread in threads), "a rank was left hanging"


def _meet(
    claims: Sequence[Claim],
    timeout: float = 20.0,  # a meeting of every rank ends when the last arrives
    placements: Sequence[Callable[[int], int]] | None = None,
    recorder: FailureRecorder | None = None,
) -> dict[int, object]:
    """Run one rendezvous per claim in threads (each with its own placement guess); index results by position."""
    results: dict[int, object] = {}
    threads = [
        _rank(results, i, claim, timeout, placements[i] if placements else lambda rank: rank % 2, recorder)
        for i, claim in enumerate(claims)
    ]
    for thread in threads:
        thread.start()
    _join(threads, timeout)
    return results


def _meet_without(
    claims: Sequence[Claim],
    placement: Callable[[int], int] = lambda rank: rank % 2,
    recorder: FailureRecorder | None = None,
) -> dict[int, object]:
    """A roll call that the ranks left out of ``claims`` never join, judged by rank 0 (``claims[0]``).

    The test serves rank 0's store (rank 0's roll call then serves from the same server: ``multi_tenant``), the other
    present ranks register there with a timeout that only ends a hang, and rank 0 starts, with ``ABSENT_TIMEOUT``
    and its guess ``placement``, once their claims are in the store. Rank 0 is then the one rank to reach the deadline,
    and the ranks it names absent are those never started, however slowly the present ones connected.
    """
    import torch.distributed as dist

    judge = claims[0]
    assert judge.rank == 0
    server = dist.TCPStore(
        "127.0.0.1",
        judge.main_port,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=timedelta(seconds=HANG),
    )
    results: dict[int, object] = {}
    others = [_rank(results, i, claim, HANG, placement, recorder) for i, claim in enumerate(claims) if i]
    for thread in others:
        thread.start()
    registered = [claim_key(claim.rank) for claim in claims[1:]]
    deadline = time.monotonic() + HANG
    while not server.check(registered):
        assert time.monotonic() < deadline, "the present ranks never registered"
        time.sleep(0.05)
    last = _rank(results, 0, judge, ABSENT_TIMEOUT, placement, recorder)
    last.start()
    _join([last, *others], HANG)
    return results


def _claims(ranks, world_size=4, hosts="ab", port=None):
    port = port or _free_port()
    claims, on_host = [], {}
    for i, rank in enumerate(ranks):
        host = hosts[i % len(hosts)]
        local_rank = on_host[host] = on_host.get(host, -1) + 1  # as a launcher numbers them: distinct per host
        claims.append(Claim(rank, world_size, host, local_rank, 1000 + i, "127.0.0.1", port))
    return claims


def test_rendezvous_resolves_round_robin_nodes():
    results = _meet(_claims([0, 1, 2, 3]))
    nodes = {i: result.nodes for i, result in results.items()}  # type: ignore[attr-defined]
    assert nodes[0] == NodeAssignment(0, 2, 0, 2)
    assert nodes[1] == NodeAssignment(1, 2, 0, 2)
    assert nodes[2] == NodeAssignment(0, 2, 1, 2)
    assert nodes[3] == NodeAssignment(1, 2, 1, 2)


def test_rendezvous_duplicate_rank_stops_every_rank():
    results = _meet(_claims([0, 1, 2, 1]), timeout=20)
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert "Duplicate rank 1" in str(result)
        assert "pid 1001" in str(result)
        assert "pid 1003" in str(result)


def test_rendezvous_names_missing_rank():
    results = _meet_without(_claims([0, 1, 2]))
    assert sorted(results) == [0, 1, 2]
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert result.value == "rank 3"
        assert result.problem == (
            f"Rank 3 of 4 never arrived within the rendezvous timeout of {ABSENT_TIMEOUT} s; it was expected on "
            "node 1 (host b). 3 rank(s) arrived."
        )


@pytest.mark.parametrize(
    "guess",
    [lambda rank: rank // 2, lambda rank: rank],
    ids=["rank-zero-s-2-nodes-of-2", "rank-one-s-4-nodes-of-1"],
)
def test_missing_rank_of_an_uneven_launch_is_not_placed_by_a_guess_the_claims_refute(guess):
    # mpirun --map-by node over a host file of 2 + 1 + 1 slots: ranks 0 and 3 on host a, 1 on b, 2 on c. Rank 0
    # (local size 2) guesses 2 nodes of 2 in blocks, ranks 1 and 2 (local size 1) 4 nodes of 1: each would say rank 3
    # was expected on a node other than host a. The arrived claims' launcher counts refute both guesses, whichever
    # the judging rank holds.
    port = _free_port()
    placed = [(0, "a", 0, 2), (1, "b", 0, 1), (2, "c", 0, 1)]  # rank, host, local rank, local size
    claims = [Claim(r, 4, host, lr, 1000 + r, "127.0.0.1", port, local_size=ls) for r, host, lr, ls in placed]
    results = _meet_without(claims, placement=guess)
    assert sorted(results) == [0, 1, 2]
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert (
            f"Rank 3 of 4 never arrived within the rendezvous timeout of {ABSENT_TIMEOUT} s. 3 rank(s) arrived."
            in str(result)
        )
        assert "expected on" not in str(result)


def test_missing_rank_of_an_even_launch_is_placed_when_the_claims_fit():
    # The same test on 2 + 2 slots (ranks 0-1 on a, 2 on b, 3 missing): the launcher counts fit the block guess.
    port = _free_port()
    placed = [(0, "a", 0), (1, "a", 1), (2, "b", 0)]
    claims = [Claim(r, 4, host, lr, 1000 + r, "127.0.0.1", port, local_size=2) for r, host, lr in placed]
    results = _meet_without(claims, placement=lambda rank: rank // 2)
    assert sorted(results) == [0, 1, 2]
    for result in results.values():
        assert isinstance(result, RendezvousError)
        expected = f"Rank 3 of 4 never arrived within the rendezvous timeout of {ABSENT_TIMEOUT} s; it was expected on"
        assert f"{expected} node 1 (host b)" in str(result)


def test_placement_holds_tests_sizes_and_positions():
    block = lambda rank: rank // 2  # noqa: E731
    assert placement_holds([Claim(2, 4, "b", 0, 1, "m", 1, local_size=2)], block, 4)
    assert not placement_holds([Claim(2, 4, "b", 0, 1, "m", 1, local_size=1)], block, 4)  # node 1 runs 2, not 1
    assert not placement_holds([Claim(2, 4, "b", 1, 1, "m", 1, local_size=2)], block, 4)  # rank 2 is node 1's first
    assert placement_holds([Claim(3, 4, "b", 1, 1, "m", 1)], block, 4)  # Lightning's layout: no launcher count


def test_rendezvous_without_rank_zero_says_main_address_never_answered():
    port = _free_port()
    results = _meet(_claims([1, 2, 3], port=port), timeout=1.5)
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert f"rank 0 never answered at the main address 127.0.0.1:{port}" in str(result)


def test_rendezvous_world_size_disagreement():
    claims = _claims([0, 1, 2, 3])
    claims[2] = Claim(2, 5, "a", 0, 1002, "127.0.0.1", claims[0].main_port)
    results = _meet(claims, timeout=20)
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert "Rank 2 on host a (pid 1002, local rank 0) expects world size 5 (rank 0 says 4)" in str(result)


def test_rendezvous_uneven_hosts_under_lightning_s_own_strategies():
    results = _meet(_claims([0, 1, 2, 3], hosts="aaab"), timeout=20)
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert "placed 4 ranks unevenly over 2 hosts (a: ranks 0-2, b: rank 3)" in str(result)
        assert 'Use strategy="ddp_mpi"' in str(result)


def test_rendezvous_uneven_hosts_under_ddp_mpi_meet():
    claims = [dataclasses.replace(claim, any_layout=True) for claim in _claims([0, 1, 2, 3], hosts="aaab")]
    results = _meet(claims, timeout=20)
    nodes = {index: result.nodes for index, result in results.items()}  # type: ignore[attr-defined]
    # _claims deals hosts a, a, a, b to ranks 0-3: block placement of 3 + 1.
    assert nodes == {
        0: NodeAssignment(0, 2, 0, 3),
        1: NodeAssignment(0, 2, 1, 3),
        2: NodeAssignment(0, 2, 2, 3),
        3: NodeAssignment(1, 2, 0, 1),
    }


def test_rendezvous_one_rank_not_under_ddp_mpi_is_named():
    claims = [dataclasses.replace(claim, any_layout=True) for claim in _claims([0, 1, 2, 3], hosts="aaab")]
    claims[3] = dataclasses.replace(claims[3], any_layout=False)
    for result in _meet(claims, timeout=20).values():
        assert isinstance(result, RendezvousError)
        assert 'Rank 3 on host b (pid 1003, local rank 0) uses a strategy other than "ddp_mpi" (rank 0 uses ' in str(
            result
        )


def test_disagreement_on_trainer_settings_alone_is_not_called_two_launches():
    # An uneven launch whose script computes devices from its own node: one launch, different settings.
    zero = dataclasses.replace(_claim(0), expected=(3, 1))
    three = dataclasses.replace(_claim(3), expected=(1, 4))
    text = str(disagreement_message(zero, three))
    assert "expects Trainer(devices=1, num_nodes=4) (rank 0 has devices=3, num_nodes=1)" in text
    assert "were given different devices/num_nodes" in text
    assert "not started by one launch" not in text
    assert 'use strategy="ddp_mpi" and pass neither' in text
    # With another difference too, it is two launches again.
    four = dataclasses.replace(three, world_size=5)
    assert "not started by one launch" in str(disagreement_message(zero, four))


def _bound(claims, lists):
    """The claims with the visible sets a launcher gave them (``srun --gpu-bind=...``, see tests/gpu/test_devices)."""
    return [
        dataclasses.replace(claim, visible_set=tuple(listed.split(",")), visible_variable="CUDA_VISIBLE_DEVICES")
        for claim, listed in zip(claims, lists, strict=True)
    ]


def test_rendezvous_gives_each_rank_its_device_under_closest_binding():
    # srun --gpu-bind=closest on two hosts, round robin: each host's local ranks 0 and 1 share one socket's GPUs.
    results = _meet(_bound(_claims([0, 1, 2, 3]), ["0,1", "2,3", "0,1", "2,3"]), timeout=20)
    assert {i: result.device_index for i, result in results.items()} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert all(result.notes == () for result in results.values())  # one socket's ranks per host: nothing is lost


def test_rendezvous_notes_lost_peer_links():
    results = _meet(_bound(_claims([0, 1, 2, 3], hosts="a"), ["0,1", "0,1", "2,3", "2,3"]), timeout=20)
    assert [result.device_index for _, result in sorted(results.items())] == [0, 1, 0, 1]
    for result in results.values():
        (note,) = result.notes
        assert "ranks 0,1 and 2,3 on host a see disjoint GPUs" in note


def test_rendezvous_refuses_two_ranks_on_one_gpu():
    # srun --gpu-bind=single:2 puts two tasks on each GPU
    results = _meet(_bound(_claims([0, 1, 2, 3]), ["0", "0", "0", "0"]), timeout=20)
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert "Ranks 0 and 2 on host a would both drive device '0'" in str(result)


def test_claim_with_visible_set_round_trips_and_old_claims_still_parse():
    (claim,) = _bound(_claims([0], world_size=1), ["2,3"])
    assert read("claim", claim.to_json(), claim_of(None)) == claim
    old = json.loads(claim.to_json())
    for name in ("visible_set", "visible_variable", "device_index"):
        del old[name]
    assert read("claim", json.dumps(old), claim_of(None)).visible_set is None


# --- a duplicate rank 0 on another host ---------------------------------------------------------------------------

CLAIM = str(Path(__file__).parents[1] / "jobs" / "rendezvous_claim.py")


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair (10.213.0.1 and .2): two hosts, each with its own ports.

    The simulated cluster's nodes share one port space, so a second rank 0 there cannot even bind; on two real
    hosts it can. Needs root and iproute2; the host's own network is not touched.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (`ip`) for network namespaces")
    tag = f"lme{os.getpid() % 100000}"
    names = (f"{tag}a", f"{tag}b")
    commands = [
        *(["ip", "netns", "add", name] for name in names),
        ["ip", "link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb"],
    ]
    for name, end, address in zip(names, ("va", "vb"), ("10.213.0.1/24", "10.213.0.2/24"), strict=True):
        commands += [
            ["ip", "link", "set", f"{tag}{end}", "netns", name],
            ["ip", "-n", name, "addr", "add", address, "dev", f"{tag}{end}"],
            ["ip", "-n", name, "link", "set", f"{tag}{end}", "up"],
            ["ip", "-n", name, "link", "set", "lo", "up"],
        ]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot make network namespaces here: {' '.join(command)}: {done.stderr.strip()}")
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"{tag}va"], capture_output=True, check=False)


CLAIMS_HANG_LIMIT = 300.0
"""Seconds for three fresh interpreters to import torch on two busy cores and meet: only a hang takes longer."""


def _communicate_all(processes: list[subprocess.Popen[str]], limit: float) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr); past ``limit`` seconds in all, each one's state and output, and a failure."""
    deadline = time.monotonic() + limit
    try:
        return [process.communicate(timeout=max(0.0, deadline - time.monotonic())) for process in processes]
    except subprocess.TimeoutExpired:
        states = "\n".join(process_tree(process.pid) for process in processes)
        for process in processes:
            process.kill()
        outputs = [process.communicate() for process in processes]
        pytest.fail(f"the claimants ran past {limit} s; their processes then:\n{states}\nand their output: {outputs}")


def test_duplicate_rank_zero_on_another_host_is_caught_at_once(two_hosts, tmp_path):
    # A world of 3 where the launcher's rank 2, on node-b, claims rank 0. It serves its own store on its own host,
    # but its store client connects to the main address: its claim lands in the real store, where the duplicate is
    # seen, long before the timeout (else the real ranks would report rank 2 as missing after it).
    host_a, host_b = two_hosts
    timeout = 60
    processes = []
    # The three start their claims together: their imports alone ended 37 s apart in a fault series on a busy machine.
    gate = {**os.environ, **start_gate(tmp_path / "gate", 3)}
    for netns, rank, host in ((host_a, 0, "node-a"), (host_b, 0, "node-b"), (host_a, 1, "node-a")):
        command = [sys.executable, CLAIM, str(rank), "3", host, "10.213.0.1", "29777", str(timeout)]
        processes.append(
            subprocess.Popen(
                ["ip", "netns", "exec", netns, *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=gate,
            )
        )
    outcomes = [json.loads(stdout) for stdout, _ in _communicate_all(processes, CLAIMS_HANG_LIMIT)]
    for outcome in outcomes:
        assert not outcome["ok"], outcome
        # Both claimants named, in the order their claims reached the store (either may come first).
        assert "Duplicate rank 0: it is claimed by host node-" in outcome["error"], outcome
        assert "host node-a (pid " in outcome["error"], outcome
        assert "host node-b (pid " in outcome["error"], outcome
        # Long before the timeout would have named a missing rank instead: a bound on a hang, not a speed target. At a
        # load average near 15 on 2 cores it took 0.6 s; the 37-44 s once seen here was torch's import, now before it.
        assert outcome["seconds"] < timeout / 2, outcome


# --- failure records (LIGHTNING_MPI_ENV_STATE_DIR) -------------------------------------------------------------------


def test_the_rank_whose_verdict_stands_records_the_missing_ranks_and_their_host(tmp_path):
    recorder = FailureRecorder(str(tmp_path), "Open MPI", "42")
    results = _meet_without(_claims([0, 1, 2]), recorder=recorder)
    assert sorted(results) == [0, 1, 2]
    assert all(isinstance(result, RendezvousError) for result in results.values())
    (record,) = read_records(str(tmp_path))  # one record however many ranks saw it
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.MISSING, (3,), ("b",))
    assert record.blames_hosts
    assert record.problem.startswith(f"Rank 3 of 4 never arrived within the rendezvous timeout of {ABSENT_TIMEOUT} s")
    assert (record.launcher, record.job_id) == ("Open MPI", "42")


def test_a_duplicate_is_recorded_as_a_wrong_launch(tmp_path):
    results = _meet(_claims([0, 1, 2, 1]), timeout=20, recorder=FailureRecorder(str(tmp_path), "srun", None))
    assert all(isinstance(result, RendezvousError) for result in results.values())
    (record,) = read_records(str(tmp_path))
    # Both claimants of rank 1 run on host b (_claims alternates a and b).
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.DUPLICATE, (1,), ("b",))
    assert not record.blames_hosts


def test_the_first_rank_of_each_node_that_cannot_reach_rank_zero_records_it(tmp_path):
    # Ranks 1 (host a, local rank 0), 2 (host b, local rank 0) and 3 (host a, local rank 1): no store, so no verdict
    # to agree on; one record per node keeps a large job's folder small.
    _meet(_claims([1, 2, 3]), timeout=1.5, recorder=FailureRecorder(str(tmp_path), "srun", "7"))
    records = read_records(str(tmp_path))
    assert sorted(record.written_by for record in records) == [1, 2]
    assert {(record.kind, record.ranks, record.hosts) for record in records} == {
        (FailureKind.STORE_UNREACHABLE, (0,), ("127.0.0.1",))
    }


def test_a_roll_call_that_meets_writes_nothing(tmp_path):
    _meet(_claims([0, 1, 2, 3]), recorder=FailureRecorder(str(tmp_path / "state"), "srun", "7"))
    assert not (tmp_path / "state").exists()


def test_a_client_of_its_own_is_answered_while_the_roll_call_s_client_waits_in_a_get():
    # A collective's first get (NCCL's unique id) may wait on init's client for minutes; the watchdog's requests go on
    # its own client (RendezvousResult.client), or they would queue behind it and call rank 0 silent.
    results = _meet(_claims([0, 1], world_size=2))
    rank_one = results[1]
    assert isinstance(rank_one, RendezvousResult), rank_one
    rank_one.store.set_timeout(timedelta(seconds=HANG))
    pending = threading.Thread(target=rank_one.store.get, args=("posted-later",))
    pending.start()
    answered = threading.Event()

    def report() -> None:
        watchdog = rank_one.client(timeout=5.0)
        watchdog.set("report", "1")
        if watchdog.check(["report"]):
            answered.set()

    try:
        threading.Thread(target=report, daemon=True).start()
        assert answered.wait(HANG)  # on the roll call's own client, it would wait as long as the get
        assert pending.is_alive()  # the get still waits: it did not hold up the requests above
    finally:
        results[0].store.set("posted-later", "now")  # type: ignore[attr-defined]
        pending.join(HANG)
    assert not pending.is_alive()


def test_a_rank_past_rank_zero_s_world_is_named_disagreeing_at_its_own_timeout(tmp_path):
    # Rank 0 waits for the claims of its own world of 4: the four meet. A fifth process that says it is rank 4 of 5 is
    # never waited for, and names its disagreement with rank 0 when its wait for the verdict runs out.
    claims = _claims([0, 1, 2, 3])
    extra = Claim(4, 5, "c", 0, 1004, "127.0.0.1", claims[0].main_port)  # the first rank of its node: it records
    recorder = FailureRecorder(str(tmp_path), "Open MPI", "42")
    results = _meet([*claims, extra], timeout=2.0, recorder=recorder)
    assert all(isinstance(results[index], RendezvousResult) for index in range(4)), results
    assert isinstance(results[4], RendezvousError), results[4]
    assert "Rank 4 on host c (pid 1004, local rank 0) expects world size 5 (rank 0 says 4)" in str(results[4])
    (record,) = read_records(str(tmp_path))
    assert (record.kind, record.ranks, record.hosts) == (FailureKind.MISMATCH, (4,), ("c",)), record
