"""The oldest Lightning this package supports (``lightning>=2.1``: 2.1.4), for tests, beside the installed one.

Lightning 2.1.4 lives in an overlay: ``pip install --target .venv/overlays/lightning-2.1.4 --no-deps`` of the two
Lightning distributions, put in front of this venv with ``PYTHONPATH``. Everything else (torch 2.13, numpy,
lightning-utilities, this package) stays the main venv's. Why not a venv of its own:

- **Cheap.** The overlay is 31 MB and installs in about 7 s with an empty pip cache (``--no-cache-dir``, measured
  on the development machine); a venv needs torch again (754 MB installed for the CPU build here, several GB
  with CUDA).
- **Faithful, and checked to be.** Lightning 2.1.4 declares its packages as ``pkg_resources`` namespaces, so
  ``lightning.__path__`` also lists the main venv's ``lightning`` directory. Only the top-level namespace
  directories are affected, and in 2.6.6 they hold nothing that 2.1.4 lacks but ``py.typed`` and a data file.
  :func:`install` checks in a fresh interpreter that every ``lightning*``/``pytorch_lightning*`` module loads from
  the overlay, that both namespaces report 2.1.4, and that ``pip check`` finds nothing wrong with them.
- **The same versions a resolver picks.** ``pip install torch==2.13.0 lightning==2.1.4`` resolves to the pins below:
  ``pytorch-lightning==2.1.4`` (``lightning`` 2.1.4 requires it unpinned, so pip would take 2.6.6),
  ``setuptools<82`` (2.1.4 imports ``pkg_resources``, gone in setuptools 82; torch 2.13 needs ``>=77.0.3``), and
  lightning 2.1.4's own upper bounds on ``fsspec`` and ``packaging``, which this venv's newer copies exceed.

Use :func:`install` (idempotent; safe from parallel test workers: a file lock serialises the install) and
:meth:`Lightning.environ`, or the ``oldest_lightning`` fixture.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from tests.clusters.locks import file_lock

REPO = Path(__file__).resolve().parents[2]
"""The checkout this file belongs to."""

OVERLAYS_DIR = REPO / ".venv" / "overlays"
"""Where the overlays live: inside the (git-ignored) main venv directory, whose torch they run on."""

OLDEST = "2.1.4"
"""The oldest Lightning supported (``pyproject.toml``: ``lightning>=2.1``; 2.1.4 is the last 2.1 release)."""

REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "2.1.4": (
        "lightning==2.1.4",
        "pytorch-lightning==2.1.4",
        "setuptools>=77.0.3,<82",
        "fsspec<2025",
        "packaging<25",
    ),
}
"""What each overlay installs, ``--no-deps`` (see the module docstring for why each pin)."""

PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
"""The top-level packages both Lightning distributions install."""

MARKER = ".lightning-mpi-env-overlay"
"""Written last: an overlay without it (an install that never finished) is redone."""

_VERIFY = """
import json, sys
import lightning, lightning.fabric, lightning.pytorch, lightning_fabric, pytorch_lightning
root = sys.argv[1]
outside = sorted(
    name for name, module in list(sys.modules.items())
    if name.split(".")[0] in {packages!r} and getattr(module, "__file__", None)
    and not module.__file__.startswith(root)
)
print(json.dumps({{"versions": [lightning.__version__, pytorch_lightning.__version__], "outside": outside}}))
"""


@dataclass(frozen=True)
class Lightning:
    """One Lightning version a test can run its subprocesses on."""

    version: str
    """``lightning.__version__`` in those subprocesses."""
    overlay: Path | None = None
    """The overlay directory to put first on ``PYTHONPATH``; ``None`` for the installed Lightning."""

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (``os.environ`` by default) with this version's overlay in front of ``PYTHONPATH``."""
        env = dict(os.environ if base is None else base)
        if self.overlay is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.overlay), env.get("PYTHONPATH", "")]))
        return env

    def __str__(self) -> str:
        return f"lightning {self.version}{'' if self.overlay is None else ' (overlay)'}"


INSTALLED = Lightning(metadata.version("lightning"))
"""The Lightning of this venv."""


def overlay_dir(version: str = OLDEST) -> Path:
    """The overlay of ``version`` (which may not exist yet)."""
    return OVERLAYS_DIR / f"lightning-{version}"


def _marker_text(version: str) -> str:
    # The overlay belongs to the interpreter (and so the torch) it was checked against.
    return json.dumps({"requirements": REQUIREMENTS[version], "python": sys.executable})


def _installed(version: str) -> bool:
    marker = overlay_dir(version) / MARKER
    return marker.is_file() and marker.read_text() == _marker_text(version)


