"""``MPIClusterEnvironment``: the layout core as a Lightning ``ClusterEnvironment`` plugin, for either namespace."""

from __future__ import annotations

import logging
import os
import signal
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from typing_extensions import override

from lightning_mpi_env.core.launchers import started_by_launcher
from lightning_mpi_env.core.network import socket_ifname_exports
from lightning_mpi_env.core.ports import DEFAULT_PORT_SOURCE
from lightning_mpi_env.core.rank_layout import RankLayout
from lightning_mpi_env.core.records import FailureRecorder
from lightning_mpi_env.core.report import restore_excepthook, shows_errors_briefly
from lightning_mpi_env.core.schedulers import job_identity
from lightning_mpi_env.core.settings import Settings
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import parse_count
from lightning_mpi_env.gpu.devices import (
    VISIBLE_DEVICE_VARIABLES,
    DeviceBasis,
    DeviceChoice,
    own_device,
    unknown_device,
    visible_devices,
)
from lightning_mpi_env.lightning.compat import quiet_entry_point_line, silence_srun_not_used
from lightning_mpi_env.lightning.device_id import warn_unbound_device
from lightning_mpi_env.lightning.entry_point import warn_without_callback
from lightning_mpi_env.lightning.errors import (
    nodes_without_launcher,
    settings_error,
    started_by_lightning_under_launcher,
    world_mismatch,
)
from lightning_mpi_env.lightning.interface import ClusterEnvironmentInterface
from lightning_mpi_env.lightning.launch import LaunchMode, Stage, find_free_port, is_per_node_launch, read_launch
from lightning_mpi_env.lightning.loop_calls import LoopCalls
from lightning_mpi_env.lightning.process_state import Change, ProcessChanges
from lightning_mpi_env.lightning.requeue import let_workers_end
from lightning_mpi_env.lightning.roll_call import before_init_process_group, run_roll_call
from lightning_mpi_env.recovery.restart import running_generation

if TYPE_CHECKING:
    from lightning_mpi_env.rollcall.store import RendezvousResult
    from lightning_mpi_env.rollcall.watchdog import Watchdog

log = logging.getLogger(__name__)


