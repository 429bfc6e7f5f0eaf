"""The fabric settings and this host's network view: interfaces, resolutions, and the gloo/NCCL interface exports."""

import socket

import pytest

from lightning_mpi_env.core.errors import SettingError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.network import (
    Interface,
    Resolution,
    apply_host_template,
    describe_interfaces,
    local_interfaces,
    owner,
    parse_if_inet6,
    resolve,
    socket_ifname_exports,
)
from lightning_mpi_env.core.settings import Settings, host_template, interface_name

# /proc/net/if_inet6: address, index, prefix length, scope, flags, name (proc(5), "/proc/net/if_inet6").
IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "fd000000000000000000000000000002 03 40 00 80     eth0\n"
    "fe8000000000000000fc00fffe000001 03 40 20 80     eth0\n"
    "not a line\n"
)
ETH0_IB0 = (Interface("eth0", ("10.0.0.5/16",)), Interface("ib0", ("10.10.0.5/16", "fd10::5/64")))


def test_parse_if_inet6_keeps_global_and_loopback_addresses():
    assert parse_if_inet6(IF_INET6) == {"lo": ["::1/128"], "eth0": ["fd00::2/64"]}


def test_local_interfaces_read_the_probes():
    found = local_interfaces(
        names=lambda: ["lo", "ib0", "down0"],
        ipv4=lambda name: {"lo": ["127.0.0.1/8"], "ib0": ["10.10.0.5/16"]}.get(name, []),
        read_if_inet6=lambda: IF_INET6,
    )
    assert found == (
        Interface("lo", ("127.0.0.1/8", "::1/128")),
        Interface("ib0", ("10.10.0.5/16",)),
        Interface("down0", ()),
    )
    assert describe_interfaces(found) == "lo 127.0.0.1/8 ::1/128, ib0 10.10.0.5/16, down0 (no address)"


def test_local_interfaces_on_this_host_include_loopback():
    # The real probes (if_nameindex, the SIOCGIFADDR/SIOCGIFNETMASK ioctls): every Linux host has lo at 127.0.0.1/8.
    interfaces = {interface.name: interface for interface in local_interfaces()}
    assert "127.0.0.1/8" in interfaces["lo"].addresses
    assert set(interfaces) == {name for _, name in socket.if_nameindex()}


def test_resolve_names_addresses_or_the_reason():
    assert resolve("localhost").addresses[:1] in (("127.0.0.1",), ("::1",))
    assert resolve("127.0.0.9") == Resolution("127.0.0.9", ("127.0.0.9",))
    missing = resolve("no-such-host.invalid")  # RFC 6761: .invalid never resolves
    assert missing.addresses == ()
    assert missing.error
    assert missing.describe().startswith("no-such-host.invalid does not resolve (")


@pytest.mark.parametrize(
    ("address", "interface"),
    [("10.10.0.5", "ib0"), ("10.10.200.1", "ib0"), ("10.0.9.9", "eth0"), ("fd10::77", "ib0"), ("8.8.8.8", None)],
)
def test_owner_is_the_interface_holding_or_reaching_an_address(address, interface):
    assert owner(address, ETH0_IB0) == interface


def test_host_template_parses_and_applies():
    # JSC's InfiniBand names append "i" to the node name (jwb0001 -> jwb0001i): JSC's own job scripts,
    # github.com/FZJ-JSC/jubench-megatron-lm/blob/main/benchmark/slurm/jobscript_13B.sbatch
    # (MASTER_ADDR="${MASTER_ADDR}i", "Allow communication over InfiniBand cells").
    assert host_template({"LIGHTNING_MPI_ENV_MAIN_HOST": " {host}i "}) == "{host}i"
    assert apply_host_template("{host}i", "jwb0001") == "jwb0001i"
    assert Settings.from_env({"LIGHTNING_MPI_ENV_MAIN_HOST": "{host}-ib"}).main_host == "{host}-ib"


