"""Real DeepSpeed under real ``mpirun``: Lightning's ``DeepSpeedStrategy`` with ``plugins=[MPIClusterEnvironment()]``.

Four ranks on two simulated nodes run ``tests/jobs/deepspeed_job.py`` with the Python of the DeepSpeed venv
(``deepspeed`` 0.19.8 from PyPI over this venv's torch and Lightning: :mod:`tests.clusters.deepspeed_venv`). The
strategy is Lightning's own class, and DeepSpeed's ``init_distributed`` and ``initialize`` run for real, on
DeepSpeed's CPU accelerator with gloo (the job's docstring says how Lightning's CUDA-only check is met on a CPU).

- A healthy job trains under ZeRO stages 0, 1 and 2: every rank reports the launcher's rank as Lightning's, torch's
  and DeepSpeed's, and its host, node and local rank; the shards cover the data, the weights agree.
- A rank that never arrives, and a rank claimed twice, are named by the roll call with the same lines as in
  ``tests/rollcall/test_fail_fast.py``, and the job ends. ``deepspeed.init_distributed`` is never called: the roll
  call runs first (the job prints a line from a spy on that call, with the environment's stage at that moment,
  which is ``met`` in the healthy jobs).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.clusters.deepspeed_venv import VERSION, DeepSpeed
from tests.conftest import JOBS, TAMPER, start_gate
from tests.rollcall.test_fail_fast import FAULTS, ROLL_CALL_TIMEOUT

JOB = JOBS / "deepspeed_job.py"
HOSTS = ("127.0.0.2", "127.0.0.3")
BLOCK = {0: HOSTS[0], 1: HOSTS[0], 2: HOSTS[1], 3: HOSTS[1]}  # mpirun --map-by slot, 2 slots per host
SAMPLES = 32
JOB_TIMEOUT = ROLL_CALL_TIMEOUT + 220  # the only time bound: 4 ranks importing torch, Lightning and DeepSpeed
SUMMARY = "lightning-mpi-env: roll call: all 4 ranks met on 2 host(s) (127.0.0.2: ranks 0-1; 127.0.0.3: ranks 2-3)"
DEEPSPEED_OWN_INIT = "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"
"""What DeepSpeed prints in each rank as its ``init_distributed`` makes its ``TorchBackend`` (on the CPU accelerator:
``build_shm_op`` in ``deepspeed/comm/torch.py``), right before that backend's ``init_process_group``."""


def _run(
    cluster: SimulatedCluster, deepspeed: DeepSpeed, options: list[str], fault: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the job on 4 ranks (2 per host), rank 3 tampered with when ``fault`` says how; a hang fails the test."""
    job = [str(deepspeed.python), str(JOB), "--samples", str(SAMPLES), *options]
    command = [str(deepspeed.python), str(TAMPER), "--rank", "3", *fault, "--", *job] if fault else job
    export = {
        **cluster.job_environment(),
        **deepspeed.environ({}),
        **start_gate(cluster.workdir / "gate", 3 if fault == ["--exit"] else 4),  # see test_fail_fast
        "LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT": str(ROLL_CALL_TIMEOUT),
    }
    try:
        return cluster.run(command, timeout=JOB_TIMEOUT, export=export)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the job still ran after {JOB_TIMEOUT} s:\n{error.output}\n{error.stderr}")


def _results(stdout: str) -> list[dict]:
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in stdout.split("RESULT ")[1:]]


@pytest.mark.mpi
@pytest.mark.parametrize(
    # ZeRO's stages differ inside DeepSpeed's engine, after the roll call: two of them, one per namespace.
    ("stage", "namespace"),
    [(0, "pytorch_lightning"), (2, "lightning.pytorch")],
)
def test_deepspeed_trains_with_the_launchers_ranks(cluster, deepspeed, stage, namespace):
    result = _run(cluster, deepspeed, ["--stage", str(stage), "--namespace", namespace])
    context = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, context
    results = _results(result.stdout)
    assert sorted(r["global_rank"] for r in results) == [0, 1, 2, 3], context
    for r in results:
        rank = r["launcher_rank"]
        # The exact rank, as the launcher gave it, wherever it is asked for.
        assert (r["global_rank"], r["torch_rank"], r["deepspeed_rank"]) == (rank, rank, rank), r
        assert (r["world_size"], r["torch_world_size"]) == (4, 4), r
        assert r["hostname"] == BLOCK[rank], r
        assert r["node_rank"] == HOSTS.index(r["hostname"]), r
        assert r["local_rank"] == rank % 2, r
        # Lightning's own strategy, and DeepSpeed's own engine at the ZeRO stage asked for, on gloo.
        assert r["strategy"] == f"{namespace}.strategies.deepspeed.DeepSpeedStrategy", r
        assert (r["engine"], r["zero_stage"], r["deepspeed"]) == ("DeepSpeedEngine", stage, VERSION), r
        assert (r["backend"], r["accelerator"]) == ("gloo", "cpu"), r
        # Lightning called deepspeed.init_distributed once, after the roll call, before any process group.
        assert r["calls"] == [{"stage": "met", "initialized": False, "rank": str(rank)}], r
    seen = [index for r in results for index in r["seen"]]
    assert sorted(seen) == list(range(SAMPLES)), context  # disjoint shards that cover the data
    assert len({tuple(r["weights"]) for r in results}) == 1, context  # the replicas agree
    summaries = [line for line in result.stderr.splitlines() if line.startswith(SUMMARY)]
    assert len(summaries) == 1, context  # the roll call's one line, from rank 0
    assert result.stdout.count("DEEPSPEED_INIT ") == 4, context
    assert result.stdout.count(DEEPSPEED_OWN_INIT) == 4, context  # DeepSpeed's own init ran in every rank


def _holds(text: str | re.Pattern[str], line: str) -> bool:
    return text.search(line) is not None if isinstance(text, re.Pattern) else text in line


@pytest.mark.mpi
@pytest.mark.parametrize("fault", ["duplicate"])  # a missing rank's job: tests/rollcall/test_fail_fast.py
def test_a_missing_or_duplicate_rank_is_named_before_deepspeed_starts(cluster, deepspeed, fault):
    option, kind, expected = FAULTS[fault]
    result = _run(cluster, deepspeed, ["--stage", "2"], fault=option)
    text = result.stdout + result.stderr
    context = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode != 0, context  # the job ended, and not as a success
    assert "RESULT" not in text, context
    # Named by the roll call: one line per process that says it, each with the cause and the hint, no traceback.
    shown = [line for line in result.stderr.splitlines() if line.startswith(f"{kind}: rank ")]
    assert shown, context
    assert len(shown) <= 4, context
    for piece in expected:
        assert all(_holds(piece, line) for line in shown), f"{piece!r} is not in every line:\n{context}"
    if fault == "duplicate":
        claimants = re.findall(r"claimed by host (\S+) \(pid \d+, local rank 1\) and by host (\S+) \(pid", text)
        assert {frozenset(pair) for pair in claimants} == {frozenset(HOSTS)}, context
    assert "Traceback (most recent call last)" not in text, context
    # The roll call came first: no rank called deepspeed.init_distributed, and DeepSpeed started no process group.
    assert "DEEPSPEED_INIT " not in text, context
    assert DEEPSPEED_OWN_INIT not in text, context
    assert SUMMARY not in text, context
