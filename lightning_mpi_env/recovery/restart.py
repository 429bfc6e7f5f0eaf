"""``restartable(main)``: run a training function and, when a rank is lost, run it again in the same processes.

Generation 1 is the launch: the roll call meets every rank in rank 0's store, and the process group opens on that
store. When a collective fails (a peer died), every living rank leaves its group, the ranks agree which are lost
(:mod:`.agreement`), and the survivors (with a new process in each lost rank's place where the allocation has a
spare node: :mod:`.replacement`) open the next generation's group on the same store (:mod:`.groups`: where torch
can, the same group reconfigured), take rank 0's kept state (:func:`.hand_over`) and call ``main`` again. What
cannot go on that way (rank 0 lost, neither a spare nor shrinking) ends every process with one
:class:`RecoveryError`, for the launcher or ``lightning-mpi-env run`` to start the job again.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_mpi_env.core.errors import RecoveryError
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.records import FailureRecorder
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.recovery.agreement import LOOKOUT_WAIT, Lookout, agree_on_lost
from lightning_mpi_env.recovery.connections import GroupConnections, not_inherited, open_sockets
from lightning_mpi_env.recovery.ending import (
    ENDING_WAIT,
    end_here,
    end_lost,
    end_rank_0,
    post_task,
    posted_task,
    task_node,
)
from lightning_mpi_env.recovery.groups import Group
from lightning_mpi_env.recovery.handover import hand_over
from lightning_mpi_env.recovery.liveness import Watcher, connect
from lightning_mpi_env.recovery.outcome import finished, unreturned
from lightning_mpi_env.recovery.replacement import (
    Joining,
    arrive,
    await_replacements,
    publish_spares,
    read_joining,
    read_spares,
    replace_lost,
    spare_nodes,
    wait_for_replacement,
)
from lightning_mpi_env.recovery.transition import Transition, watched
from lightning_mpi_env.recovery.worlds import Relaunch, World, first, successor
from lightning_mpi_env.rollcall.claims import Claim
from lightning_mpi_env.rollcall.deadline import Deadline
from lightning_mpi_env.rollcall.process_info import process_info
from lightning_mpi_env.rollcall.store import RendezvousResult, client_of, rendezvous

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store, TCPStore  # the public torch.distributed's

T = TypeVar("T")

DEFAULT_SETTLE = 3.0
"""Seconds rank 0 waits, after the last rank that answered the alarm, for another before it names the rest lost."""

GROUP_TIMEOUT = 1800.0
"""The process group's timeout without a stall timeout set: torch's own default for gloo."""

KEPT_CHECKPOINT = "memory://lightning-mpi-env/kept"
"""The ``ckpt_path`` under which ``"ddp_mpi"``'s Trainer resumes the state rank 0 kept in memory (no file)."""


@dataclass
class Generation:
    """What ``main`` is called with: this process's place in the current generation and the state it goes on from."""

    number: int
    """1 for the launch; one more after each recovery."""
    rank: int
    """This process's rank in the default process group now (survivors are renumbered when the world shrinks)."""
    world_size: int
    resumed: Any = None
    """The state the previous generation kept (:meth:`keep`), as rank 0 held it; ``None`` in generation 1."""
    kept: Any = field(default=None, repr=False)
    node_rank: int = 0
    """This process's node among the launch's, as the roll call found it (it does not change)."""
    num_nodes: int = 1
    """The launch's number of nodes, as the roll call found it."""
    reconfigured: bool = False
    """Whether this generation's group is the process's one group reconfigured in place (torch 2.14+'s reconfigure,
    gloo) rather than a group opened anew."""
    unkept: str | None = field(default=None, repr=False)
    """Why none of this generation's state can be handed over in memory (:meth:`keep_none`); ``None``: it can."""
    recovered: dict[str, float] = field(default_factory=dict)
    """When (``time.time()``) each part of the recovery that began this generation ended on this process: ``failed``
    (``main`` raised), ``left`` (its group left), ``agreed`` (the lost ranks named), ``opened`` (this generation's
    group open), ``restored`` (the state handed over). Empty in generation 1."""

    @property
    def ckpt_path(self) -> str | None:
        """For ``Trainer.fit(ckpt_path=...)`` under ``"ddp_mpi"``: the Trainer state rank 0 kept, handed over in memory.

        ``None`` in generation 1, and where no step had finished (``generation.ckpt_path or "last"`` resumes a file).
        """
        return KEPT_CHECKPOINT if self.resumed is not None else None

    def keep(self, state: Any) -> None:
        """Keep ``state`` (a reference: no copy) as what the next generation resumes from; call it after each step.

        Keep what a finished step leaves: model and optimizer state dictionaries and the loop's position. A lost
        peer fails a step's collective before the optimizer steps, so the live tensors are those of the last
        finished step, and the step that failed is done again.
        """
        self.kept = state

    def keep_none(self, reason: str) -> None:
        """Keep nothing in memory, because of ``reason`` (the state is sharded: rank 0 holds a part of it).

        A lost rank then ends every process with one :class:`RecoveryError` saying so, for the job to start again from
        its last checkpoint.
        """
        self.kept, self.unkept = None, reason


