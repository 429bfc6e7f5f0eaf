"""Roll-call scale benchmark: thousands of simulated ranks meeting in one ``TCPStore`` on this machine.

Every rank runs the real :func:`lightning_mpi_env.rollcall.store.rendezvous` with its own real ``TCPStore`` client:

- **rank 0** runs in a process of its own, as in a job: it serves the store (``multi_tenant``, libuv) and meets the
  others. Its resident memory is read right after its imports (the baseline), when its own roll call returned, and
  when every rank is done with the store (the server holds every key until then); the peak is ``ru_maxrss``.
- **ranks 1..N-1** are threads, each with its own ``TCPStore`` client (a socket of its own), spread over processes
  of 512 threads at most (``--client-processes``): more threads in one interpreter mostly measure its lock (the GIL)
  handing over between them. Their memory is the clients', not rank 0's; it is shown for context.

Both processes get ready (imports, claims, threads); then rank 0 starts, and the others as soon as its port accepts
connections. The time is from rank 0's start until the last rank has its node assignment. ``--together`` starts
every rank at once instead: the ranks then wait for rank 0's port, polling it every 0.2 s, which on one machine
takes CPU from rank 0 itself (4,095 polling threads on 2 cores), unlike a job, whose ranks poll from their own
nodes. Ranks are placed ``--ranks-per-node`` to a simulated host (``node00000``...),
with the versions of this Python/torch/Lightning in every claim, as a job's claims carry them. A missing-rank run
(the last rank never starts) measures the time to the named error on every rank with a short timeout.

Torch's c10d sockets look up the peer's host name (``getnameinfo``) at every connection, on the client and on the
server: two reverse DNS queries per rank, for ``::ffff:127.0.0.1`` here, which glibc sends to the DNS server (the
hosts file does not answer v4-mapped addresses). Where that server drops some replies, a connection stalls for the
resolver's timeout (5 s; seen on the development machine with ``strace``), which says nothing about the roll call.
``--resolver auto`` (the default) probes 60 such lookups; if one takes over 1 s, the ranks run in a private mount
namespace whose ``/etc/nsswitch.conf`` says ``hosts: files``, so the lookups answer at once (as a working resolver
does), and the output says so. ``--resolver system`` keeps the machine's resolver. Connections that still took
over 0.5 s are counted.

Usage: ``.venv/bin/python benchmarks/roll_call_scale.py [--sizes 256 512 1024 2048 4096] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

ADDRESS = "127.0.0.1"


# --- the machine ------------------------------------------------------------------------------------------------


def machine_description() -> str:
    """One markdown line: CPUs, platform, Python, torch, Lightning, Open MPI and the load average now."""
    versions = []
    for name in ("torch", "lightning", "pytorch-lightning"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    from lightning_mpi_env.core.errors import MpiEnvError
    from lightning_mpi_env.tools.simcluster import find_mpirun

    try:
        first = subprocess.run([find_mpirun(), "--version"], capture_output=True, text=True, timeout=30).stdout
        versions.append(first.strip().splitlines()[0] if first.strip() else "mpirun (no version)")
    except (OSError, subprocess.SubprocessError, MpiEnvError):  # no Open MPI here: say so, measure the rest
        versions.append("no Open MPI mpirun")
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs ({platform.machine()}, {platform.processor() or 'unknown processor'}), "
        f"{platform.platform()}, Python {platform.python_version()}, {', '.join(versions)}; load average {load}"
    )


def slowest_reverse_lookup(count: int = 60) -> float:
    """Seconds of the slowest of ``count`` reverse lookups of the address torch's c10d sockets look up here."""
    slowest = 0.0
    for _ in range(count):
        start = time.monotonic()
        with contextlib.suppress(OSError):
            socket.getnameinfo(("::ffff:" + ADDRESS, 4242, 0, 0), socket.NI_NUMERICSERV)
        slowest = max(slowest, time.monotonic() - start)
    return slowest


