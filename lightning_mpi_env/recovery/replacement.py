"""A replacement for a lost rank: a new process on a spare node of the allocation, joining the running job's store.

Where the launcher can run a command on a node of the job (srun's ``on_node``: a step of one task beside the
running one) and the allocation holds a node that no rank runs on, the world keeps its size: rank 0 starts the
program again there, as it was started, with :data:`REPLACES` saying which generation and rank it joins and where
the job's store is. The new process skips the roll call, opens that generation's group with the survivors and
takes rank 0's kept state (:func:`.hand_over`) like they do. The spare is rank 0's choice, published in the store
so that every survivor knows whether the world keeps its size.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.hostlist import expand_nodelist
from lightning_mpi_env.core.launchers import NODE_NAME, on_node_command
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.schedulers import detect_scheduler
from lightning_mpi_env.core.settings import REPLACES, VARIABLE
from lightning_mpi_env.recovery.ending import ENDING_WAIT, read_task
from lightning_mpi_env.recovery.ending import KEY as TASK_KEY
from lightning_mpi_env.recovery.worlds import FOREIGN_WRITE, MAX_GENERATIONS, World, prefix

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store  # the public torch.distributed.Store

MAX_WORLD_SIZE = 1 << 20
"""The largest world a replacement accepts to join (the roll call's own bound is far below)."""

SPARE_KEY = "end/spare"
"""Under the generation that lost ranks: the spare nodes rank 0 starts their replacements on, ``""`` for none."""

FORMAT = "<generation> <rank> <world size> <node rank> <nodes> <host> <port>"

ARRIVED_KEY = "arrived/"
"""Under the generation a replacement joins: its rank, once its process reached the job's store."""

ENDED_KEY = "end/replacement-ended"
"""Under that generation: rank 0's word that a replacement's step ended before its process arrived.

``<rank> <exit status>``."""

ENDED = re.compile(r"([0-9]{1,7}) (-?[0-9]{1,4})")

ARRIVAL_POLL = 0.1
"""Seconds between two looks at the store (and rank 0's at the replacements' steps) while the survivors wait."""


@dataclass(frozen=True)
class Joining:
    """What a replacement is told (:data:`REPLACES`): the generation and rank it joins, and where the store is."""

    generation: int
    rank: int
    world_size: int
    node_rank: int
    num_nodes: int
    host: str
    port: int

    def text(self) -> str:
        """The variable's value, as :func:`read_joining` reads it back."""
        numbers = (self.generation, self.rank, self.world_size, self.node_rank, self.num_nodes)
        return " ".join(str(number) for number in numbers) + f" {self.host} {self.port}"


def read_joining(env: Mapping[str, str]) -> Joining | None:
    """The generation this process joins as a replacement (``None``: it is no replacement), each value checked.

    Raises:
        RecoveryError: :data:`REPLACES` is set to anything but what rank 0 writes, naming it and its value.
    """
    raw = env.get(REPLACES)
    if raw is None:
        return None
    parts = raw[:400].split(" ")
    if len(raw) <= 300 and len(parts) == 7 and all(part.isdigit() and len(part) <= 7 for part in parts[:5] + parts[6:]):
        generation, rank, world_size, node_rank, num_nodes, port = (int(part) for part in parts[:5] + parts[6:])
        if (
            1 < generation <= MAX_GENERATIONS
            and 0 < rank < world_size <= MAX_WORLD_SIZE
            and 0 <= node_rank < num_nodes <= world_size
            and NODE_NAME.fullmatch(parts[5])
            and 0 < port < 65536
        ):
            return Joining(generation, rank, world_size, node_rank, num_nodes, parts[5], port)
    raise RecoveryError(
        f"{REPLACES}={raw[:300]!r} is not `{FORMAT}`: the generation (2 to {MAX_GENERATIONS}) and rank (not 0) a"
        " replacement joins, the world size, its node's index and the node count, and the store's host and port",
        f"{REPLACES} is set by `restartable` on rank 0 for the process it starts on a spare node: unset it",
        variable=REPLACES,
        value=raw[:300],
    )


def spare_nodes(store: Store, layout: RankLayout, env: Mapping[str, str], world_size: int) -> list[str]:
    """The allocation's nodes that no rank of the job runs on, in its order (``[]``: none, or none can be reached).

    Only where the launcher runs a command on a node of the job (:func:`on_node_command`), and every rank said where
    it runs (:func:`.post_task`): a node the records do not cover might hold a rank.
    """
    from torch.distributed import DistError

    scheduler = detect_scheduler(env)
    if scheduler is None or on_node_command(layout.launcher, env, "node") is None:
        return []
    lists = [source.variable for source in scheduler.host_lists if source.variable == "SLURM_JOB_NODELIST"]
    if not lists or lists[0] not in env:
        return []
    keys = [f"{TASK_KEY}{rank}" for rank in range(world_size)]
    try:
        if not store.check(keys):
            return []
        used = {read_task(store.get(key), key)[0] for key in keys}
        nodes = expand_nodelist(env[lists[0]], variable=lists[0])
    except (DistError, RecoveryError, ValueError):
        return []
    return [node for node in dict.fromkeys(nodes) if node not in used and NODE_NAME.fullmatch(node)]


def node_index(store: Store, world_size: int, rank: int) -> tuple[int, int]:
    """``rank``'s node index and the job's node count.

    The nodes are numbered by the lowest rank on each, as the roll call numbers them, from the ranks' task records
    (which :func:`spare_nodes` found complete).
    """
    of_rank = [read_task(store.get(f"{TASK_KEY}{number}"), f"{TASK_KEY}{number}")[0] for number in range(world_size)]
    nodes = list(dict.fromkeys(of_rank))
    return nodes.index(of_rank[rank]), len(nodes)


def publish_spares(store: Store, generation: int, spares: Sequence[str]) -> None:
    """Rank 0: the spare nodes it starts replacements on for ``generation``'s lost ranks (none: the job cannot)."""
    store.set(prefix(generation) + SPARE_KEY, ",".join(spares))


def read_spares(store: Store, generation: int, lost: int) -> tuple[str, ...]:
    """The spares rank 0 published for ``generation``, one per lost rank, or ``()`` (waits as the store's requests do).

    Raises:
        RecoveryError: The value is neither empty nor ``lost`` node names, naming the key and the value; or it did
            not come (rank 0 is gone).
    """
    from torch.distributed import DistError

    key = prefix(generation) + SPARE_KEY
    try:
        raw = store.get(key)
    except DistError as error:
        raise RecoveryError(
            f"rank 0's choice of spare nodes under {key} did not come: {error}",
            "rank 0 writes it and serves the job's store; if it is gone, the job is started again"
            " (`lightning-mpi-env run` does)",
            variable=key,
        ) from error
    text = raw[:2000].decode("ascii", "replace")
    names = tuple(text.split(",")) if text else ()
    if len(raw) <= 2000 and (not names or (len(names) == lost and all(NODE_NAME.fullmatch(name) for name in names))):
        return names
    raise RecoveryError(
        f"the spare nodes under {key} in the job's store are {text!r}, not {lost} node name(s) separated by commas",
        FOREIGN_WRITE,
        variable=key,
        value=text,
    )


def start_replacement(
    layout: RankLayout, env: Mapping[str, str], node: str, joining: Joining
) -> subprocess.Popen[bytes]:
    """Start this program again on ``node`` (a step of one task there) as ``joining`` says; its output is this one's.

    Raises:
        RecoveryError: The launcher cannot run a command on ``node``, or the command does not start.
    """
    prefix_command = on_node_command(layout.launcher, env, node)
    if prefix_command is None:
        raise RecoveryError(
            f"cannot start a replacement on {node}: the launcher runs no command on a node of the job",
            "start the job again (`lightning-mpi-env run` does)",
            value=node,
        )
    command = [*prefix_command, sys.executable, *sys.orig_argv[1:]]
    try:
        return subprocess.Popen(command, env={**env, REPLACES: joining.text()}, stdin=subprocess.DEVNULL)
    except OSError as error:
        raise RecoveryError(
            f"the replacement on {node} did not start: {error}",
            "start the job again (`lightning-mpi-env run` does)",
            value=node,
        ) from error


def arrive(store: Store, joining: Joining) -> None:
    """A replacement, once it reached the job's store: say so to the survivors (:func:`await_replacements`)."""
    store.set(f"{prefix(joining.generation)}{ARRIVED_KEY}{joining.rank}", "1")


def await_replacements(
    store: Store,
    world: World,
    nodes: Sequence[str],
    timeout: float,
    started: Sequence[subprocess.Popen[bytes]] = (),
) -> None:
    """Wait until the new process in each place ``world`` lost (on ``nodes``, in order) has reached the job's store.

    A replacement starts as the program did: its launcher step, interpreter and imports may take longer than the
    process group's timeout, the survivors' bound once every member is there. So they wait for it here first, at
    most ``timeout`` seconds (the roll call's). Rank 0 passes the steps it started (in the same order): one that ends
    before its process arrived ends the wait on every rank; past ``timeout`` rank 0 ends those still starting.

    Raises:
        RecoveryError: A replacement's step ended first, or it did not arrive in time, naming its rank and node; or
            the store does not answer (rank 0 is gone).
    """
    from torch.distributed import DistError

    places = dict(zip(world.lost, nodes, strict=True))
    steps = dict(zip(world.lost, started, strict=True)) if started else {}
    keys = {rank: f"{prefix(world.number)}{ARRIVED_KEY}{rank}" for rank in world.lost}
    ended_key = prefix(world.number) + ENDED_KEY
    deadline = time.monotonic() + timeout
    try:
        while not store.check(list(keys.values())):
            for rank, step in steps.items():  # its process writes its key before it ends, if it arrived
                if step.poll() is not None and not store.check([keys[rank]]):
                    store.set(ended_key, f"{rank} {step.returncode}")
            if store.check([ended_key]):
                rank, status = _read_ended(store.get(ended_key), ended_key, places)
                raise RecoveryError(
                    f"the replacement for rank {rank} on {places[rank]} ended (exit status {status}) before it reached"
                    " the job's store",
                    "its output above says why; start the job again (`lightning-mpi-env run` does)",
                    value=places[rank],
                )
            if time.monotonic() > deadline:
                missing = [rank for rank, key in keys.items() if not store.check([key])]
                for rank in missing:
                    if rank in steps:
                        steps[rank].terminate()
                names = ", ".join(f"rank {rank} on {places[rank]}" for rank in missing)
                variable = VARIABLE["rendezvous_timeout"]
                raise RecoveryError(
                    f"the replacement for {names} did not reach the job's store within {timeout:g} s ({variable})",
                    f"a node that starts the program slower than that: raise {variable}; else start the job again"
                    " (`lightning-mpi-env run` does)",
                    variable=variable,
                    value=f"{timeout:g}",
                )
            time.sleep(ARRIVAL_POLL)
    except DistError as error:
        raise RecoveryError(
            f"the job's store did not answer while generation {world.number} waited for its replacements: {error}",
            "rank 0 serves the job's store; if it is gone, the job is started again (`lightning-mpi-env run` does)",
        ) from error


def replace_lost(
    store: Store,
    layout: RankLayout,
    environ: Mapping[str, str],
    before: World,
    after: World,
    spares: tuple[str, ...],
    address: tuple[str, int],
) -> list[subprocess.Popen[bytes]]:
    """Rank 0: start a process on each spare in the place of each rank ``before`` lost, joining ``after``."""
    started = []
    for number, node in zip(after.lost, spares, strict=True):
        node_rank, num_nodes = node_index(store, before.world_size, number)
        joining = Joining(after.number, number, after.world_size, node_rank, num_nodes, *address)
        started.append(start_replacement(layout, environ, node, joining))
    names = ", ".join(str(number) for number in after.lost)
    print(
        f"lightning-mpi-env: generation {before.number} lost rank {names} of {before.world_size}; generation"
        f" {after.number} goes on with a new process on {', '.join(spares)} in its place",
        file=sys.stderr,
        flush=True,
    )
    return started


def wait_for_replacement(replacement: subprocess.Popen[bytes]) -> None:
    """Let a replacement's step end as the job does; past :data:`ENDING_WAIT`, end it."""
    try:
        replacement.wait(ENDING_WAIT)
    except subprocess.TimeoutExpired:
        replacement.kill()
        replacement.wait()


def _read_ended(raw: bytes, key: str, places: Mapping[int, str]) -> tuple[int, int]:
    """The rank and exit status under ``key``, one of the ranks in ``places``.

    Raises:
        RecoveryError: Anything else (the store is anyone's on the network), naming the key and the value.
    """
    text = raw[:40].decode("ascii", "replace")
    found = ENDED.fullmatch(text) if len(raw) <= 40 else None
    if found is not None and int(found[1]) in places:
        return int(found[1]), int(found[2])
    raise RecoveryError(
        f"the word under {key} in the job's store is {text!r}, not a lost rank ({', '.join(map(str, places))}) and"
        " its replacement's exit status",
        FOREIGN_WRITE,
        variable=key,
        value=text,
    )
