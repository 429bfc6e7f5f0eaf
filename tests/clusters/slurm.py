"""A real two-node Slurm cluster on this one machine, for tests.

One ``munged``, one ``slurmctld`` and one ``slurmd`` per node run from Debian's ``slurm-wlm`` and ``munge``
packages. Each daemon runs under ``unshare --uts`` with its own host name (``slurmctl``, ``node1``, ``node2``), so a
task started on node2 really sees ``socket.gethostname() == "node2"``. The nodes listen on 127.0.0.2, 127.0.0.3, ...
(``NodeAddr``), each slurmd on its own ``Port``; ``/etc/hosts`` gets ``127.0.0.2 node1`` and so on.

Everything else (config, state, spool, logs, pid files, the MUNGE key and socket) lives in a work directory and
clients find it through ``SLURM_CONF=<workdir>/slurm.conf``: nothing under ``/etc/slurm`` or ``/etc/munge`` is used.

Typical use (root only; installs ``slurm-wlm`` and ``munge`` with apt-get when they are missing)::

    reason = SlurmCluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster() as cluster:
        out = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "hostname"], timeout=30)
        job = cluster.sbatch("#!/bin/bash\\nsrun hostname\\n", ["--nodes=2", "--ntasks-per-node=2"])
        assert cluster.wait(job, timeout=60) == "COMPLETED"
        print(cluster.output(job))

Two clusters cannot run at once with the same ports (the base port is ``LME_SLURM_BASE_PORT`` or 16817), so tests
that use it should share one xdist group; ``start()`` raises :class:`ClusterBusyError` when another cluster holds
them, and another base port then works (each base port numbers its jobs apart, see ``first_job_id``).
``python tests/clusters/slurm.py`` starts a cluster, runs a smoke test, prints how long the start took and stops it.

Gotchas for tests: ``srun`` forwards each task's output in 1 KiB chunks, which interleave between tasks, so a task
should write its report to a file of its own (or keep each line under 1 KiB and write it in one ``write``); and
every task inherits ``SLURM_CONF`` from the client's environment, which a real cluster's tasks do not have.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.clusters.children import communicate_from
from tests.clusters.locks import file_lock

PACKAGES = ("slurm-wlm", "munge")
"""Debian packages that provide the daemons and clients."""

PMIX_PACKAGE = "libpmix-dev"
"""Debian package that ``srun --mpi=pmix`` needs: the plugin dlopens ``.../pmix2/lib/libpmix.so``, a -dev symlink."""

BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "srun",
    "sbatch",
    "salloc",
    "scancel",
    "scontrol",
    "squeue",
    "sinfo",
)
"""Programs the cluster needs (``unshare`` and ``hostname`` come with the base system)."""

DEFAULT_BASE_PORT = 16817
"""slurmctld's port; slurmd ``i`` (from 0) listens on ``base_port + 1 + i``."""

TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
"""Job states after which a job will not run again (unless requeued by hand)."""