def files_only_resolver(workdir: str) -> list[str] | None:
    """A command prefix running a program where host lookups use the hosts file only; ``None`` if impossible.

    A private mount namespace (``unshare``, as root or in a user namespace) with ``/etc/nsswitch.conf`` saying
    ``hosts: files``: nothing changes for the rest of the machine.
    """
    try:
        with open("/etc/nsswitch.conf") as current:
            lines = [line for line in current if not line.lstrip().startswith("hosts:")]
    except OSError:
        lines = []
    conf = os.path.join(workdir, "nsswitch.conf")
    with open(conf, "w") as replacement:
        replacement.writelines([*lines, "hosts: files\n"])
    script = f'mount --bind {conf} /etc/nsswitch.conf && exec "$@"'
    for unshare in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        prefix = [*unshare, "sh", "-c", script, "sh"]
        try:
            probe = subprocess.run([*prefix, "grep", "-q", "^hosts: files$", "/etc/nsswitch.conf"], timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return None


# --- the two roles ------------------------------------------------------------------------------------------------


def rss_mib() -> float:
    """Resident memory of this process now, in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """The most resident memory this process had, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User and system CPU time of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_fd_limit(needed: int) -> int:
    """Raise the soft limit on open files to ``needed`` (up to the hard limit); return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def claims(world_size: int, port: int, per_node: int, ranks: Sequence[int]) -> list[Any]:
    """The claims of ``ranks``: hosts of ``per_node`` ranks each, this process's software versions."""
    from lightning_mpi_env.rollcall.claims import Claim
    from lightning_mpi_env.rollcall.process_info import process_info as local_facts

    facts = local_facts("gloo")
    return [
        Claim(rank, world_size, f"node{rank // per_node:05d}", rank % per_node, 100_000 + rank, ADDRESS, port, **facts)
        for rank in ranks
    ]


def say(tag: str, payload: dict[str, Any]) -> None:
    print(f"{tag} {json.dumps(payload)}", flush=True)


def serve(args: argparse.Namespace) -> None:
    """Rank 0: serve the store and meet; report times and memory."""
    from lightning_mpi_env.core.errors import RendezvousError
    from lightning_mpi_env.rollcall.store import rendezvous

    fd_limit = raise_fd_limit(2 * args.world_size + 256)
    (claim,) = claims(args.world_size, args.port, args.per_node, [0])
    baseline = rss_mib()
    say("READY", {"rss": baseline, "fd_limit": fd_limit})
    go = float(sys.stdin.readline().split()[1])
    cpu = cpu_seconds()
    outcome: dict[str, Any] = {"ok": True}
    try:
        result = rendezvous(claim, timeout=args.timeout, expected_node=lambda rank: rank // args.per_node)
    except RendezvousError as error:
        outcome = {"ok": False, "error": error.problem}
        result = None
    end = time.monotonic()
    after_own = rss_mib()
    judged = getattr(result, "judged_in", None)
    say("DONE", {"end": end, "since_go": end - go, "rss_after_own": after_own, "judged": judged, **outcome})
    sys.stdin.readline()  # EXIT: every other rank is done with the store
    say(
        "EXIT",
        {
            "rss_at_exit": rss_mib(),
            "peak": peak_rss_mib(),
            "baseline": baseline,
            "cpu": cpu_seconds() - cpu,  # the store's server thread included
            "kept": result is not None,
        },
    )


def clients(args: argparse.Namespace) -> None:
    """Ranks 1..N-1 (less the missing one), one thread and one TCPStore client each."""
    import lightning_mpi_env.rollcall.store as rendezvous_module
    from lightning_mpi_env.core.errors import RendezvousError

    ranks = range(args.first_rank, args.end_rank)
    fd_limit = raise_fd_limit(2 * args.world_size + 256)
    threading.stack_size(256 * 1024)  # 4,095 threads: keep their stacks small
    own = claims(args.world_size, args.port, args.per_node, ranks)
    # Timing only: each step of the roll call runs unchanged, its start and end recorded (where the time goes).
    steps: dict[str, list[tuple[float, float]]] = {"connect": [], "verdict": []}
    for owner, name, step in (
        (rendezvous_module, "_connect", "connect"),  # torch's TCPStore() client, once rank 0's port accepts it
        (rendezvous_module._RollCall, "_await_verdict", "verdict"),  # every rank, until the verdict is written
    ):
        setattr(owner, name, timed(getattr(owner, name), steps[step]))
    ends: list[float] = []
    errors: list[str] = []
    kept: list[object] = []
    barrier = threading.Barrier(len(own) + 1)

    def run(claim: Any) -> None:
        barrier.wait()
        try:
            kept.append(rendezvous_module.rendezvous(claim, timeout=args.timeout, expected_node=expected_node))
        except RendezvousError as error:
            errors.append(error.problem)
        ends.append(time.monotonic())

    def expected_node(rank: int) -> int:
        return rank // args.per_node

    threads = [threading.Thread(target=run, args=(claim,), daemon=True) for claim in own]
    for thread in threads:
        thread.start()
    baseline = rss_mib()
    say("READY", {"rss": baseline, "fd_limit": fd_limit, "threads": len(threads)})
    go = float(sys.stdin.readline().split()[1])
    cpu = cpu_seconds()
    barrier.wait()
    for thread in threads:
        thread.join()
    cpu = cpu_seconds() - cpu
    end = max(ends)
    connect_seconds = [stop - start for start, stop in steps["connect"]]
    say(
        "DONE",
        {
            "end": end,
            "since_go": end - go,
            "met": len(kept),
            "errors": len(errors),
            "error_sample": sorted(set(errors))[:2],
            "last_connected": max(stop for _, stop in steps["connect"]) - go,
            "slow_connects": sum(seconds > 0.5 for seconds in connect_seconds),
            "cpu": cpu,
            "rss_growth": rss_mib() - baseline,
        },
    )


def timed(function: Any, sink: list[tuple[float, float]]) -> Any:
    """``function``, unchanged, recording ``(start, end)`` of every call in ``sink`` (a list: thread-safe appends)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            sink.append((start, time.monotonic()))

    return wrapper


# --- the orchestrator -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((ADDRESS, 0))
        return int(probe.getsockname()[1])


def expect(process: subprocess.Popen[str], tag: str) -> dict[str, Any]:
    """The payload of the next line tagged ``tag`` from ``process`` (other lines are shown)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(tag + " "):
            payload: dict[str, Any] = json.loads(line.split(" ", 1)[1])
            return payload
        print(f"    | {line.rstrip()}", flush=True)
    raise RuntimeError(f"process {process.args!r} ended without {tag} (status {process.wait()})")


def port_open(port: int, deadline: float) -> bool:
    """Whether ``port`` accepts a connection before ``deadline`` (polled every 5 ms)."""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((ADDRESS, port), timeout=1):
            return True
        time.sleep(0.005)
    return False


def one_run(world_size: int, args: argparse.Namespace, *, timeout: float, missing: bool, prefix: list[str]) -> Run:
    """One roll call of ``world_size`` ranks (less the last, when ``missing``)."""
    port = free_port()
    common = ["--world-size", str(world_size), "--port", str(port), "--per-node", str(args.ranks_per_node)]
    common += ["--timeout", str(timeout)]

    def start(role: str, *more: str) -> subprocess.Popen[str]:
        command = [*prefix, sys.executable, __file__, "--role", role, *common, *more]
        # stderr: torch's c10d warnings, one per connection on some machines; the outcome comes on stdout.
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
        return subprocess.Popen(command, text=True, **pipes)

    end = world_size - 1 if missing else world_size
    count = max(1, min(args.client_processes or -(-world_size // 512), end - 1))
    bounds = [1 + (end - 1) * index // count for index in range(count + 1)]
    server = start("server")
    others = [start("clients", "--first-rank", str(a), "--end-rank", str(b)) for a, b in itertools.pairwise(bounds)]
    processes = [server, *others]
    try:
        for process in processes:
            expect(process, "READY")
        go = time.monotonic()
        for process in processes:
            if process is others[0] and not args.together:
                port_open(port, go + timeout)
            assert process.stdin is not None
            process.stdin.write(f"GO {go!r}\n")
            process.stdin.flush()
        done = [expect(process, "DONE") for process in others]
        rank0 = expect(server, "DONE")
        assert server.stdin is not None
        server.stdin.write("EXIT\n")
        server.stdin.flush()
        memory = expect(server, "EXIT")
    finally:
        for process in processes:
            try:
                process.wait(timeout=timeout + 30)
            except subprocess.TimeoutExpired:
                process.kill()
    return Run(
        wall=max(rank0["end"], *(part["end"] for part in done)) - go,
        met=sum(part["met"] for part in done) + (1 if rank0["ok"] else 0),
        errors=sum(part["errors"] for part in done) + (0 if rank0["ok"] else 1),
        error_sample=[text for part in done for text in part["error_sample"]][:1] or [rank0.get("error", "")],
        last_connected=max(part["last_connected"] for part in done),
        judged=rank0.get("judged"),
        slow_connects=sum(part["slow_connects"] for part in done),
        rank0_growth=memory["rss_at_exit"] - memory["baseline"],
        rank0_peak_growth=memory["peak"] - memory["baseline"],
        rank0_cpu=memory["cpu"],
        clients_growth=sum(part["rss_growth"] for part in done),
        clients_cpu=sum(part["cpu"] for part in done),
        client_processes=count,
    )


@dataclass(frozen=True)
class Run:
    """What one roll call measured; times in seconds from rank 0's start, memory in MiB."""

    wall: float
    met: int
    errors: int
    error_sample: list[str]
    last_connected: float
    judged: float | None
    slow_connects: int
    rank0_growth: float
    rank0_peak_growth: float
    rank0_cpu: float
    clients_growth: float
    clients_cpu: float
    client_processes: int


def growth(values: list[float], sizes: list[int], index: int) -> str:
    """``"x3.1 for x4 ranks"``: how ``values`` grew from the row above, beside how the number of ranks grew."""
    if index == 0 or values[index - 1] <= 0:
        return "-"
    return f"x{values[index] / values[index - 1]:.2f} for x{sizes[index] / sizes[index - 1]:g} ranks"


def judged(runs: list[Run]) -> str:
    """The median time rank 0 took to judge the table of claims."""
    times = [run.judged for run in runs if run.judged is not None]
    return f"{statistics.median(times) * 1e3:.0f} ms" if times else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the median is shown)")
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120.0, help="roll-call timeout of the healthy runs")
    parser.add_argument("--missing-size", type=int, default=1024, help="ranks in the missing-rank run (0: none)")
    parser.add_argument("--missing-timeout", type=float, default=5.0)
    parser.add_argument("--resolver", choices=["auto", "system", "files"], default="auto", help="see the docstring")
    parser.add_argument(
        "--together", action="store_true", help="start every rank at once (default: rank 0 first, see the docstring)"
    )
    parser.add_argument("--role", choices=["server", "clients"], help=argparse.SUPPRESS)
    parser.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--per-node", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--client-processes", type=int, help="processes the other ranks' threads are spread over (default: N / 512)"
    )
    parser.add_argument("--first-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end-rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        serve(args)
        return
    if args.role == "clients":
        clients(args)
        return

    with tempfile.TemporaryDirectory() as workdir:
        run_all(args, workdir)


def run_all(args: argparse.Namespace, workdir: str) -> None:
    prefix: list[str] = []
    slowest = slowest_reverse_lookup()
    resolver_note = f"the machine's resolver (slowest of 60 reverse lookups: {slowest:.2f} s)"
    if args.resolver == "files" or (args.resolver == "auto" and slowest > 1.0):
        isolated = files_only_resolver(workdir)
        if isolated is None:
            resolver_note += "; `hosts: files` was asked for but no private mount namespace could be made"
        else:
            prefix = isolated
            resolver_note = (
                f"ranks resolve host names from /etc/hosts only (private mount namespace): the machine's resolver "
                f"stalls (slowest of 60 reverse lookups: {slowest:.2f} s)"
            )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"machine: {machine_description()}", flush=True)
    print(f"open files: soft {soft}, hard {hard} (raised per process as needed); {resolver_note}", flush=True)

    rows = []
    for size in args.sizes:
        runs = []
        for index in range(args.repeat):
            run = one_run(size, args, timeout=args.timeout, missing=False, prefix=prefix)
            runs.append(run)
            print(
                f"  N={size} #{index + 1}: {run.wall:.2f} s, met {run.met}/{size}, rank 0 +"
                f"{run.rank0_growth:.1f} MiB, slow connects {run.slow_connects}",
                flush=True,
            )
        rows.append((size, runs))
    missing = None
    if args.missing_size:
        missing = one_run(args.missing_size, args, timeout=args.missing_timeout, missing=True, prefix=prefix)

    sizes = [size for size, _ in rows]
    walls = [statistics.median(r.wall for r in runs) for _, runs in rows]
    memory = [statistics.median(r.rank0_growth for r in runs) for _, runs in rows]
    start = "every rank at once" if args.together else "rank 0 first, the others as soon as its port is open"
    print(f"\nRoll call of N simulated ranks on one TCPStore ({args.ranks_per_node} per simulated host), median of")
    processes = sorted({run.client_processes for _, runs in rows for run in runs})
    print(
        f"{args.repeat} runs, started {start}; ranks 1..N-1 as threads of {'/'.join(map(str, processes))} "
        f"process(es) by size; machine: {machine_description()}; {resolver_note}.\n"
    )
    print(
        "| ranks | time to all met | growth (time) | per rank | last rank connected "
        "| rank 0's judging | CPU: rank 0 / ranks 1..N-1 | rank 0 RSS growth | growth (memory) "
        "| rank 0 peak growth | clients' RSS growth | connections over 0.5 s |"
    )
    print(f"|{'---|' * 12}")
    for index, (size, runs) in enumerate(rows):
        ok = all(r.met == size for r in runs)
        spread = f"{min(r.wall for r in runs):.2f}-{max(r.wall for r in runs):.2f}"
        print(
            f"| {size} | {walls[index]:.2f} s ({spread}){'' if ok else ' NOT ALL MET'} | {growth(walls, sizes, index)} "
            f"| {walls[index] / size * 1e3:.2f} ms "
            f"| {statistics.median(r.last_connected for r in runs):.2f} s | {judged(runs)} "
            f"| {statistics.median(r.rank0_cpu for r in runs):.2f} s / "
            f"{statistics.median(r.clients_cpu for r in runs):.2f} s "
            f"| {memory[index]:.1f} MiB | {growth(memory, sizes, index)} "
            f"| {statistics.median(r.rank0_peak_growth for r in runs):.1f} MiB "
            f"| {statistics.median(r.clients_growth for r in runs):.0f} MiB "
            f"| {max(r.slow_connects for r in runs)} |"
        )
    print(
        "\nGrowth: from the row above; linear growth grows as the ranks do. Rank 0 RSS growth: its process when "
        "every rank is done, less right after its imports; peak: its ru_maxrss less the same baseline. Clients: the "
        "processes of ranks 1..N-1 (threads), for context. Last rank connected: when the last client had its "
        "TCPStore connection; rank 0's judging: parsing and checking every claim and placing every rank. CPU: "
        "user + system time from the start to the end, of rank 0's process (its store server included) and of the "
        "processes whose threads are the other ranks."
    )
    if missing is not None:
        named = missing.errors == args.missing_size - 1 and not missing.met
        print(
            f"\nMissing rank ({args.missing_size} ranks, the last never starts; timeout {args.missing_timeout:g} s): "
            f"every rank raised the named error at {missing.wall:.2f} s "
            f"({missing.errors}/{args.missing_size - 1} errors; e.g. "
            f"{missing.error_sample[0][:110]!r})"
            if named
            else f"\nMissing rank: UNEXPECTED {missing}"
        )


if __name__ == "__main__":
    main()