_RUNNING: ContextVar[Generation | None] = ContextVar("lightning_mpi_env.recovery.generation", default=None)


def running_generation() -> Generation | None:
    """The generation whose ``main`` is running in this thread under :func:`restartable`, else ``None``.

    ``"ddp_mpi"`` made inside it takes the generation's ranks and its open process group, and keeps the Trainer's state.
    """
    return _RUNNING.get()


def restartable(
    main: Callable[[Generation], T],
    *,
    shrink: bool = False,
    settle: float = DEFAULT_SETTLE,
    backend: str | None = None,
    env: Mapping[str, str] | None = None,
) -> T:
    """Call ``main`` on every rank; when a rank is lost, call it again in the surviving processes. Returns its result.

    ``shrink``: go on with the survivors alone, renumbered (rank 0 stays rank 0): the world is smaller, so each
    step's global batch is too, and rank 0 says so once. Without it, where ``srun`` can start a step on a node of
    the allocation that runs no rank, rank 0 starts this program there in each lost rank's place (it joins the next
    generation and takes rank 0's kept state): the world keeps its ranks. Else a lost rank ends every process with
    a :class:`RecoveryError`, as does losing rank 0 (its process served the store). ``backend``: the process group's
    (torch's default where ``None``); its timeout is the stall timeout (``LIGHTNING_MPI_ENV_STALL_TIMEOUT``), which is
    how long the survivors wait on a frozen peer.

    An exception of ``main`` with no rank lost is the program's own: every rank raises it (or the collective error
    it met) as it would without ``restartable``.
    """
    environ = os.environ if env is None else env
    layout = from_env(environ)
    settings = Settings.from_env(environ)
    timeout = settings.stall_timeout if settings.stall_timeout > 0 else GROUP_TIMEOUT
    joining = read_joining(environ)
    if joining is None:  # the launch: every rank meets in the roll call
        met = _roll_call(layout, settings, backend, environ)
        store, main_address = met.store, met.claim.main_address
        world, rank, nodes = first(layout.world_size), layout.rank, (met.nodes.node_rank, met.nodes.num_nodes)
    else:  # a replacement rank 0 started: it joins the generation the survivors open
        store, main_address = _join(joining, timeout), joining.host
        arrive(store, joining)
        world, rank = World(joining.generation, tuple(range(joining.world_size))), joining.rank
        nodes = (joining.node_rank, joining.num_nodes)
    post_task(store, layout, environ, world.launch_ranks[rank])
    watcher = Watcher(world.world_size).start(store) if rank == 0 and joining is None else None
    line = None if watcher is not None else connect(store, main_address, world.launch_ranks[rank], os.getpid())
    held = {fd: link for fd, link in open_sockets().items() if line is not None and fd == line.fileno()}  # its copy
    endings: list[threading.Thread] = []
    replacements: list[subprocess.Popen[bytes]] = []
    lost_nodes: dict[int, str] = {}  # rank 0: each lost launch rank's node (no spare; run's record)
    identity = job_identity(environ)
    recorder = FailureRecorder.plan(settings.state_dir, layout.launcher_name, identity and identity[0])
    kept = None
    recovered: dict[str, float] = {}
    group = Group(store, backend, timeout)
    rank_0 = None  # where rank 0 runs, read once it has said so (its store may freeze with it)
    requests = Deadline("lightning-mpi-env-store-request")  # a frozen rank 0 would hold a request without end
    watch: Transition | None = None  # a survivor's, from the agreement to the next group
    try:
        while True:
            before = open_sockets()
            with watched(watch):
                group.open(world, rank)  # every rank posted where it runs before
            if watch is not None:  # the next group is open: rank 0 answered
                watch.stop()
                watch = None
            if recovered:
                recovered["opened"] = time.time()
            rank_0 = rank_0 or (posted_task(store, 0) if rank else None)
            connections = GroupConnections.opened_since(before, store.port, *([watcher.port] if watcher else []))
            # A killed rank's connections close with it, not with its loader workers: its line to rank 0 too.
            not_inherited(GroupConnections({**connections.sockets, **held}, connections.kept_ports))
            gone = functools.partial(_ended, watcher, world)
            client = client_of(store, LOOKOUT_WAIT)
            lookout = Lookout(store, client, world, rank, settle=settle, timeout=timeout, gone=gone, requests=requests)
            lookout.start()
            ending_0 = functools.partial(end_rank_0, rank_0, layout, environ, store.port, ask=rank == 1)
            generation = Generation(
                world.number,
                rank,
                world.world_size,
                node_rank=nodes[0],
                num_nodes=nodes[1],
                reconfigured=bool(group.reconfigurable),
            )
            running = _RUNNING.set(generation)
            try:
                if world.number > 1:  # what this generation keeps, until it keeps more, is what it resumed
                    generation.resumed = generation.kept = hand_over(kept, 0)
                    generation.recovered = {**recovered, "restored": time.time()}
                result = main(generation)
            except Exception as error:
                recovered = {"failed": time.time()}
                group.leave(error, connections)
                recovered["left"] = time.time()
                lost = agree_on_lost(
                    store, world, rank, settle=settle, timeout=timeout, requests=requests, store_lost=ending_0
                )
                recovered["agreed"] = time.time()
                watch = Transition(store, world, rank, timeout=timeout, store_lost=ending_0).start() if rank else None
                with watched(watch):
                    launch_ranks = [world.launch_ranks[number] for number in lost]
                    end_here(store, layout, environ, launch_ranks)
                    if lost and rank == 0:  # a frozen process among them would hold the launcher's step
                        lost_nodes.update({launch_rank: task_node(store, launch_rank) for launch_rank in launch_ranks})
                        endings.append(end_lost(store, layout, environ, launch_ranks))
                    if lost and generation.unkept is not None:
                        raise _no_state(world, lost, generation.unkept) from error
                    avoided = set(lost_nodes.values())
                    spares = _spares(store, layout, environ, world, rank, lost, shrink=shrink, avoided=avoided)
                    before_loss = world
                    world, rank = _next(world, rank, lost, error, shrink=shrink, spares=len(spares))
                    if spares:
                        address = (main_address, store.port)
                        started = (
                            [] if rank else replace_lost(store, layout, environ, before_loss, world, spares, address)
                        )
                        replacements += started
                        await_replacements(store, world, spares, settings.rendezvous_timeout, started)
                kept = generation.kept
                continue
            else:  # an error here is not main's: nothing to recover from
                # No collective is left for this rank: shut its group's connections, so that a peer still held in one
                # (a program that caught a step's error after a loss is out of step) fails now, not at the timeout.
                connections.shut()
                frozen = finished(
                    store, world, rank, lost_nodes, recorder, timeout, gone, requests=requests, store_lost=ending_0
                )
                end_here(store, layout, environ, [world.launch_ranks[number] for number in frozen])
                if not frozen or rank != 0:
                    return result
            finally:
                _RUNNING.reset(running)
                lookout.close()
            # Rank 0, where main returned on a frozen rank's peers (they caught their errors): srun would wait for it
            # (a survivor on its node has ended it, if one runs there).
            endings.append(end_lost(store, layout, environ, [world.launch_ranks[number] for number in frozen]))
            raise unreturned(
                world, {number: task_node(store, world.launch_ranks[number]) for number in frozen}, timeout
            )
    finally:
        if watch is not None:
            watch.stop()
        group.close()
        not_inherited(None)
        if watcher is not None:
            watcher.close()
        if line is not None:
            line.close()
        # Before the program ends, or the error leaves: the launcher's step ends only once the lost processes have,
        # and a replacement is a child of rank 0's process, which the step would end with it.
        for ending in endings:
            ending.join(ENDING_WAIT)
        for replacement in replacements:
            wait_for_replacement(replacement)


