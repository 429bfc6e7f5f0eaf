"""The main address as given in MASTER_ADDR (issue 15, item 8); the derived port is tested in test_layout.py."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import LayoutError
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
