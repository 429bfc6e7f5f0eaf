"""``lightning-mpi-env doctor``: check this process's situation and say how to fix each finding."""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from lightning_mpi_env.checks.findings import FOLDER_HINT
from lightning_mpi_env.checks.folder import FolderCheck, check_folder, shown_path
from lightning_mpi_env.core.errors import LayoutError
from lightning_mpi_env.core.launchers import LAUNCHERS, detect_launcher, inherited_variables
from lightning_mpi_env.core.layout import from_env
from lightning_mpi_env.core.namespaces import NAMESPACES
from lightning_mpi_env.core.rank_layout import RankLayout, describe_counts, even_launches, uneven_fix
from lightning_mpi_env.core.schedulers import first_host
from lightning_mpi_env.core.settings import VARIABLE, setting_errors, unknown_settings
from lightning_mpi_env.core.torch_names import TORCH
from lightning_mpi_env.core.values import shown
from lightning_mpi_env.gpu.devices import DeviceBasis, own_device, visible_devices
from lightning_mpi_env.tools.cli_output import layout_summary


class Level(str, Enum):
    """How much a finding matters."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    """One thing the doctor checked, and the fix when it is not fine."""

    level: Level
    topic: str
    message: str
    fix: str = ""
    variable: str | None = None
    value: str | None = None

    def __str__(self) -> str:
        fix = f" HINT: {self.fix}" if self.fix else ""
        return f"[{self.level.value}] {self.topic}: {self.message}{fix}"

    def as_dict(self) -> dict[str, object]:
        """The finding as JSON-ready values (``doctor --json``)."""
        return {
            "level": self.level.value,
            "topic": self.topic,
            "message": self.message,
            "hint": self.fix,
            "variable": self.variable,
            "value": self.value,
        }


def doctor_object(findings: list[Finding], host: str, rank: int | None) -> dict[str, object]:
    """``doctor --json``: ``ok`` when no finding is an error, this process's host and rank, and every finding."""
    return {
        "ok": all(finding.level is not Level.ERROR for finding in findings),
        "host": host,
        "rank": rank,
        "findings": [finding.as_dict() for finding in findings],
    }


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _nvidia_gpu_count() -> int | None:
    """GPUs the NVIDIA driver knows on this host, without CUDA; ``None`` without the driver."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else None


def _bind(address: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, port))


def _resolve(host: str) -> str:
    return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])


def diagnose(
    env: Mapping[str, str],
    *,
    module_available: Callable[[str], bool] = _module_available,
    loaded_modules: Collection[str] | None = None,
    gpu_count: Callable[[], int | None] = _nvidia_gpu_count,
    resolve: Callable[[str], str] = _resolve,
    bind: Callable[[str, int], None] = _bind,
    folders: Sequence[str] | None = None,
    probe_folder: Callable[[str], FolderCheck] = check_folder,
) -> list[Finding]:
    """Check the launcher, settings, stale variables, Lightning, mpi4py, GPUs, main address and port, and folders.

    ``folders`` are checkpoint folders, probed as the node check does (by default the working folder, Lightning's
    default ``default_root_dir``): one this host cannot use is an error on rank 0's host, which writes checkpoints,
    a warning elsewhere.

    Each ``LIGHTNING_MPI_ENV_*`` setting is read by the ranks' own reader: a value they would refuse is an error here
    too. Pure apart from the probes given (the tests replace them); the defaults look at this machine without
    importing torch, Lightning or mpi4py. ``resolve`` and ``bind`` raise ``OSError`` when they cannot.
    """
    findings = [*_launcher_findings(env), *_settings_findings(env)]
    layout: RankLayout | None
    try:
        layout = from_env(env)
    except LayoutError as error:
        findings.append(Finding(Level.ERROR, "layout", error.problem, error.hint, error.variable, error.value))
        layout = None
    if layout is not None:
        findings.append(Finding(Level.OK, "layout", layout_summary(layout)))
        if layout.launcher is not None and (layout.num_nodes is None or not layout.is_even):
            findings.append(_uneven_finding(layout))
        findings.extend(Finding(Level.WARN, "layout", warning.problem, warning.hint) for warning in layout.warnings)
        findings.extend(_torchrun_findings(env, layout))
    findings.extend(_package_findings(module_available, sys.modules if loaded_modules is None else loaded_modules))
    if layout is not None:
        findings.extend(_gpu_findings(env, layout, gpu_count()))
        findings.extend(_network_findings(layout, resolve, bind))
    writer = layout is None or layout.rank == 0
    for checked in map(probe_folder, [os.getcwd()] if folders is None else folders):
        if checked.fault is None:
            free = f" ({checked.free / (1 << 30):.1f} GiB free)" if checked.free is not None else ""
            findings.append(Finding(Level.OK, "checkpoint folder", f"{shown_path(checked.folder)} is writable{free}."))
        else:
            level = Level.ERROR if writer else Level.WARN  # elsewhere it matters to sharded checkpoints and relaunches
            findings.append(Finding(level, "checkpoint folder", f"{checked.sentence()} from this host.", FOLDER_HINT))
    return findings


def _settings_findings(env: Mapping[str, str]) -> list[Finding]:
    """Every ``LIGHTNING_MPI_ENV_*`` setting read as the package reads it, and the names it does not know."""
    findings = [
        Finding(Level.ERROR, "settings", error.problem, error.hint, error.variable, error.value)
        for error in setting_errors(env)
    ]
    findings += [
        Finding(Level.WARN, "settings", warning.problem, warning.hint, warning.variable, warning.value)
        for warning in unknown_settings(env)
    ]
    if not findings:
        given = [variable for variable in VARIABLE.values() if variable in env]
        said = f"{', '.join(given)}: valid." if given else "no LIGHTNING_MPI_ENV_* setting is set: the defaults apply."
        findings.append(Finding(Level.OK, "settings", said))
    return findings


def _uneven_finding(layout: RankLayout) -> Finding:
    # Uneven is not an error: ddp_mpi trains it. Said here because Lightning's own strategies would refuse it.
    counts = f" ({describe_counts(layout.ranks_per_node)} per node)" if layout.ranks_per_node else ""
    nodes = layout.num_nodes if layout.num_nodes is not None and layout.num_nodes_is_exact else None
    on_nodes = f" on {nodes} nodes{counts}" if nodes is not None else ""
    even = f" An even launch: {even_launches(layout.world_size, nodes)}." if nodes is not None else ""
    return Finding(
        Level.INFO,
        "uneven",
        f"{layout.launcher_name} launched {layout.world_size} ranks{on_nodes}, {layout.local_size} on this node: not "
        "the same number on every node.",
        f"{uneven_fix(layout.launcher.key if layout.launcher else None)}.{even}",
    )


def _launcher_findings(env: Mapping[str, str]) -> list[Finding]:
    launcher = detect_launcher(env)
    if launcher is None:
        found = inherited_variables(env)
        hint = (
            f"{', '.join(name for name, _ in found)} alone is inherited from a batch script, not set by a launcher: "
            f"{found[0][1].launch_hint}"
            if found
            else "Run under `mpirun`/`mpiexec`/`srun`/`flux run` to see the job's layout; alone this is one process."
        )
        return [Finding(Level.INFO, "launcher", "no launcher detected: this is a single process.", hint)]
    findings = [
        Finding(Level.OK, "launcher", f"{launcher.name} (found {launcher.marker}={shown(env[launcher.marker])}).")
    ]
    # What the launcher exports besides its row's variables (Open MPI 5's PMIX_RANK) is its own, not another's.
    own = {name for exported in launcher.flavours.values() for name in exported}
    others = [row for row in LAUNCHERS if row is not launcher and row.marker in env and row.marker not in own]
    for row in others:
        findings.append(
            Finding(
                Level.INFO,
                "launcher",
                f"{row.name} variables ({row.marker}={shown(env[row.marker])}) are present too and ignored: "
                f"{launcher.name} takes precedence.",
                "Nothing to do when they are inherited from the batch job (e.g. mpirun inside sbatch).",
            )
        )
    return findings


def _torchrun_findings(env: Mapping[str, str], layout: RankLayout) -> list[Finding]:
    findings = []
    for variable in (TORCH.node_rank, TORCH.group_rank):
        value = env.get(variable)
        if value is not None and value != str(layout.node_rank):
            findings.append(
                Finding(
                    Level.WARN,
                    "stale variable",
                    f"{variable}={shown(value)} disagrees with the resolved node rank {layout.node_rank} "
                    f"({layout.sources.get('node_rank')}).",
                    f"unset {variable} in the job script, or use `lightning-mpi-env exec --overwrite`.",
                )
            )
    address = env.get(TORCH.master_addr)
    if not address:
        return findings
    try:
        launch = (layout.launcher.host_lists, layout.launcher.name) if layout.launcher is not None else None
        # Host lists in variables only: while MASTER_ADDR is set, no host file is opened (it may be anything).
        listed = first_host(env, _no_host_files, launch=launch)
    except LayoutError:
        listed = None  # an unreadable host list does not matter while MASTER_ADDR is set
    if listed is not None and listed[0] != address:
        findings.append(
            Finding(
                Level.WARN,
                "stale variable",
                f"MASTER_ADDR={shown(address)} overrides the scheduler's first host {shown(listed[0])} ({listed[1]}).",
                f"Make sure rank 0 runs on {address}, or unset MASTER_ADDR to use the host list.",
            )
        )
    return findings


def _no_host_files(path: str) -> str:
    raise OSError(f"{path} is not read while MASTER_ADDR is set")


def _package_findings(module_available: Callable[[str], bool], loaded: Collection[str]) -> list[Finding]:
    findings = []
    installed = [namespace.top_level for namespace in NAMESPACES if module_available(namespace.top_level)]
    if len(installed) == 2:
        findings.append(
            Finding(
                Level.INFO,
                "lightning",
                "both `lightning` and `pytorch_lightning` are installed.",
                "Import one namespace throughout your script (`lightning.pytorch` or `pytorch_lightning`); a Trainer "
                "from one rejects callbacks and plugins from the other. MPIClusterEnvironment works with either.",
            )
        )
    elif installed:
        findings.append(Finding(Level.OK, "lightning", f"`{installed[0]}` is installed."))
    else:
        findings.append(Finding(Level.INFO, "lightning", "Lightning is not installed (fine for plain torch or JAX)."))
    if all(namespace.top_level in loaded for namespace in NAMESPACES):
        findings.append(
            Finding(
                Level.WARN,
                "lightning",
                "both `lightning` and `pytorch_lightning` are imported in this process.",
                "Import only one namespace.",
            )
        )
    if module_available("mpi4py"):
        findings.append(
            Finding(
                Level.INFO,
                "mpi4py",
                "mpi4py is installed, and not needed: ranks come from the launcher's variables.",
                "Do not import mpi4py just for Lightning; importing it initializes MPI (which can interfere with "
                "fork-based data loader workers).",
            )
        )
    else:
        findings.append(Finding(Level.OK, "mpi4py", "not installed, and not needed."))
    return findings


def _gpu_findings(env: Mapping[str, str], layout: RankLayout, gpus: int | None) -> list[Finding]:
    found = visible_devices(env)
    if found is not None and found[1]:
        variable, devices = found
        count, seen = len(devices), f"{variable}={shown(env[variable])}"
    elif found is not None:
        hidden = f"{found[0]}={shown(env[found[0]])} shows no GPU: this process runs on the CPU."
        return [Finding(Level.INFO, "gpus", hidden)]
    elif gpus is None:
        return [
            Finding(Level.INFO, "gpus", "no NVIDIA driver found: this process runs on the CPU or another accelerator.")
        ]
    else:
        count, seen = gpus, f"{gpus} GPU(s) on this host"
    if count == 1 and layout.local_size > 1 and found is not None:
        return [Finding(Level.OK, "gpus", f"{seen}: one GPU per rank, bound by the launcher; each rank uses device 0.")]
    choice = own_device(found, local_rank=layout.local_rank, local_size=layout.local_size, node_devices=gpus)
    if found is not None and choice.basis is DeviceBasis.UNKNOWN:
        of_node = f" of the node's {gpus}" if gpus is not None else ""
        return [
            Finding(
                Level.INFO,
                "gpus",
                f"{seen}: {count}{of_node} GPUs for this rank, fewer than the {layout.local_size} ranks on this node. "
                "The launcher binds a subset to each task (e.g. `srun --gpu-bind=closest`: the GPUs of its socket), "
                "so this rank's device is its index among the ranks that see the same GPUs, not its local rank "
                f"{layout.local_rank}; its own variables cannot say which.",
                'With Lightning, use `strategy="ddp_mpi"`: its roll call finds each rank\'s device and refuses two '
                "ranks on one GPU. Elsewhere choose the device yourself, or bind one GPU per task "
                "(`srun --gpus-per-task=1`).",
            )
        ]
    if count < layout.local_size:
        return [
            Finding(
                Level.WARN,
                "gpus",
                f"{seen} but {layout.local_size} ranks run on this node ({layout.sources.get('local_size')}): ranks "
                "would share GPUs.",
                f"Launch at most {count} rank(s) per node, or set Trainer(devices=...) to the ranks per node.",
            )
        ]
    line = f"{seen} for {layout.local_size} rank(s) on this node."
    if choice.basis is DeviceBasis.SHARED_LIST and gpus is not None:
        line += (
            f" {count} of the node's {gpus} GPUs: each rank takes the one at its local rank, as long as every rank "
            "on the node sees this same list (the roll call checks it)."
        )
    return [Finding(Level.OK, "gpus", line)]


def _network_findings(
    layout: RankLayout, resolve: Callable[[str], str], bind: Callable[[str, int], None]
) -> list[Finding]:
    try:
        address = resolve(layout.main_address)
    except (OSError, UnicodeError, ValueError) as error:  # the resolver's IDNA codec raises UnicodeError
        return [
            Finding(
                Level.ERROR,
                "main address",
                f"{shown(layout.main_address)} (from {layout.sources.get('main_address')}) does not resolve: {error}.",
                "Set MASTER_ADDR to a host name or address every node can resolve.",
            )
        ]
    findings = [Finding(Level.OK, "main address", f"{layout.main_address} resolves to {address}.")]
    if layout.rank != 0:
        return findings
    try:
        bind(address, layout.main_port)
    except (UnicodeError, ValueError) as error:
        findings.append(Finding(Level.WARN, "main port", f"could not test port {layout.main_port}: {error}."))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            findings.append(
                Finding(
                    Level.ERROR,
                    "main port",
                    f"port {layout.main_port} ({layout.sources.get('main_port')}) is already in use on {address}.",
                    "export MASTER_PORT=<a free port> to every rank (Open MPI: `mpirun -x MASTER_PORT`).",
                )
            )
        elif error.errno == errno.EADDRNOTAVAIL:
            findings.append(
                Finding(
                    Level.ERROR,
                    "main address",
                    f"rank 0 runs here, but {layout.main_address} ({address}, from "
                    f"{layout.sources.get('main_address')}) is not an address of this host: the other ranks would "
                    "wait for rank 0 somewhere else.",
                    "Set MASTER_ADDR to the host of rank 0, or make the host list's first host run rank 0.",
                )
            )
        else:
            findings.append(Finding(Level.WARN, "main port", f"could not test port {layout.main_port}: {error}."))
    else:
        findings.append(Finding(Level.OK, "main port", f"{address}:{layout.main_port} is free on rank 0's host."))
    return findings
