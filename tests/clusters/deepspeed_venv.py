"""Real DeepSpeed (``deepspeed`` from PyPI) for the tests, in a venv of its own under ``.venv/launchers/deepspeed``.

DeepSpeed is no dependency of this package, and the main venv must not have it: the plugin's tests without
DeepSpeed, and every program there, see exactly what a user without it sees. So it lives beside the MPI launchers'
venvs (:mod:`tests.clusters.hydra`), installed on first use by the ``deepspeed`` fixture, under a file lock.

- **The main venv's torch, Lightning and this checkout, not copies.** ``deepspeed`` requires ``torch``, and a
  resolver would fetch the CUDA build of the newest torch (several GB). The venv instead holds one ``.pth`` file whose
  ``site.addsitedir`` puts the main venv's ``site-packages`` after its own (with that directory's own ``.pth`` files:
  the editable install of this checkout), and ``pip install --no-deps`` of :data:`REQUIREMENTS`: DeepSpeed and
  those of its requirements the main venv lacks, pinned to what ``pip install deepspeed==0.19.8`` resolves to beside
  torch 2.13. ``pip check`` then confirms that every requirement of theirs is met.
- **No compiled ops at install.** ``DS_BUILD_OPS=0``: DeepSpeed's sdist builds a pure-Python wheel (torch is not
  importable in pip's isolated build, so it could compile nothing anyway).
- **One op built at install, by DeepSpeed's own JIT.** On a machine without a GPU DeepSpeed picks its CPU
  accelerator (collectives over gloo), and its ``TorchBackend`` loads the shared-memory collectives op
  (``deepspeed_shm_comm``) in ``init_distributed``, compiling it with ninja and the C++ compiler on first use, as it
  does for any CPU user (two C++ files, about 2 min of CPU). :func:`ensure_venv` does that once, into
  :data:`EXTENSIONS_DIR` inside the venv (``TORCH_EXTENSIONS_DIR``; :meth:`DeepSpeed.environ`), so that no test job
  compiles, and no job killed mid-build leaves torch's build lock behind in a shared cache.

The venv's size and install time, as measured here, are in ``docs/development.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.clusters.hydra import LAUNCHERS_DIR
from tests.clusters.locks import file_lock

VERSION = "0.19.8"
"""The DeepSpeed the tests run."""

REQUIREMENTS = (
    f"deepspeed=={VERSION}",
    "annotated-types==0.8.0",
    "einops==0.8.2",
    "hjson==3.1.0",
    "msgpack==1.2.4",
    "ninja==1.13.2",
    "psutil==7.2.2",
    "py-cpuinfo==9.0.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "typing-inspection==0.4.5",
)
"""What the venv installs, ``--no-deps``: DeepSpeed and the requirements of it (and of pydantic) that the main venv
lacks; ``torch``, ``numpy``, ``packaging``, ``tqdm`` and ``typing-extensions`` are the main venv's."""

VENV_DIR = LAUNCHERS_DIR / "deepspeed"
"""The venv (which may not exist yet)."""

EXTENSIONS_DIR = VENV_DIR / "torch-extensions"
"""Where DeepSpeed's JIT-built ops live (``TORCH_EXTENSIONS_DIR``)."""

SHM_OP = "ShareMemCommBuilder"
"""The op builder DeepSpeed's ``TorchBackend`` loads on the CPU accelerator (``deepspeed/comm/torch.py``)."""

MARKER = ".lightning-mpi-env-deepspeed"
"""Written last: a venv without it (an install or a build that never finished) is redone."""

_VERIFY = """
import json, sys
import deepspeed, lightning, torch
from deepspeed.accelerator import get_accelerator
accelerator = get_accelerator()
accelerator.create_op_builder({op!r}).load(verbose=False)
print(json.dumps({{
    "deepspeed": [deepspeed.__version__, deepspeed.__file__], "torch": [torch.__version__, torch.__file__],
    "lightning": lightning.__file__, "accelerator": accelerator.device_name(),
    "backend": accelerator.communication_backend_name(),
}}))
"""


@dataclass(frozen=True)
class DeepSpeed:
    """The DeepSpeed venv: a Python to run the tests' DeepSpeed programs with."""

    python: Path
    """The venv's interpreter: DeepSpeed, with the main venv's torch, Lightning and this checkout."""

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (``os.environ`` by default) with ``TORCH_EXTENSIONS_DIR`` naming the venv's built ops."""
        return {**(os.environ if base is None else base), "TORCH_EXTENSIONS_DIR": str(EXTENSIONS_DIR)}


