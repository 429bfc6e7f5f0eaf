"""``MPIClusterEnvironment``: the layout core as a Lightning ``ClusterEnvironment`` plugin, for either namespace.

It subclasses neither namespace's ``ClusterEnvironment`` (importing one just to subclass it would itself mix the
two): :mod:`lightning_mpi_env.lightning.registration` registers it as a virtual subclass of each.
"""

from __future__ import annotations

import logging
import os
import signal
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

from typing_extensions import override

from lightning_mpi_env.core.devices import (
    VISIBLE_DEVICE_VARIABLES,
    DeviceBasis,
    DeviceChoice,
    own_device,
    unknown_device,
    visible_devices,
)
from lightning_mpi_env.core.failures import FailureRecorder
from lightning_mpi_env.core.launchers import SLURM, started_by_launcher
from lightning_mpi_env.core.layout import RankLayout
from lightning_mpi_env.core.network import socket_ifname_exports
from lightning_mpi_env.core.report import restore_excepthook, shows_errors_briefly
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import parse_count
from lightning_mpi_env.lightning.compat import (
    release_collectives_at_exit,
    settle_collectives_at_exit,
    silence_srun_not_used,
)
from lightning_mpi_env.lightning.device_id import warn_unbound_device
from lightning_mpi_env.lightning.entry_point import warn_without_callback
from lightning_mpi_env.lightning.interface import ClusterEnvironmentInterface
from lightning_mpi_env.lightning.launch import (
    LaunchMode,
    Ranks,
    Stage,
    check_fabric,
    devices_against_launch,
    export_fabric,
    find_free_port,
    initial_mode_and_ranks,
    known_node_count,
    nodes_against_launch,
    read_launch,
    restore_environment,
    settings_mismatch,
    started_by_lightning_under_launcher,
    uneven_layout,
    world_mismatch,
)
from lightning_mpi_env.lightning.meeting import expected_node, meet
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.lightning.requeue import Requeue, requeue_due, requeue_now

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import Watchdog

log = logging.getLogger(__name__)


