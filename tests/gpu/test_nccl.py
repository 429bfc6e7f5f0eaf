"""torch 2.15's ``nccl2`` rules (:mod:`lightning_mpi_env.gpu.nccl`).

As read in torch 2.15.0's ``torch/distributed/distributed_c10d.py`` (``_nccl2_device``,
``_register_builtin_nccl_backend``; pytorch/pytorch#192281 and #193237).
"""

import pytest

from lightning_mpi_env.gpu.nccl import installed_torch, nccl2_device, nccl_is_nccl2, version_numbers


@pytest.mark.parametrize(
    ("torch_version", "env", "backend", "expected"),
    [
        ((2, 15, 0), {}, "nccl", True),  # the default from 2.15 on
        ((2, 15, 0), {"TORCH_DIST_USE_NCCL2": "1"}, "nccl", True),
        ((2, 15, 0), {"TORCH_DIST_USE_NCCL2": "0"}, "nccl", False),  # the rollback
        ((2, 15, 0), {"TORCH_DIST_USE_NCCL2": "0"}, "nccl2", True),  # asked for by name
        ((2, 15, 0), {}, "nccl-legacy", False),
        ((2, 15, 0), {}, "gloo", False),
        ((2, 14, 1), {}, "nccl", False),  # ProcessGroupNCCL
    ],
)
def test_which_nccl_is_nccl2(torch_version, env, backend, expected):
    assert nccl_is_nccl2(torch_version, env, backend) is expected


@pytest.mark.parametrize(
    ("env", "global_rank", "count", "expected"),
    [
        ({"LOCAL_RANK": "2"}, 6, 1, 0),  # one GPU per task: always 0, whatever LOCAL_RANK says
        ({"LOCAL_RANK": "2"}, 6, 4, 2),  # LOCAL_RANK first
        ({"LOCAL_RANK": "3"}, 3, 2, 1),  # --gpu-bind=closest, two GPUs per task: 3 % 2
        ({}, 6, 4, 2),  # no LOCAL_RANK (mpirun, srun): the global rank
        ({}, 6, 0, None),  # no GPU
        ({"LOCAL_RANK": "9" * 5000}, 6, 4, 2),  # not a count (bounded, never int() of 5,000 digits): the global rank
        ({"LOCAL_RANK": "-1"}, 6, 4, 2),
    ],
)
def test_the_device_nccl2_binds_without_device_id(env, global_rank, count, expected):
    assert nccl2_device(env, global_rank, count) == expected


def test_versions_read_without_importing_torch():
    assert version_numbers("2.15.0+cu132") == (2, 15, 0)
    assert version_numbers("2.16.0a0+git1234") == (2, 16, 0)
    assert version_numbers("") == ()
    import sys

    assert installed_torch()[:2] >= (2, 0)  # this venv's torch, from its metadata
    assert "torch" not in sys.modules or installed_torch() == version_numbers(sys.modules["torch"].__version__)
