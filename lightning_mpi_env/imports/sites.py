"""Where each Lightning namespace entered the process, and the warning when both did."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import FrameType, FunctionType, ModuleType
from typing import NamedTuple

from lightning_mpi_env.core.errors import MixedImportError, MixedImportWarning, SettingError
from lightning_mpi_env.core.namespaces import (
    NAMESPACES,
    NAMESPACES_BY_KEY,
    STANDALONE,
    UNIFIED,
    namespace_of,
    other,
    package_of,
)
from lightning_mpi_env.core.report import show_briefly
from lightning_mpi_env.core.settings import VARIABLE, MixedImportMode, mixed_import_mode
from lightning_mpi_env.imports.hooks import when_imported

MODE_VARIABLE = VARIABLE["mixed_imports"]
"""Environment variable choosing what a mixed import does: ``warn``, ``error`` or ``ignore``."""

Mode = MixedImportMode


def mode(environ: Mapping[str, str] | None = None) -> MixedImportMode:
    """``LIGHTNING_MPI_ENV_MIXED_IMPORTS`` of ``environ`` (``os.environ`` by default); ``SettingError`` if bad."""
    return mixed_import_mode(os.environ if environ is None else environ)


_NOT_IMPORTERS = frozenset(
    {"importlib", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "lightning_mpi_env"}
)


def loaded_roots(key: str) -> list[str]:
    """Root packages of the namespace ``key`` really loaded: an alias made by ``unify_imports`` does not count."""
    loaded = []
    for root in NAMESPACES_BY_KEY[key].roots:
        module = sys.modules.get(root)
        if module is not None and getattr(module, "__name__", None) == root:
            loaded.append(root)
    return loaded


def both_namespaces_loaded() -> bool:
    """Whether modules of both namespaces are loaded in this process."""
    return all(loaded_roots(namespace.key) for namespace in NAMESPACES)


class ImportSite(NamedTuple):
    """Where a namespace entered the process: ``file`` and ``line`` of the importer, ``None`` when unknown."""

    module: str
    """The Lightning module that arrived (``pytorch_lightning``, ``lightning.fabric``, ...)."""
    file: str | None
    line: int | None
    exact: bool
    """Seen by the import hook (exact), or guessed from module globals after the fact."""

    def __str__(self) -> str:
        where = "unknown file" if self.file is None else self.file
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where} (imports `{self.module}`)" if self.exact else f"{where} (refers to `{self.module}`)"


_sites: dict[str, ImportSite] = {}
_reported = False


def site_of(key: str) -> ImportSite | None:
    """Where the namespace ``key`` was first imported, when seen by the hook."""
    return _sites.get(key)


def _importer_frame(frame: FrameType | None) -> tuple[FrameType | None, str | None]:
    """The importer's frame (``None`` if none) outside the import system, Lightning and us, and what it imported."""
    outermost = None
    while frame is not None:
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            name = frame.f_globals.get("__name__")
            if not isinstance(name, str) or name.partition(".")[0] not in _NOT_IMPORTERS:
                return frame, outermost
            if package_of(name) is not None:
                outermost = name
        frame = frame.f_back
    return None, outermost


def _guess_sites(key: str, limit: int = 3) -> list[ImportSite]:
    """Modules whose globals hold a module, class or function of namespace ``key``: who imported it, after the fact."""
    import warnings

    sites: dict[str, ImportSite] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Some libraries warn on attribute access of deprecated names.
        for name, module in list(sys.modules.items()):
            top = name.partition(".")[0]
            if not isinstance(module, ModuleType) or top in _NOT_IMPORTERS or top in sys.stdlib_module_names:
                continue
            found = _first_reference(module, key)
            raw_file = getattr(module, "__file__", None)
            file = raw_file if isinstance(raw_file, str) else None
            if found is None or (file is not None and file in sites):
                continue
            sites[file or name] = ImportSite(found, file, _first_import_line(file, key), exact=False)
            if len(sites) == limit:
                break
    return list(sites.values())


