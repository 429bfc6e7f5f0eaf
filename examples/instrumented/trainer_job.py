"""An instrumented Lightning Trainer job: one JSON line per rank saying where it ran and what it trained on.

Run it under your launcher to check a cluster (unique ranks, node ranks matching the hosts, disjoint data shards,
identical weights): `mpirun -np 4 python examples/instrumented/trainer_job.py --devices 2 --num-nodes 2`. The
tests and the benchmarks run it on simulated nodes; `--vanish-rank`, `--freeze`, `--kill`, `--step-seconds`,
`--slow-rank` and `--tag` serve their fault and interruption scenarios.

It resumes as a requeue-ready script does: `--root-dir DIR` is the Trainer's `default_root_dir`, and
`fit(model, ckpt_path=hpc_checkpoint(trainer))` takes this job's own newest complete HPC checkpoint there (a requeue's,
or a periodic one with LIGHTNING_MPI_ENV_CHECKPOINT_EVERY, for a step relaunched in the same allocation). The RESULT
line lists the global steps this process trained (`steps`).
"""

import argparse
import importlib
import json
import os
import socket
import sys
import time

import torch
from torch.utils.data import Dataset

from lightning_mpi_env import MPIClusterEnvironment, hpc_checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tamper.py, beside this file
from tamper import block_here, fault_here, stall_here, start_gate, step_seconds  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", choices=["lightning.pytorch", "pytorch_lightning"], default="lightning.pytorch")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--strategy", choices=["ddp", "ddp_mpi"], default="ddp")
    parser.add_argument("--tag", help="ignored: marks the processes of one run")
    parser.add_argument("--vanish-rank", type=int, help="this rank exits with status 0 at its second step")
    parser.add_argument("--plain-ddp", action="store_true", help="Lightning's DDPStrategy with its own environment")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in every training step (a long job)")
    parser.add_argument(
        "--slow-rank",
        metavar="RANK:FACTOR",
        help="that rank (or `all`, or `@HOST`: the ranks on that host) sleeps FACTOR times --step-seconds in each "
        "step: a straggler, a slow job, or a slow node",
    )
    parser.add_argument(
        "--zero-config",
        action="store_true",
        help="leave devices and num_nodes out (ddp_mpi takes them from the launch)",
    )
    parser.add_argument("--root-dir", help="Trainer(default_root_dir=...): where HPC checkpoints go on a requeue")
    parser.add_argument("--epochs", type=int, help="max_epochs (1 by default; unbounded with --steps)")
    parser.add_argument("--steps", type=int, help="max_steps: the global step at which training ends")
    parser.add_argument("--freeze", metavar="RANK:STEP", help="that rank stops itself (SIGSTOP) at that global step")
    parser.add_argument("--kill", metavar="RANK:STEP", help="that rank kills itself (SIGKILL) at that global step")
    parser.add_argument(
        "--freeze-once",
        metavar="FILE",
        help="--freeze and --kill only where FILE does not exist yet, made right before (a relaunch runs through)",
    )
    parser.add_argument(
        "--lightning-resume",
        action="store_true",
        help="fit(model) with no ckpt_path: leave the resume to Lightning (its own HPC resume under Slurm)",
    )
    parser.add_argument(
        "--slow-eval",
        type=float,
        default=0.0,
        help="validate and checkpoint after each epoch, each taking this long: every rank sleeps in validation, "
        "rank 0 in saving the checkpoint while the others wait for it (work slow for everyone, not a stall)",
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="DataLoader(num_workers=...) for training and validation"
    )
    parser.add_argument("--persistent-workers", action="store_true", help="DataLoader(persistent_workers=True)")
    parser.add_argument(
        "--load-seconds", type=float, default=0.0, help="sleep in every sample's load (a loader that steps wait for)"
    )
    parser.add_argument(
        "--stall-loader-after",
        type=int,
        default=0,
        help="each loader process (worker) loads this many samples, then says LOADER_STALL and never loads another",
    )
    parser.add_argument(
        "--restartable",
        nargs="?",
        const="shrink",
        choices=["shrink", "replace"],
        help="fit under restartable (ddp_mpi): the survivors go on alone (shrink), or with a process on a spare node",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="a job as users write it: a validation loop after each epoch and a ModelCheckpoint of the last step",
    )
    parser.add_argument(
        "--result-dir",
        help="also write the RESULT line's JSON to DIR/result-<job>-<rank>.json: srun forwards output in messages of "
        "at most 1024 bytes (Slurm's SLURM_IO_MAX_MSG_LEN), so a longer line of one task can be cut by another's",
    )
    args = parser.parse_args()
    pl = importlib.import_module(args.namespace)

    class Indexed(Dataset):
        loaded = 0

        def __len__(self):
            return args.samples

        def __getitem__(self, index):
            block_here("loader")  # tamper.py --block loader: this rank's first batch never comes
            time.sleep(args.load_seconds)
            Indexed.loaded += 1  # in this process: each worker counts its own
            if args.stall_loader_after and Indexed.loaded > args.stall_loader_after:
                print(f"LOADER_STALL pid={os.getpid()}\n", end="", flush=True)
                while True:  # every rank's loader stops at the same batch: no rank has a batch the others lack
                    time.sleep(3600)
            x = torch.full((4,), float(index))
            return index, x, x.sum(dim=0, keepdim=True) * 0.5

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.seen = []
            self.first_global_step = None
            self.steps = []  # the global step of every training step this process ran

        def training_step(self, batch, batch_index):
            index, x, y = batch
            if self.first_global_step is None:  # the first step this process runs (past 0 after a resume)
                self.first_global_step = self.trainer.global_step
                self.first_step_time = time.monotonic()
                print(
                    f"FIRST_STEP rank={self.global_rank} time={time.time()!r} step={self.first_global_step}\n",
                    end="",
                    flush=True,
                )
            if batch_index == 1 and self.global_rank == args.vanish_rank:
                print(
                    f"VANISH: rank {self.global_rank} exits with status 0 in the middle of training\n",
                    end="",
                    flush=True,
                )
                os._exit(0)
            fault_here(
                self.global_rank,
                self.trainer.global_step,
                {"freeze": args.freeze, "kill": args.kill},
                args.freeze_once,
            )
            self.seen += index.tolist()
            self.steps.append(self.trainer.global_step)
            stall_here(self.global_rank, self.trainer.global_step)
            time.sleep(step_seconds(args, self.global_rank))
            return torch.nn.functional.mse_loss(self.layer(x) / 100, y / 100)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return loader()

        def validation_step(self, batch, batch_index):
            if not self.trainer.sanity_checking:
                block_here("validation")  # tamper.py --block validation: this rank's validation never ends
            if batch_index == 0:
                print(f"VALIDATE rank={self.global_rank} for {args.slow_eval} s\n", end="", flush=True)
                time.sleep(args.slow_eval)
            index, x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x) / 100, y / 100)

        def on_train_batch_end(self, outputs, batch, batch_index):
            if args.stall_loader_after:  # the steps the loader allows, each said: then the rank waits for a batch
                print(f"STEP_END rank={self.global_rank} step={self.trainer.global_step}\n", end="", flush=True)

        def on_save_checkpoint(self, checkpoint):
            # Every rank builds the checkpoint; a process that is no rank (a data loader worker) must never get here.
            print(
                f"SAVE rank={self.global_rank} pid={os.getpid()} step={self.trainer.global_step}\n", end="", flush=True
            )
            if args.slow_eval and self.global_rank == 0:  # rank 0 writes the file; the others wait for it in a barrier
                print(f"CHECKPOINT rank=0 for {args.slow_eval} s\n", end="", flush=True)
                time.sleep(args.slow_eval)

    def loader():
        workers = {"num_workers": args.workers, "persistent_workers": args.persistent_workers and args.workers > 0}
        return torch.utils.data.DataLoader(Indexed(), batch_size=4, **workers)

    validate = args.slow_eval or args.validate
    if validate:
        Model.val_dataloader = lambda self: loader()
    else:  # no validation loop: the job as the layout tests run it
        del Model.validation_step
    if args.strategy == "ddp_mpi":
        import lightning_mpi_env  # noqa: F401  (registers "ddp_mpi")

        strategy, plugins = "ddp_mpi", []
    elif args.plain_ddp:  # Lightning's own DDP and environment: the torchrun-style variables must be right already
        strategy, plugins = pl.strategies.DDPStrategy(process_group_backend="gloo"), []
    else:
        strategy, plugins = pl.strategies.DDPStrategy(process_group_backend="gloo"), [MPIClusterEnvironment()]
    sizes = {} if args.zero_config else {"devices": args.devices, "num_nodes": args.num_nodes}

    def fit(generation=None):
        # under default_root_dir/checkpoints
        callbacks = [pl.callbacks.ModelCheckpoint(save_last=True)] if args.validate else []
        trainer = pl.Trainer(
            accelerator="cpu",
            **sizes,
            strategy=strategy,
            plugins=plugins,
            default_root_dir=args.root_dir,
            max_epochs=args.epochs if args.epochs is not None else (None if args.steps else 1),
            max_steps=args.steps or -1,
            logger=False,
            enable_checkpointing=validate,
            callbacks=callbacks,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        model = Model()
        start_gate()  # a test of the rendezvous waits here for the other ranks to finish their imports
        print(f"FIT pid={os.getpid()}\n", end="", flush=True)
        if generation is not None and generation.recovered:
            recovered = json.dumps(generation.recovered)
            print(f"RECOVERED rank={generation.rank} pid={os.getpid()} {recovered}\n", end="", flush=True)
        if generation is not None and generation.ckpt_path:  # after a recovery: the state rank 0 kept in memory
            ckpt_path = generation.ckpt_path
        else:  # Lightning resumes an HPC checkpoint by itself under Slurm only, whichever job saved it: say which one
            ckpt_path = None if args.lightning_resume else hpc_checkpoint(trainer)
        trainer.fit(model, ckpt_path=ckpt_path)
        return trainer, model

    if args.restartable:  # the survivors of a lost rank go on in their processes
        from lightning_mpi_env import restartable

        trainer, model = restartable(fit, shrink=args.restartable == "shrink")
    else:
        trainer, model = fit()
    trained = time.monotonic() - model.first_step_time if model.first_global_step is not None else None
    result = json.dumps(
        {
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            "strategy_module": type(trainer.strategy).__mro__[1].__module__,
            "hostname": socket.gethostname(),
            # Where this rank met rank 0 (the environment's public property; None for Lightning's own without one).
            "main_address": getattr(getattr(trainer.strategy, "cluster_environment", None), "main_address", None),
            "seen": model.seen,
            "first_global_step": model.first_global_step,
            "global_step": trainer.global_step,
            "steps": model.steps,
            "step_id": os.environ.get("SLURM_STEP_ID"),
            "restart_count": os.environ.get("SLURM_RESTART_COUNT"),
            "train_seconds": trained,  # from this process's first training step to the end of fit()
            "weights": [round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()],
        }
    )
    if args.result_dir:
        job = os.environ.get("SLURM_JOB_ID", "local")
        path = os.path.join(args.result_dir, f"result-{job}-{trainer.global_rank}.json")
        with open(path + ".tmp", "w") as file:
            file.write(result)
        os.replace(path + ".tmp", path)  # whole or absent: a reader never sees half a result
    print("RESULT " + result + "\n", end="", flush=True)  # newline included: one write per line


if __name__ == "__main__":  # not when pytest imports it to look for doctests
    main()
