"""The roll call plus ``init_process_group``'s store work against ``init_process_group``'s store work alone.

Thousands of simulated ranks on this machine, as in ``roll_call_scale.py`` (rank 0 in its own process serving the
store; ranks 1..N-1 as threads of processes of at most 512 threads, each with its own ``TCPStore`` clients; the same
private mount namespace with ``hosts: files`` where the machine's resolver stalls). Two configurations, interleaved
(their order alternates from one repeat to the next), medians and ranges:

- **init alone**: what ``init_process_group(init_method="env://")`` does with the store, by torch's own functions:
  ``torch.distributed.rendezvous._create_c10d_store`` (what ``_env_rendezvous_handler`` calls: rank 0 serves a
  ``TCPStore`` with ``multi_tenant=True`` and libuv, every other rank connects a client; ``wait_for_workers`` is
  left at its default, so every rank adds itself to the store's ``init/`` key and rank 0 waits until all N did),
  then ``store.set_timeout``, ``PrefixStore("default_pg", store)``, and
  ``torch.distributed.distributed_c10d._store_based_barrier`` on it with the default group's name (``"0"``), as
  ``init_process_group`` runs it after creating the group (with ``TORCH_DIST_INIT_BARRIER=1``; torch 2.13 skips
  it by default, so the time at which the last rank had its store is shown too).
- **roll call + init**: the real :func:`lightning_mpi_env.rollcall.store.rendezvous` first (its own ``TCPStore``
  client per rank; rank 0's ``multi_tenant`` server, kept open as the plugin keeps it), then exactly the above: the
  store ``init_process_group`` opens on the same port is the same server (no new port), but, as in a job, each rank
  connects one more client to it.

Not simulated: the backend's own setup inside ``_new_process_group_helper`` (gloo's full mesh of N x N
connections, NCCL's communicator), which is the same with and without the roll call and cannot be run N times on
one machine. The time is from rank 0's start until the last rank is through the barrier.

On one machine all clients share one range of ephemeral ports (``net.ipv4.ip_local_port_range``) towards each
destination address, and each connection probed and closed holds its port a while (``TIME_WAIT``): at 16,384 ranks
the clients of both kinds would not fit in one. So the clients of each process of ranks connect to loopback
addresses of their own (``127.0.1.P`` for the roll call, ``127.0.2.P`` for init, P the process), in both
configurations: the same interface and server, as each node of a job has its ports of its own. Rank 0 uses
``127.0.0.1``. Rank 0's server holds 2N sockets in roll call + init (the roll call's store stays open, as the plugin
keeps it): the limit on open files is raised (the hard limit too, where this process may: ``CAP_SYS_RESOURCE``);
where 2N + 512 cannot be had, that size runs init alone only, and the output says so.

Usage: ``.venv/bin/python benchmarks/roll_call_vs_init.py [--sizes 1024 4096 16384] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from roll_call_scale import (  # noqa: E402  (the script beside this one)
    claims,
    expect,
    files_only_resolver,
    free_port,
    machine_description,
    port_open,
    say,
    slowest_reverse_lookup,
)


def addresses(process: int) -> tuple[str, str]:
    """Where the roll call's and init's clients of the ``process``-th process of ranks connect (0: rank 0's)."""
    if process == 0:
        return "127.0.0.1", "127.0.0.1"
    return f"127.0.1.{process}", f"127.0.2.{process}"


MODES = ("init", "rollcall+init", "lean+init", "lean2+init")
"""``lean+init`` is a prototype (issue 26, item 1): :func:`lean_roll_call` on one client, which init then shares."""


def judged_table(store: Any, prefix: str, world_size: int) -> tuple[str | None, list[str]]:
    """The prototypes' rank-0 work: every claim in one ``multi_get``, checked with the package's own functions.

    Returns the problem (``None``: none) and, without one, every rank's node assignment as written to its key.
    """
    import json

    from lightning_mpi_env.rollcall.claims import assign_all, devices_of
    from lightning_mpi_env.rollcall.errors import collisions, disagreement_message
    from lightning_mpi_env.rollcall.store_values import claim_of, read

    keys = [f"{prefix}claim/{rank}" for rank in range(world_size)]
    raws = store.multi_get(keys)
    claims = [read(key, raw, claim_of(rank)) for rank, (key, raw) in enumerate(zip(keys, raws, strict=True))]
    problems = [disagreement_message(claims[0], other) for other in claims[1:]]
    problem = next((p for p in problems if p is not None), None) or collisions(claims)
    if problem is not None:
        return problem.problem, []
    assignments = assign_all([c.host for c in claims], any_layout=all(c.any_layout for c in claims))
    devices, _ = devices_of(claims)
    return None, [
        json.dumps([a.node_rank, a.num_nodes, a.local_rank, a.local_size, devices.get(rank)])
        for rank, a in enumerate(assignments)
    ]


def lean2_roll_call(store: Any, claim: Any, timeout: float) -> Any:
    """The happy path in two requests per rank other than 0, and no counter (a prototype, not the package's code).

    Every rank: ``compare_set(claim/R, "", claim)`` (the claim; a duplicate sees the first claim come back). Rank 0
    then reads every claim in one ``multi_get``, which the server holds until the last claim is in (no ``add`` by
    each rank), checks the table with the package's own functions and writes every node assignment and the verdict
    in one ``multi_set``. Every other rank reads the verdict and its own assignment in one ``multi_get``, also held
    by the server until they are written. On a problem, rank 0 would write the verdict and a placeholder for every
    assignment (so no rank waits for a key that never comes), and on a timeout it would name the missing ranks from
    ``check`` of their claims: only a failure pays for the detail.
    """
    import json

    from lightning_mpi_env.rollcall.store_values import node_of, read

    prefix = "lean2/"
    mine = claim.to_json()
    first = store.compare_set(f"{prefix}claim/{claim.rank}", "", mine)
    if first.decode() != mine:
        raise RuntimeError(f"duplicate rank {claim.rank}")
    node_key = f"{prefix}node/{claim.rank}"
    if claim.rank == 0:
        problem, nodes_json = judged_table(store, prefix, claim.world_size)
        if problem is not None:
            raise RuntimeError(problem)
        verdict = json.dumps({"summary": f"{claim.world_size} ranks met"})
        store.multi_set(
            [f"{prefix}node/{rank}" for rank in range(claim.world_size)] + [prefix + "verdict"],
            [*nodes_json, verdict],
        )
        raw_verdict, raw_node = verdict.encode(), store.get(node_key)
    else:
        raw_verdict, raw_node = store.multi_get([prefix + "verdict", node_key])
    if "problem" in json.loads(raw_verdict):
        raise RuntimeError(json.loads(raw_verdict)["problem"])
    nodes, _ = read(node_key, raw_node, node_of(claim))
    return nodes


def lean_roll_call(store: Any, claim: Any, timeout: float) -> Any:
    """The roll call's happy path in four requests per rank, on ``store`` (a prototype, not the package's code).

    1. ``compare_set(claim/R, "", claim)``: the claim, and a duplicate found at once (the first claim comes back);
    2. ``add(arrived, 1)``: the last rank to arrive reads every claim in one ``multi_get``, checks the table with the
       package's own functions (disagreement, collisions, node assignment, devices), writes every node assignment in
       one ``multi_set``, then the verdict;
    3. ``get(verdict)``: waits on the server (no polling);
    4. ``get(node/R)``: this rank's assignment, read and checked as the package reads it.

    Left out of the prototype: the early comparison with rank 0's claim, the missing-rank naming (only on a
    timeout: ``arrived_ranks`` would be one ``append`` more per rank), the count of ranks that read the verdict.
    """
    import json

    from lightning_mpi_env.rollcall.store_values import node_of, read

    prefix = "lean/"
    mine = claim.to_json()
    first = store.compare_set(f"{prefix}claim/{claim.rank}", "", mine)
    if first.decode() != mine:
        raise RuntimeError(f"duplicate rank {claim.rank}")
    if store.add(prefix + "arrived", 1) == claim.world_size:
        problem, nodes_json = judged_table(store, prefix, claim.world_size)
        if problem is not None:
            store.set(prefix + "verdict", json.dumps({"problem": problem}))
        else:
            store.multi_set([f"{prefix}node/{rank}" for rank in range(claim.world_size)], nodes_json)
            store.set(prefix + "verdict", json.dumps({"summary": f"{claim.world_size} ranks met"}))
    verdict = json.loads(store.get(prefix + "verdict"))
    if "problem" in verdict:
        raise RuntimeError(verdict["problem"])
    key = f"{prefix}node/{claim.rank}"
    nodes, _ = read(key, store.get(key), node_of(claim))
    return nodes


def raise_fd_limit(needed: int) -> int:
    """Raise the limit on open files to ``needed`` (the hard limit too, where allowed); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return needed
        except (ValueError, OSError):
            needed = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


def one_rank(rank: int, args: argparse.Namespace, claim: Any, expected_node: Any, keep: list[Any]) -> dict[str, float]:
    """One rank's part: the roll call (in ``rollcall+init``), then init's store work; times of each end.

    The stores go to ``keep``: they stay open until every rank is through, as in a job.
    """
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import _store_based_barrier
    from torch.distributed.rendezvous import _create_c10d_store

    from lightning_mpi_env.rollcall.store import rendezvous

    timeout = timedelta(seconds=args.timeout)
    times: dict[str, float] = {}
    roll_call_address, init_address = addresses(args.process)
    if args.mode in ("lean+init", "lean2+init"):
        # One client: the lean roll call on it, then init_process_group(store=it) (no env:// store of its own:
        # init wraps the given store in PrefixStore("default_pg", ...) and runs the barrier on it).
        from torch.distributed import TCPStore

        store = TCPStore(
            init_address,
            args.port,
            args.world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
            multi_tenant=True,
        )
        keep.append(store)
        times["connected"] = time.monotonic()
        (lean_roll_call if args.mode == "lean+init" else lean2_roll_call)(store, claim, args.timeout)
        times["met"] = time.monotonic()
        _store_based_barrier(rank, PrefixStore("default_pg", store), "0", args.world_size, timeout)
        times["done"] = time.monotonic()
        return times
    if args.mode == "rollcall+init":
        claim = dataclasses.replace(claim, main_address=roll_call_address)
        keep.append(rendezvous(claim, timeout=args.timeout, expected_node=expected_node))
        times["met"] = time.monotonic()
    # init_process_group(init_method="env://"): _env_rendezvous_handler -> _create_c10d_store ...
    store = _create_c10d_store(init_address, args.port, rank, args.world_size, timeout, use_libuv=True)
    store.set_timeout(timeout)
    keep.append(store)
    times["connected"] = time.monotonic()
    # ... PrefixStore("default_pg", store), the group, then the store-based barrier with the group's name.
    _store_based_barrier(rank, PrefixStore("default_pg", store), "0", args.world_size, timeout)
    times["done"] = time.monotonic()
    return times


def serve(args: argparse.Namespace) -> None:
    """Rank 0 in a process of its own."""
    fd_limit = raise_fd_limit(2 * args.world_size + 512)
    (claim,) = claims(args.world_size, args.port, args.per_node, [0])
    say("READY", {"fd_limit": fd_limit})
    sys.stdin.readline()
    keep: list[Any] = []
    times = one_rank(0, args, claim, lambda rank: rank // args.per_node, keep)
    say("DONE", times)
    sys.stdin.readline()  # EXIT: every rank is through


def clients(args: argparse.Namespace) -> None:
    """Ranks ``first_rank..end_rank-1``, one thread each."""
    ranks = range(args.first_rank, args.end_rank)
    fd_limit = raise_fd_limit(4 * len(ranks) + 512)
    threading.stack_size(256 * 1024)
    own = claims(args.world_size, args.port, args.per_node, ranks)
    results: list[dict[str, float]] = []
    errors: list[str] = []
    keep: list[Any] = []
    barrier = threading.Barrier(len(own) + 1)

    def run(claim: Any) -> None:
        barrier.wait()
        try:
            results.append(one_rank(claim.rank, args, claim, lambda rank: rank // args.per_node, keep))
        except Exception as error:  # noqa: BLE001 (counted and shown)
            errors.append(f"{type(error).__name__}: {str(error)[:200]}")

    threads = [threading.Thread(target=run, args=(claim,), daemon=True) for claim in own]
    for thread in threads:
        thread.start()
    say("READY", {"fd_limit": fd_limit, "threads": len(threads)})
    sys.stdin.readline()
    barrier.wait()
    for thread in threads:
        thread.join()
    say(
        "DONE",
        {
            "ok": len(results),
            "errors": errors[:2],
            "error_count": len(errors),
            **{
                key: max(result[key] for result in results) if results else 0.0
                for key in ("met", "connected", "done")
                if not results or key in results[0]
            },
        },
    )


def one_run(size: int, mode: str, args: argparse.Namespace, prefix: list[str]) -> dict[str, Any]:
    """One run of ``size`` ranks in ``mode``: seconds from rank 0's start to the last rank's end of each step."""
    port = free_port()
    common = ["--mode", mode, "--world-size", str(size), "--port", str(port), "--per-node", str(args.ranks_per_node)]
    common += ["--timeout", str(args.timeout)]

    def start(role: str, *more: str) -> subprocess.Popen[str]:
        command = [*prefix, sys.executable, __file__, "--role", role, *common, *more]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
        return subprocess.Popen(command, text=True, **pipes)

    count = max(1, min(-(-size // 512), size - 1))
    bounds = [1 + (size - 1) * index // count for index in range(count + 1)]
    server = start("server")
    others = [
        start("clients", "--first-rank", str(a), "--end-rank", str(b), "--process", str(index + 1))
        for index, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    processes = [server, *others]
    try:
        for process in processes:
            expect(process, "READY")
        go = time.monotonic()
        for process in processes:
            if process is others[0]:
                port_open(port, go + args.timeout)
            assert process.stdin is not None
            process.stdin.write("GO\n")
            process.stdin.flush()
        done = [expect(process, "DONE") for process in others]
        rank0 = expect(server, "DONE")
        assert server.stdin is not None
        server.stdin.write("EXIT\n")
        server.stdin.flush()
    finally:
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    ok = 1 + sum(part["ok"] for part in done)
    if ok != size:
        errors = [text for part in done for text in part["errors"]]
        raise RuntimeError(f"{mode} at {size} ranks: {ok}/{size} through; e.g. {errors[:1]}")
    keys = [key for key in ("met", "connected", "done") if key in rank0]
    return {key: max(rank0[key], *(part[key] for part in done)) - go for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size and configuration (median shown)")
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES[:2]), help="configurations to run")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--resolver", choices=["auto", "system", "files"], default="auto")
    parser.add_argument("--role", choices=["server", "clients"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--per-node", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        serve(args)
    elif args.role == "clients":
        clients(args)
    else:
        with tempfile.TemporaryDirectory() as workdir:
            run_all(args, workdir)


def run_all(args: argparse.Namespace, workdir: str) -> None:
    prefix: list[str] = []
    slowest = slowest_reverse_lookup()
    note = f"the machine's resolver (slowest of 60 reverse lookups: {slowest:.2f} s)"
    if args.resolver == "files" or (args.resolver == "auto" and slowest > 1.0):
        isolated = files_only_resolver(workdir)
        if isolated is not None:
            prefix = isolated
            note = f"ranks resolve host names from /etc/hosts only (the machine's resolver: {slowest:.2f} s)"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as port_range:
        ports = port_range.read().split()
    print(f"machine: {os.uname().nodename}: {machine_description()}", flush=True)
    print(f"open files: soft {soft}, hard {hard}; ephemeral ports {'-'.join(ports)}; {note}", flush=True)
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    skipped: set[int] = set()
    for size in args.sizes:
        if "rollcall+init" in args.modes and raise_fd_limit(2 * size + 512) < 2 * size + 512:
            skipped.add(size)  # rank 0's server would stop accepting at the limit, and every rank wait it out
            print(
                f"  N={size}: roll call + init needs {2 * size + 512} open files in rank 0's process; the hard "
                f"limit here is {resource.getrlimit(resource.RLIMIT_NOFILE)[1]} and cannot be raised: init alone only"
            )
        for index in range(args.repeat):
            order = args.modes if index % 2 == 0 else args.modes[::-1]
            for mode in order:
                if size in skipped and mode == "rollcall+init":
                    continue
                steps = one_run(size, mode, args, prefix)
                results.setdefault((size, mode), []).append(steps)
                shown = ", ".join(f"{key} {value:.2f} s" for key, value in steps.items())
                print(f"  N={size} #{index + 1} {mode}: {shown}", flush=True)

    def median(size: int, mode: str, key: str) -> float:
        return statistics.median(steps[key] for steps in results[(size, mode)])

    def cell(size: int, mode: str, key: str = "done") -> str:
        values = [steps[key] for steps in results[(size, mode)]]
        return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"

    print(
        f"\nN simulated ranks on one TCPStore ({args.ranks_per_node} per simulated host), the two configurations "
        f"interleaved, median of {args.repeat} (range); machine {os.uname().nodename}: {machine_description()}; "
        f"{note}.\n"
    )
    print(
        "| ranks | configuration | init alone | with the roll call | difference | ratio | roll call done | connected |"
    )
    print(f"|{'---|' * 8}")
    for size in args.sizes:
        for mode in (m for m in args.modes if m != "init"):
            if (size, mode) not in results:
                print(f"| {size} | {mode} | {cell(size, 'init')} | not run (open files) | - | - | - | - |")
                continue
            alone, both = median(size, "init", "done"), median(size, mode, "done")
            print(
                f"| {size} | {mode} | {cell(size, 'init')} | {cell(size, mode)} | {both - alone:+.2f} s "
                f"| x{both / alone:.2f} | {cell(size, mode, 'met')} "
                f"| {median(size, 'init', 'connected'):.2f} s / {median(size, mode, 'connected'):.2f} s |"
            )
    print(
        "\nTimes from rank 0's start until the last rank is through init's store-based barrier. Roll call done: "
        "the last rank's node assignment (roll call + init). Last store connected: the last rank's init store "
        "(init alone / roll call + init), where torch 2.13's init_process_group ends by default (no barrier)."
    )


if __name__ == "__main__":
    main()