class MPIClusterEnvironment(LoopCalls, ClusterEnvironmentInterface):
    """Ranks from the launcher itself (``mpirun``/``mpiexec``/``srun``/``flux run``/``jsrun``), with no ``mpi4py``.

    Use it as ``Trainer(plugins=[MPIClusterEnvironment()])`` or ``Fabric(plugins=[MPIClusterEnvironment()])``. Made, it
    reads the launcher and scheduler rows' variables, Lightning's ``LOCAL_RANK``/``NODE_RANK``/``WORLD_SIZE`` and the
    ``LIGHTNING_MPI_ENV_*`` settings, and puts in the requeue signal's handler (undone by ``teardown()``); before
    ``init_process_group``, its roll call stops every rank on a bad one.

    Args:
        environ: The environment to read; ``os.environ`` by default.
        roll_call: Run the roll call (default: on).
        rendezvous_timeout: Seconds to wait for every rank in the roll call (default: 120).
        auto_requeue: Checkpoint and requeue on ``requeue_signal`` (default: on under a scheduler that can requeue).
        requeue_signal: The signal that asks for it; by default the one the scheduler sends before its limit
            (Slurm and PBS: ``SIGUSR1``; Grid Engine and LSF: ``SIGUSR2``).
        requeue_command: The command that puts the job back in the queue, instead of the scheduler's.
        stall_timeout: Seconds without progress on any rank before the stall watchdog stops the job (300; ``0``: off).
        stall_soft_timeout: Seconds before rank 0 reports such a stall and lets the job go on (default: 60; ``0``: no
            report).

    Each argument left out takes its ``LIGHTNING_MPI_ENV_*`` setting, else its default.
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
        self.generation = running_generation()  # restartable's: its ranks and open process group, no roll call here
        self._layout, self._mode, self._ranks = read_launch(env, self.generation)
        identity = job_identity(env)
        self._recorder = FailureRecorder.plan(
            self.settings.state_dir, self._layout.launcher_name, None if identity is None else identity[0]
        )
        if self._layout.launcher is not None:  # before the Trainer or Fabric that takes this environment is made
            self.changes.add(Change.SRUN_FILTER, silence_srun_not_used())
            if self._ranks.global_rank != 0:  # rank 0 says it for the job
                self.changes.add(Change.ENTRY_POINT_LINE, quiet_entry_point_line())
        self._fabric = socket_ifname_exports(self.settings.ifname, env)  # checked now, exported before init
        if not self.settings.roll_call:  # with the roll call, node ranks become exact before any use
            for warning in self._layout.warnings:
                warnings.warn(warning, stacklevel=2)
        self._visible = visible_devices(env)  # which accelerators this process sees, read once
        self._visible_env = {name: env[name] for name in VISIBLE_DEVICE_VARIABLES if name in env}
        self._device: DeviceChoice | None = None  # the device this rank drives, once "ddp_mpi" asked or it met
        self._stage = Stage.CONFIGURED
        self._expected: tuple[int, int] | None = None  # (devices, num_nodes) the launcher was given
        self.any_layout = False
        """Whether ``"ddp_mpi"`` takes world, ranks and devices from the launch: nodes may run different numbers."""
        self.api = "Trainer/Fabric"
        """Who takes ``devices``/``num_nodes``, for the messages (``"ddp_mpi"`` says which; a plugin is not told)."""
        self._met: RendezvousResult | None = None  # keeps rank 0's store serving until init_process_group
        self._watch_after_init: Watchdog | None = None  # "ddp_mpi"'s, started once its process group is open
        self._free_port: int | None = None
        self._made_in_pid = os.getpid()  # a copy in another process was forked or pickled there by Lightning
        self.process_group_backend: str | None = None  # the strategy's, when it says (ddp_mpi); else the device's
        self.accelerator = ""
        """The device type ``"ddp_mpi"`` drives (``"cuda"``): the roll call then finds each rank's own device."""
        self._plan_loop_calls(env, self.settings.requeue, requeue_signal, requeue_command)

    @property
    def roll_call(self) -> bool:
        """Whether the roll call runs before ``init_process_group``."""
        return self.settings.roll_call

    @property
    def met(self) -> RendezvousResult | None:
        """The roll call's outcome once it met: its client of rank 0's store, for ``init_process_group(store=...)``."""
        return self._met

    def watch_after_init(self) -> None:
        """Start the stall watchdog the roll call made for ``"ddp_mpi"``, once it opened the process group."""
        watchdog, self._watch_after_init = self._watch_after_init, None
        if watchdog is not None:
            watchdog.start()

    @property
    def rendezvous_timeout(self) -> float:
        """Seconds the roll call waits for every rank."""
        return self.settings.rendezvous_timeout

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
        if self._layout.launcher is None and self._layout.sources.get("main_port") == DEFAULT_PORT_SOURCE:
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
                raise world_mismatch(self._layout, size)
            log.debug(f"Keeping the launcher's world size {self._ranks.world_size}; Lightning proposed {size}.")

    @property
    def visible(self) -> tuple[str, list[str]] | None:
        """The variable restricting this process's accelerators and the devices it lists, or ``None`` if unset."""
        return self._visible

    @shows_errors_briefly
    def device_for(self, accelerator: str) -> DeviceChoice:
        """This rank's device, as an index among those it sees: from its variables, else the roll call, run now."""
        if self._device is not None:
            return self._device
        self.accelerator = accelerator  # the roll call then states this rank's visible set and its choice
        choice = own_device(
            self._visible,
            local_rank=self.local_rank(),
            local_size=self._layout.local_size,
            shared=self.managed_by_lightning,  # Lightning's workers inherit one environment
        )
        if choice.basis is not DeviceBasis.UNKNOWN:
            self._device = choice
            return choice
        if self.settings.roll_call and self._stage is not Stage.MET and not self.managed_by_lightning:
            self._start_roll_call()  # now, before the strategy sets up its device
        if self._device is None:
            raise unknown_device(
                choice,
                local_rank=self.local_rank(),
                local_size=self._layout.local_size,
                launcher=self._layout.launcher_name,
                roll_call=self.settings.roll_call,
            )
        return self._device

    @override
    @shows_errors_briefly
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise a ``LayoutError`` at once when ``devices`` x ``num_nodes`` does not fit the launch."""
        self._expected = (num_devices, num_nodes)
        layout = self._layout
        if self._mode is LaunchMode.NO_LAUNCHER and num_nodes > 1:
            sources = layout.sources  # no other node can find a loopback address or the port picked here at random
            unreachable = [TORCH.master_addr] if sources["main_address"] != TORCH.master_addr else []
            unreachable += [TORCH.master_port] if sources["main_port"] == DEFAULT_PORT_SOURCE else []
            if unreachable:  # the other nodes' ranks could never find this one: say so now, not at the timeout
                raise nodes_without_launcher(self.api, num_devices, num_nodes, unreachable)
        later = self.generation is not None and self.generation.number > 1  # restartable's world, not the launch's
        if layout.launcher is None or self._mode is LaunchMode.PER_NODE or later:
            return
        if is_per_node_launch(layout, num_devices, num_nodes):
            self._mode = LaunchMode.PER_NODE
            self._ranks = replace(self._ranks, node_rank=layout.rank, local_rank=None, num_nodes=layout.world_size)
            return
        roll_call, visible = self.settings.roll_call, self._visible
        error = settings_error(
            layout, self.api, num_devices, num_nodes, any_layout=self.any_layout, roll_call=roll_call, visible=visible
        )
        if error is not None:
            raise error

    @override
    def teardown(self) -> None:
        """The end of the run: put back what this environment changed process-wide (idempotent; ``process_state``)."""
        self.changes.undo()
        restore_excepthook()

    def __repr__(self) -> str:
        return f"MPIClusterEnvironment({self._layout!r})"

    def _meet_when_due(self) -> None:
        """Run the roll call at the first read of the address after the strategy's last rank proposal."""
        if self._stage is Stage.SETTING_UP:
            if not self.any_layout:  # Lightning's own strategy: it alone decides what init_process_group gets
                warn_unbound_device(self.global_rank(), self.local_rank())
                warn_without_callback()  # nor does it hand the plugin the Trainer, to add the callback to
            self._start_roll_call()

    @shows_errors_briefly
    def meet_now(self) -> None:
        """Run the roll call now, once: ``"ddp_mpi"``'s ``setup_environment`` calls it after proposing the ranks."""
        if self._stage is not Stage.MET:
            self._start_roll_call()

    def _start_roll_call(self) -> None:
        """Once per process, right before ``init_process_group``: from :meth:`meet_now`, the address or the device."""
        self._stage = Stage.MET
        # Again: in a rank forked since the environment was made (ddp_fork), or a run after a teardown.
        self.watch_requeue_signal()
        if self.generation is not None:  # restartable met every rank and opened the group: the ranks are final
            return
        before_init_process_group(
            self.changes,
            self._fabric,
            self.settings.ifname,
            self._layout.main_address,
            rank_zero=self.global_rank() == 0,
        )
        if not self.settings.roll_call:
            return
        outcome = run_roll_call(
            self._layout,
            self.settings,
            replace(self._ranks, local_rank=self.local_rank()),
            main_port=self._port(),
            managed_by_lightning=self.managed_by_lightning,
            # Under "ddp_mpi" each rank's devices is its own node's count: nothing to compare between ranks.
            expected=None if self.any_layout else self._expected,
            any_layout=self.any_layout,
            backend=self.process_group_backend,
            accelerator=self.accelerator,
            device=self._device,
            visible_env=self._visible_env,
            requeue=self.requeue,
            recorder=self._recorder,
            init_on_store=self.any_layout,  # "ddp_mpi" opens the process group on the roll call's store
        )
        self._device = outcome.device if outcome.device is not None else self._device
        nodes = outcome.result.nodes
        # The launcher's local rank stays (the device was chosen by it); the node index becomes exact.
        self._ranks = replace(self._ranks, node_rank=nodes.node_rank, num_nodes=nodes.num_nodes)
        self._met = outcome.result
        if outcome.watchdog is not None:
            self._watchdog = outcome.watchdog
            self.changes.add(Change.WATCHDOG, outcome.watchdog.stop)
            self._watch_after_init = outcome.watchdog if self.any_layout else None
            if outcome.watchdog.sigterm is not None:  # a scheduler's SIGTERM ends the data loader workers too
                # Until the rank exits, not undone at teardown: Lightning's strategy tears the environment down before
                # its loops shut the workers down (and the Trainer puts back its pre-fit handlers after that).
                outcome.watchdog.sigterm.on_note = let_workers_end
