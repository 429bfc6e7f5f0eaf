"""A GPU check anyone can run: NCCL with this package on the GPUs of one node, under a real ``mpirun``.

Runs one short Lightning Trainer job per check on one simulated node (this machine, Open MPI's ``mpirun`` from the
venv: :class:`~lightning_mpi_env.tools.simcluster.SimulatedCluster`) with one rank per GPU, and prints a pass/fail
table:

- ``ddp_mpi``: ``strategy="ddp_mpi"`` with NCCL; every rank's process group is bound to the device it trains on
  (``device_id`` reached ``init_process_group``: ``torch.distributed.group.WORLD.bound_device_id``), and an
  all-reduce and the trained weights agree on every rank;
- ``fabric``: Fabric with ``MPIDDPStrategy`` (``"ddp_mpi"``) and NCCL: bound, all-reduce and weights agree, as above;
- ``plugin``: ``plugins=[MPIClusterEnvironment()]`` with Lightning's own ``"ddp"`` and NCCL (bound where Lightning
  2.5.5+ passes ``device_id``);
- ``per-task binding``: each rank sees one GPU of its own through ``CUDA_VISIBLE_DEVICES`` (as ``srun
  --gpus-per-task=1`` gives), ``ddp_mpi`` trains each on its ``cuda:0``;
- ``fsdp``: Lightning's ``"fsdp"`` with the plugin;
- ``watchdog``: rank 1 stalls in its third step; the stall watchdog ends the job naming it;
- ``requeue``: every rank gets Grid Engine's warning signal (``SIGUSR2``) in its second step; the job saves
  Lightning's HPC checkpoint and exits 99 (Grid Engine requeues on 99), with NCCL;
- ``nccl2``, ``nccl-legacy``: torch 2.15's two NCCL backends by name, under ``ddp_mpi`` (skipped on older torch).

Exit status: 0 when every check that ran passed, 1 when one failed, 77 when no CUDA device is present (nothing was
checked). ``--cpu`` runs the checks that do not need a GPU on the CPU with gloo, to check this script itself.

Usage: ``.venv/bin/python benchmarks/gpu_check.py [--gpus N] [--only ddp_mpi,watchdog] [--timeout 300]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_NO_CUDA = 77
"""No CUDA device: nothing was checked (77: "skipped", as automake's test drivers and many CI systems read it)."""

STALL_TIMEOUT = 20
"""Seconds of the watchdog check's stall timeout."""


@dataclass(frozen=True)
class Check:
    """One job and what its output must show."""

    name: str
    what: str
    strategy: str  # "ddp_mpi", "fabric" (Fabric with ddp_mpi), "plugin" (Lightning's ddp with it) or "fsdp"
    needs_gpu: bool = False
    backend: str | None = None  # process_group_backend; None: the strategy's default
    bind_per_task: bool = False
    fault: str = ""  # "stall" or "requeue"
    min_torch: tuple[int, int] = (0, 0)
    variables: dict[str, str] = field(default_factory=dict)


CHECKS = (
    Check("ddp_mpi", 'strategy="ddp_mpi", NCCL, device_id bound', "ddp_mpi"),
    Check("fabric", 'Fabric(strategy="ddp_mpi"), NCCL, device_id bound', "fabric"),
    Check("plugin", "MPIClusterEnvironment with Lightning's ddp, NCCL", "plugin"),
    Check(
        "per-task binding", "one GPU per rank via CUDA_VISIBLE_DEVICES, ddp_mpi", "ddp_mpi", True, bind_per_task=True
    ),
    Check("fsdp", "Lightning's fsdp with the plugin, NCCL", "fsdp", True),
    Check("watchdog", f"rank 1 stalls: named within {STALL_TIMEOUT} s", "ddp_mpi", fault="stall"),
    Check("requeue", "SIGUSR2: HPC checkpoint, exit 99 (Grid Engine)", "ddp_mpi", fault="requeue"),
    Check("nccl2", 'torch 2.15 process_group_backend="nccl2"', "ddp_mpi", True, "nccl2", min_torch=(2, 15)),
    Check(
        "nccl-legacy",
        'torch 2.15 process_group_backend="nccl-legacy"',
        "ddp_mpi",
        True,
        "nccl-legacy",
        min_torch=(2, 15),
    ),
)

# --- the job: one rank ------------------------------------------------------------------------------------------


def job(name: str, accelerator: str, root: str) -> None:
    """One rank of check ``name``: train a few steps, print ``RESULT {json}``."""
    check = next(check for check in CHECKS if check.name == name)
    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    if check.bind_per_task:  # what srun --gpus-per-task=1 or a wrapper script does, before CUDA starts
        listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        os.environ["CUDA_VISIBLE_DEVICES"] = listed[local_rank] if listed else str(local_rank)

    import lightning.pytorch as pl
    import torch

    import lightning_mpi_env

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    seen: dict[str, object] = {"rank": rank, "local_rank": local_rank}
    if check.strategy == "fabric":
        fabric_job(accelerator, seen)
        return

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def on_train_start(self) -> None:
            record_binding(seen, self.trainer.strategy.root_device)

        def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
            if check.fault == "stall" and rank == 1 and index == 2:
                time.sleep(10 * STALL_TIMEOUT)  # a frozen data loader
            if check.fault == "requeue":
                if index == 1:
                    os.kill(os.getpid(), signal.SIGUSR2)  # Grid Engine's -notify warning, to every rank
                time.sleep(0.5)  # steps long enough for the ranks to agree on the stop step through the store
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            generator = torch.Generator().manual_seed(0)
            return torch.utils.data.DataLoader(torch.randn(160, 8, generator=generator), batch_size=4)

    plugins: list[object] = []
    if check.strategy == "ddp_mpi":
        kwargs = {} if check.backend is None else {"process_group_backend": check.backend}
        strategy: object = lightning_mpi_env.strategy_class("lightning.pytorch")(**kwargs)
        devices: object = "auto"
    else:
        strategy = "ddp" if check.strategy == "plugin" else "fsdp"
        plugins = [lightning_mpi_env.MPIClusterEnvironment()]
        devices = int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy=strategy,
        plugins=plugins,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    model = Model()
    trainer.fit(model)
    # FSDP: each rank holds its own shard, no weights to compare.
    report(seen, trainer.strategy.root_device, rank, None if check.strategy == "fsdp" else model.parameters())


def fabric_job(accelerator: str, seen: dict[str, object]) -> None:
    """One rank of the ``fabric`` check: Fabric with ``MPIDDPStrategy``, a few steps, ``RESULT {json}``."""
    import torch
    from lightning.fabric import Fabric

    import lightning_mpi_env

    fabric = Fabric(accelerator=accelerator, strategy=lightning_mpi_env.strategy_class("lightning.fabric")())
    fabric.launch()
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 1)
    model, optimizer = fabric.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.01))
    record_binding(seen, fabric.device)
    for step in range(8):
        batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(step)).to(fabric.device)
        optimizer.zero_grad()
        fabric.backward(model(batch).pow(2).mean())
        optimizer.step()
    report(seen, fabric.device, fabric.global_rank, model.parameters())


