from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_mpi_env import from_env
from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.launchers import LAUNCHERS, LAUNCHERS_BY_KEY, detect_launcher
from lightning_mpi_env.core.placement import Placement
from lightning_mpi_env.core.ports import DEFAULT_MAIN_PORT
from lightning_mpi_env.core.rank_layout import RankLayout
from tests.clusters.hydra import launcher_truth


def test_every_row_has_a_unique_key_and_marker():
    assert len(LAUNCHERS_BY_KEY) == len(LAUNCHERS)
    assert len({launcher.marker for launcher in LAUNCHERS}) == len(LAUNCHERS)


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda launcher: launcher.key)
def test_every_row_reads_its_marker_or_the_marker_only_identifies_it(launcher):
    assert launcher.rank in launcher.variables
    assert launcher.launch_hint


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_STEP_ID", "PMI_RANK"], "openmpi"),
        (["MV2_COMM_WORLD_RANK", "PMI_RANK", "MPI_LOCALRANKID"], "mvapich2"),
        (["PALS_RANKID", "PMI_RANK", "PMI_SIZE"], "pals"),
        (["PMI_RANK", "MPI_LOCALRANKID", "SLURM_STEP_ID"], "mpich"),
        (["PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID", "PMIX_RANK"], "slurm"),
        (["PMIX_RANK"], "pmix"),
        # The Cray plugins of srun and Flux set PALS_* beside their own (test_layout.py cites them).
        (["PALS_RANKID", "PMI_RANK", "SLURM_STEP_ID", "SLURM_PROCID"], "slurm"),
        (["PALS_RANKID", "FLUX_TASK_RANK"], "flux"),
        # torchrun spawned the process; the MPI and Slurm variables are its agent's (docs/launchers.md).
        (["TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "SLURM_STEP_ID", "PMI_RANK"], "torchrun"),
    ],
)
def test_precedence(names, expected):
    launcher = detect_launcher(dict.fromkeys(names, "0"))
    assert launcher is not None
    assert launcher.key == expected


def test_no_launcher():
    assert detect_launcher({"SLURM_PROCID": "0", "PMI_RANK": "0", "RANK": "0"}) is None


# --- the rows against real launchers: environments captured from real launches (tests/data) ----------------------
# Each capture is a list of one launch's tasks (a batch script's: one), each the task's launcher variables and the
# host it ran on. The truth is what the launcher itself told each task, and where the task ran; from_env must give
# exactly that. They were captured by tests/clusters (slurm.py's cluster, hydra.py's `capture`), which the real
# tests in test_slurm.py and test_hydra.py run again.

DATA = Path(__file__).parents[1] / "data"
CAPTURES = sorted(DATA.glob("*/*.json"))
HOSTS = {"slurm": ("node1", "node2"), "mpich": ("127.0.0.2", "127.0.0.3"), "intelmpi": ("127.0.0.2", "127.0.0.3")}
"""Each capture directory's hosts in the launch's order (the job's node list; Hydra's ``-hosts``)."""
TRUTH = {
    "openmpi": {
        "rank": "OMPI_COMM_WORLD_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
    },
    "mpich": {"rank": "PMI_RANK", "world_size": "PMI_SIZE", "local_rank": "MPI_LOCALRANKID"},
    "slurm": {"rank": "SLURM_PROCID", "world_size": "SLURM_NTASKS", "local_rank": "SLURM_LOCALID"},
}
"""Each launcher's own word for a task's ranks (named here, not taken from the rows under test)."""
NOT_EXACT = {
    "mpich/mpiexec_pmi-port_n4_ppn2.json",  # no PMI_RANK, no world size at all: refused, see below
    "mpich/mpiexec_uneven_n3_ppn2.json",  # the lone rank cannot see the other node's count: refused, see below
    "intelmpi/mpiexec_uneven_n3_ppn2.json",
}


def launched_by(capture: Path) -> str | None:
    """Which launcher started the captured tasks, from how they were captured; ``None``: no launch (a batch script)."""
    if capture.parent.name in ("mpich", "intelmpi"):
        return "mpich"  # MPICH's and Intel MPI's mpiexec are both Hydra
    if capture.name.startswith("mpirun_"):
        return "openmpi"  # Open MPI's mpirun inside an sbatch or salloc allocation
    if capture.name.startswith("srun_") or "_srun_step" in capture.name:
        return "slurm"
    assert "batch_script" in capture.name or capture.name.startswith("salloc_command"), capture
    return None


def captured_environments(capture: Path) -> list[dict[str, str]]:
    """Each task's environment as its process saw it; with MASTER_ADDR where the launch needed one passed."""
    tasks = json.loads(capture.read_text())
    environments = [{name: value for name, value in task.items() if name != "hostname"} for task in tasks]
    if launched_by(capture) == "mpich":
        # Hydra lists no hosts to its ranks: a multi-node job passes MASTER_ADDR (`-genv`), the first host.
        environments = [{"MASTER_ADDR": HOSTS[capture.parent.name][0], **env} for env in environments]
    return environments


def captured_truth(capture: Path) -> list[dict]:
    tasks = [{"launcher": task} for task in json.loads(capture.read_text())]
    return launcher_truth(tasks, HOSTS[capture.parent.name], **TRUTH[launched_by(capture)])