@pytest.mark.parametrize("value", ["i", "{host}{host}", "{hostname}i", "{host} i", "{host}/x"])
def test_host_template_refuses_what_is_no_template(value):
    with pytest.raises(SettingError, match=r"(?s)LIGHTNING_MPI_ENV_MAIN_HOST=.* is not a host name template.*HINT"):
        host_template({"LIGHTNING_MPI_ENV_MAIN_HOST": value})


@pytest.mark.parametrize("value", ["ib0,ib1", "^docker", "a" * 16, "ib 0"])
def test_interface_name_refuses_lists_and_long_names(value):
    with pytest.raises(SettingError, match=r"(?s)LIGHTNING_MPI_ENV_IFNAME=.* is not the name of one network.*HINT"):
        interface_name({"LIGHTNING_MPI_ENV_IFNAME": value})


SLURM_OPEN_MPI = {
    # Open MPI's rank variables (docs.open-mpi.org, "mpirun(1)": OMPI_COMM_WORLD_*) under a Slurm allocation,
    # whose node list (slurm.schedmd.com/sbatch.html: SLURM_JOB_NODELIST) names the main host.
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "jwb[0001-0002]",
}


def test_the_template_names_the_host_list_s_main_host_on_the_fabric():
    layout = from_env({**SLURM_OPEN_MPI, "LIGHTNING_MPI_ENV_MAIN_HOST": "{host}i"})
    assert layout.main_address == "jwb0001i"
    assert layout.sources["main_address"] == "SLURM_JOB_NODELIST (first host) as LIGHTNING_MPI_ENV_MAIN_HOST={host}i"
    assert from_env(SLURM_OPEN_MPI).main_address == "jwb0001"


def test_the_template_leaves_a_given_master_addr_alone():
    # A MASTER_ADDR is the user's (or Lightning's, in its own workers: templated twice it would be jwb0001ii).
    layout = from_env({**SLURM_OPEN_MPI, "LIGHTNING_MPI_ENV_MAIN_HOST": "{host}i", "MASTER_ADDR": "jwb0001i"})
    assert layout.main_address == "jwb0001i"


def test_socket_ifname_exports_both_variables_for_an_interface_here():
    # gloo reads GLOO_SOCKET_IFNAME, NCCL NCCL_SOCKET_IFNAME (pytorch.org/docs/stable/distributed.html, "Choosing
    # the network interface to use"); NCCL takes prefixes, `=ib0` for exactly ib0
    # (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname).
    assert socket_ifname_exports("ib0", {"NCCL_SOCKET_IFNAME": "=ib0"}, lambda: ETH0_IB0) == {
        "GLOO_SOCKET_IFNAME": "ib0"
    }
    assert socket_ifname_exports("ib0", {}, lambda: ETH0_IB0) == {
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_SOCKET_IFNAME": "ib0",
    }
    assert socket_ifname_exports("ib0", {"NCCL_SOCKET_IFNAME": "ib0"}, lambda: ETH0_IB0) == {
        "GLOO_SOCKET_IFNAME": "ib0"
    }
    assert socket_ifname_exports("", {"GLOO_SOCKET_IFNAME": "eth0"}, lambda: ETH0_IB0) == {}


def test_socket_ifname_exports_refuse_a_contradiction_naming_both():
    with pytest.raises(SettingError, match=r"(?s)LIGHTNING_MPI_ENV_IFNAME='ib0'.*GLOO_SOCKET_IFNAME='eth0'.*HINT"):
        socket_ifname_exports("ib0", {"GLOO_SOCKET_IFNAME": "eth0"}, lambda: ETH0_IB0)


def test_socket_ifname_exports_refuse_an_interface_this_host_lacks():
    with pytest.raises(SettingError, match=r"(?s)no interface hsn0 \(it has eth0 10.0.0.5/16, ib0 .*HINT: Set"):
        socket_ifname_exports("hsn0", {}, lambda: ETH0_IB0)
