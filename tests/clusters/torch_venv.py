"""A newer torch for the tests, in a venv of its own under ``.venv/launchers/torch-<version>``: torch's reconfigure API.

torch 2.14 added a way to reconfigure a process group in place (``init_process_group(enable_reconfigure=True)``,
pytorch/pytorch#186298; gloo: #187381), which ``restartable`` takes where the installed torch has it
(``lightning_mpi_env/recovery/groups.py``). The main venv holds torch 2.13 (the CPU build, the README's), which
takes the other path; this venv holds :data:`VERSION`, so that the tests run both.

- **torch from this machine's disk, the rest the main venv's.** ``pip install torch==2.14.1`` takes the wheel and
  its requirements from the files this kind of machine keeps on disk (a CUDA build: about 5.4 GB in the venv, which
  runs on the CPU). One ``.pth`` file then puts the main venv's ``site-packages`` after the venv's own (with that
  directory's own ``.pth`` files: the editable install of this checkout), so that Lightning, torchdata and this
  checkout are the main venv's, and torch is the venv's.
- Installed on first use under a file lock, as the other venvs of :mod:`tests.clusters.hydra`; a marker written
  last says it finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.clusters.deepspeed_venv import main_site_packages, overlay_venv
from tests.clusters.hydra import LAUNCHERS_DIR
from tests.clusters.locks import file_lock

VERSION = "2.14.1"
"""The torch the venv holds: the newest this machine keeps on disk, with the reconfigure API."""

VENV_DIR = LAUNCHERS_DIR / f"torch-{VERSION}"
"""The venv (which may not exist yet)."""

MARKER = ".lightning-mpi-env-torch"
"""Written last: a venv without it (an install that never finished) is redone."""

_VERIFY = """
import json, lightning, lightning_mpi_env, torch
print(json.dumps({"torch": [torch.__version__, torch.__file__], "lightning": lightning.__file__,
                  "package": lightning_mpi_env.__file__}))
"""


def _marker_text() -> str:
    return json.dumps({"torch": VERSION, "python": sys.executable})


def _installed() -> bool:
    marker = VENV_DIR / MARKER
    return marker.is_file() and marker.read_text() == _marker_text()


def ensure_venv(*, timeout: float = 1800) -> Path:
    """Create the venv and install torch :data:`VERSION` into it, unless that was done already; its Python.

    Idempotent and safe to call from several processes at once (a file lock serialises the install).

    Raises:
        subprocess.CalledProcessError: ``venv`` or ``pip`` failed (e.g. the wheel is neither on disk nor reachable).
        subprocess.TimeoutExpired: The install took longer than ``timeout``.
        RuntimeError: The venv is not what it should be (torch, Lightning or this checkout loads from elsewhere).
    """
    python = VENV_DIR / "bin" / "python"
    if _installed():
        return python
    with file_lock(LAUNCHERS_DIR / ".torch.lock"):
        if _installed():
            return python  # another process finished it while this one waited
        print(f"installing torch {VERSION} into {VENV_DIR} (once)", file=sys.stderr, flush=True)
        overlay_venv(VENV_DIR, timeout)
        pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "-q", f"torch=={VERSION}"], check=True, timeout=timeout)
        _check(python)
        (VENV_DIR / MARKER).write_text(_marker_text())
    return python


def _check(python: Path) -> None:
    """torch from the venv, at :data:`VERSION`; Lightning and this checkout from the main venv."""
    probe = subprocess.run(
        [str(python), "-c", _VERIFY], capture_output=True, text=True, timeout=300, check=True, env=os.environ.copy()
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    main = main_site_packages()
    if (
        found["torch"][0].split("+")[0] != VERSION
        or not found["torch"][1].startswith(str(VENV_DIR) + os.sep)
        or not any(found["lightning"].startswith(path) for path in main)
        or Path(found["package"]).parents[1] != Path(__file__).parents[2]
    ):
        raise RuntimeError(f"the torch venv {VENV_DIR} is not what runs: {found}")


__all__ = ["VENV_DIR", "VERSION", "ensure_venv"]