def captured_layouts(capture: Path) -> list[tuple[RankLayout, dict]]:
    """Each task's layout from from_env, with the layout in the truth's terms (``show --json``'s); sorted by rank."""
    hosts = [task["hostname"] for task in json.loads(capture.read_text())]
    layouts = [from_env(env) for env in captured_environments(capture)]
    fields = ("global_rank", "world_size", "local_rank", "local_size", "node_rank", "num_nodes")
    shown = [
        {**{key: layout.as_dict()[key] for key in fields}, "host": host}
        for layout, host in zip(layouts, hosts, strict=True)
    ]
    return sorted(zip(layouts, shown, strict=True), key=lambda pair: pair[0].rank)


def test_every_capture_directory_is_a_known_launcher():
    assert {capture.parent.name for capture in CAPTURES} == set(HOSTS)
    assert {launched_by(capture) for capture in CAPTURES} == {*TRUTH, None}


@pytest.mark.parametrize(
    "capture",
    [capture for capture in CAPTURES if f"{capture.parent.name}/{capture.name}" not in NOT_EXACT],
    ids=lambda capture: f"{capture.parent.name}/{capture.stem}",
)
def test_captured_launch_resolves_to_what_the_launcher_said(capture: Path):
    resolved = captured_layouts(capture)
    layouts = [layout for layout, _ in resolved]
    launcher = launched_by(capture)
    if launcher is None:
        # A batch script (or salloc's command) inherits SLURM_PROCID=0 of a many-task job: it is one process.
        assert {(layout.launcher, layout.world_size, layout.rank) for layout in layouts} == {(None, 1, 0)}
        assert all(layout.placement is Placement.SINGLE for layout in layouts)
        return
    truth = captured_truth(capture)
    assert [shown for _, shown in resolved] == truth
    assert {layout.launcher.key for layout in layouts if layout.launcher is not None} == {launcher}
    assert all(layout.warnings == () for layout in layouts)
    # One launch: every task meets at rank 0's host, on one port; loopback when every task ran on that one host.
    assert len({(layout.main_address, layout.main_port) for layout in layouts}) == 1
    one_host = len({row["host"] for row in truth}) == 1
    assert layouts[0].main_address == ("127.0.0.1" if one_host else truth[0]["host"])


def test_captured_intel_mpi_launches_each_get_their_own_port():
    # Two mpiexec runs of one job script: I_MPI_HYDRA_UUID differs, and so do the ports (MPICH has no such name).
    def ports(kind: str, name: str) -> set[int]:
        return {from_env(env).main_port for env in captured_environments(DATA / kind / name)}

    runs = ("mpiexec_block_n4_ppn2.json", "mpiexec_block_n4_ppn2_rerun.json")
    [first], [second] = (ports("intelmpi", name) for name in runs)
    assert first != second
    assert [ports("mpich", name) for name in runs] == [{DEFAULT_MAIN_PORT}, {DEFAULT_MAIN_PORT}]


def test_captured_mpich_pmi_port_mode_is_refused_naming_what_is_missing():
    # `mpiexec -pmi-port` exports PMI_ID and PMI_PORT instead of PMI_RANK, PMI_SIZE: no world size anywhere.
    for env in captured_environments(DATA / "mpich" / "mpiexec_pmi-port_n4_ppn2.json"):
        with pytest.raises(LayoutError, match="but PMI_RANK, PMI_SIZE are missing") as raised:
            from_env(env)
        assert "drop `-pmi-port`" in raised.value.hint


@pytest.mark.parametrize("kind", ["mpich", "intelmpi"])
def test_captured_uneven_hydra_launch_is_exact_where_it_can_be_and_refused(kind: str):
    from lightning_mpi_env import MPIClusterEnvironment  # here, not at the top: it loads Lightning

    capture = DATA / kind / "mpiexec_uneven_n3_ppn2.json"
    truth = captured_truth(capture)
    resolved = captured_layouts(capture)
    exact = ("global_rank", "world_size", "local_rank", "local_size", "host")
    assert [{name: shown[name] for name in exact} for _, shown in resolved] == [
        {name: row[name] for name in exact} for row in truth
    ]
    assert [shown["node_rank"] for _, shown in resolved[:2]] == [0, 0]
    # The lone rank on the second node sees 1 rank of 3 on its node, as in a 3-node job: no variable of Hydra's tells
    # it otherwise (its node rank resolves to 2, the truth is 1). The job is refused instead, on every rank.
    for env in captured_environments(capture):
        problem = (
            "placed ranks unevenly" if env["MPI_LOCALNRANKS"] == "2" else "launched 3 ranks, 1 per node (3 node(s)"
        )
        with pytest.raises(LayoutError, match=re.escape(problem)):
            MPIClusterEnvironment(env).validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda row: row.key)
def test_started_by_launcher_is_the_layouts_answer(launcher):
    # One answer to "is this a launched job": the layout records the same launcher that started_by_launcher sees.
    from lightning_mpi_env.core.launchers import started_by_launcher
    from lightning_mpi_env.core.layout import from_env
    from tests.layouts import launcher_env

    env = launcher_env(launcher, rank=1, world_size=4, local_rank=1, local_size=2, node=0, num_nodes=2)
    env |= {"MASTER_ADDR": "nodea"}
    assert started_by_launcher(env)
    assert from_env(env).launcher == launcher
    # What a batch script or a job script alone carries is no launch: the layout is a single process's.
    alone = {name: "1" if name in (launcher.world_size, launcher.local_size) else "0" for name in launcher.inherited}
    alone["SLURM_JOB_ID"] = "7"
    assert not started_by_launcher(alone)
    assert from_env(alone).launcher is None
