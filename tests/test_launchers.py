from __future__ import annotations

import pytest

from lightning_mpi_env.launchers import LAUNCHERS, LAUNCHERS_BY_KEY, detect_launcher


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
    ],
)
def test_precedence(names, expected):
    launcher = detect_launcher(dict.fromkeys(names, "0"))
    assert launcher is not None
    assert launcher.key == expected


def test_no_launcher():
    assert detect_launcher({"SLURM_PROCID": "0", "PMI_RANK": "0", "RANK": "0"}) is None