def _ended(watcher: Watcher | None, world: World, rank: int) -> bool:
    """Whether the process of ``world``'s ``rank`` has ended, as rank 0's watcher saw it (``False`` elsewhere)."""
    return watcher is not None and watcher.ended(world.launch_ranks[rank])


def _roll_call(
    layout: RankLayout, settings: Settings, backend: str | None, environ: Mapping[str, str]
) -> RendezvousResult:
    """The launch's roll call (:func:`rendezvous`): rank 0 says who met where."""
    claim = Claim.here(
        rank=layout.rank,
        world_size=layout.world_size,
        local_rank=layout.local_rank,
        main_address=layout.main_address,
        main_port=layout.main_port,
        local_size=layout.local_size,
        **process_info(backend, environ=environ),
    )
    met = rendezvous(claim, timeout=settings.rendezvous_timeout, launch=layout)
    if claim.rank == 0 and met.summary:
        print(met.summary, file=sys.stderr, flush=True)
    return met


def _join(joining: Joining, timeout: float) -> TCPStore:
    """A replacement's client of the job's store.

    Raises:
        RecoveryError: The store does not answer (the job ended meanwhile, or rank 0's host is gone).
    """
    import torch.distributed as dist

    try:
        store: TCPStore = dist.TCPStore(  # type: ignore[attr-defined]
            joining.host, joining.port, is_master=False, timeout=timedelta(seconds=timeout)
        )
    except (RuntimeError, TimeoutError) as error:
        raise RecoveryError(
            f"the replacement for rank {joining.rank} cannot reach the job's store at {joining.host}:{joining.port}:"
            f" {error}",
            "start the job again (`lightning-mpi-env run` does)",
            value=f"{joining.host}:{joining.port}",
        ) from error
    return store


