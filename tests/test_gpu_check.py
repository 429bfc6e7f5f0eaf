"""``benchmarks/gpu_check.py``: its answer on a machine without a GPU, and how it judges a job.

This machine has no GPU, so the checks themselves do not run here (``--cpu`` runs those that need none, on gloo, by
hand: docs/benchmarks.md). What runs here: the script as a user runs it, which must say "no CUDA device" and exit
77, and its judgement of a finished job, which must fail a rank whose process group is not bound to its device.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_77():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present here: run benchmarks/gpu_check.py itself")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 77, done.stdout + done.stderr
    assert "gpu_check: no CUDA device" in done.stdout
    assert "Traceback" not in done.stderr


def _rank(rank: int, device: str, bound: str | None, ranks: int = 2) -> dict:
    return {
        "rank": rank,
        "root_device": device,
        "bound_device_id": bound,
        "backend": "nccl",
        "visible": None,
        "all_reduce": ranks * (ranks - 1) / 2,
        "weights_agree": True,
    }


@pytest.mark.parametrize("name", ["ddp_mpi", "fabric"])
def test_a_rank_whose_group_is_not_bound_to_its_device_fails(tmp_path, name):
    gpu_check = _module()
    check = next(check for check in gpu_check.CHECKS if check.name == name)
    bound = [_rank(0, "cuda:0", "cuda:0"), _rank(1, "cuda:1", "cuda:1")]
    assert gpu_check.judge(check, 2, 0, "", bound, tmp_path).status == "PASS"
    dropped = [_rank(0, "cuda:0", "cuda:0"), _rank(1, "cuda:1", None)]  # device_id never reached init_process_group
    outcome = gpu_check.judge(check, 2, 0, "", dropped, tmp_path)
    assert outcome.status == "FAIL"
    assert "device_id not passed" in outcome.detail


def test_faults_pass_only_when_named(tmp_path):
    gpu_check = _module()
    stall = next(check for check in gpu_check.CHECKS if check.name == "watchdog")
    assert gpu_check.judge(stall, 2, 1, "StallError: Rank 1 stalled: ...", [], tmp_path).status == "PASS"
    assert gpu_check.judge(stall, 2, 0, "", [], tmp_path).status == "FAIL"
    requeue = next(check for check in gpu_check.CHECKS if check.name == "requeue")
    assert gpu_check.judge(requeue, 2, 99, "", [], tmp_path).status == "FAIL"  # no checkpoint saved
    (tmp_path / "hpc_ckpt_1.ckpt").write_text("")
    assert gpu_check.judge(requeue, 2, 99, "", [], tmp_path).status == "PASS"


def test_a_package_that_is_not_installed_stops_the_check_with_one_line(monkeypatch, capsys):
    # Only on PYTHONPATH, the package has no callbacks_factory entry point: no requeue callback reaches the Trainer,
    # and SIGUSR2 would end the requeue check's rank with status 140 and no word why (seen on a GPU machine).
    gpu_check = _module()
    assert gpu_check.installed()  # this venv installs the package: the entry point is there
    monkeypatch.setattr(gpu_check, "installed", lambda: False)
    assert gpu_check.main(["--cpu"]) == gpu_check.EXIT_FAILED
    assert "importable but not installed (no callbacks_factory entry point)" in capsys.readouterr().out
