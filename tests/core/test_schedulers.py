"""The scheduler rows: host lists (first host runs rank 0) and job identities."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.launchers import JSRUN, SLURM
from lightning_mpi_env.core.schedulers import SCHEDULERS, SCHEDULERS_BY_KEY, first_host, job_identity


def test_first_host_order_and_sources():
    files = {"/sge": "g0001\ng0002\n", "/pbs": "cn1\ncn1\ncn2\n"}
    read = files.__getitem__
    assert first_host({}, read) is None
    assert first_host({"PBS_NODEFILE": "/pbs"}, read) == ("cn1", "PBS_NODEFILE")
    assert first_host({"PBS_NODEFILE": "/pbs", "SGE_JOB_HOSTLIST": "/sge"}, read) == ("g0001", "SGE_JOB_HOSTLIST")
    assert first_host({"LSB_MCPU_HOSTS": "hostA 4 hostB 4"}, read) == ("hostA", "LSB_MCPU_HOSTS")
    # The step's list is srun's own; ranks another launcher started inherit a step that may be a daemon's.
    assert first_host({"SLURM_JOB_NODELIST": "a[3-4]", "SLURM_STEP_NODELIST": "a[4]"}, read) == (
        "a3",
        "SLURM_JOB_NODELIST",
    )
    srun = (SLURM.host_lists, SLURM.name)
    assert first_host({"SLURM_JOB_NODELIST": "a[3-4]", "SLURM_STEP_NODELIST": "a[4]"}, read, launch=srun) == (
        "a4",
        "SLURM_STEP_NODELIST",
    )


def test_host_file_with_slots_and_comments():
    text = "# allocated\n\n  g0002 slots=4\n"
    assert first_host({"SGE_JOB_HOSTLIST": "/x"}, lambda _: text) == ("g0002", "SGE_JOB_HOSTLIST")


def test_host_file_that_is_not_text(tmp_path):
    binary = tmp_path / "hosts"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LayoutError, match=r"LSB_DJOB_HOSTFILE=.*\(LSF\) names a host file that cannot be read"):
        first_host({"LSB_DJOB_HOSTFILE": str(binary)})


def test_pe_hostfile_and_abci_host_list():
    files = {"/pe": "g0007 4 all.q@g0007 UNDEFINED\ng0008 4 all.q@g0008 UNDEFINED\n", "/abci": "g0001\n"}
    read = files.__getitem__
    assert first_host({"PE_HOSTFILE": "/pe"}, read) == ("g0007", "PE_HOSTFILE")
    assert first_host({"PE_HOSTFILE": "/pe", "SGE_JOB_HOSTLIST": "/abci"}, read) == ("g0001", "SGE_JOB_HOSTLIST")


def test_jsrun_rank_file_skips_the_launch_node():
    # On CSM/jsrun systems the first line of LSB_DJOB_RANKFILE is the launch ("batch") node, which runs no rank.
    text = "batch4\nd29n14\nd29n14\nd29n15\nd29n15\n"
    launch = (JSRUN.host_lists, JSRUN.name)
    assert first_host({"LSB_DJOB_RANKFILE": "/r"}, lambda _: text, launch=launch) == ("d29n14", "LSB_DJOB_RANKFILE")


def test_unreadable_rank_file_names_the_launcher():
    launch = (JSRUN.host_lists, JSRUN.name)
    with pytest.raises(LayoutError, match=r"LSB_DJOB_RANKFILE='/missing' \(LSF jsrun\) names a host file that cannot"):
        first_host({"LSB_DJOB_RANKFILE": "/missing"}, launch=launch)


def test_job_identity_order_and_values():
    assert job_identity({}) is None
    assert job_identity({"PBS_JOBID": "4242.pbs01"}) == ("4242.pbs01", ("PBS_JOBID",))
    # The job, never the step: mpirun's ranks on another node inherit a daemon's step.
    assert job_identity({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"}) == ("9", ("SLURM_JOB_ID",))
    assert job_identity({"FLUX_ENCLOSING_ID": "ƒ2n7Sd1Ky"}) == ("ƒ2n7Sd1Ky", ("FLUX_ENCLOSING_ID",))
    assert job_identity({"JOB_ID": ""}) is None  # empty is absent


def test_every_row_has_a_unique_key_and_job_id():
    assert len(SCHEDULERS_BY_KEY) == len(SCHEDULERS)
    assert len({row.job_id for row in SCHEDULERS}) == len(SCHEDULERS)
    for row in SCHEDULERS:
        assert set(row.job_id) <= set(row.simulated), f"simulate must export {row.key}'s job id"