def _spares(
    store: Store,
    layout: RankLayout,
    environ: Mapping[str, str],
    world: World,
    rank: int,
    lost: tuple[int, ...],
    *,
    shrink: bool,
    avoided: set[str],
) -> tuple[str, ...]:
    """The spare node for each lost rank, rank 0's choice on every rank; ``()`` where the world cannot keep its size.

    ``avoided``: the nodes ranks were lost on (rank 0 knows them), which are no spares.
    """
    if not lost or shrink or 0 in lost:
        return ()
    if rank == 0:
        found = [node for node in spare_nodes(store, layout, environ, world.world_size) if node not in avoided]
        chosen = tuple(found[: len(lost)]) if len(found) >= len(lost) else ()
        publish_spares(store, world.number, chosen)
        return chosen
    return read_spares(store, world.number, len(lost))


def _no_state(world: World, lost: tuple[int, ...], reason: str) -> RecoveryError:
    """The error of a generation that lost ``lost`` and kept no state (:meth:`Generation.keep_none`, ``reason``)."""
    return RecoveryError(
        f"generation {world.number} of {world.world_size} ranks lost rank {', '.join(map(str, lost))}, and no rank kept"
        f" the state in memory: {reason}",
        "start the job again from its last checkpoint (`lightning-mpi-env run` does): save one with"
        ' ModelCheckpoint(save_last=True) and pass fit(ckpt_path=generation.ckpt_path or "last")',
    )


def _next(
    world: World, rank: int, lost: tuple[int, ...], failure: Exception, *, shrink: bool, spares: int
) -> tuple[World, int]:
    """The next generation and this process's rank in it, or ``failure`` (no rank lost) or a ``RecoveryError``."""
    if not lost:
        raise failure
    after = successor(world, lost, shrink=shrink, spares=spares)
    names = ", ".join(str(number) for number in lost)
    if isinstance(after, Relaunch):
        raise RecoveryError(
            f"generation {world.number} of {world.world_size} ranks lost rank {names}, and this process cannot go on:"
            f" {after.reason}",
            "start the job again (`lightning-mpi-env run` does), add a spare node to the allocation, or pass"
            " `shrink=True` to `restartable` to go on with the survivors",
        ) from failure
    new_rank = after.rank_of(world.launch_ranks[rank])
    assert new_rank is not None  # a rank that agreed on the list is not in it
    if new_rank == 0 and after.world_size < world.world_size:
        print(
            f"lightning-mpi-env: generation {world.number} lost rank {names} of {world.world_size}; generation"
            f" {after.number} goes on with the {after.world_size} survivors, renumbered: each step's global batch is"
            f" {after.world_size}/{world.world_size} of what it was",
            file=sys.stderr,
            flush=True,
        )
    return after, new_rank