def main_site_packages() -> list[str]:
    """This (the main) venv's ``site-packages`` folders."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def overlay_venv(venv_dir: Path, timeout: float) -> Path:
    """A new venv at ``venv_dir`` (emptied first, no pip) that sees the main venv's packages after its own; its Python.

    One ``.pth`` file in its ``site-packages`` adds the main venv's with ``site.addsitedir`` (their own ``.pth``
    files too: the editable install of this checkout). Install into it with this Python's ``pip --python``.
    """
    python = venv_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv_dir)], check=True, timeout=timeout
    )
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        ).stdout.strip()
    )
    lines = "".join(f"import site; site.addsitedir({path!r})\n" for path in main_site_packages())
    (site_packages / "lightning_mpi_env_main_venv.pth").write_text(lines)
    return python


def _marker_text() -> str:
    # The venv belongs to the interpreter (and so the torch) whose site-packages it links.
    return json.dumps({"requirements": REQUIREMENTS, "python": sys.executable})


def _installed() -> bool:
    marker = VENV_DIR / MARKER
    return marker.is_file() and marker.read_text() == _marker_text()


def ensure_venv(*, timeout: float = 1800) -> DeepSpeed:
    """Create the DeepSpeed venv, install :data:`REQUIREMENTS` and build its op, unless that was done already.

    Idempotent and safe to call from several processes at once (a file lock serialises the install).

    Args:
        timeout: Seconds the whole install may take (the op's build takes most of it on a loaded machine).

    Returns:
        The venv.

    Raises:
        subprocess.CalledProcessError: ``venv``, ``pip`` or the op's build failed (e.g. no package index, no C++
            compiler).
        subprocess.TimeoutExpired: The install took longer than ``timeout``.
        RuntimeError: The venv is not what it should be (``pip check`` complains, or DeepSpeed or torch loads from
            elsewhere).
    """
    deepspeed = DeepSpeed(VENV_DIR / "bin" / "python")
    if _installed():
        return deepspeed
    with file_lock(LAUNCHERS_DIR / ".deepspeed.lock"):
        if _installed():
            return deepspeed  # another process finished it while this one waited
        print(f"installing deepspeed {VERSION} into {VENV_DIR} (once)", file=sys.stderr, flush=True)
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        overlay_venv(VENV_DIR, left())
        # This Python's pip installs into the venv (`pip --python`, pip 22.3+), as for the launcher venvs.
        pip = [sys.executable, "-m", "pip", "--python", str(deepspeed.python), "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "install", "-q", "--no-deps", *REQUIREMENTS],
            check=True,
            timeout=left(),
            env={**os.environ, "DS_BUILD_OPS": "0"},
        )
        _check(pip, deepspeed, left())
        (VENV_DIR / MARKER).write_text(_marker_text())
    return deepspeed


def _check(pip: list[str], deepspeed: DeepSpeed, timeout: float) -> None:
    """Check the requirements and where everything loads from, and build the op (see the module docstring)."""
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=timeout, check=False)
    ours = {requirement.split("==")[0] for requirement in REQUIREMENTS}
    broken = [line for line in check.stdout.splitlines() if line.split(" ", 1)[0].lower() in ours]
    if broken:
        raise RuntimeError(f"pip check in {VENV_DIR}:\n" + "\n".join(broken))
    shutil.rmtree(EXTENSIONS_DIR, ignore_errors=True)  # a build that never finished leaves torch's lock file
    probe = subprocess.run(
        [str(deepspeed.python), "-c", textwrap.dedent(_VERIFY.format(op=SHM_OP))],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
        env=deepspeed.environ(),
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    main = main_site_packages()
    if (
        found["deepspeed"][0] != VERSION
        or not found["deepspeed"][1].startswith(str(VENV_DIR) + os.sep)
        or not any(found["torch"][1].startswith(path) for path in main)
        or not any(found["lightning"].startswith(path) for path in main)
        or (found["accelerator"], found["backend"]) != ("cpu", "gloo")
    ):
        raise RuntimeError(f"the DeepSpeed venv {VENV_DIR} is not what runs: {found}")


__all__ = [
    "EXTENSIONS_DIR",
    "REQUIREMENTS",
    "VENV_DIR",
    "VERSION",
    "DeepSpeed",
    "ensure_venv",
    "main_site_packages",
    "overlay_venv",
]