def record_binding(seen: dict[str, object], device: object) -> None:
    """Where this rank trains, its backend, and the device its process group is bound to, into ``seen``."""
    import torch.distributed as dist

    seen["root_device"] = str(device)
    seen["backend"] = dist.get_backend()
    bound = getattr(dist.group.WORLD, "bound_device_id", None)  # set from init_process_group's device_id
    seen["bound_device_id"] = None if bound is None else str(bound)
    seen["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")


def report(seen: dict[str, object], device: object, rank: int, parameters: Iterable[object] | None) -> None:
    """After training: an all-reduce of the ranks and whether their weights agree; print ``RESULT {json}``.

    ``parameters`` is ``None`` where the ranks hold no common weights to compare (FSDP's shards).
    """
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(rank)], device=device)
    dist.all_reduce(total)
    seen["all_reduce"] = total.item()
    seen["weights_agree"] = None
    if parameters is not None:
        weights = torch.cat([parameter.detach().flatten() for parameter in parameters]).to(device)
        low, high = weights.clone(), weights.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        seen["weights_agree"] = bool(torch.equal(low, high))
    print("RESULT " + json.dumps(seen), flush=True)


# --- the driver ---------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one check found."""

    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float = 0.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def judge(check: Check, ranks: int, returncode: int, output: str, results: list[dict], root: Path) -> Outcome:
    """PASS or FAIL, and why, from a finished job."""
    fail: Callable[[str], Outcome] = lambda why: Outcome(check.name, "FAIL", why)  # noqa: E731
    if check.fault == "stall":
        if returncode == 0:
            return fail("the job finished: no stall was named")
        if "Rank 1 stalled" not in output:
            return fail(f"exit {returncode}, but no 'Rank 1 stalled' in the output")
        return Outcome(check.name, "PASS", f"exit {returncode}, 'Rank 1 stalled' named")
    if check.fault == "requeue":
        saved = sorted(path.name for path in root.glob("hpc_ckpt_*.ckpt"))
        if returncode != 99 or not saved:
            return fail(f"exit {returncode} (99 expected), checkpoints {saved}")
        return Outcome(check.name, "PASS", f"exit 99, {saved[0]} saved")
    if returncode != 0 or len(results) != ranks:
        return fail(f"exit {returncode}, {len(results)} of {ranks} ranks finished")
    expected_sum = ranks * (ranks - 1) / 2
    for result in results:
        if result["all_reduce"] != expected_sum:
            return fail(f"rank {result['rank']}: all-reduce gave {result['all_reduce']}, not {expected_sum}")
        if result["weights_agree"] is False:
            return fail(f"rank {result['rank']}: the ranks' weights differ after training")
        if check.backend is not None and result["backend"] != check.backend:
            return fail(f"rank {result['rank']}: backend {result['backend']!r}, not {check.backend!r}")
        if check.bind_per_task and result["root_device"] != "cuda:0":
            return fail(f"rank {result['rank']} sees one GPU but trains on {result['root_device']}")
        ours = check.strategy in ("ddp_mpi", "fabric")
        must_bind = result["root_device"].startswith("cuda") and (ours or lightning_binds())
        if must_bind and result["bound_device_id"] != result["root_device"]:
            return fail(
                f"rank {result['rank']}: process group bound to {result['bound_device_id']}, "
                f"trains on {result['root_device']} (device_id not passed)"
            )
    devices = sorted({f"{r['root_device']} (CUDA_VISIBLE_DEVICES={r['visible']})" for r in results})
    return Outcome(check.name, "PASS", f"{ranks} ranks, backend {results[0]['backend']}, {', '.join(devices)}")


