import errno
import os
from unittest import mock

import pytest

from lightning_mpi_env.tools.doctor import Finding, Level, diagnose

OPEN_MPI_RANK_0 = {
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "nodea",
    "MASTER_PORT": "29611",
}


def _bind_ok(address, port):
    return None


def _bind_error(code):
    def bind(address, port):
        raise OSError(code, "simulated")

    return bind


def _diagnose(env, **overrides):
    probes = {
        "module_available": lambda name: False,
        "loaded_modules": (),
        "gpu_count": lambda: None,
        "resolve": lambda host: "10.0.0.1",
        "bind": _bind_ok,
    }
    return diagnose(env, **{**probes, **overrides})


def _by_topic(findings, topic):
    return [finding for finding in findings if finding.topic == topic]


def test_healthy_rank_zero():
    findings = _diagnose(OPEN_MPI_RANK_0)
    assert not [finding for finding in findings if finding.level in (Level.WARN, Level.ERROR)]
    assert str(_by_topic(findings, "launcher")[0]) == "[ok] launcher: Open MPI (found OMPI_COMM_WORLD_RANK='0')."
    assert str(_by_topic(findings, "main port")[0]) == "[ok] main port: 10.0.0.1:29611 is free on rank 0's host."


def test_single_process_and_inherited_batch_variables():
    findings = _diagnose({"SLURM_PROCID": "0"})
    assert "SLURM_PROCID alone is inherited from a batch script" in str(_by_topic(findings, "launcher")[0])


def test_other_launchers_are_reported_as_ignored():
    findings = _diagnose({**OPEN_MPI_RANK_0, "SLURM_STEP_ID": "0"})
    assert "Slurm srun variables (SLURM_STEP_ID='0') are present too and ignored" in str(findings[1])


def test_layout_error_is_a_finding_with_its_hint():
    findings = _diagnose({**OPEN_MPI_RANK_0, "RANK": "3"})
    (error,) = [finding for finding in findings if finding.level is Level.ERROR]
    assert error.message.startswith("RANK='3' disagrees with Open MPI")
    assert error.fix.startswith("Unset RANK")
    assert not _by_topic(findings, "main address")  # nothing further to check without a layout


def test_stale_node_rank():
    findings = _diagnose({**OPEN_MPI_RANK_0, "NODE_RANK": "1"})
    assert _by_topic(findings, "stale variable")[0].level is Level.WARN


def test_master_addr_overriding_host_list():
    findings = _diagnose({**OPEN_MPI_RANK_0, "SLURM_JOB_NODELIST": "gpu[01-02]"})
    (finding,) = _by_topic(findings, "stale variable")
    assert finding.message == "MASTER_ADDR='nodea' overrides the scheduler's first host 'gpu01' (SLURM_JOB_NODELIST)."
    assert not _by_topic(_diagnose({**OPEN_MPI_RANK_0, "SLURM_JOB_NODELIST": "nodea"}), "stale variable")
    # An unreadable host list is ignored while MASTER_ADDR is set.
    assert not _by_topic(_diagnose({**OPEN_MPI_RANK_0, "PBS_NODEFILE": "/nonexistent"}), "stale variable")


def test_lightning_and_mpi4py_installed():
    findings = _diagnose(
        OPEN_MPI_RANK_0, module_available=lambda name: True, loaded_modules=("lightning", "pytorch_lightning")
    )
    messages = [str(finding) for finding in findings]
    assert any("both `lightning` and `pytorch_lightning` are installed" in message for message in messages)
    assert any(message.startswith("[warn] lightning: both") and "imported" in message for message in messages)
    assert any(message.startswith("[info] mpi4py: mpi4py is installed, and not needed") for message in messages)


@pytest.mark.parametrize(
    ("env", "gpus", "level", "text"),
    [
        ({}, None, Level.INFO, "no NVIDIA driver found"),
        ({}, 1, Level.WARN, "1 GPU(s) on this host but 2 ranks run on this node"),
        ({}, 2, Level.OK, "2 GPU(s) on this host for 2 rank(s)"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 4, Level.OK, "one GPU per rank"),
        ({"CUDA_VISIBLE_DEVICES": ""}, 4, Level.INFO, "CUDA_VISIBLE_DEVICES='' shows no GPU"),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 4, Level.INFO, "CUDA_VISIBLE_DEVICES='NoDevFiles' shows no GPU"),
    ],
)
def test_gpus_against_local_ranks(env, gpus, level, text):
    (finding,) = _by_topic(_diagnose({**OPEN_MPI_RANK_0, **env}, gpu_count=lambda: gpus), "gpus")
    assert finding.level is level
    assert text in finding.message


def test_subset_binding_is_explained():
    # srun --gpu-bind=closest (https://slurm.schedmd.com/srun.html): 4 ranks per node, each sees its socket's 2 GPUs
    env = {**OPEN_MPI_RANK_0, "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": "2,3"}
    (finding,) = _by_topic(_diagnose(env, gpu_count=lambda: 4), "gpus")
    assert finding.level is Level.INFO
    assert "CUDA_VISIBLE_DEVICES='2,3': 2 of the node's 4 GPUs for this rank, fewer than the 4 ranks" in finding.message
    assert "not its local rank 0" in finding.message
    assert 'strategy="ddp_mpi"' in finding.fix


