"""Ranks that cannot reach rank 0: each side names what it resolved the main host to; rank 0 its interfaces too."""

import socket

import pytest

from lightning_mpi_env.core.errors import FabricWarning, RendezvousError
from lightning_mpi_env.core.network import Interface, Resolution
from lightning_mpi_env.rollcall.claims import Claim
from lightning_mpi_env.rollcall.errors import missing_message, port_in_use, serve_error, with_rank_zero_view
from lightning_mpi_env.rollcall.network_view import NetworkView, off_fabric
from lightning_mpi_env.rollcall.store import rendezvous
from lightning_mpi_env.rollcall.store_values import network_view, read
from tests.rollcall.test_rendezvous import _claims, _free_port, _meet_without

VIEW = NetworkView(
    "nodea",
    Resolution("nodea", ("10.0.0.5",)),
    (Interface("lo", ("127.0.0.1/8",)), Interface("eth0", ("10.0.0.5/16",)), Interface("ib0", ("10.10.0.5/16",))),
)


def test_network_view_round_trips_and_names_the_interface_of_each_address():
    assert read("network view", VIEW.to_json(), network_view) == VIEW
    assert VIEW.resolved() == "nodea resolves to 10.0.0.5 (eth0)"
    unresolved = VIEW._replace(resolution=Resolution("nodez", (), "Name or service not known"))
    assert unresolved.resolved() == "nodez does not resolve (Name or service not known)"


def test_rank_zero_view_is_added_to_the_missing_ranks_verdict():
    missing = missing_message([2, 3], {}, 4, 5, lambda rank: rank // 2)
    text = str(with_rank_zero_view(missing, VIEW))
    assert text.startswith(missing.problem)
    assert "Rank 0's node nodea: nodea resolves to 10.0.0.5 (eth0); its interfaces: lo 127.0.0.1/8, eth0" in text
    assert "ib0 10.10.0.5/16" in text
    assert "LIGHTNING_MPI_ENV_MAIN_HOST='{host}i'" in text.split("HINT:")[1]


def test_missing_whole_node_names_rank_zero_s_resolution_and_interfaces():
    # Ranks 1 and 3 (node 1 by rank % 2) never come: none of node 1 reached rank 0, so its network view is named.
    results = _meet_without(_claims([0, 2], hosts="a"))
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert result.value == "ranks 1, 3"
        text = str(result)
        assert "Ranks 1, 3 of 4 never arrived" in text
        assert "Rank 0's node " in text
        assert "127.0.0.1 resolves to 127.0.0.1 (lo); its interfaces: lo 127.0.0.1/8" in text


def test_missing_rank_of_a_node_that_arrived_leaves_the_network_out():
    # Rank 1 of node 1 arrived, so node 1 reaches rank 0: the network is not the cause.
    results = _meet_without(_claims([0, 1, 2]))
    assert sorted(results) == [0, 1, 2]
    for result in results.values():
        assert isinstance(result, RendezvousError)
        assert result.value == "rank 3"
        assert "Rank 3 of 4 never arrived" in str(result)
        assert "Rank 0's node" not in str(result)


def test_unreachable_rank_zero_names_the_resolution_and_the_last_failure():
    port = _free_port()  # nothing listens there: every connection is refused
    claim = Claim(1, 2, "b", 0, 1001, "localhost", port)
    with pytest.raises(RendezvousError) as raised:
        rendezvous(claim, timeout=1.0)
    text = str(raised.value)
    assert f"rank 0 never answered at the main address localhost:{port} within the rendezvous timeout of 1 s" in text
    assert "On this node localhost resolves to " in text
    assert "the last attempt failed: connecting to localhost:" in text
    assert "Connection refused" in text
    assert "This node's interfaces: lo 127.0.0.1/8" in text
    assert "rank 0's own error lists what it resolved" in text
    # Refused: the host answered and nothing listened, so the causes that are not the network come first.
    assert raised.value.hint.startswith(
        f"Nothing listens at localhost:{port}: rank 0 never served the roll call there. Either it failed before "
        "(its own error says why), or no process claims rank 0: a wrapper or job script that exports one rank"
    ), raised.value.hint


def test_port_in_use_on_rank_zero_s_host_is_named_with_the_port_the_host_and_the_fix():
    with socket.socket() as other_program:
        other_program.bind(("0.0.0.0", 0))  # as a program that is not this job's would
        other_program.listen()
        port = other_program.getsockname()[1]
        claim = Claim(0, 2, "nodea", 0, 1000, "127.0.0.1", port)
        with pytest.raises(RendezvousError) as raised:
            rendezvous(claim, timeout=2.0)
    error = raised.value
    assert f"could not serve the rendezvous on port {port}: port {port} is already in use on host nodea" in str(error)
    assert "EADDRINUSE" in error.problem  # torch's own words, kept in parentheses
    assert "export MASTER_PORT=<a free port>" in error.hint
    assert f"`ss -ltnp 'sport = :{port}'` on nodea" in error.hint
    assert (error.variable, error.value) == ("MASTER_PORT", str(port))


def test_other_serve_failures_keep_the_general_message():
    claim = Claim(0, 2, "nodea", 0, 1000, "127.0.0.1", 29500)
    error = serve_error(claim, RuntimeError("something else"))
    assert not port_in_use(RuntimeError("something else"))
    assert str(error).startswith("Rank 0 on host nodea (pid 1000, local rank 0) could not serve the rendezvous on port")
    assert "(RuntimeError: something else)" in str(error)


def test_off_fabric_warns_when_the_main_host_resolves_to_another_network_than_the_fabric_s():
    warning = off_fabric("ib0", VIEW)
    assert isinstance(warning, FabricWarning)
    assert warning.problem == (
        "LIGHTNING_MPI_ENV_IFNAME='ib0' names the fabric, but on rank 0's node nodea nodea resolves to 10.0.0.5 "
        "(eth0), not to an address on ib0 (10.10.0.5/16): the ranks meet over that network, gloo and NCCL over ib0."
    )
    assert "LIGHTNING_MPI_ENV_MAIN_HOST='{host}i'" in warning.hint
    on_fabric = VIEW._replace(resolution=Resolution("nodeai", ("10.10.0.5",)))
    assert off_fabric("ib0", on_fabric) is None
    single_node = VIEW._replace(resolution=Resolution("127.0.0.1", ("127.0.0.1",)))
    assert off_fabric("ib0", single_node) is None  # every rank on one node meets over loopback: no other network
    assert off_fabric("", VIEW) is None
