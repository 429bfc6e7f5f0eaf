"""The oldest supported Lightning (2.1.4) in real ``mpirun`` jobs: the plugin and ``ddp_mpi``, in both namespaces.

The newest (the installed Lightning) runs the same jobs in ``test_strategy.py`` and ``test_examples.py``. Each job
here is one Lightning code path that exists in both versions and differs between namespaces: a ``DDPStrategy`` with
``MPIClusterEnvironment`` as a plugin, and the registered ``"ddp_mpi"``, for ``lightning.pytorch`` and
``pytorch_lightning`` (four jobs; one training per process, as users run them).
"""

import json
import sys
import textwrap

import pytest

from lightning_mpi_env.tools.simcluster import SimulatedCluster
from tests.clusters.lightning_versions import (  # noqa: F401  (oldest_lightning: a fixture, requested by name)
    OLDEST,
    Lightning,
    oldest_lightning,
    verify,
)
from tests.conftest import TRAINER_JOB

pytestmark = pytest.mark.slow  # the oldest Lightning is installed on first use (an overlay)

SAMPLES = 64
HOSTS = ("127.0.0.2", "127.0.0.3")

# Runs the instrumented job as its own __main__ (so nothing is imported before it), then says which Lightning ran.
REPORTING_VERSION = textwrap.dedent(
    """
    import json, runpy, sys
    job, namespace = sys.argv[1], sys.argv[sys.argv.index("--namespace") + 1]
    sys.argv = sys.argv[1:]
    runpy.run_path(job, run_name="__main__")
    module = sys.modules[namespace]
    print("LIGHTNING " + json.dumps([module.__version__, module.__file__]) + "\\n", end="", flush=True)
    """
)


@pytest.fixture
def oldest(request: pytest.FixtureRequest) -> Lightning:
    lightning: Lightning = request.getfixturevalue("oldest_lightning")
    return lightning


def _results(stdout: str) -> list[dict]:
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in stdout.split("RESULT ")[1:]]


def test_overlay_supplies_every_lightning_module(oldest):
    # What install() checked once, checked again on every run: the overlay may have been touched since.
    verify(oldest)


@pytest.mark.mpi
@pytest.mark.parametrize(
    # Each path (ddp: DDPStrategy with MPIClusterEnvironment as plugin), placement (block, round-robin) and Trainer
    # namespace once; the oldest Lightning's private names are checked in every namespace by test_compat.py.
    ("namespace", "map_by", "strategy"),
    [("lightning.pytorch", "slot", "ddp"), ("pytorch_lightning", "node", "ddp_mpi")],
)
def test_mpirun_trains_on_oldest_lightning(oldest, tmp_path, namespace, map_by, strategy):
    cluster = SimulatedCluster(tmp_path)
    job = [str(TRAINER_JOB), "--strategy", strategy, "--namespace", namespace, "--samples", str(SAMPLES)]
    export = {**cluster.job_environment(), "PYTHONPATH": oldest.environ()["PYTHONPATH"]}
    result = cluster.run([sys.executable, "-c", REPORTING_VERSION, *job], timeout=300, map_by=map_by, export=export)
    assert result.returncode == 0, result.stderr[-3000:]

    versions = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("LIGHT")]
    assert len(versions) == 4, result.stdout[-3000:]
    for version, path in versions:
        assert version == OLDEST
        assert path.startswith(str(oldest.overlay))

    results = _results(result.stdout)
    assert sorted(r["global_rank"] for r in results) == [0, 1, 2, 3]
    for r in results:
        assert r["world_size"] == 4
        assert r["strategy"] == ("MPIDDPStrategy" if strategy == "ddp_mpi" else "DDPStrategy")
        # The module of the strategy's base class: DDPStrategy's for ddp_mpi, ParallelStrategy's for DDPStrategy.
        assert r["strategy_module"] == f"{namespace}.strategies.{'ddp' if strategy == 'ddp_mpi' else 'parallel'}"
        placed = r["global_rank"] // 2 if map_by == "slot" else r["global_rank"] % 2
        assert r["hostname"] == HOSTS[placed]
        assert r["node_rank"] == placed  # node 0 is rank 0's host
    assert len({(r["hostname"], r["local_rank"]) for r in results}) == 4
    # Training happened, on disjoint shards covering the data, and every rank ends with the same weights.
    assert sorted(index for r in results for index in r["seen"]) == list(range(SAMPLES))
    assert len({tuple(r["weights"]) for r in results}) == 1