def lightning_binds() -> bool:
    """Whether the installed Lightning passes ``device_id`` itself (2.5.5+)."""
    import lightning  # noqa: F401  (imported, so that its version can be read)

    from lightning_mpi_env.lightning.compat import DEVICE_ID_SINCE, package_version

    return package_version("lightning") >= DEVICE_ID_SINCE


def installed() -> bool:
    """Whether the package is installed with its ``callbacks_factory`` entry point (not only on ``PYTHONPATH``)."""
    from importlib.metadata import entry_points

    return any(point.name == "lightning_mpi_env" for point in entry_points(group="lightning.pytorch.callbacks_factory"))


def run_check(check: Check, ranks: int, accelerator: str, timeout: float, workdir: Path) -> Outcome:
    from lightning_mpi_env.tools.simcluster import SimulatedCluster

    root = workdir / check.name.replace(" ", "-")
    root.mkdir()
    cluster = SimulatedCluster.of(root, nodes=1, per_node=ranks)
    export = {
        **cluster.job_environment(),  # a Grid Engine job: JOB_ID (requeue: exit 99) and its host list
        "MASTER_ADDR": cluster.hosts[0],
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        **({"LIGHTNING_MPI_ENV_STALL_TIMEOUT": str(STALL_TIMEOUT)} if check.fault == "stall" else {}),
        **({"LIGHTNING_MPI_ENV_REQUEUE": "0"} if check.fault != "requeue" else {}),
        **check.variables,
    }
    command = [sys.executable, os.path.abspath(__file__), "--job", check.name, "--accelerator", accelerator]
    command += ["--root", str(root)]
    started = time.monotonic()
    try:
        done = cluster.run(command, timeout=timeout, export=export)
    except Exception as error:  # a timeout, or mpirun missing: a failed check, said in one line
        return Outcome(check.name, "FAIL", f"{type(error).__name__}: {str(error)[:200]}", time.monotonic() - started)
    output = (done.stdout or "") + (done.stderr or "")
    results = [
        json.loads(line.split(" ", 1)[1]) for line in (done.stdout or "").splitlines() if line.startswith("RESULT ")
    ]
    outcome = judge(check, ranks, done.returncode, output, results, root)
    outcome.seconds = time.monotonic() - started
    if outcome.status == "FAIL":
        (root / "output.txt").write_text(output)
        outcome.detail += f" (output: {root / 'output.txt'})"
    return outcome


