"""The launcher line as the loop sees it: an mpirun relaunch's host file, its shrinking, and the srun refusals."""

from __future__ import annotations

import pytest

from lightning_mpi_env.supervise.mpirun_line import MpirunLine
from lightning_mpi_env.supervise.mpirun_options import OPEN_MPI_LINE
from lightning_mpi_env.supervise.relaunch_hosts import Relaunch, Shortfall
from lightning_mpi_env.supervise.srun_line import SrunLineError
from lightning_mpi_env.supervise.steps import HOST_FILE, Step, mpirun_step, step_line


def _step(hosts: str, *placement: str, min_nodes: int | None = None) -> Step:
    line = MpirunLine.parse(["mpirun", "-H", hosts, "-np", "4", *placement, "python", "t.py"], OPEN_MPI_LINE)
    return mpirun_step(line, line.allocation({}), min_nodes)


def test_a_spare_host_takes_the_failed_one_s_place_through_the_host_file(tmp_path):
    step = _step("n1:2,n2:2,n3:2", "-N", "2")
    placed = step.relaunch(["n2", "n9"], overlap=False, folder=tmp_path / "step-2")
    assert isinstance(placed, Relaunch)
    assert placed.argv[:5] == ["mpirun", "--hostfile", str(tmp_path / "step-2" / HOST_FILE), "-np", "4"]
    assert (tmp_path / "step-2" / HOST_FILE).read_text() == "n1 slots=2\nn3 slots=2\n"
    assert placed.nodes is None
    assert placed.unmatched == ("n9",)  # named by a record, a host of no allocation: said in the timeline


def test_without_a_spare_the_step_stops_unless_min_nodes_lets_it_shrink(tmp_path):
    stopped = _step("n1:2,n2:2", "-N", "2").relaunch(["n2"], overlap=False, folder=tmp_path / "a")
    assert isinstance(stopped, Shortfall)
    assert "spare" in f"{stopped.message} {stopped.hint}"
    assert not (tmp_path / "a" / HOST_FILE).exists()
    shrunk = _step("n1:2,n2:2", "-N", "2", min_nodes=1).relaunch(["n2"], overlap=False, folder=tmp_path / "b")
    assert isinstance(shrunk, Relaunch)
    assert shrunk.nodes == 1
    assert shrunk.argv[3:5] == ["-np", "2"]
    assert (tmp_path / "b" / HOST_FILE).read_text() == "n1 slots=2\n"


def test_a_line_without_ranks_per_host_cannot_shrink_and_says_so(tmp_path):
    # Hosts of different slots and no -N: the ranks per host on fewer hosts are unknown. A stop, not a traceback.
    placed = _step("n1:3,n2:1", min_nodes=1).relaunch(["n2"], overlap=False, folder=tmp_path)
    assert isinstance(placed, Shortfall)
    assert "per-node" in placed.message


def test_srun_lines_say_their_own_range_of_nodes():
    with pytest.raises(SrunLineError, match=r"--min-nodes is for mpirun lines"):
        step_line(["srun", "-N2", "python", "t.py"], {}, min_nodes=1)
    with pytest.raises(SrunLineError, match=r"not srun, mpirun or mpiexec"):
        step_line(["flux", "run", "python", "t.py"], {})


def test_rank_zero_s_host_is_named_on_the_fabric_where_the_job_says_how(tmp_path):
    line = MpirunLine.parse(["mpirun", "-H", "n1:2,n2:2,n3:2", "-np", "4", "-N", "2", "python", "t.py"], OPEN_MPI_LINE)
    plain = mpirun_step(line, line.allocation({}), None).relaunch(["n1"], overlap=False, folder=tmp_path / "a")
    fabric = mpirun_step(line, line.allocation({}), None, "{host}-ib").relaunch(["n1"], overlap=False, folder=tmp_path)
    assert isinstance(plain, Relaunch)
    assert isinstance(fabric, Relaunch)
    assert (plain.env, plain.argv[5:7]) == ({"MASTER_ADDR": "n2"}, ["-x", "MASTER_ADDR=n2"])
    # LIGHTNING_MPI_ENV_MAIN_HOST='{host}-ib': the ranks would reach n2-ib for rank 0 had nothing been given.
    assert (fabric.env, fabric.argv[5:7]) == ({"MASTER_ADDR": "n2-ib"}, ["-x", "MASTER_ADDR=n2-ib"])
