"""One ``TCPStore`` client runs one request at a time: a request waits behind another thread's blocked ``get``.

Why the stall watchdog cannot share ``init_process_group``'s store client (docs/notes/issue-26-roll-call-cost.md):
``ProcessGroupNCCL`` blocks in ``store->get`` until the group's first rank posts the NCCL unique id, and every
request of the client waits on its ``activeOpLock_`` meanwhile. Here a thread blocks in ``get`` on a key that
another client posts after ``--post-after`` seconds; the main thread's ``check`` on the same client returns only
then, and a ``check`` on a client of its own at once.

Usage: ``.venv/bin/python benchmarks/store_one_request_at_a_time.py [--post-after 4]``
"""

from __future__ import annotations

import argparse
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--post-after", type=float, default=4.0, help="seconds before the awaited key is posted")
    args = parser.parse_args()
    timeout = timedelta(seconds=30)
    server = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False, timeout=timeout)
    shared = dist.TCPStore("127.0.0.1", server.port, 3, is_master=False, timeout=timeout)
    own = dist.TCPStore("127.0.0.1", server.port, 3, is_master=False, timeout=timeout)

    def post_later() -> None:
        time.sleep(args.post_after)
        server.set("unique-id", "posted")

    threading.Thread(target=lambda: shared.get("unique-id"), daemon=True).start()  # NCCL's wait for the id
    threading.Thread(target=post_later, daemon=True).start()
    time.sleep(0.5)  # the get is in flight
    start = time.monotonic()
    own.check(["anything"])
    alone = time.monotonic() - start
    start = time.monotonic()
    shared.check(["anything"])  # what a watchdog thread on the same client would ask
    behind = time.monotonic() - start
    print(f"torch {torch.__version__}: the key was posted {args.post_after:g} s after the get began")
    print(f"  check on a client of its own:               {alone * 1000:.1f} ms")
    print(f"  check on the client blocked in get:          {behind * 1000:.1f} ms")


if __name__ == "__main__":
    main()
