"""Rank 0's serial work when the last claim is in: parse and check N claims, assign nodes and devices, encode.

A prototype's measurement for issue 26, item 1 (docs/notes/issue-26-roll-call-cost.md): the package's own
functions on N claims as ``roll_call_scale.claims`` makes them, median of 3, in one process.

Usage: ``.venv/bin/python benchmarks/roll_call_finalize_cost.py``
"""

import json
import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
from roll_call_scale import claims

from lightning_mpi_env.rollcall.claims import assign_all, devices_of
from lightning_mpi_env.rollcall.errors import collisions, disagreement_message
from lightning_mpi_env.rollcall.store_values import claim_of, read

for n in (1024, 4096, 16384):
    raws = [c.to_json().encode() for c in claims(n, 29500, 4, range(n))]
    times = {"parse": [], "check": [], "assign+devices": [], "encode": []}
    for _ in range(3):
        t0 = time.perf_counter()
        parsed = [read(f"k/{r}", raw, claim_of(r)) for r, raw in enumerate(raws)]
        t1 = time.perf_counter()
        [disagreement_message(parsed[0], other) for other in parsed[1:]]
        collisions(parsed)
        t2 = time.perf_counter()
        a = assign_all([c.host for c in parsed], any_layout=all(c.any_layout for c in parsed))
        d, _ = devices_of(parsed)
        t3 = time.perf_counter()
        [json.dumps([x.node_rank, x.num_nodes, x.local_rank, x.local_size, d.get(r)]) for r, x in enumerate(a)]
        t4 = time.perf_counter()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[k].append(v)
    size = sum(map(len, raws)) / n
    print(f"N={n}: claim {size:.0f} bytes; " + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in times.items()))
