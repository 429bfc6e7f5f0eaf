"""The scheduler rows: host lists (first host runs rank 0) and job identities."""

from __future__ import annotations

import re

import pytest

from lightning_mpi_env.core import schedulers
from lightning_mpi_env.core.errors import JobIdError, LayoutError
from lightning_mpi_env.core.launchers import JSRUN, SRUN
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.ports import derive_port
from lightning_mpi_env.core.schedulers import (
    SCHEDULERS,
    SCHEDULERS_BY_KEY,
    detect_scheduler,
    first_host,
    job_identity,
    requeue_name,
    scheduler_job,
)


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
    srun = (SRUN.host_lists, SRUN.name)
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


# --- array jobs: each task its own port -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "tasks", "outside"),
    [
        # Grid Engine qsub(1), https://gridscheduler.sourceforge.net/htmlman/htmlman1/qsub.html: "SGE_TASK_ID ...
        # This environment variable is set to 'undefined' for non-array jobs"; the tasks share JOB_ID.
        ({"JOB_ID": "77"}, [{"SGE_TASK_ID": "1"}, {"SGE_TASK_ID": "2"}], {"SGE_TASK_ID": "undefined"}),
        # LSF, https://www.ibm.com/docs/en/SSWRJV_10.1.0/lsf_admin/job_array_cl_args.html: the element's index;
        # 0 outside job arrays. The elements share LSB_JOBID.
        ({"LSB_JOBID": "4242"}, [{"LSB_JOBINDEX": "1"}, {"LSB_JOBINDEX": "2"}], {"LSB_JOBINDEX": "0"}),
        # PBS Professional, https://docs.it4i.cz/general/job-arrays/: each subjob has its own $PBS_ARRAY_INDEX (0 is
        # a valid index), and its PBS_JOBID is `123[4].server`; Torque's is PBS_ARRAYID.
        ({"PBS_JOBID": "123[].pbs01"}, [{"PBS_ARRAY_INDEX": "0"}, {"PBS_ARRAY_INDEX": "1"}], {}),
        ({"PBS_JOBID": "123[].pbs01"}, [{"PBS_ARRAYID": "0"}, {"PBS_ARRAYID": "1"}], {}),
    ],
)
def test_array_tasks_derive_different_ports(job, tasks, outside):
    identities = [job_identity({**job, **task}) for task in tasks]
    assert len({identity for identity, _ in identities}) == len(tasks)
    assert len({derive_port(identity) for identity, _ in identities}) == len(tasks)
    assert job_identity({**job, **outside}) == (next(iter(job.values())), tuple(job))


def test_pbs_subjob_ids_already_differ():
    ports = {derive_port(job_identity({"PBS_JOBID": f"123[{index}].pbs01"})[0]) for index in range(4)}
    assert len(ports) == 4


def test_array_task_port_through_the_layout():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    env |= {"OMPI_COMM_WORLD_LOCAL_SIZE": "1", "JOB_ID": "77", "SGE_TASK_ID": "5"}
    layout = from_env(env)
    assert (layout.main_port, layout.sources["main_port"]) == (derive_port("77/5"), "derived from JOB_ID+SGE_TASK_ID")


# --- job ids in each scheduler's own syntax ---------------------------------------------------------------------------


def test_every_job_variable_read_has_a_syntax_in_its_row():
    for row in SCHEDULERS:
        named = {name for template in row.requeue_job for name in re.findall(r"\{(\w+)\}", template)}
        used = {*row.job_id, *row.array_task, *named, *filter(None, [row.restart_count])}
        assert used <= set(row.job_syntax), f"{row.key}: {used - set(row.job_syntax)} without a syntax"


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_ID": "4242", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "2", "SLURM_RESTART_COUNT": "0"},
        {"JOB_ID": "77", "SGE_TASK_ID": "undefined"},
        {"PBS_JOBID": "4242.pbs01.cluster.example.org"},
        {"PBS_JOBID": "123[4].pbs01", "PBS_ARRAY_INDEX": "4"},
        {"LSB_JOBID": "7", "LSB_JOBINDEX": "0"},
        {"FLUX_ENCLOSING_ID": "ƒ2n7Sd1Ky"},
        {"FLUX_ENCLOSING_ID": "f2n7Sd1Ky"},
    ],
)
def test_real_job_ids_are_in_their_scheduler_s_syntax(env):
    job = scheduler_job(env)
    assert job is not None
    assert job.identity == job_identity(env)[0]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"SLURM_JOB_ID": "--partition=evil"}, "SLURM_JOB_ID"),  # once passed to `scontrol requeue` as an option
        ({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "1e3"}, "SLURM_RESTART_COUNT"),
        ({"SLURM_JOB_ID": "1" * 20}, "SLURM_JOB_ID"),
        ({"JOB_ID": "77", "SGE_TASK_ID": "../3"}, "SGE_TASK_ID"),
        ({"PBS_JOBID": "4242.pbs01/../../x"}, "PBS_JOBID"),
        ({"PBS_JOBID": "-r y"}, "PBS_JOBID"),
        ({"LSB_JOBID": "7\n8"}, "LSB_JOBID"),
        ({"LSB_JOBID": "\u0667"}, "LSB_JOBID"),  # an Arabic-Indic 7: int() reads it, LSF never writes it
        ({"FLUX_ENCLOSING_ID": "ƒ0OIl"}, "FLUX_ENCLOSING_ID"),  # not base58
    ],
)
def test_a_job_variable_outside_its_syntax_is_one_named_error(env, variable):
    with pytest.raises(JobIdError, match=rf"^{variable}=.* is not in .*'s syntax for it") as raised:
        scheduler_job(env)
    assert (raised.value.variable, raised.value.value) == (variable, env[variable])
    assert raised.value.launcher == detect_scheduler(env).name
    assert f"do not set {variable} by hand" in raised.value.hint


def test_one_home_for_detection_and_the_array_task_rule():
    # The requeue's plan and the port's identity both detect through detect_scheduler, and read array tasks by one
    # rule: "undefined" (Grid Engine) and, for LSF, "0" mean no array.
    assert detect_scheduler({"JOB_ID": "5", "SLURM_JOB_ID": "9"}).key == "sge"  # the table's order
    assert requeue_name(SCHEDULERS_BY_KEY["lsf"], {"LSB_JOBID": "7", "LSB_JOBINDEX": "0"}) == "7"
    assert requeue_name(SCHEDULERS_BY_KEY["lsf"], {"LSB_JOBID": "7", "LSB_JOBINDEX": "3"}) == "7[3]"
    assert requeue_name(SCHEDULERS_BY_KEY["slurm"], {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "8"}) == "9"
    assert requeue_name(SCHEDULERS_BY_KEY["lsf"], {}) is None
    assert scheduler_job({"JOB_ID": "77", "SGE_TASK_ID": "undefined"}).identity == "77"
    assert not hasattr(schedulers, "_is_array_task")  # the rule's second copy is gone


def test_slurm_s_restart_count_is_read_and_others_have_none():
    assert scheduler_job({"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "3"}).restarts == 3
    assert scheduler_job({"SLURM_JOB_ID": "9"}).restarts is None
    assert scheduler_job({"LSB_JOBID": "7", "LSB_RESTART": "Y"}).restarts is None  # a flag, not a count
    assert str(scheduler_job({"JOB_ID": "77", "SGE_TASK_ID": "3"})) == "SGE job 77 task 3"
    assert scheduler_job({"JOB_ID": "77", "SGE_TASK_ID": "3"}).key == "sge-77.3"