def test_a_share_of_the_node_for_every_rank_is_taken_at_the_local_rank():
    # srun --gpus-per-node=2 on a 4-GPU node: every task sees the job's 2 GPUs
    env = {**OPEN_MPI_RANK_0, "CUDA_VISIBLE_DEVICES": "0,1"}
    (finding,) = _by_topic(_diagnose(env, gpu_count=lambda: 4), "gpus")
    assert finding.level is Level.OK
    assert "2 of the node's 4 GPUs: each rank takes the one at its local rank" in finding.message


def test_unresolvable_main_address():
    def resolve(host):
        raise OSError("Name or service not known")

    (finding,) = _by_topic(_diagnose(OPEN_MPI_RANK_0, resolve=resolve), "main address")
    assert finding.level is Level.ERROR
    assert "'nodea' (from MASTER_ADDR) does not resolve" in finding.message


@pytest.mark.parametrize(
    ("code", "topic", "text"),
    [
        (errno.EADDRINUSE, "main port", "port 29611 (MASTER_PORT) is already in use"),
        (errno.EADDRNOTAVAIL, "main address", "is not an address of this host"),
        (errno.EACCES, "main port", "could not test port 29611"),
    ],
)
def test_main_port_on_rank_zero(code, topic, text):
    findings = _diagnose(OPEN_MPI_RANK_0, bind=_bind_error(code))
    assert any(text in finding.message for finding in _by_topic(findings, topic))


def test_port_is_checked_only_on_rank_zero():
    env = {**OPEN_MPI_RANK_0, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    findings = _diagnose(env, bind=_bind_error(errno.EADDRINUSE))
    assert not _by_topic(findings, "main port")


def test_finding_str():
    assert str(Finding(Level.WARN, "t", "m", "f")) == "[warn] t: m HINT: f"


# --- issue 23: the doctor never crashes on what it exists to diagnose -----------------------------------------------


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("a..b", "it has an empty label"),
        ("a" * 64, "a label is longer than 63 characters"),
        ("node\udcff", "not printable ASCII"),  # bytes that are not UTF-8, as os.environ holds them
        (" ", "it is blank"),
        ("-oX=y", "a label starts or ends with '-'"),
    ],
)
def test_a_main_address_that_is_no_host_is_a_finding(address, problem):
    # Before: a raw UnicodeError from the resolver's IDNA codec (a..b, 64 characters, non-UTF-8 bytes).
    findings = diagnose({**OPEN_MPI_RANK_0, "MASTER_ADDR": address}, module_available=lambda name: False)
    (finding,) = [finding for finding in _by_topic(findings, "layout") if finding.level is Level.ERROR]
    assert "is not a host name or an IP address" in finding.message
    assert problem in finding.message


@pytest.mark.parametrize("error", [UnicodeError("label empty or too long"), ValueError("embedded null")])
def test_a_resolver_that_raises_anything_it_may_is_a_finding(error):
    def resolve(host):
        raise error

    (finding,) = _by_topic(_diagnose(OPEN_MPI_RANK_0, resolve=resolve), "main address")
    assert finding.level is Level.ERROR
    assert "does not resolve" in finding.message


def test_no_host_file_is_opened_while_master_addr_is_set(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer: a hang, were it opened
    opened = []
    real_open = os.open

    def watching_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    with mock.patch("os.open", watching_open):
        findings = _diagnose({**OPEN_MPI_RANK_0, "PBS_NODEFILE": str(fifo), "SLURM_JOB_NODELIST": "gpu[01-02]"})
    assert str(fifo) not in opened
    assert not _by_topic(findings, "stale variable")  # the host list that comes first is a file: not compared
    findings = _diagnose({**OPEN_MPI_RANK_0, "SLURM_JOB_NODELIST": "gpu[01-02]"})
    assert "overrides the scheduler's first host 'gpu01'" in _by_topic(findings, "stale variable")[0].message


# --- uneven launches (issue 25) ------------------------------------------------------------------------------------


def test_uneven_slurm_launch_is_an_info_with_what_trains_it():
    # srun -n5 over 2 nodes: SLURM_STEP_TASKS_PER_NODE=4,1 proves it uneven (srun(1)).
    env = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "4",
        "SLURM_NTASKS": "5",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4,1",
        "SLURM_STEP_NODELIST": "n[1-2]",
    }
    (finding,) = _by_topic(_diagnose(env), "uneven")
    assert finding.level is Level.INFO  # not an error: ddp_mpi trains it
    assert finding.message == (
        "Slurm srun launched 5 ranks on 2 nodes (4,1 per node), 1 on this node: not the same number on every node."
    )
    assert finding.fix.startswith(
        "Trainer(strategy=lightning_mpi_env.pytorch.MPIDDPStrategy()) (the object, not the name"
    )
    # The even launches near this one, for Lightning's own strategies: 2 or 3 per node, never one rank in all.
    assert finding.fix.endswith(
        "An even launch: `mpirun -np 4 --map-by ppr:2:node` or `-np 6 --map-by ppr:3:node` (Open MPI), or "
        "`srun -N 2 --ntasks-per-node=2` or `=3`."
    )


def test_uneven_open_mpi_launch_names_no_node_count_it_cannot_know():
    # 7 ranks, 4 here: surely uneven, but Open MPI exports no node count, so no even launch is suggested.
    env = {**OPEN_MPI_RANK_0, "OMPI_COMM_WORLD_SIZE": "7", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    (finding,) = _by_topic(_diagnose(env), "uneven")
    assert finding.message == "Open MPI launched 7 ranks, 4 on this node: not the same number on every node."
    assert "An even launch" not in finding.fix


def test_even_launch_has_no_uneven_finding():
    assert _by_topic(_diagnose(OPEN_MPI_RANK_0), "uneven") == []