def install(version: str = OLDEST, *, timeout: float = 900) -> Lightning:
    """Install the overlay of ``version`` unless that was done already, and return it.

    Args:
        version: A key of :data:`REQUIREMENTS`.
        timeout: Seconds the install and its check may take.

    Returns:
        The overlay, ready for :meth:`Lightning.environ`.

    Raises:
        subprocess.CalledProcessError: ``pip`` failed (e.g. no access to the package index).
        subprocess.TimeoutExpired: The install took longer than ``timeout``.
        RuntimeError: The overlay is not faithful (a module loads from elsewhere, or ``pip check`` complains).
    """
    target = overlay_dir(version)
    if _installed(version):
        return Lightning(version, target)
    with file_lock(OVERLAYS_DIR / f".lightning-{version}.lock"):
        if _installed(version):
            return Lightning(version, target)  # another worker finished it while this one waited
        print(f"lightning_versions: installing Lightning {version} into {target} (once)", file=sys.stderr, flush=True)
        staging = target.with_name(f"{target.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps"]
        subprocess.run([*pip, "--target", str(staging), *REQUIREMENTS[version]], check=True, timeout=timeout)
        verify(Lightning(version, staging), timeout=timeout)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        (target / MARKER).write_text(_marker_text(version))
    return Lightning(version, target)


def verify(lightning: Lightning, *, timeout: float = 300) -> None:
    """Check that ``lightning``'s overlay alone supplies Lightning, at its version, with its requirements met.

    Raises:
        RuntimeError: Naming the modules loaded from elsewhere, the versions found, or what ``pip check`` says.
    """
    assert lightning.overlay is not None
    program = textwrap.dedent(_VERIFY.format(packages=set(PACKAGES)))
    env = lightning.environ()
    probe = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program, str(lightning.overlay) + os.sep],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if probe.returncode != 0:
        raise RuntimeError(f"Lightning {lightning.version} does not import from {lightning.overlay}:\n{probe.stderr}")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if found["versions"] != [lightning.version] * 2 or found["outside"]:
        raise RuntimeError(f"the overlay {lightning.overlay} is not what runs: {found}")
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    ours = {"lightning", "pytorch-lightning"}
    broken = [line for line in check.stdout.splitlines() if line.split(" ", 1)[0].lower() in ours]
    if broken:
        raise RuntimeError(f"pip check with the overlay {lightning.overlay}:\n" + "\n".join(broken))


_REASONS: dict[str, str | None] = {}


def unavailable_reason(version: str = OLDEST) -> str | None:
    """Why Lightning ``version`` cannot run here, or ``None`` when it can (installing it if needed, once).

    Meant for ``pytest.skip``: the first call may take a while, since it installs the overlay.
    """
    if version not in _REASONS:
        try:
            install(version)
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            _REASONS[version] = f"cannot install Lightning {version} into {overlay_dir(version)}: {error}"
        else:
            _REASONS[version] = None
    return _REASONS[version]


OLDEST_PACKAGES = ("lightning.pytorch", "lightning_fabric")
"""The namespaces a test over every namespace runs in on the oldest Lightning: a Trainer and a Fabric one, a unified
and a standalone one. Lightning builds its standalone packages from the same source, renamed; all four run on the
installed Lightning."""


def in_each_namespace(packages: tuple[str, ...]) -> list[object]:
    """``(lightning, package)`` parameters for a test module's ``lightning`` fixture (indirect; ``"installed"`` or
    ``"oldest"``): every package on the installed Lightning, those of :data:`OLDEST_PACKAGES` also on the oldest (in
    the whole suite only)."""
    installed = [
        pytest.param("installed", package, id=f"lightning-{INSTALLED.version}-{package}") for package in packages
    ]
    oldest = [
        pytest.param("oldest", package, marks=pytest.mark.slow, id=f"lightning-{OLDEST}-{package}")
        for package in packages
        if package in OLDEST_PACKAGES
    ]
    return [*installed, *oldest]


@pytest.fixture(scope="session")
def oldest_lightning() -> Lightning:
    """Lightning :data:`OLDEST` as an overlay on this venv (installed on first use, ~7 s, once per checkout).

    Outside CI it skips when the overlay cannot be installed (no network); with ``CI`` set that is a failure.
    """
    reason = unavailable_reason(OLDEST)
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI={os.environ['CI']!r}: the oldest supported Lightning must be tested. {reason}")
        pytest.skip(reason)
    return install(OLDEST)


__all__ = [
    "INSTALLED",
    "OLDEST",
    "OLDEST_PACKAGES",
    "REQUIREMENTS",
    "Lightning",
    "in_each_namespace",
    "install",
    "oldest_lightning",
    "unavailable_reason",
    "verify",
]
