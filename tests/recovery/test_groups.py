"""``recovery.groups.Group`` in real processes over gloo, on each torch this machine installs: the installed 2.13
opens each generation's group anew, torch 2.14.1 (:mod:`tests.clusters.torch_venv`) reconfigures the one group
(``init_process_group(enable_reconfigure=True)``, ``_reconfigure``: pytorch/pytorch#186298 and #187381, whose
``test/distributed/test_c10d_fault_tolerance.py`` shows the contract). The program is
``tests/jobs/group_generations.py``: three ranks, one lost, then a new process in its place.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.recovery.groups import read_handles
from tests.clusters.hydra import free_port

PROGRAM = Path(__file__).parents[1] / "jobs" / "group_generations.py"
TIMEOUT = 180  # four torch processes on two (maybe busy) cores


def run_generations(python: Path | str, out: Path) -> dict[int, dict]:
    port = free_port("127.0.0.1")
    ranks = [
        subprocess.Popen([str(python), str(PROGRAM), str(role), str(port), str(out)], stderr=subprocess.PIPE, text=True)
        for role in range(3)
    ]
    try:
        errors = [rank.communicate(timeout=TIMEOUT)[1] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0, 0], "\n".join(error[-3000:] for error in errors)
    return {int(path.stem): json.loads(path.read_text()) for path in out.glob("*.json")}


def sums_and_sizes(seen: dict) -> list[tuple[int, int, int, float]]:
    return [(fact["generation"], fact["rank"], fact["size"], fact["sum"]) for fact in seen["facts"]]


def check_generations(seen: dict[int, dict]) -> None:
    """Generation 1 of 3 ranks, 2 of the survivors, 3 with the new process as rank 2: each all-reduce sums its ranks."""
    assert sorted(seen) == [0, 1, 2, 3]
    for role in (0, 1):
        assert sums_and_sizes(seen[role]) == [(1, role, 3, 6.0), (2, role, 2, 3.0), (3, role, 3, 6.0)]
    assert sums_and_sizes(seen[2]) == [(1, 2, 3, 6.0)]
    assert sums_and_sizes(seen[3]) == [(3, 2, 3, 6.0)]


@pytest.mark.mpi
def test_the_installed_torch_opens_each_generations_group_anew(tmp_path: Path):
    seen = run_generations(sys.executable, tmp_path)
    check_generations(seen)
    assert {seen[role]["torch"].split("+")[0] for role in seen} == {"2.13.0"}
    assert {fact["reconfigured"] for role in seen for fact in seen[role]["facts"]} == {False}


@pytest.mark.mpi
def test_torch_2_14_reconfigures_the_one_group_in_place(newer_torch: Path, tmp_path: Path):
    seen = run_generations(newer_torch, tmp_path)
    check_generations(seen)
    assert {seen[role]["torch"].split("+")[0] for role in seen} == {"2.14.1"}
    assert {fact["reconfigured"] for role in seen for fact in seen[role]["facts"]} == {True}
    for role in (0, 1):  # the survivors' group is the same object in every generation: reconfigured, not made anew
        assert len({fact["group"] for fact in seen[role]["facts"]}) == 1, seen[role]


def test_the_handles_are_read_in_rank_order():
    store = dist.HashStore()  # type: ignore[attr-defined]
    for rank, handle in enumerate(["gloo:0:-1:0:127.0.0.1:29500", "gloo:1:-1:1:127.0.0.1:29500"]):
        store.set(f"gen/2/handle/{rank}", handle)
    assert read_handles(store, "gen/2/handle/", 2, 5.0) == [
        "gloo:0:-1:0:127.0.0.1:29500",
        "gloo:1:-1:1:127.0.0.1:29500",
    ]


@pytest.mark.parametrize("forged", [b"", b"gloo:0 x", b"gloo:\n", b"\xff\xfe", b"g" * 1025])
def test_a_forged_handle_is_one_named_error(forged: bytes):
    store = dist.HashStore()  # type: ignore[attr-defined]
    store.set("gen/2/handle/0", "gloo:0:-1:0:127.0.0.1:29500")
    store.set("gen/2/handle/1", forged)
    with pytest.raises(RecoveryError) as raised:
        read_handles(store, "gen/2/handle/", 2, 5.0)
    assert raised.value.variable == "gen/2/handle/1"
    assert "not one torch writes" in str(raised.value)


def test_a_handle_that_never_comes_ends_the_wait_at_the_timeout():
    store = dist.HashStore()  # type: ignore[attr-defined]
    store.set("gen/2/handle/0", "gloo:0:-1:0:127.0.0.1:29500")
    with pytest.raises(RuntimeError):  # torch's DistStoreError; Group.open makes it a RecoveryError after generation 1
        read_handles(store, "gen/2/handle/", 2, 0.5)
