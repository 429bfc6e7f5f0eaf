"""Run a callback right after a named module is imported, and alias modules, at one dict lookup per import."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Loader as _Loader
    from importlib.abc import MetaPathFinder as _Finder
else:  # The import system needs no base classes, and importing importlib.abc would slow the package's import.
    _Loader = _Finder = object

ImportCallback = Callable[[ModuleType], None]

_callbacks: dict[str, list[ImportCallback]] = {}
_aliases: dict[str, str] = {}
# Every name the finder acts on, callbacks and aliases together: the one lookup on the fast path.
_watched: dict[str, None] = {}


def when_imported(module_name: str, callback: ImportCallback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported: now if it already is, else right after.

    The callback runs while the importing statement is still on the stack, so it may walk ``sys._getframe()``
    outwards to find the importer.
    """
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    _callbacks.setdefault(module_name, []).append(callback)
    _watched[module_name] = None
    _install_finder()


def alias_modules(aliases: Mapping[str, str]) -> None:
    """Make ``import alias`` give the module object of ``target``, for each ``alias -> target`` pair (full names).

    Aliases whose target is already imported are put in ``sys.modules`` at once; the others resolve on import,
    which then imports the target (never a second copy of it).
    """
    for alias, target in aliases.items():
        module = sys.modules.get(target)
        if module is not None:
            sys.modules[alias] = module
        _aliases[alias] = target
        _watched[alias] = None
    _install_finder()


def _install_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


class _PostImportFinder(_Finder):
    """Finds nothing itself: for watched names, wraps the loader that the other finders return."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _watched:
            return None
        alias_target = _aliases.get(fullname)
        if alias_target is not None:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(alias_target))
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, fullname)
                return spec
        return None


class _NotifyingLoader(_Loader):
    def __init__(self, loader: _Loader, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first, so the module never sees this wrapper.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        callbacks = _callbacks.pop(self._fullname, [])
        if self._fullname not in _aliases:
            _watched.pop(self._fullname, None)
        for callback in callbacks:
            callback(module)


class _AliasLoader(_Loader):
    """Loads an alias by importing its target and handing back that same module object."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._target_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set ``__spec__`` to the alias's spec; the target keeps its own.
        module.__spec__ = self._target_spec
