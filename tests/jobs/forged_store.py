"""The roll call and the watchdog (no Lightning) on every rank of a real launch, with forged values in the store.

Usage: python forged_store.py KIND [TAG]. On rank 3, a second client of the job's ``TCPStore`` (as anyone on the
network could open) writes a forged or malformed value before the rank's own roll call; KIND says which:

- ``node``: a verdict saying the ranks met, and node assignments ``node_rank=7`` of ``num_nodes=3``;
- ``claim``: a claim under rank 3's key that is not a claim;
- ``verdict``: a roll call verdict that is not JSON;
- ``report``: after the roll call, while the ranks run steps of 0.5 s, malformed watchdog reports under rank 2's
  key. The ranks go on (up to 120 steps) until rank 0 has named the forged report, which it leaves as a file at
  ``FORGED_STORE_NAMED`` for every rank and the forger to see: on a loaded machine rank 0's watchdog may not read
  within one window of forging. The forger then stops writing and says so in a file beside it; rank 0, whose
  process serves the store, ends only after that, so no forged write meets a closed store.

A forged device index, a malformed stall verdict and a malformed stop record take the same parsers and readers,
which the unit tests over a real store cover (``tests/rollcall/test_store_values.py``, ``test_watchdog.py``,
``test_agreement.py``).

Each rank prints ``MET rank=R`` after the roll call and ``DONE rank=R`` at the end; this package's errors are one
line per rank.
"""

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

FORGER_RANK = 3
P = "lightning_mpi_env/"


def forge_before_roll_call(kind, address, port):
    import torch.distributed as dist

    client = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=30))
    if kind == "node":
        # A verdict saying the ranks met, before rank 0's: every rank reads the forged assignment beside it.
        client.set(P + "verdict", '{"summary": "forged"}')
        for rank in range(4):
            client.set(f"{P}node/{rank}", "[7, 3, 0, 2, null]")
    elif kind == "claim":
        client.set(P + "claim/3", '{"rank": "three"}')  # rank 3's own claim then finds it there
    elif kind == "verdict":
        client.set(P + "verdict", "not json {")
    return client


def forger_stopped(named):
    return named.with_name(named.name + ".forger-stopped")


def forge_while_training(kind, client, stop, named):
    if kind == "report":
        # In windows of 1.5 s, faster than rank 2's own reports, so rank 0 reads a forged one; 2 s apart, for rank
        # 2's own reports to be read too: a rank whose reports cannot be read for the stall timeout looks frozen.
        # Until rank 0 has named it.
        while not stop.is_set() and not named.is_file():
            until = time.monotonic() + 1.5
            while not stop.is_set() and not named.is_file() and time.monotonic() < until:
                client.set(P + "watchdog/2", '{"rank": 2, "beat": "x"}')
                time.sleep(0.02)
            stop.wait(2.0)
        forger_stopped(named).touch()


def main():
    from lightning_mpi_env.core.layout import from_env
    from lightning_mpi_env.core.report import install_excepthook
    from lightning_mpi_env.core.settings import Settings
    from lightning_mpi_env.rollcall.claims import Claim
    from lightning_mpi_env.rollcall.store import rendezvous
    from lightning_mpi_env.rollcall.watchdog import watch

    kind = sys.argv[1]
    install_excepthook()
    layout = from_env(os.environ)
    settings = Settings.from_env(os.environ)
    client = None
    if layout.rank == FORGER_RANK:
        time.sleep(1.0)  # rank 0's store is up by now, or the client waits for it
        client = forge_before_roll_call(kind, layout.main_address, layout.main_port)
    claim = Claim.here(
        rank=layout.rank,
        world_size=layout.world_size,
        local_rank=layout.local_rank,
        main_address=layout.main_address,
        main_port=layout.main_port,
    )
    result = rendezvous(claim, timeout=settings.rendezvous_timeout)
    print(f"MET rank={layout.rank}\n", end="", flush=True)
    dog = watch(result, settings.stall_timeout, signalled=lambda: False, launch=layout)
    stop = threading.Event()
    named = Path(os.environ["FORGED_STORE_NAMED"]) if kind == "report" else None
    forger = None
    if client is not None:
        forger = threading.Thread(target=forge_while_training, args=(kind, client, stop, named), daemon=True)
        forger.start()
    for step in range(120):
        if step >= 12 and (named is None or named.is_file()):
            break
        dog.mark(step, 2)
        time.sleep(0.5)
        if named is not None and layout.rank == 0 and dog.named:
            named.touch()
        assert dog.agreement is not None
        if dog.agreement.due(step + 1, wait=20.0):
            print(f"STOP rank={layout.rank}\n", end="", flush=True)
            break
    stop.set()
    if forger is not None:
        forger.join()
    if named is not None and layout.rank == 0:
        while not forger_stopped(named).is_file():  # the test's limit ends a hang
            time.sleep(0.1)
    dog.stop()
    print(f"DONE rank={layout.rank} named={sorted(dog.named)}\n", end="", flush=True)


if __name__ == "__main__":
    main()
