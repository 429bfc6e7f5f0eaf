"""Alias the standalone namespace to the unified one: code written for ``pytorch_lightning`` runs unchanged."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lightning_mpi_env.core.errors import MixedImportError
from lightning_mpi_env.core.namespaces import COUNTERPART, STANDALONE, UNIFIED
from lightning_mpi_env.imports.hooks import alias_modules
from lightning_mpi_env.imports.sites import loaded_roots, site_of

if TYPE_CHECKING:
    from pathlib import Path


def _installed_version(distribution: str) -> str | None:
    import importlib.metadata  # Here, not at the top: it costs milliseconds at every import of the package.

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_names(package_dir: Path, prefix: str) -> Iterator[str]:
    """Dotted names of every module and package under ``package_dir``, without importing any."""
    yield prefix
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(part.isidentifier() for part in parts):
            yield ".".join((prefix, *parts))


def unify_imports() -> None:
    """Make ``pytorch_lightning`` and ``lightning_fabric`` imports give ``lightning.pytorch``/``lightning.fabric``.

    Call it at the top of the entry script, before any Lightning import; it imports nothing itself, and may be
    called again.

    Raises:
        MixedImportError: ``pytorch_lightning`` or ``lightning_fabric`` is already imported (it would stay a second
            copy), ``lightning`` is not installed, or the versions of ``lightning``, ``pytorch-lightning`` and
            ``lightning-fabric`` differ.
    """
    already = loaded_roots(STANDALONE.key)
    if already:
        both = f" and `{UNIFIED.trainer}`/`{UNIFIED.fabric}`" if loaded_roots(UNIFIED.key) else ""
        site = site_of(STANDALONE.key)
        by = f" (first imported by {site})" if site is not None else ""
        raise MixedImportError(
            f"unify_imports() was called after {', '.join(f'`{r}`' for r in already)}{both} had been imported{by}; "
            f"those module objects already exist and cannot be made the same as `{UNIFIED.trainer}`'s.",
            "Call `lightning_mpi_env.unify_imports()` at the very top of your entry script, before any import of "
            "Lightning or of a library that imports it.",
        )
    spec = importlib.util.find_spec(UNIFIED.distribution)
    version = _installed_version(UNIFIED.distribution)
    if spec is None or not spec.submodule_search_locations or version is None:
        raise MixedImportError(
            f"unify_imports() needs the unified `{UNIFIED.distribution}` package, which is not installed; "
            f"`{STANDALONE.trainer}` cannot be redirected to it.",
            f"`pip install {UNIFIED.distribution}` (the same version as {STANDALONE.distribution}), or do not call "
            "unify_imports().",
        )
    for distribution in (STANDALONE.distribution, STANDALONE.fabric_distribution):
        installed = _installed_version(distribution)
        if installed is not None and installed != version:
            raise MixedImportError(
                f"unify_imports(): installed {UNIFIED.distribution}=={version} but {distribution}=={installed}; "
                f"code written for {distribution} {installed} may not run on {UNIFIED.distribution} {version}.",
                f"`pip install {UNIFIED.distribution}=={installed}` or `pip install {distribution}=={version}` so "
                "both match.",
            )
    from pathlib import Path

    root = Path(next(iter(spec.submodule_search_locations)))
    aliases: dict[str, str] = {}
    for alias_root in STANDALONE.roots:
        target_root = COUNTERPART[alias_root]
        subdir = root / target_root.partition(".")[2]
        for target in _module_names(subdir, target_root):
            aliases[alias_root + target[len(target_root) :]] = target
        # Modules Lightning puts in sys.modules itself (deprecation shims) have no file to find.
        for name in list(sys.modules):
            if name.startswith(target_root + "."):
                aliases.setdefault(alias_root + name[len(target_root) :], name)
    alias_modules(aliases)
