"""The main address as given in MASTER_ADDR; the derived port is tested in test_layout.py."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import AddressError, LayoutError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.ports import given_main_address
from lightning_mpi_env.tools.interop import jax_distributed_kwargs

OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_PORT": "29611",
}


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("g0001", "g0001"),
        ("10.1.2.3", "10.1.2.3"),
        ("g0001.cluster.example", "g0001.cluster.example"),
        ("fe80::1", "fe80::1"),
        ("fe80::1%ib0", "fe80::1%ib0"),
        ("[fe80::1]", "fe80::1"),
        ("::1", "::1"),
    ],
)
def test_host_names_and_addresses_are_taken_as_given(given, address):
    assert given_main_address({"MASTER_ADDR": given}, None) == address
    assert from_env({**OPEN_MPI, "MASTER_ADDR": given}).main_address == address


def test_ipv6_addresses_keep_working_for_jax():
    env = {**OPEN_MPI, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "fe80::1"}
    kwargs = jax_distributed_kwargs({**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert kwargs["coordinator_address"] == "[fe80::1]:29611"


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("g0001:29500", "`export MASTER_ADDR=g0001 MASTER_PORT=29500`"),
        ("[fe80::1]:29500", "`export MASTER_ADDR=fe80::1 MASTER_PORT=29500`"),
        ("tcp://g0001", "MASTER_PORT=<port>"),
    ],
)
def test_a_host_with_a_port_is_refused_with_where_the_port_goes(given, fix):
    with pytest.raises(LayoutError, match=r"^MASTER_ADDR=.* \(Open MPI\) is not a host name or an address") as raised:
        from_env({**OPEN_MPI, "MASTER_ADDR": given})
    assert fix in raised.value.hint
    assert (raised.value.variable, raised.value.value, raised.value.launcher) == ("MASTER_ADDR", given, "Open MPI")


def test_a_host_with_a_port_is_refused_for_a_single_process_too():
    with pytest.raises(LayoutError, match=r"MASTER_ADDR='localhost:1234' \(no launcher\)"):
        from_env({"MASTER_ADDR": "localhost:1234"})


# --- a main address has host-name or IP syntax, from MASTER_ADDR or from a host list ----------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (" ", "it is blank"),
        ("a\nb", "not printable ASCII"),
        ("-oX=y", "a label starts or ends with '-'"),
        ("a..b", "an empty label"),
        (".a", "an empty label"),
        ("a" * 64, "a label is longer than 63 characters"),
        (("a" * 60 + ".") * 5, "longer than 253 characters"),
        ("node\udcff", "not printable ASCII"),  # bytes that are not UTF-8, as os.environ holds them
        ("nöde", "not printable ASCII"),
        ("node a", "the character ' '"),
        ("node;rm", "the character ';'"),
        ("fe80::1::2", "not an IPv6 address"),
        ("fe80::1%eth 0", "zone"),
    ],
)
def test_a_main_address_that_is_no_host_is_one_address_error(value, problem):
    with pytest.raises(
        AddressError, match=rf"MASTER_ADDR=.* \(Open MPI\) is not a host name or an IP address: .*{problem}"
    ):
        from_env({**OPEN_MPI, "MASTER_ADDR": value})


@pytest.mark.parametrize(
    "value", ["nodea", "node-01.cluster.example", "10.0.0.5", "a" * 63, "fe80::1%eth0", "[::1]", "n_1", "host."]
)
def test_host_names_and_addresses_pass(value):
    assert from_env({**OPEN_MPI, "MASTER_ADDR": value}).main_address == value.strip("[]")


def test_a_host_list_s_first_host_is_checked_too():
    env = {**OPEN_MPI, "MASTER_PORT": "29611", "LSB_MCPU_HOSTS": "-oProxyCommand=x 4 b 4"}
    with pytest.raises(AddressError, match=r"LSB_MCPU_HOSTS \(first host\)='-oProxyCommand=x' \(Open MPI\)"):
        from_env(env)