def table(outcomes: list[Outcome]) -> str:
    rows = [("check", "result", "seconds", "detail")]
    rows += [(o.name, o.status, f"{o.seconds:.0f}", o.detail) for o in outcomes]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [" | ".join([*(row[c].ljust(widths[c]) for c in range(3)), row[3]]) for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in [*widths, 6]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, help="ranks (one per GPU); default: every GPU torch sees")
    parser.add_argument("--only", help="comma-separated check names")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per check")
    parser.add_argument("--cpu", action="store_true", help="run the checks that need no GPU on the CPU (gloo)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--accelerator", default="gpu", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        job(args.job, args.accelerator, args.root)
        return EXIT_PASSED

    import torch

    from lightning_mpi_env.gpu.nccl import version_numbers

    if not installed():
        print(
            "gpu_check: lightning_mpi_env is importable but not installed (no callbacks_factory entry point): the "
            "requeue and watchdog callbacks reach a Trainer through that entry point. Install it: `pip install .`.",
            flush=True,
        )
        return EXIT_FAILED

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(
        f"# {platform.node()}, Python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    if count == 0 and not args.cpu:
        print(f"gpu_check: no CUDA device (torch {torch.__version__}): nothing checked.", flush=True)
        return EXIT_NO_CUDA
    names = torch.cuda.get_device_name(0) if count else "none"
    print(f"# {count} CUDA device(s): {names}")
    ranks = args.gpus or (count if count else 2)
    wanted = set(args.only.split(",")) if args.only else None
    torch_version = version_numbers(torch.__version__)
    outcomes: list[Outcome] = []
    directory = tempfile.mkdtemp(prefix="gpu-check-")  # kept where a check failed: its output is there
    for check in CHECKS:
        if wanted is not None and check.name not in wanted:
            continue
        if args.cpu and check.needs_gpu:
            outcomes.append(Outcome(check.name, "SKIP", "needs a GPU (--cpu)"))
        elif torch_version[:2] < check.min_torch:
            outcomes.append(
                Outcome(check.name, "SKIP", f"torch {torch.__version__} < {check.min_torch[0]}.{check.min_torch[1]}")
            )
        elif check.name == "watchdog" and ranks < 2 or check.bind_per_task and ranks > max(count, 1):
            outcomes.append(Outcome(check.name, "SKIP", f"needs 2 ranks, one GPU each ({ranks} ranks, {count} GPUs)"))
        else:
            accelerator = "cpu" if args.cpu else "gpu"
            outcomes.append(run_check(check, ranks, accelerator, args.timeout, Path(directory)))
        print(f"{outcomes[-1].name}: {outcomes[-1].status}", file=sys.stderr, flush=True)
    print(table(outcomes))
    failed = [outcome.name for outcome in outcomes if outcome.status == "FAIL"]
    if not failed:
        shutil.rmtree(directory, ignore_errors=True)
    passed = len(outcomes) - len(failed)
    print(f"gpu_check: {passed} of {len(outcomes)} passed or skipped; failed: {', '.join(failed) or 'none'}")
    return EXIT_FAILED if failed else EXIT_PASSED


if __name__ == "__main__":
    sys.exit(main())