class MPIClusterEnvironment(ClusterEnvironmentInterface):
    """Ranks from the launcher itself (``mpirun``/``mpiexec``/``srun``/``flux run``/``jsrun``), with no ``mpi4py``.

    Use it as ``Trainer(plugins=[MPIClusterEnvironment()])`` (``lightning.pytorch`` or ``pytorch_lightning``) or
    ``Fabric(plugins=[MPIClusterEnvironment()])``. The environment is read once, when the object is made; a bad
    layout raises :class:`~lightning_mpi_env.LayoutError` right there. The variables read are the launcher rows'
    (:mod:`lightning_mpi_env.core.launchers`), the scheduler rows' (:mod:`lightning_mpi_env.core.schedulers`),
    Lightning's own ``LOCAL_RANK``/``NODE_RANK``/``WORLD_SIZE`` and the ``LIGHTNING_MPI_ENV_*`` settings
    (:class:`~lightning_mpi_env.core.settings.Settings`).

    Three ways to run (:class:`LaunchMode`): one launcher process per rank (``mpirun -np 8`` with
    ``Trainer(devices=4, num_nodes=2)``: the launcher's ranks are the truth); one per node (``mpirun -npernode 1``
    with ``Trainer(devices=N, num_nodes=M)``: Lightning starts the N workers, node rank = launcher rank; not with
    Slurm or Flux, which export no local size); or no launcher (``python train.py``: one node, like Lightning's
    ``LightningEnvironment``, on a free port where ``MASTER_PORT`` and every job identity are unset). With
    Lightning's own strategies every node must run ``devices`` ranks; with ``"ddp_mpi"`` (:attr:`any_layout`) nodes
    may differ.

    Right before ``init_process_group`` every rank checks in on the roll call (:mod:`lightning_mpi_env.rollcall`): a
    missing, duplicate or disagreeing rank stops every process with a :class:`~lightning_mpi_env.RendezvousError`
    naming it, instead of a silent hang; node ranks become exact. When it runs is in
    :mod:`~lightning_mpi_env.lightning.compat`; checkpoint and requeue on a scheduler's warning signal in
    :mod:`~lightning_mpi_env.lightning.requeue`; what changes process-wide for the run, undone by :meth:`teardown`,
    in :mod:`~lightning_mpi_env.lightning.process_state`.

    Args:
        environ: The environment to read; ``os.environ`` by default.
        roll_call: Run the roll call; else ``LIGHTNING_MPI_ENV_ROLL_CALL`` (``0``/``1``), else on.
        rendezvous_timeout: Seconds to wait for every rank in the roll call; else
            ``LIGHTNING_MPI_ENV_RENDEZVOUS_TIMEOUT``, else 120.
        auto_requeue: Checkpoint and requeue on ``requeue_signal``; else ``LIGHTNING_MPI_ENV_REQUEUE`` (``0``/``1``),
            else on under a scheduler that can requeue.
        requeue_signal: The signal that asks for it; by default the one the scheduler sends before its limit
            (Grid Engine's ``-notify`` and LSF: ``SIGUSR2``; Slurm and PBS: ``SIGUSR1``, as Lightning's
            ``SLURMEnvironment``).
        stall_timeout: Seconds without progress on any rank, ranks not level, before the stall watchdog stops the
            job naming the stalled rank; ``0`` turns it off; else ``LIGHTNING_MPI_ENV_STALL_TIMEOUT``, else 300
            (:mod:`lightning_mpi_env.rollcall.watchdog`; it needs the roll call).
        stall_soft_timeout: Seconds before rank 0 reports such a stall and lets the job go on; ``0``: no report;
            else ``LIGHTNING_MPI_ENV_STALL_SOFT_TIMEOUT``, else 60. Only below ``stall_timeout``.
        requeue_command: The command that puts the job back in the queue, instead of the scheduler's (e.g.
            ``["qsub", "job.sh"]`` where PBS's ``qrerun`` needs a manager).
    """

    @shows_errors_briefly
    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        roll_call: bool | None = None,
        rendezvous_timeout: float | None = None,
        auto_requeue: bool | None = None,
        requeue_signal: signal.Signals | int | None = None,
        requeue_command: Sequence[str] | None = None,
        stall_timeout: float | None = None,
        stall_soft_timeout: float | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.changes = ProcessChanges()
        """What this environment changed process-wide for its run, undone by :meth:`teardown`."""
        self.settings = Settings.from_env(env).with_arguments(
            roll_call=roll_call,
            rendezvous_timeout=rendezvous_timeout,
            requeue=auto_requeue,
            stall_timeout=stall_timeout,
            stall_soft_timeout=stall_soft_timeout,
        )
        """The ``LIGHTNING_MPI_ENV_*`` settings, with the arguments given here taking precedence."""
        self._layout, spawned = read_launch(env)
        identity = job_identity(env)
        self._recorder = FailureRecorder.plan(
            self.settings.state_dir, self._layout.launcher_name, None if identity is None else identity[0]
        )
        launcher = self._layout.launcher
        if launcher is not None and launcher.key != SLURM.key:
            self.changes.add(Change.SRUN_FILTER, silence_srun_not_used())
        self._fabric = socket_ifname_exports(self.settings.ifname, env)  # checked now, exported before init
        if not self.settings.roll_call:  # with the roll call, node ranks become exact before any use
            for warning in self._layout.warnings:
                warnings.warn(warning, stacklevel=2)
        self._mode, self._ranks = initial_mode_and_ranks(self._layout, env, spawned)
        self._visible = visible_devices(env)  # which accelerators this process sees, read once
        self._visible_env = {name: env[name] for name in VISIBLE_DEVICE_VARIABLES if name in env}
        self._device: DeviceChoice | None = None  # the device this rank drives, once "ddp_mpi" asked or it met
        self._stage = Stage.CONFIGURED
        self._expected: tuple[int, int] | None = None  # (devices, num_nodes) the launcher was given
        self.any_layout = False
        """Whether the strategy (``"ddp_mpi"``) takes world, ranks, devices and sampler from the launch, so that
        nodes may run different numbers of ranks; Lightning's own strategies refuse an uneven launch."""
        self.api = "Trainer/Fabric"
        """Who takes ``devices``/``num_nodes``, for the messages (``"ddp_mpi"`` says which; a plugin is not told)."""
        self._met: RendezvousResult | None = None  # keeps rank 0's store serving until init_process_group
        self._watchdog: Watchdog | None = None  # started by the roll call, stopped at teardown
        self._steps_asked = 0  # requeue_requested() calls: a Fabric loop's steps
        self._free_port: int | None = None
        self._made_in_pid = os.getpid()  # a copy in another process was forked or pickled there by Lightning
        self.process_group_backend: str | None = None  # the strategy's, when it says (ddp_mpi); else the device's
        self.accelerator = ""
        """The device type ``"ddp_mpi"`` drives (``"cuda"``): the roll call then finds each rank's own device."""
        self.requeue = Requeue.plan(
            env, enabled=self.settings.requeue, requeue_signal=requeue_signal, command=requeue_command
        )
        """How this job checkpoints and requeues (``None``: it does not); the handler goes in when training starts."""

    @property
    def roll_call(self) -> bool:
        """Whether the roll call runs before ``init_process_group``."""
        return self.settings.roll_call

    @property
    def rendezvous_timeout(self) -> float:
        """Seconds the roll call waits for every rank."""
        return self.settings.rendezvous_timeout

    # --- what Lightning reads ------------------------------------------------------------------------------------

    @property
    def layout(self) -> RankLayout:
        """The resolved layout of this process."""
        return self._layout

    @property
    def mode(self) -> LaunchMode:
        """Who starts the processes."""
        return self._mode

    @property
    def stage(self) -> Stage:
        """Where the environment is in Lightning's life cycle."""
        return self._stage

    @property
    def managed_by_lightning(self) -> bool:
        """Whether Lightning starts the local workers and sets global ranks (one process per node, no launcher)."""
        return self._mode.managed_by_lightning

    @property
    @override
    def creates_processes_externally(self) -> bool:
        if self.managed_by_lightning:
            # Lightning's workers carry LOCAL_RANK; the process that starts them does not.
            return self._ranks.local_rank is not None
        return True

    @property
    @override
    @shows_errors_briefly
    def main_address(self) -> str:
        """Host of rank 0; read right before ``init_process_group``, it first runs the roll call (see compat)."""
        self._meet_when_due()
        return self._layout.main_address

    @property
    @override
    @shows_errors_briefly
    def main_port(self) -> int:
        """Port on the main address; read right before ``init_process_group``, it first runs the roll call."""
        self._meet_when_due()
        return self._port()

    def _port(self) -> int:
        if self._layout.launcher is None and self._layout.sources.get("main_port") == "default":
            # Like LightningEnvironment: several jobs may share a workstation. The workers inherit it as MASTER_PORT.
            if self._free_port is None:
                self._free_port = find_free_port()
            return self._free_port
        return self._layout.main_port

    @staticmethod
    @override
    def detect() -> bool:
        """Whether a supported launcher started this process."""
        return started_by_launcher(os.environ)

    @override
    def world_size(self) -> int:
        return self._ranks.world_size

    @override
    def global_rank(self) -> int:
        return self._ranks.global_rank

    @override
    @shows_errors_briefly
    def local_rank(self) -> int:
        if self._ranks.local_rank is not None:
            return self._ranks.local_rank
        # ddp_spawn/ddp_fork/ddp_notebook set it in each worker after this object was made (as LightningEnvironment).
        value = os.environ.get(TORCH.local_rank)
        return 0 if value is None else parse_count(value, variable=TORCH.local_rank)

    @override
    def node_rank(self) -> int:
        return self._ranks.node_rank

    @property
    def num_nodes(self) -> int | None:
        """Number of nodes: from the roll call once it ran, else from the launcher (``None`` when uneven)."""
        return self._ranks.num_nodes

    # --- what Lightning proposes ---------------------------------------------------------------------------------

    @override
    @shows_errors_briefly
    def set_global_rank(self, rank: int) -> None:
        if self.managed_by_lightning:
            if self._stage is not Stage.MET:
                self._ranks = replace(self._ranks, global_rank=rank)
            return
        if os.getpid() != self._made_in_pid:
            raise started_by_lightning_under_launcher(self._layout, self._made_in_pid)
        if rank != self._ranks.global_rank:
            log.debug(f"Keeping the launcher's global rank {self._ranks.global_rank}; Lightning proposed {rank}.")

    @override
    @shows_errors_briefly
    def set_world_size(self, size: int) -> None:
        # The second of Lightning's two proposals, right before init_process_group, arms the roll call (compat).
        if self._stage is Stage.CONFIGURED:
            self._stage = Stage.PROPOSED
        elif self._stage is Stage.PROPOSED:
            self._stage = Stage.SETTING_UP
        if self.managed_by_lightning:
            if self._stage is not Stage.MET:
                self._ranks = replace(self._ranks, world_size=size)
        elif size != self._ranks.world_size:
            if self._stage is Stage.SETTING_UP:
                # Lightning is about to set up torch.distributed for `size` processes: they would never all come.
                raise world_mismatch(self._layout, size)
            log.debug(f"Keeping the launcher's world size {self._ranks.world_size}; Lightning proposed {size}.")

    # --- the device ---------------------------------------------------------------------------------------------

    @property
    def visible(self) -> tuple[str, list[str]] | None:
        """The variable restricting this process's accelerators and the devices it lists, or ``None`` if unset."""
        return self._visible

    @shows_errors_briefly
    def device_for(self, accelerator: str) -> DeviceChoice:
        """The device this rank drives, as an index into the devices it sees; asked by ``"ddp_mpi"``'s root device.

        From the rank's own variables where they say it (:func:`~lightning_mpi_env.core.devices.own_device`), else
        from the roll call, run right here (:func:`~lightning_mpi_env.core.devices.assign_devices`). Made once. Not
        :meth:`local_rank`: under per-task GPU binding the device index is not the local rank.

        Args:
            accelerator: The device type the strategy drives (``"cuda"``).

        Raises:
            LayoutError: If neither the variables nor a roll call (turned off, or already past) can say.
            RendezvousError: From the roll call, e.g. two ranks on one device.
        """
        if self._device is not None:
            return self._device
        self.accelerator = accelerator  # the roll call then states this rank's visible set and its choice
        choice = own_device(
            self._visible,
            local_rank=self.local_rank(),
            local_size=self._layout.local_size,
            shared=self.managed_by_lightning,  # Lightning's workers inherit one environment
        )
        if choice.basis is DeviceBasis.UNKNOWN:
            if self.settings.roll_call and self._stage is not Stage.MET and not self.managed_by_lightning:
                self._start_meeting()  # now, before the strategy sets up its device
            if self._device is None:
                layout = self._layout
                raise unknown_device(
                    choice,
                    local_rank=self.local_rank(),
                    local_size=layout.local_size,
                    launcher=layout.launcher_name,
                    roll_call=self.settings.roll_call,
                )
            return self._device
        self._device = choice
        return choice

    # --- the launch ---------------------------------------------------------------------------------------------

    @override
    @shows_errors_briefly
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail at once when the Trainer's ``devices`` x ``num_nodes`` does not match the launched world.

        With ``"ddp_mpi"`` (:attr:`any_layout`) any layout trains: ``devices`` must be this node's number of ranks
        (every launcher exports it), and ``num_nodes`` the number of nodes where the launcher proves it (else the
        roll call's host names check it, in the strategy). With Lightning's own strategies, every node must run
        ``devices`` ranks.

        Raises:
            LayoutError: Naming the launched world, the Trainer's settings and the fix.
        """
        self._expected = (num_devices, num_nodes)
        layout = self._layout
        if layout.launcher is None or self._mode is LaunchMode.PER_NODE:
            return
        per_node_launch = layout.local_size == 1 and num_devices > 1 and num_nodes == layout.world_size
        if per_node_launch and layout.is_even:
            # One launcher process per node: Lightning starts the `num_devices` workers on each node itself.
            self._mode = LaunchMode.PER_NODE
            self._ranks = replace(self._ranks, node_rank=layout.rank, local_rank=None, num_nodes=layout.world_size)
            return
        if self.any_layout:
            self._validate_any_layout(num_devices, num_nodes)
            return
        if not layout.is_even:
            raise uneven_layout(layout, self.api, num_devices, num_nodes)
        if (num_devices, num_nodes) != (layout.local_size, layout.num_nodes):
            raise settings_mismatch(self._layout, self.api, num_devices, num_nodes, self._visible)

    def _validate_any_layout(self, num_devices: int, num_nodes: int) -> None:
        """``"ddp_mpi"``'s check: what this rank can prove; the node count otherwise waits for the roll call."""
        layout = self._layout
        if num_devices != layout.local_size:
            if not layout.is_even:
                raise devices_against_launch(layout, self.api, num_devices)
            raise settings_mismatch(layout, self.api, num_devices, num_nodes, self._visible)
        nodes = known_node_count(layout)
        if nodes is not None and num_nodes != nodes:
            raise nodes_against_launch(layout, self.api, num_nodes, nodes, layout.sources["num_nodes"])
        if nodes is None and not self.settings.roll_call and layout.is_even and num_nodes != layout.num_nodes:
            # No roll call will count the hosts: hold the given value to this node's reckoning.
            raise settings_mismatch(layout, self.api, num_devices, num_nodes, self._visible)

    @override
    def teardown(self) -> None:
        """The end of the run: put back everything this environment changed process-wide (idempotent).

        Who calls it, and what goes back: :mod:`~lightning_mpi_env.lightning.process_state`.
        """
        self.changes.undo()
        restore_excepthook()

    # --- progress, for the stall watchdog ----------------------------------------------------------------------

    def mark_progress(self, step: int, phase: int) -> None:
        """Tell the stall watchdog this rank reached ``phase`` of ``step`` (see ``watchdog.PHASES``).

        The Trainer's callback calls it at the four hooks of each training step, and ``"ddp_mpi"`` around each
        ``fabric.backward()``; it costs two assignments and no I/O.
        """
        if self._watchdog is not None:
            self._watchdog.mark(step, phase)

    def progress(self, step: int) -> None:
        """For a Fabric loop with the plugin (not ``"ddp_mpi"``): call right before each ``fabric.backward()``.

        A rank that has not reached it while others wait in backward's collectives is the stalled one. With
        ``"ddp_mpi"`` each ``fabric.backward()`` counts by itself; in a Trainer, the training step's hooks do.
        """
        self.mark_progress(step, 2)

    def __repr__(self) -> str:
        return f"MPIClusterEnvironment({self._layout!r})"

    # --- the roll call -------------------------------------------------------------------------------------------

    def _meet_when_due(self) -> None:
        """Run the roll call at the first read of the address after the strategy's last rank proposal."""
        if self._stage is Stage.SETTING_UP:
            if not self.any_layout:  # Lightning's own strategy: it alone decides what init_process_group gets
                warn_unbound_device(self.global_rank(), self.local_rank())
                warn_without_callback()  # nor does it hand the plugin the Trainer, to add the callback to
            self._start_meeting()

    @shows_errors_briefly
    def meet_now(self) -> None:
        """Run the roll call now, once: ``"ddp_mpi"``'s ``setup_environment`` calls it after proposing the ranks."""
        if self._stage is not Stage.MET:
            self._start_meeting()

    def _start_meeting(self) -> None:
        """Once per process, right before ``init_process_group``: the fabric's exports, then the roll call.

        Reached from :meth:`meet_now`, :attr:`main_address`/:attr:`main_port` or :meth:`device_for`, alike.
        """
        self._stage = Stage.MET
        settle_collectives_at_exit()  # init_process_group comes next
        self.changes.add(Change.SETTLE_AT_EXIT, release_collectives_at_exit)
        replaced = export_fabric(self._fabric)
        self.changes.add(Change.FABRIC_EXPORTS, lambda: restore_environment(replaced))
        if self.settings.ifname and self.global_rank() == 0:
            check_fabric(self.settings.ifname, self._layout.main_address)
        if self.settings.roll_call:
            self._meet()

    def _meet(self) -> None:
        """Meet every rank in the roll call (:mod:`~lightning_mpi_env.lightning.meeting`); take what it finds."""
        meeting = meet(
            rank=self.global_rank(),
            world_size=self.world_size(),
            local_rank=self.local_rank(),
            main_address=self._layout.main_address,
            main_port=self._port(),
            # Under "ddp_mpi" each rank's devices is its own node's count: nothing to compare between ranks.
            expected=None if self.any_layout else self._expected,
            backend=self.process_group_backend,
            accelerator=self.accelerator,
            device=self._device,
            visible_env=self._visible_env,
            timeout=self.rendezvous_timeout,
            expected_node=expected_node(
                self._layout,
                managed_by_lightning=self.managed_by_lightning,
                world_size=self.world_size(),
                num_nodes=self._ranks.num_nodes,
            ),
            stall_timeout=self.settings.stall_timeout,
            stall_soft_timeout=self.settings.stall_soft_timeout,
            requeue=self.requeue,
            launch=self._layout,
            any_layout=self.any_layout,
            local_size=None if self.managed_by_lightning else self._layout.local_size,
            recorder=self._recorder,
        )
        if meeting.device is not None:
            self._device = meeting.device
        nodes = meeting.result.nodes
        # The launcher's local rank stays (the device was chosen by it); the node index becomes exact.
        self._ranks = replace(self._ranks, node_rank=nodes.node_rank, num_nodes=nodes.num_nodes)
        self._met = meeting.result
        if meeting.watchdog is not None:
            self._watchdog = meeting.watchdog
            self.changes.add(Change.WATCHDOG, meeting.watchdog.stop)

    # --- requeue -------------------------------------------------------------------------------------------------

    def watch_requeue_signal(self) -> None:
        """Install the requeue signal handler for this run (idempotent; chained to the handler in place).

        Called when training starts (the Trainer's callback, after Lightning's own handlers) or by a Fabric loop's
        first :meth:`requeue_requested`; :meth:`teardown` takes it out.
        """
        plan = self.requeue
        if plan is None or Change.REQUEUE_HANDLER in self.changes:
            return
        plan.install()
        self.changes.add(Change.REQUEUE_HANDLER, plan.restore)

    @shows_errors_briefly
    def requeue_due(self, finished: int, reduce_boolean_decision: Callable[..., bool]) -> bool:
        """Whether every rank checkpoints and requeues now, after its ``finished``-th step (all ranks ask each step).

        With the roll call, the ranks agree on the step through its store from the watchdog thread
        (:mod:`lightning_mpi_env.rollcall.agreement`): until a signal comes, this reads two local variables. Without
        it, every call is a collective (``reduce_boolean_decision``, the strategy's); also when the signal is
        ``SIGTERM``, on which Lightning's Trainer ends ``fit()`` by itself at its next step, before the store could
        agree.

        Raises:
            StallError: A signal came, and not every rank answered the agreement in time.
        """
        return requeue_due(self.requeue, self._watchdog, finished, reduce_boolean_decision)

    def requeue_requested(self, fabric: object) -> bool:
        """For a Fabric loop: whether every rank checkpoints now (every rank calls it once after each step).

        A Fabric program saves its own checkpoint when this says so, then calls :meth:`requeue_now`. Until the
        signal comes it costs nothing (with the roll call; see :meth:`requeue_due`).
        """
        self.watch_requeue_signal()
        self._steps_asked += 1
        return self.requeue_due(self._steps_asked, fabric.strategy.reduce_boolean_decision)  # type: ignore[attr-defined]

    @shows_errors_briefly
    def requeue_now(self, fabric: object) -> NoReturn:
        """For a Fabric loop, after the checkpoint: rank 0 requeues the job, then every rank exits.

        Raises:
            SystemExit: With the scheduler's requeue exit status (on rank 0, 1 when the requeue command failed).
            SettingError: Outside a scheduler that can requeue, or with requeue turned off.
        """
        requeue_now(self.requeue, fabric)


__all__ = ["LaunchMode", "MPIClusterEnvironment", "Ranks", "Stage"]