# Variables that mark a process as already inside a launch; a client of this cluster must not inherit them.
_LAUNCH_PREFIXES = (
    *("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "FLUX_"),
    *("PBS_", "LSB_", "SGE_", "JSM_", "PALS_", "MV2_", "I_MPI_", "HYDRA_", "MPI_LOCAL"),  # other launchers' too
)
# And the variables a job script passes to its ranks: a developer's exported MASTER_ADDR would reach every task.
_LAUNCH_NAMES = frozenset(
    ("JOB_ID", "PE_HOSTFILE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    + ("NODE_RANK", "GROUP_RANK")
)
_SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_CONTROLLER_HOST = "slurmctl"


_SETUP_LOCK = Path(tempfile.gettempdir()) / "lme-slurm-setup.lock"
"""Held while installing packages or editing ``/etc/hosts``, which every cluster of this machine shares."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *_SYSTEM_PATH]))


def _missing_binaries() -> list[str]:
    return [name for name in (*BINARIES, "unshare", "hostname") if _which(name) is None]


def _dpkg_installed(package: str) -> bool:
    if _which("dpkg-query") is None:
        return False
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip().endswith(" installed")


def _start_time(pid: int | str) -> str | None:
    """The process's start time (field 22 of ``/proc/PID/stat``): with the pid, it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _uts_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _mentions(pid: str, marker: str) -> bool:
    """Whether the process's command line or environment contains ``marker`` (e.g. the work directory)."""
    for part in ("cmdline", "environ"):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{pid}/{part}").read_bytes():
                return True
    return False


def _sweep(
    namespaces: Iterable[str], *, marker: str | None = None, spare: Iterable[int] = (), timeout: float = 5.0
) -> None:
    """SIGKILL the processes in the given UTS namespaces until none is left.

    A namespace's inode number is reused once it is gone, so pass a namespace bare only while a daemon of ours
    holds it; for one that may be gone, pass ``marker`` too, and only processes that mention it are killed.

    Args:
        namespaces: ``uts:[inode]`` names; this process's own namespace is always left alone.
        marker: If given, kill only processes whose command line or environment contains it.
        spare: Pids not to kill (the daemons themselves).
        timeout: Give up after this many seconds.
    """
    wanted = set(namespaces) - {_uts_namespace("self")}
    spared = {str(pid) for pid in spare}
    deadline = time.monotonic() + timeout
    while wanted:
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or entry in spared or _uts_namespace(entry) not in wanted:
                continue
            if marker is not None and not _mentions(entry, marker):
                continue
            found = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _hosts_names(path: Path) -> dict[str, str]:
    """Map each host name in an ``/etc/hosts`` file to the first address given for it."""
    names: dict[str, str] = {}
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            names.setdefault(name, fields[0])
    return names


class ClusterBusyError(RuntimeError):
    """Another cluster (or program) holds this cluster's ports: try another base port."""


class ClientTimeout(subprocess.TimeoutExpired):
    """A client ran past its time limit; the message ends with its last output and the cluster's state.

    A plain ``TimeoutExpired`` names only the command: a job that waited for a node, or a step that hung, looks
    the same in a CI log. Output tails are kept short.
    """

    def __init__(
        self, cmd: list[str], timeout: float, output: str | None, stderr: str | None, cluster_state: str
    ) -> None:
        super().__init__(cmd, timeout, output, stderr)
        self.cluster_state = cluster_state

    def __str__(self) -> str:
        tail = ((self.output or "") + (self.stderr or ""))[-4000:]
        return f"{super().__str__()}\n--- its output, last 4000 characters:\n{tail}\n--- then:\n{self.cluster_state}"


CLIENT_HANG_LIMIT = 300.0
"""Seconds a client run with ``after`` gets to print it: a limit that only ends a hang."""


DAEMON_LOG_LINES = 25
"""Lines of each Slurm daemon's log that a failure message ends with."""


class SlurmCluster:
    """A running Slurm cluster of ``nodes`` nodes (``node1``...) on this machine.

    Attributes:
        nodes: The node names, ``node1`` to ``nodeN``.
        addresses: Each node's ``NodeAddr`` (127.0.0.2, 127.0.0.3, ...).
        cpus_per_node: ``CPUs=`` of every node in ``slurm.conf`` (more than the machine has is fine).
        base_port: slurmctld's port; node ``i`` listens on ``base_port + 1 + i``.
        first_job_id: The first job's id (``FirstJobId``).
        workdir: The work directory once started, else None.
        start_seconds: How long the last ``start()`` took, in seconds.
    """

    def __init__(
        self,
        nodes: int = 2,
        cpus_per_node: int = 4,
        base_port: int | None = None,
        *,
        pmix: bool = False,
        first_job_id: int | None = None,
    ) -> None:
        """Describe a cluster; nothing runs until ``start()``.

        Args:
            nodes: Number of compute nodes (1 to 10).
            cpus_per_node: CPUs declared for each node.
            base_port: slurmctld's port; defaults to ``LME_SLURM_BASE_PORT`` or 16817.
            pmix: Also install ``libpmix-dev`` so that ``srun --mpi=pmix`` works (``pmi2`` needs nothing).
            first_job_id: The first job's id; ``100 * base_port`` by default, so that two clusters on different
                ports never give out the same job id (a port derived from ``SLURM_JOB_ID`` would clash).
        """
        if not 1 <= nodes <= 10:
            raise ValueError(f"nodes must be 1..10, not {nodes}")
        self.nodes = [f"node{i + 1}" for i in range(nodes)]
        self.addresses = [f"127.0.0.{i + 2}" for i in range(nodes)]
        self.cpus_per_node = cpus_per_node
        self.pmix = pmix
        self.base_port = base_port or int(os.environ.get("LME_SLURM_BASE_PORT", DEFAULT_BASE_PORT))
        self.first_job_id = first_job_id or 100 * self.base_port
        self.workdir: Path | None = None
        self.start_seconds = 0.0
        self._owns_workdir = False
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._namespaces: set[str] = set()
        self._script_count = 0

    # ----------------------------------------------------------------------------------------------- availability

    @classmethod
    def unavailable_reason(cls, pmix: bool = False) -> str | None:
        """Why no cluster can run here, or None when ``start()`` should work.

        Args:
            pmix: Also require ``srun --mpi=pmix`` (``libpmix-dev`` installed or installable).

        Returns:
            None when running as root on Linux with ``unshare --uts`` permitted and the Slurm/MUNGE programs either
            installed or installable with apt-get; otherwise a sentence fit for ``pytest.skip``. Setting
            ``LME_SLURM_CLUSTER=0`` also makes it return a reason.
        """
        if os.environ.get("LME_SLURM_CLUSTER", "1") == "0":
            return "LME_SLURM_CLUSTER=0 turns the real Slurm cluster off"
        if not sys.platform.startswith("linux"):
            return "a real Slurm cluster needs Linux"
        if os.geteuid() != 0:
            return "a real Slurm cluster needs root (slurmd under unshare --uts, /etc/hosts entries, SlurmUser=root)"
        missing = _missing_binaries()
        if pmix and not _dpkg_installed(PMIX_PACKAGE):
            missing.append(PMIX_PACKAGE)
        if missing and _which("apt-get") is None:
            return f"Slurm/MUNGE programs missing ({', '.join(missing)}) and no apt-get to install them"
        unshare = _which("unshare")
        if unshare is None:
            return "unshare (util-linux) is missing"
        probe = subprocess.run([unshare, "--uts", "true"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            return f"unshare --uts is not permitted here: {probe.stderr.strip()}"
        return None

    @staticmethod
    def ensure_installed(pmix: bool = False, timeout: float = 900) -> None:
        """Install ``slurm-wlm`` and ``munge`` with apt-get when any program is missing (idempotent).

        Args:
            pmix: Also install ``libpmix-dev`` (for ``srun --mpi=pmix``) if it is missing.
            timeout: Seconds allowed for ``apt-get update`` and for ``apt-get install`` each.

        Raises:
            RuntimeError: A program is missing and cannot be installed (not root, or apt-get failed).
        """
        missing = _missing_binaries()
        packages = list(PACKAGES) if missing else []
        if pmix and not _dpkg_installed(PMIX_PACKAGE):
            packages.append(PMIX_PACKAGE)
        if not packages:
            return
        if os.geteuid() != 0 or _which("apt-get") is None:
            raise RuntimeError(f"missing {missing or packages}; install {' '.join(packages)} (needs root and apt-get)")
        with file_lock(_SETUP_LOCK):  # a second apt-get at once would fail on dpkg's lock
            if not _missing_binaries() and (not pmix or _dpkg_installed(PMIX_PACKAGE)):
                return  # another process installed them while we waited
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            # No recommends: slurm-wlm-plugins (HDF5, RRD, ...) would bring ~150 packages, ~85 MB, none of them used.
            install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
            for argv in (["apt-get", "update", "-qq"], install):
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
        still = _missing_binaries()
        if still:
            raise RuntimeError(f"after installing {PACKAGES}, still missing {still}")

    def ensure_hosts(self, hosts_file: Path = Path("/etc/hosts")) -> None:
        """Append ``127.0.0.N nodeM`` lines that ``hosts_file`` lacks (idempotent).

        Args:
            hosts_file: The hosts file to check and extend.

        Raises:
            RuntimeError: A node name already maps to another address.
        """
        with file_lock(_SETUP_LOCK):  # two processes at once would both append the lines
            known = _hosts_names(hosts_file)
            lines = []
            for name, address in zip(self.nodes, self.addresses, strict=True):
                if name not in known:
                    lines.append(f"{address} {name}\n")
                elif known[name] != address:
                    raise RuntimeError(f"{hosts_file} maps {name} to {known[name]}, the cluster needs {address}")
            if lines:
                text = hosts_file.read_text()
                with hosts_file.open("a") as handle:
                    handle.write(("" if text.endswith("\n") or not text else "\n") + "".join(lines))

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def ports(self) -> list[int]:
        """slurmctld's port, then each slurmd's."""
        return [self.base_port + i for i in range(len(self.nodes) + 1)]

    def daemon_pid(self, node: str) -> int:
        """The process id of ``node``'s slurmd (for a test that stops it, as on a node that hangs).

        Raises:
            KeyError: ``node`` is not one of this cluster's started nodes.
        """
        if node not in self.nodes or node not in self._procs:
            raise KeyError(f"{node} is not a started node of this cluster ({', '.join(self.nodes)})")
        return self._procs[node].pid

    @property
    def hosts(self) -> tuple[str, ...]:
        """The host name each node's tasks see (``socket.gethostname()``), in the job's node order."""
        return tuple(self.nodes)

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` clients use (``SLURM_CONF``)."""
        if self.workdir is None:
            raise RuntimeError("the cluster is not started")
        return self.workdir / "slurm.conf"

    @property
    def running(self) -> bool:
        """Whether every daemon started by ``start()`` is still alive."""
        return bool(self._procs) and all(proc.poll() is None for proc in self._procs.values())

    @property
    def env(self) -> dict[str, str]:
        """The variables a client (srun, sbatch, scontrol...) needs: ``SLURM_CONF`` and a ``PATH`` with them."""
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
        path += [p for p in _SYSTEM_PATH if p not in path]
        return {"SLURM_CONF": str(self.conf), "PATH": os.pathsep.join(path)}

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a client process.

        It is this process's environment without any variable of an enclosing launch or job (``SLURM_*``,
        ``PMI_*``, ``PMIX_*``, ``OMPI_*``, ``PRTE_*``, ``FLUX_*``, ``PBS_*``..., ``MASTER_ADDR``, ``RANK``...), plus
        ``env``, plus ``extra``.

        Args:
            extra: Variables to add or override last.

        Returns:
            A complete environment mapping.
        """
        base = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_PREFIXES) and k not in _LAUNCH_NAMES}
        return {**base, **self.env, **(extra or {})}

    def _registry(self) -> Path:
        return Path(tempfile.gettempdir()) / f"lme-slurm-{self.base_port}.json"

    def _reap_stale(self) -> None:
        """Stop a cluster left on our ports by a test process that died without ``stop()``.

        Raises:
            RuntimeError: The cluster recorded there still has a live owner (this process included).
        """
        registry = self._registry()
        try:
            record = json.loads(registry.read_text())
        except (OSError, ValueError):
            return
        owner, born = record.get("owner", [0, ""])
        if owner and _start_time(owner) == born:
            raise ClusterBusyError(f"a Slurm cluster on port {self.base_port} is in use by pid {owner} ({registry})")
        workdir = str(record.get("workdir", ""))
        live = set()
        for pid, pid_born in record.get("pids", []):
            if workdir and _start_time(pid) == pid_born and _mentions(str(pid), workdir):
                if (ns := _uts_namespace(pid)) is not None:
                    live.add(ns)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        _sweep(live)
        if workdir:
            _sweep(set(record.get("namespaces", [])) - live, marker=workdir)
            if record.get("owns_workdir"):
                shutil.rmtree(workdir, ignore_errors=True)
        registry.unlink(missing_ok=True)

    def _write_conf(self, work: Path) -> None:
        lines = [
            "# Written by tests/clusters/slurm.py: a throwaway cluster; see that module.",
            "ClusterName=lmetest",
            f"SlurmctldHost={_CONTROLLER_HOST}(127.0.0.1)",
            f"SlurmctldPort={self.base_port}",
            f"FirstJobId={self.first_job_id}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also delays a requeued job's restart (default 120 s).
            f"AuthInfo=socket={work}/munge/munge.sock,cred_expire=5",
            f"StateSaveLocation={work}/state",
            f"SlurmdSpoolDir={work}/spool/%n",
            # Per-node TmpFS: the mpi/pmix plugin puts its client directory there, and the nodes share one /tmp.
            f"TmpFS={work}/tmp/%n",
            f"SlurmctldPidFile={work}/run/slurmctld.pid",
            f"SlurmdPidFile={work}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={work}/log/slurmctld.log",
            f"SlurmdLogFile={work}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # Schedule often: a requeued job becomes eligible after cred_expire + 1 s, then waits for a pass.
            "SchedulerParameters=bf_interval=1,sched_interval=1",
            "ReturnToService=2",
            "JobRequeue=1",
            "MinJobAge=300",
            "KillWait=5",
            "InactiveLimit=0",
            "MessageTimeout=10",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
        ]
        for i, (name, address) in enumerate(zip(self.nodes, self.addresses, strict=True)):
            lines.append(
                f"NodeName={name} NodeAddr={address} NodeHostname={name} Port={self.base_port + 1 + i} "
                f"CPUs={self.cpus_per_node} State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        (work / "slurm.conf").write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str], hostname: str | None = None) -> None:
        assert self.workdir is not None
        if hostname is not None:
            command = " ".join(f"'{arg}'" for arg in argv)
            argv = [str(_which("unshare")), "--uts", "sh", "-c", f"hostname {hostname} && exec {command}"]
        env = {"PATH": os.pathsep.join(_SYSTEM_PATH), "LANG": "C", "SLURM_CONF": str(self.conf)}
        with (self.workdir / "log" / f"{name}.out").open("wb") as out:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def _fail(self, message: str) -> RuntimeError:
        logs = []
        if self.workdir is not None:
            for log in sorted((self.workdir / "log").glob("*")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                logs.append(f"--- {log.name}\n" + "\n".join(tail))
        self.stop()
        return RuntimeError(message + "\n" + "\n".join(logs))

    def start(self, workdir: str | os.PathLike[str] | None = None, timeout: float = 30) -> SlurmCluster:
        """Install if needed, write the config and start munged, slurmctld and the slurmds; wait until all idle.

        Args:
            workdir: Directory for config, state, logs and job output; a fresh temporary one (removed by ``stop()``)
                when None. An existing directory is reused, its old state and spool cleared.
            timeout: Seconds to wait for every node to report ``idle``.

        Returns:
            This cluster, started.

        Raises:
            ClusterBusyError: Another cluster, or another program, holds the ports.
            RuntimeError: The cluster could not start (a daemon died...); the logs' tails are quoted.
        """
        if self._procs:
            raise RuntimeError("the cluster is already started")
        began = time.monotonic()
        self.ensure_installed(pmix=self.pmix)
        self.ensure_hosts()
        # Two callers on one base port at once (two test workers) would both find the ports free and the second's
        # daemons would die: one at a time, until the registry names the owner.
        with file_lock(self._registry().with_suffix(".lock")):
            self._start_locked(workdir, timeout)
        self.start_seconds = time.monotonic() - began
        return self

    def _start_locked(self, workdir: str | os.PathLike[str] | None, timeout: float) -> None:
        self._reap_stale()
        busy = [port for port in self.ports if not _port_free(port)]
        if busy:
            raise ClusterBusyError(f"ports {busy} are in use; set LME_SLURM_BASE_PORT or base_port to other ports")
        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="lme-slurm-"))
            self._owns_workdir = True
        else:
            self.workdir = Path(workdir).resolve()
            self._owns_workdir = False
        work = self.workdir
        work.mkdir(parents=True, exist_ok=True)
        work.chmod(0o755)  # munged wants its socket's directories searchable by all
        for sub in ("state", "spool", "tmp"):
            shutil.rmtree(work / sub, ignore_errors=True)
        subs = ["munge", "state", "log", "run", "jobs", "out"]
        subs += [f"{top}/{node}" for top in ("spool", "tmp") for node in self.nodes]
        for sub in subs:
            (work / sub).mkdir(parents=True, exist_ok=True)
            (work / sub).chmod(0o755)
        key = work / "munge" / "munge.key"
        key.unlink(missing_ok=True)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf(work)

        munge = work / "munge"
        (munge / "munge.sock").unlink(missing_ok=True)
        self._spawn(
            "munged",
            [
                str(_which("munged")),
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge}/munge.sock",
                f"--pid-file={work}/run/munged.pid",
                f"--log-file={work}/log/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
        )
        deadline = time.monotonic() + timeout
        while not (munge / "munge.sock").exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise self._fail("munged did not start")
            time.sleep(0.02)
        self._spawn("slurmctld", [str(_which("slurmctld")), "-D", "-f", str(self.conf)], hostname=_CONTROLLER_HOST)
        for name in self.nodes:
            self._spawn(name, [str(_which("slurmd")), "-D", "-N", name, "-f", str(self.conf)], hostname=name)

        while True:
            dead = [name for name, proc in self._procs.items() if proc.poll() is not None]
            if dead:
                raise self._fail(f"daemon(s) {dead} exited during start")
            states = self.node_states()
            if all(states.get(name) == "idle" for name in self.nodes):
                break
            if time.monotonic() > deadline:
                raise self._fail(f"nodes not idle after {timeout} s: {states or 'sinfo gave no answer'}")
            time.sleep(0.1)

        own = _uts_namespace("self")
        self._namespaces = {ns for proc in self._procs.values() if (ns := _uts_namespace(proc.pid)) and ns != own}
        record = {
            "owner": [os.getpid(), _start_time(os.getpid())],
            "workdir": str(work),
            "pids": [[proc.pid, _start_time(proc.pid)] for proc in self._procs.values()],
            "namespaces": sorted(self._namespaces),
            "owns_workdir": self._owns_workdir,
        }
        self._registry().write_text(json.dumps(record))

    def stop(self, timeout: float = 10) -> None:
        """Cancel all jobs, stop every daemon and kill whatever is left on the nodes (job tasks, slurmstepd).

        Safe to call twice or after a failed start. A temporary work directory made by ``start()`` is removed.

        Args:
            timeout: Seconds to wait for the daemons to exit on SIGTERM before SIGKILL.
        """
        if not self._procs:
            return
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            # Let Slurm end the jobs itself first, so that srun clients still running get told and exit.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run(["scancel", "--user=root"], timeout=5)
                drain = time.monotonic() + 5
                while time.monotonic() < drain and self.run(["squeue", "-h", "-o", "%i"], timeout=5).stdout.strip():
                    time.sleep(0.1)
        # While a slurmd lives, its namespace is surely ours: kill all else in it (slurmstepd, tasks) first.
        # (Not in slurmctld's: killing its slurmscriptd would hang slurmctld's shutdown.)
        alive = {proc.pid for name, proc in self._procs.items() if name in self.nodes and proc.poll() is None}
        _sweep({ns for pid in alive if (ns := _uts_namespace(pid)) is not None}, spare=alive)
        # Then the slurmds, slurmctld, and munged (which both still need).
        order = [*self.nodes, "slurmctld", "munged"]
        for name in order:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()  # not the group: slurmctld stops its slurmscriptd itself
        deadline = time.monotonic() + timeout
        for name in order:
            proc = self._procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if self.workdir is not None:  # namespaces now maybe gone (and their numbers reused): check each process
            _sweep(self._namespaces, marker=str(self.workdir))
        self._procs.clear()
        self._namespaces.clear()
        self._registry().unlink(missing_ok=True)
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> SlurmCluster:
        """Start the cluster (in a temporary work directory) unless it is already started."""
        if not self._procs:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the cluster."""
        self.stop()

    # --------------------------------------------------------------------------------------------------- clients

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` abbreviates it (``idle``, ``alloc``, ``comp*``...); {} if sinfo fails."""
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            env=self.client_env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if done.returncode != 0:
            return {}
        return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)

    def wait_idle(self, nodes: Iterable[str] | None = None, timeout: float = 300) -> None:
        """Wait until ``nodes`` (all by default) are ``idle``: the last job has finished completing on each.

        A job's client (``salloc``, ``srun``) returns before every slurmd has ended the job; a node still
        completing is not allocated, and one that then hangs stays completing. A test that hangs a node, or needs
        every node, waits here first. A node brought back (``SIGCONT``) may be ``down`` for a while (``SlurmdTimeout``)
        until it registers again (``ReturnToService=2``).

        Raises:
            RuntimeError: A node is not idle after ``timeout`` seconds; every node's state is quoted.
        """
        wanted = list(self.nodes if nodes is None else nodes)
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(name) == "idle" for name in wanted):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"node(s) {wanted} not idle after {timeout:g} s: {states or 'sinfo gave no answer'}")
            time.sleep(0.2)

    def describe(self) -> str:
        """The nodes' and jobs' states (``sinfo -N``, ``squeue``) and the daemons' last log lines, for a failure
        message; never raises."""
        parts = []
        for argv in (["sinfo", "-N", "-o", "%N %t %E"], ["squeue", "-o", "%i %j %T %R %N"]):
            try:
                done = subprocess.run(
                    argv, env=self.client_env(), capture_output=True, text=True, check=False, timeout=15
                )
                parts.append(f"$ {' '.join(argv)}\n{(done.stdout + done.stderr).strip()}")
            except (OSError, subprocess.SubprocessError) as error:
                parts.append(f"$ {' '.join(argv)}\n{error}")
        logs = sorted((self.workdir / "log").glob("slurm*.log")) if self.workdir is not None else []
        for log in logs:  # slurmctld's and each slurmd's: a signal or a message lost on the way shows there
            try:
                lines = log.read_text(errors="replace").splitlines()[-DAEMON_LOG_LINES:]
            except OSError as error:
                lines = [str(error)]
            parts.append(f"$ tail -n {DAEMON_LOG_LINES} {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def run(
        self,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        check: bool = False,
        after: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client (``srun``, ``salloc``, ``scontrol``...) and capture its output as text.

        On timeout the client gets SIGINT twice (srun then cancels its step), then SIGKILL.

        Args:
            argv: The command line.
            timeout: Seconds before the client is stopped and :class:`ClientTimeout` is raised.
            env: Variables added to ``client_env()``.
            cwd: Working directory; the work directory by default.
            check: Raise ``subprocess.CalledProcessError`` on a non-zero exit.
            after: Count ``timeout`` from the moment the client has printed this (on stdout or stderr), not from
                its start: for a test of the time limit itself, whose client must get that far first (``salloc``'s
                "queued and waiting for resources"). It gets :data:`CLIENT_HANG_LIMIT` seconds to print it.

        Returns:
            The finished process, with ``stdout`` and ``stderr`` as strings.
        """
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd or self.workdir,
            env=self.client_env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wanted = None if after is None else after.encode()
            seen = None if wanted is None else lambda out, err: wanted in out or wanted in err
            stdout, stderr = communicate_from(proc, timeout, seen, CLIENT_HANG_LIMIT)
        except subprocess.TimeoutExpired as expired:
            state = self.describe()  # before the client goes: its job, pending or running, is still listed
            for _ in range(2):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
                time.sleep(0.2)
            try:
                stdout, stderr = proc.communicate(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    stdout, stderr = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired as held:  # a grandchild holds the pipes: report what came so far
                    stdout, stderr = (
                        (part or b"").decode(errors="replace") if isinstance(part, bytes) else (part or "")
                        for part in (held.output, held.stderr)
                    )
            raise ClientTimeout(list(argv), expired.timeout, stdout, stderr, state) from None
        done = subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
        if check:
            done.check_returncode()
        return done

    def sbatch(self, script_text: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """Submit a batch script; its output goes to ``output(job_id)`` unless ``args`` name ``--output``.

        Args:
            script_text: The script; ``#!/bin/bash`` is prepended when it has no ``#!`` line.
            args: Extra sbatch options, e.g. ``["--nodes=2", "--ntasks-per-node=2"]``.
            env: Variables added to ``client_env()`` (sbatch exports them to the job by default).

        Returns:
            The job id (for an array, the array's job id).

        Raises:
            RuntimeError: sbatch failed.
        """
        assert self.workdir is not None, "the cluster is not started"
        if not script_text.startswith("#!"):
            script_text = "#!/bin/bash\n" + script_text
        self._script_count += 1
        script = self.workdir / "jobs" / f"job{self._script_count}.sh"
        script.write_text(script_text)
        script.chmod(0o755)
        argv = ["sbatch", "--parsable"]
        if not any(a == "-o" or a.startswith(("--output", "-o")) for a in args):
            argv.append(f"--output={self.workdir}/out/%j.out")
        done = self.run([*argv, *args, str(script)], timeout=30, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def output_path(self, job_id: str) -> Path:
        """Where a job submitted by ``sbatch()`` without ``--output`` writes its output."""
        assert self.workdir is not None, "the cluster is not started"
        return self.workdir / "out" / f"{job_id}.out"

    def output(self, job_id: str) -> str:
        """The output so far of a job submitted by ``sbatch()`` without ``--output`` ("" if none yet)."""
        path = self.output_path(job_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def job_info(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job -o`` parsed: one dict per record (an array job has one per task).

        Values containing spaces are cut at the first space; an unknown (or purged) job gives ``[]``.
        """
        done = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=15)
        if done.returncode != 0:
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in done.stdout.splitlines() if line.strip()]

    def job_state(self, job_id: str) -> str | None:
        """The job's ``JobState`` (array tasks' distinct states joined by ``,``), or None if unknown."""
        states = sorted({record.get("JobState", "") for record in self.job_info(job_id)})
        return ",".join(states) if states else None

    def wait_state(self, job_id: str, states: Iterable[str], timeout: float = 60) -> str:
        """Wait until the job's state is one of ``states``.

        Args:
            job_id: The job.
            states: Acceptable states, e.g. ``{"RUNNING"}``.
            timeout: Seconds to wait.

        Returns:
            The state reached.

        Raises:
            TimeoutError: Not reached in time (the last state seen is quoted).
        """
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in wanted:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout} s (waiting for {sorted(wanted)})")
            time.sleep(0.1)

    def wait(self, job_id: str, timeout: float = 60) -> str:
        """Wait until the job (every task of an array) has finished and return its final state.

        Raises:
            TimeoutError: The job is still queued or running after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state is not None and set(state.split(",")) <= TERMINAL_STATES:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout} s")
            time.sleep(0.1)

    def wait_output(self, job_id: str, text: str, timeout: float = 60, count: int = 1) -> str:
        """Wait until the job's output (see ``output()``) contains ``text`` at least ``count`` times.

        Returns:
            The output at that moment.

        Raises:
            TimeoutError: Not seen in time (the output so far is quoted).
        """
        deadline = time.monotonic() + timeout
        while True:
            out = self.output(job_id)
            if out.count(text) >= count:
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id}: {text!r} x{count} not in output after {timeout} s:\n{out}")
            time.sleep(0.1)

    def signal(
        self, job_id: str, sig: str = "USR1", *, batch: bool = False, full: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``scancel --signal=SIG [--batch|--full] JOB``.

        Without flags Slurm signals the job's steps only (not the batch shell); ``batch`` signals only the batch
        shell; ``full`` signals the batch shell and all steps.
        """
        argv = ["scancel", f"--signal={sig}"]
        if batch:
            argv.append("--batch")
        if full:
            argv.append("--full")
        return self.run([*argv, str(job_id)], timeout=15)

    def requeue(self, job_id: str, *, hold: bool = False) -> subprocess.CompletedProcess[str]:
        """``scontrol requeue JOB`` (or ``requeuehold``); the job restarts with ``SLURM_RESTART_COUNT`` raised."""
        return self.run(["scontrol", "requeuehold" if hold else "requeue", str(job_id)], timeout=15)

    def cancel(self, job_id: str) -> subprocess.CompletedProcess[str]:
        """``scancel JOB``."""
        return self.run(["scancel", str(job_id)], timeout=15)


def _main() -> int:
    reason = SlurmCluster.unavailable_reason()
    if reason:
        print(f"unavailable: {reason}")
        return 1
    with SlurmCluster() as cluster:
        print(f"started in {cluster.start_seconds:.2f} s, SLURM_CONF={cluster.conf}")
        done = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "-l", "hostname"], timeout=60)
        print(done.stdout + done.stderr, end="")
        job = cluster.sbatch("srun -l hostname\n", ["--nodes=2", "--ntasks-per-node=1"])
        print(f"batch job {job}: {cluster.wait(job, timeout=60)}")
        print(cluster.output(job), end="")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(_main())