def _first_reference(module: ModuleType, key: str) -> str | None:
    for value in list(vars(module).values()):
        owner: object
        if isinstance(value, ModuleType):
            owner = value.__name__
        elif isinstance(value, (type, FunctionType)):
            owner = getattr(value, "__module__", None)
        else:
            continue
        if isinstance(owner, str) and namespace_of(owner) == key:
            return owner
    return None


def _first_import_line(file: str | None, key: str) -> int | None:
    if file is None:
        return None
    import linecache
    import re

    pattern = re.compile(NAMESPACES_BY_KEY[key].import_line)
    for number, text in enumerate(linecache.getlines(file), start=1):
        if pattern.match(text):
            return number
    return None


def _describe(key: str) -> str:
    label = NAMESPACES_BY_KEY[key].label
    site = _sites.get(key)
    if site is not None:
        return f"{label}: first imported by {site}"
    guesses = _guess_sites(key)
    if not guesses:
        roots = ", ".join(f"`{root}`" for root in loaded_roots(key))
        return f"{label}: {roots} loaded before lightning_mpi_env; importer unknown"
    listed = "; ".join(str(site) for site in guesses)
    return f"{label}: loaded before lightning_mpi_env, importer unknown; used by {listed}"


def _mixed_problem() -> str:
    return (
        "Both Lightning namespaces are imported in this process. Their classes are not interchangeable: a Trainer "
        "from one refuses or silently ignores a model, callback, logger or plugin built on the other.\n"
        f"  {_describe(STANDALONE.key)}\n"
        f"  {_describe(UNIFIED.key)}"
    )


MIXED_HINT = (
    "Import one namespace only: change `pytorch_lightning` to `lightning.pytorch` and `lightning_fabric` to "
    "`lightning.fabric` in the files above, or, for code you cannot edit, call `lightning_mpi_env.unify_imports()` "
    f"at the top of your entry script before any Lightning import. {MODE_VARIABLE}=error makes this an error, "
    "=ignore silences it."
)


def _report(frame: FrameType | None) -> None:
    """Warn or raise, per the mode, about the mixed import; at most once per process."""
    global _reported
    import warnings  # Here, not at the top: only a mixed import needs it.

    if _reported:
        return
    _reported = True  # one report, also when it is the SettingError of a bad mode
    try:
        current = mode()
    except SettingError as error:
        show_briefly(error)
        raise
    if current is Mode.IGNORE:
        return
    problem = _mixed_problem()
    if current is Mode.ERROR:
        mixed = MixedImportError(problem, MIXED_HINT)
        show_briefly(mixed)
        raise mixed
    message = MixedImportWarning(problem, MIXED_HINT)
    if frame is None:
        warnings.warn(message, stacklevel=2)
        return
    # Attributed to the importing line. No ``module_globals``: under ``python -c`` the loader is BuiltinImporter,
    # whose get_source raises ImportError instead of letting the warning be shown.
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message,
        MixedImportWarning,  # ignored for a Warning instance; the signature wants it
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
        registry=registry,
    )


def _on_namespace_imported(module: ModuleType) -> None:
    key = namespace_of(module.__name__)
    if key is None:  # pragma: no cover - only Lightning roots are watched
        return
    frame, imported = _importer_frame(sys._getframe(1))
    imported = imported or module.__name__
    if frame is None:
        site = ImportSite(imported, None, None, exact=True)
    else:
        site = ImportSite(imported, frame.f_code.co_filename, frame.f_lineno, exact=True)
    _sites.setdefault(key, site)
    if loaded_roots(other(key).key):
        _report(frame)


def watch_imports() -> None:
    """At import of this package: hook the roots not loaded yet, and report a mix that is already there.

    A bad ``LIGHTNING_MPI_ENV_MIXED_IMPORTS`` is a ``SettingError`` when a mix is seen, never at this import.
    """
    for namespace in NAMESPACES:
        for root in namespace.roots:
            if root not in sys.modules:
                when_imported(root, _on_namespace_imported)
    if both_namespaces_loaded():
        try:
            mode()
        except SettingError:
            return  # not at this import: the guard says so where it acts next (a Trainer's setup, a new import)
        _report(_importer_frame(sys._getframe(1))[0])
