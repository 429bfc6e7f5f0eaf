"""Run one ddp_mpi rendezvous claim in this process and print how it ended, as one JSON line.

Usage: python rendezvous_claim.py RANK WORLD_SIZE HOST MAIN_ADDRESS MAIN_PORT TIMEOUT
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "instrumented"))
from tamper import start_gate  # noqa: E402  (INSTRUMENTED_START_GATE: the claimants start together)


def main():
    # torch as a training script has it before the roll call: rendezvous() imports torch.distributed lazily, and
    # that import, tens of seconds on a busy machine, would otherwise be timed as the rendezvous's.
    import torch.distributed  # noqa: F401

    from lightning_mpi_env.rollcall.claims import Claim
    from lightning_mpi_env.rollcall.store import rendezvous

    rank, world_size, host, address, port, timeout = sys.argv[1:]
    claim = Claim(int(rank), int(world_size), host, 0, os.getpid(), address, int(port))
    start_gate()  # the time below is the rendezvous's, not how far apart the imports ended on a busy machine
    start = time.monotonic()
    try:
        result = rendezvous(claim, timeout=float(timeout))
        outcome = {"ok": True, "node_rank": result.nodes.node_rank, "num_nodes": result.nodes.num_nodes}
    except Exception as error:  # noqa: BLE001  (reported to the test)
        outcome = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    outcome["seconds"] = time.monotonic() - start
    print(json.dumps(outcome) + "\n", end="", flush=True)


if __name__ == "__main__":
    main()
