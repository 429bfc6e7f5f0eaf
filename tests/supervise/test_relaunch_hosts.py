"""Where a relaunched srun step goes: the same node count on a spare, fewer nodes where the line allows, or a stop."""

from __future__ import annotations

import pytest

from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.supervise.relaunch_hosts import Relaunch, Shortfall, allocation_hosts, place, spares
from lightning_mpi_env.supervise.srun_line import SrunLine, SrunLineError

FIXED = SrunLine.parse(["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "python", "train.py"])
RANGE = SrunLine.parse(["srun", "--nodes=1-2", "--ntasks-per-node=2", "python", "train.py"])
THREE = ("node1", "node2", "node3")


def test_a_spare_takes_the_failed_node_s_place_at_the_same_node_count():
    placed = place(FIXED, THREE, ["node2"])
    assert isinstance(placed, Relaunch)
    assert placed.argv == [
        "srun",
        "--exclude=node2",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "python",
        "train.py",
    ]
    assert placed.hosts == ("node1", "node3")
    assert placed.nodes is None


def test_a_range_of_nodes_shrinks_to_the_nodes_left_with_the_ranks_per_node_kept():
    placed = place(RANGE, ("node1", "node2"), ["node2"])
    assert isinstance(placed, Relaunch)
    assert placed.nodes == 1
    # --ntasks is always given: inside an allocation srun would take SLURM_NTASKS (the allocation's) otherwise.
    assert placed.argv[:5] == ["srun", "--exclude=node2", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2"]


def test_a_fixed_node_count_without_a_spare_stops_saying_to_add_one():
    placed = place(FIXED, ("node1", "node2"), ["node2"])
    assert isinstance(placed, Shortfall)
    assert "needs 2 node(s) (srun --nodes=2)" in placed.message
    assert "only node1 left" in placed.message
    assert "#SBATCH --nodes=3" in placed.hint
    assert "--nodes=1-2" in placed.hint


def test_hosts_the_line_excludes_itself_count_as_gone():
    line = SrunLine.parse(["srun", "-x", "node3", "--nodes=2", "--ntasks-per-node=2", "a"])
    placed = place(line, THREE, ["node2"])
    assert isinstance(placed, Shortfall)
    assert "node2, node3 failed or were excluded" in placed.message


def test_the_allocation_s_spelling_is_excluded_and_a_name_of_no_host_is_kept_apart():
    placed = place(FIXED, ("node1.c", "node2.c", "node3.c"), ["node2", "node9"])
    assert isinstance(placed, Relaunch)
    assert placed.argv[1] == "--exclude=node2.c"
    assert placed.hosts == ("node1.c", "node3.c")
    assert placed.unmatched == ("node9",)


def test_a_name_of_no_host_leaves_the_line_as_it_was():
    placed = place(FIXED, THREE, ["node9"])
    assert isinstance(placed, Relaunch)
    assert placed.argv == list(FIXED.words)
    assert placed.unmatched == ("node9",)


def test_outside_an_allocation_the_line_is_relaunched_with_the_hosts_excluded():
    placed = place(FIXED, None, ["node2"])
    assert isinstance(placed, Relaunch)
    assert placed.hosts is None
    assert placed.argv[1] == "--exclude=node2"


def test_an_abandoned_step_s_relaunch_overlaps_its_cpus():
    placed = place(FIXED, THREE, ["node2"], overlap=True)
    assert isinstance(placed, Relaunch)
    assert "--overlap" in placed.argv[: placed.argv.index("python")]


def test_shrinking_needs_the_ranks_per_node():
    line = SrunLine.parse(["srun", "--nodes=1-2", "--ntasks=4", "a"])
    with pytest.raises(SrunLineError, match="no number of tasks per node"):
        place(line, ("node1", "node2"), ["node2"])


def test_the_allocation_is_slurm_s_node_list_and_a_malformed_one_is_named():
    assert allocation_hosts({"SLURM_JOB_NODELIST": "node[1-2],gpu7"}) == ("node1", "node2", "gpu7")
    assert allocation_hosts({}) is None
    with pytest.raises(LayoutError, match="SLURM_JOB_NODELIST"):
        allocation_hosts({"SLURM_JOB_NODELIST": "node[1-"})


@pytest.mark.parametrize(
    ("line", "hosts", "excluded", "expected"),
    [
        (FIXED, THREE, [], 1),
        (FIXED, THREE, ["node3"], 0),
        (FIXED, ("node1.cluster", "node2.cluster", "node3.cluster", "node4.cluster"), ["node4"], 1),  # its spelling
        (RANGE, THREE, [], 1),  # up to 2 nodes: the third is spare
        (SrunLine.parse(["srun", "--exclude=node1", "--nodes=2", "python", "train.py"]), THREE, [], 0),
        (SrunLine.parse(["srun", "--ntasks=4", "python", "train.py"]), THREE, [], 0),  # every host: SLURM_NNODES
        (FIXED, None, [], 0),  # outside an allocation: unknown
    ],
)
def test_the_spares_are_the_allocation_s_hosts_an_srun_step_leaves_unused(line, hosts, excluded, expected):
    assert spares(line, hosts, excluded) == expected
