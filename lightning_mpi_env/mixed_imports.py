"""Catch programs that mix ``pytorch_lightning``/``lightning_fabric`` with ``lightning.pytorch``/``lightning.fabric``.

The two namespaces ship the same code twice, and a class from one is not an instance of the other's: a Trainer
from one refuses, ignores or trips over a callback, logger, plugin or model built on the other. This module

- warns (:class:`MixedImportWarning`) as soon as both namespaces are loaded, naming the file and line that imported
  each (exact when the import happens after ``lightning_mpi_env``, a best guess from module globals otherwise);
- checks the objects a Trainer holds (:func:`check_mixed_imports`), raising :class:`MixedImportError` that names
  every offender and its fix; :class:`~lightning_mpi_env.MPIClusterEnvironment` and ``"ddp_mpi"`` run it on the
  arguments of ``fit``/``validate``/``test``/``predict`` (:func:`guard_trainer`) and again at launch;
- aliases the old namespace to the new one (:func:`unify_imports`), so third-party code written for
  ``pytorch_lightning`` runs on ``lightning.pytorch`` unchanged.

``LIGHTNING_MPI_ENV_MIXED_IMPORTS``: ``warn`` (default) warns; ``error`` raises :class:`MixedImportError` instead of
warning; ``ignore`` silences the warning and skips the automatic launch-time check (an explicit call to
:func:`check_mixed_imports` always checks).

Nothing here imports torch or Lightning.
"""

from __future__ import annotations

import enum
import importlib.util
import linecache
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType, FunctionType, ModuleType
from typing import TYPE_CHECKING

from lightning_mpi_env._import_hooks import alias_modules, when_imported

if TYPE_CHECKING:
    from pathlib import Path

MODE_VARIABLE = "LIGHTNING_MPI_ENV_MIXED_IMPORTS"
"""Environment variable choosing what a mixed import does: ``warn``, ``error`` or ``ignore``."""


class MixedImportWarning(UserWarning):
    """Both Lightning namespaces are imported in one process."""


class MixedImportError(TypeError):
    """Objects from both Lightning namespaces meet, or the namespaces cannot be unified."""


class Mode(enum.Enum):
    """What a mixed import does, from ``LIGHTNING_MPI_ENV_MIXED_IMPORTS``."""

    WARN = "warn"
    ERROR = "error"
    IGNORE = "ignore"


def mode(environ: Mapping[str, str] | None = None) -> Mode:
    """Read ``LIGHTNING_MPI_ENV_MIXED_IMPORTS``.

    Args:
        environ: The environment to read; ``os.environ`` by default.

    Returns:
        The mode; :attr:`Mode.WARN` when the variable is unset or empty.

    Raises:
        ValueError: The variable holds anything else than ``warn``, ``error`` or ``ignore``.

    >>> mode({"LIGHTNING_MPI_ENV_MIXED_IMPORTS": "Error"})
    <Mode.ERROR: 'error'>
    """
    raw = (os.environ if environ is None else environ).get(MODE_VARIABLE, "")
    value = raw.strip().lower() or Mode.WARN.value
    try:
        return Mode(value)
    except ValueError:
        allowed = ", ".join(m.value for m in Mode)
        raise ValueError(
            f"{MODE_VARIABLE}={raw!r} is not one of {allowed}.\n"
            f"HINT: Set {MODE_VARIABLE}=warn (the default), =error to fail on mixed Lightning imports, or =ignore "
            "to silence them."
        ) from None


# --- namespaces -------------------------------------------------------------------------------------------------

STANDALONE = "pytorch_lightning"
"""The standalone packages: ``pytorch_lightning`` and ``lightning_fabric``."""
UNIFIED = "lightning"
"""The unified package: ``lightning.pytorch`` and ``lightning.fabric``."""

_LABELS = {STANDALONE: "pytorch_lightning / lightning_fabric", UNIFIED: "lightning.pytorch / lightning.fabric"}
_ROOTS = {STANDALONE: ("pytorch_lightning", "lightning_fabric"), UNIFIED: ("lightning.pytorch", "lightning.fabric")}
_COUNTERPART_PREFIX = {
    "pytorch_lightning": "lightning.pytorch",
    "lightning_fabric": "lightning.fabric",
    "lightning.pytorch": "pytorch_lightning",
    "lightning.fabric": "lightning_fabric",
}
# Frames from these packages are never "the importer": the import system, Lightning itself, and us.
_NOT_IMPORTERS = frozenset(
    {"importlib", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "lightning_mpi_env"}
)
_IMPORT_LINE = {
    STANDALONE: re.compile(r"^\s*(?:from|import)\s+(?:pytorch_lightning|lightning_fabric)\b"),
    UNIFIED: re.compile(r"^\s*(?:from|import)\s+lightning(?:\.(?:pytorch|fabric))?(?:\s|,|$)"),
}


def package_of(module_name: str) -> str | None:
    """The Lightning package a module belongs to, or ``None`` for anything else.

    Args:
        module_name: A full dotted module name.

    Returns:
        ``"pytorch_lightning"``, ``"lightning_fabric"``, ``"lightning.pytorch"``, ``"lightning.fabric"``,
        ``"lightning"`` (the unified root itself) or ``None``.

    >>> [package_of(n) for n in ("pytorch_lightning.core", "lightning.fabric", "lightning_mpi_env", "lightning")]
    ['pytorch_lightning', 'lightning.fabric', None, 'lightning']
    """
    top, _, rest = module_name.partition(".")
    if top in ("pytorch_lightning", "lightning_fabric"):
        return top
    if top != "lightning":
        return None
    sub = rest.partition(".")[0]
    return f"lightning.{sub}" if sub in ("pytorch", "fabric") else "lightning"


def namespace_of(module_name: str) -> str | None:
    """:data:`STANDALONE`, :data:`UNIFIED` or ``None``, for a full dotted module name.

    >>> namespace_of("lightning_fabric.plugins"), namespace_of("lightning.pytorch"), namespace_of("torch")
    ('pytorch_lightning', 'lightning', None)
    """
    package = package_of(module_name)
    if package is None:
        return None
    return STANDALONE if package in ("pytorch_lightning", "lightning_fabric") else UNIFIED


def _other(namespace: str) -> str:
    return UNIFIED if namespace == STANDALONE else STANDALONE


def _loaded_roots(namespace: str) -> list[str]:
    """Roots of ``namespace`` really loaded: an alias made by :func:`unify_imports` does not count."""
    loaded = []
    for root in _ROOTS[namespace]:
        module = sys.modules.get(root)
        if module is not None and getattr(module, "__name__", None) == root:
            loaded.append(root)
    return loaded


def _both_namespaces_loaded() -> bool:
    return bool(_loaded_roots(STANDALONE)) and bool(_loaded_roots(UNIFIED))


def _frames_above(frame: FrameType | None, max_depth: int) -> Iterator[FrameType]:
    """``frame`` and its callers, at most ``max_depth`` of them."""
    for _ in range(max_depth):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


# --- where each namespace was imported --------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportSite:
    """Where a namespace entered the process."""

    module: str
    """The Lightning module that arrived (``pytorch_lightning``, ``lightning.fabric``, ...)."""
    file: str | None
    """The importing file, ``None`` when unknown."""
    line: int | None
    """The importing line, ``None`` when unknown."""
    exact: bool
    """Seen by the import hook (exact), or guessed from module globals after the fact."""

    def __str__(self) -> str:
        where = "unknown file" if self.file is None else self.file
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where} (imports `{self.module}`)" if self.exact else f"{where} (refers to `{self.module}`)"


_sites: dict[str, ImportSite] = {}
_reported = False


def _importer_frame(frame: FrameType | None) -> tuple[FrameType | None, str | None]:
    """The first frame outwards from ``frame`` outside the import system, Lightning and this package.

    Returns:
        That frame (``None`` if none) and the outermost Lightning module on the way: what the importer imported.
    """
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


def _guess_sites(namespace: str, limit: int = 3) -> list[ImportSite]:
    """Modules whose globals hold a module, class or function of ``namespace``: who imported it, after the fact."""
    sites: dict[str, ImportSite] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Some libraries warn on attribute access of deprecated names.
        for name, module in list(sys.modules.items()):
            top = name.partition(".")[0]
            if not isinstance(module, ModuleType) or top in _NOT_IMPORTERS or top in sys.stdlib_module_names:
                continue
            found = _first_reference(module, namespace)
            raw_file = getattr(module, "__file__", None)
            file = raw_file if isinstance(raw_file, str) else None
            if found is None or (file is not None and file in sites):
                continue
            sites[file or name] = ImportSite(found, file, _first_import_line(file, namespace), exact=False)
            if len(sites) == limit:
                break
    return list(sites.values())


def _first_reference(module: ModuleType, namespace: str) -> str | None:
    for value in list(vars(module).values()):
        owner: object
        if isinstance(value, ModuleType):
            owner = value.__name__
        elif isinstance(value, (type, FunctionType)):
            owner = getattr(value, "__module__", None)
        else:
            continue
        if isinstance(owner, str) and namespace_of(owner) == namespace:
            return owner
    return None


def _first_import_line(file: str | None, namespace: str) -> int | None:
    if file is None:
        return None
    for number, text in enumerate(linecache.getlines(file), start=1):
        if _IMPORT_LINE[namespace].match(text):
            return number
    return None


def _describe(namespace: str) -> str:
    site = _sites.get(namespace)
    if site is not None:
        return f"{_LABELS[namespace]}: first imported by {site}"
    guesses = _guess_sites(namespace)
    if not guesses:
        roots = ", ".join(f"`{root}`" for root in _loaded_roots(namespace))
        return f"{_LABELS[namespace]}: {roots} loaded before lightning_mpi_env; importer unknown"
    listed = "; ".join(str(site) for site in guesses)
    return f"{_LABELS[namespace]}: loaded before lightning_mpi_env, importer unknown; used by {listed}"


def _mixed_message() -> str:
    return (
        "Both Lightning namespaces are imported in this process. Their classes are not interchangeable: a Trainer "
        "from one refuses or silently ignores a model, callback, logger or plugin built on the other.\n"
        f"  {_describe(STANDALONE)}\n"
        f"  {_describe(UNIFIED)}\n"
        "HINT: Import one namespace only: change `pytorch_lightning` to `lightning.pytorch` and `lightning_fabric` "
        "to `lightning.fabric` in the files above, or, for code you cannot edit, call "
        "`lightning_mpi_env.unify_imports()` at the top of your entry script before any Lightning import. "
        f"{MODE_VARIABLE}=error makes this an error, =ignore silences it."
    )


def _report(frame: FrameType | None) -> None:
    """Warn or raise, per the mode, about the mixed import; at most once per process."""
    global _reported
    current = mode()
    if _reported or current is Mode.IGNORE:
        return
    _reported = True
    message = _mixed_message()
    if current is Mode.ERROR:
        raise MixedImportError(message)
    if frame is None:
        warnings.warn(message, MixedImportWarning, stacklevel=2)
        return
    # Attribute the warning to the importing line, as ``warnings.warn(stacklevel=...)`` would.
    # No ``module_globals``: for ``python -c`` the loader is BuiltinImporter, whose get_source
    # raises ImportError instead of letting the warning be shown.
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message,
        MixedImportWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
        registry=registry,
    )


def _on_namespace_imported(module: ModuleType) -> None:
    namespace = namespace_of(module.__name__)
    if namespace is None:  # pragma: no cover - only Lightning roots are watched
        return
    frame, imported = _importer_frame(sys._getframe(1))
    imported = imported or module.__name__
    if frame is None:
        site = ImportSite(imported, None, None, exact=True)
    else:
        site = ImportSite(imported, frame.f_code.co_filename, frame.f_lineno, exact=True)
    _sites.setdefault(namespace, site)
    if _loaded_roots(_other(namespace)):
        _report(frame)


def _watch_imports() -> None:
    """At import of this package: hook the roots not loaded yet, and report a mix that is already there."""
    mode()  # A bad value fails now, not at the first mixed import.
    for namespace in (STANDALONE, UNIFIED):
        for root in _ROOTS[namespace]:
            if root not in sys.modules:
                when_imported(root, _on_namespace_imported)
    if _both_namespaces_loaded():
        _report(_importer_frame(sys._getframe(1))[0])


# --- objects ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Offender:
    """An object built on the other namespace than the reference (the Trainer's)."""

    role: str
    """What the object is to the Trainer: ``callback``, ``logger``, ``object``, ..."""
    cls: type
    """The object's class."""
    base: type
    """The nearest base class from the foreign namespace."""

    @property
    def package(self) -> str:
        """The Lightning package of the foreign base (``pytorch_lightning``, ``lightning.fabric``, ...)."""
        return package_of(self.base.__module__) or "?"

    @property
    def defined_in(self) -> str:
        """``file:line`` (or ``file``, or the module name) where the object's class is defined."""
        module = sys.modules.get(self.cls.__module__)
        file = getattr(module, "__file__", None)
        if not isinstance(file, str):
            return f"module `{self.cls.__module__}`"
        line = _class_line(self.cls, file)
        return file if line is None else f"{file}:{line}"


def _class_line(cls: type, file: str) -> int | None:
    pattern = re.compile(rf"^\s*class\s+{re.escape(cls.__name__)}\b")
    for number, text in enumerate(linecache.getlines(file), start=1):
        if pattern.match(text):
            return number
    return None


def _lightning_bases(cls: type) -> list[type]:
    return [base for base in cls.__mro__ if package_of(base.__module__) is not None]


def _class_of(obj: object) -> type:
    return obj if isinstance(obj, type) else type(obj)


def _is_ours(cls: type) -> bool:
    return cls.__module__.partition(".")[0] == "lightning_mpi_env"


def _namespace_of_object(obj: object) -> str | None:
    cls = _class_of(obj)
    if _is_ours(cls):
        return None
    for base in _lightning_bases(cls):
        return namespace_of(base.__module__)
    return None


def _accepted_by(cls: type, namespace: str) -> bool:
    """Whether ``cls`` passes ``isinstance`` checks of ``namespace``: it inherits, or is registered, there."""
    bases = _lightning_bases(cls)
    if any(namespace_of(base.__module__) == namespace for base in bases):
        return True
    for base in bases:
        package = package_of(base.__module__)
        if package is None or package == "lightning":
            continue
        counterpart_module = _COUNTERPART_PREFIX[package] + base.__module__[len(package) :]
        counterpart = getattr(sys.modules.get(counterpart_module), base.__qualname__, None)
        if isinstance(counterpart, type) and issubclass(cls, counterpart):
            return True
    return False


def _find_offenders(held: Iterable[tuple[str, object]], namespace: str) -> list[Offender]:
    offenders = []
    seen: set[int] = set()
    for role, obj in held:
        cls = _class_of(obj)
        if id(obj) in seen or _is_ours(cls):
            continue
        seen.add(id(obj))
        bases = _lightning_bases(cls)
        if not bases or _accepted_by(cls, namespace):
            continue
        foreign = next(base for base in bases if namespace_of(base.__module__) != namespace)
        offenders.append(Offender(role, cls, foreign))
    return offenders


def _safe_getattr(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a property that cannot answer yet holds nothing to check
        return None


def held_by(trainer: object) -> Iterator[tuple[str, object]]:
    """What a Trainer holds, as ``(role, object)``: callbacks, loggers, strategy and its plugins, profiler, data.

    Args:
        trainer: A ``lightning.pytorch`` or ``pytorch_lightning`` Trainer.

    Yields:
        ``(role, object)`` for every non-``None`` object.
    """
    for role, name in (("callback", "callbacks"), ("logger", "loggers")):
        items = _safe_getattr(trainer, name)
        if isinstance(items, (list, tuple)):
            for item in items:
                yield role, item
    strategy = _safe_getattr(trainer, "strategy")
    single = [
        ("strategy", strategy),
        ("accelerator", _safe_getattr(strategy, "accelerator")),
        ("cluster environment", _safe_getattr(strategy, "cluster_environment")),
        ("precision plugin", _safe_getattr(strategy, "precision_plugin")),
        ("checkpoint IO plugin", _safe_getattr(strategy, "_checkpoint_io")),
        ("profiler", _safe_getattr(trainer, "profiler")),
        ("datamodule", _safe_getattr(trainer, "datamodule")),
        ("model", _safe_getattr(strategy, "_lightning_module")),
    ]
    for role, obj in single:
        if obj is not None:
            yield role, obj


def _fix(offender: Offender, reference_package: str) -> str:
    wrong = offender.package
    right = _COUNTERPART_PREFIX.get(wrong, reference_package)
    where = offender.defined_in.rpartition(":")[0] if offender.defined_in.count(":") else offender.defined_in
    fix = f"in {where}, import from `{right}` instead of `{wrong}`"
    if namespace_of(wrong) == STANDALONE:
        fix += " (or, if you cannot edit it, call `lightning_mpi_env.unify_imports()` before any Lightning import)"
    return fix


def check_mixed_imports(*objects: object, trainer: object | None = None) -> None:
    """Refuse objects built on the other Lightning namespace than the Trainer's (or than the first object's).

    Walks the MRO of every object given (an object or a class) and of everything the Trainer holds: callbacks,
    loggers, strategy, accelerator, cluster environment, precision and checkpoint plugins, profiler, datamodule and
    model when attached. An object counts as the Trainer's when it inherits from, or is registered with, a class of
    the Trainer's namespace; objects with no Lightning base (and everything from ``lightning_mpi_env``) are neutral.

    Args:
        *objects: Objects or classes to check as well, e.g. the model and datamodule before ``fit``.
        trainer: A Trainer; its namespace is the reference. Without it, the first Lightning-based object's is.

    Raises:
        MixedImportError: Listing every offender: role and class, the namespace of its Lightning base, the file
            that defines it, the Trainer's namespace, and the fix.
    """
    _check(trainer, [("object", obj) for obj in objects])


def _check(trainer: object | None, given: Iterable[tuple[str, object]]) -> None:
    """:func:`check_mixed_imports` on ``(role, object)`` pairs, so that the message can say what each object is."""
    held: list[tuple[str, object]] = []
    reference: str | None = None
    reference_name = ""
    if trainer is not None:
        reference = _namespace_of_object(trainer)
        trainer_package = next((package_of(b.__module__) for b in _lightning_bases(type(trainer))), None)
        reference_name = f"the Trainer's namespace `{trainer_package}`"
        held.extend(held_by(trainer))
    held.extend(given)
    if reference is None:
        for role, obj in held:
            reference = _namespace_of_object(obj)
            if reference is not None:
                first = _lightning_bases(_class_of(obj))[0]
                reference_name = f"the namespace `{package_of(first.__module__)}` of the first {role}, "
                reference_name += f"`{_class_of(obj).__qualname__}`"
                break
    if reference is None:
        return
    offenders = _find_offenders(held, reference)
    if not offenders:
        return
    reference_package = "lightning.pytorch" if reference == UNIFIED else "pytorch_lightning"
    lines = [
        f"{len(offenders)} object(s) are built on the other Lightning namespace than {reference_name}; "
        "a Trainer refuses or silently ignores them:"
    ]
    for offender in offenders:
        lines.append(
            f"  - {offender.role} `{offender.cls.__qualname__}` inherits "
            f"`{offender.base.__module__}.{offender.base.__qualname__}` (namespace `{offender.package}`, "
            f"not the Trainer's `{reference_package}`), defined in {offender.defined_in}. "
            f"Fix: {_fix(offender, reference_package)}."
        )
    lines.append(
        "HINT: Use one namespace throughout: `lightning.pytorch`/`lightning.fabric` or "
        f"`pytorch_lightning`/`lightning_fabric`, never both. To skip this check at launch, set {MODE_VARIABLE}=ignore."
    )
    raise MixedImportError("\n".join(lines))


def _is_trainer(obj: object) -> bool:
    return any(
        base.__name__ == "Trainer" and package_of(base.__module__) in ("lightning.pytorch", "pytorch_lightning")
        for base in type(obj).__mro__
    )


def check_launching_trainer(trainer: object | None = None, *objects: object, max_depth: int = 40) -> None:
    """The automatic check at launch time: find the Trainer on the stack if not given, and check what it holds.

    Honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore`` (skips). Called by
    :meth:`MPIClusterEnvironment.validate_settings`, which Lightning's launcher calls from
    ``launch(function, *args, trainer=...)`` before the first step; the positional ``args`` there (model, data,
    datamodule) are checked too. Does nothing when no Trainer is found (e.g. under Fabric).

    Args:
        trainer: The Trainer, when the caller has it.
        *objects: More objects to check.
        max_depth: How many frames to look through for the Trainer.

    Raises:
        MixedImportError: As :func:`check_mixed_imports`.
    """
    if mode() is Mode.IGNORE:
        return
    extra = list(objects)
    if trainer is None:
        for frame in _frames_above(sys._getframe(1), max_depth):
            local = frame.f_locals
            candidate = local.get("trainer")
            if candidate is not None and _is_trainer(candidate):
                trainer = candidate
                arguments = local.get("args")
                if frame.f_code.co_name == "launch" and isinstance(arguments, tuple):
                    extra.extend(arg for arg in arguments if arg is not None)
                break
    if trainer is not None:
        check_mixed_imports(*extra, trainer=trainer)


_ENTRY_POINTS = ("fit", "validate", "test", "predict")
_GUARDED = "_lightning_mpi_env_guarded"


class _CheckedEntryPoint:
    """``fit``/``validate``/``test``/``predict`` of one Trainer, with the mixed-import check first.

    A class rather than a closure: ``ddp_spawn`` pickles the Trainer, and with it its instance attributes.
    """

    def __init__(self, trainer: object, name: str) -> None:
        self._trainer = trainer
        self.__name__ = name
        self.__wrapped__ = getattr(type(trainer), name)
        self.__doc__ = self.__wrapped__.__doc__

    def __call__(self, *args: object, **kwargs: object) -> object:
        trainer, entry = self._trainer, self.__wrapped__
        if mode() is not Mode.IGNORE and _both_namespaces_loaded():
            import inspect  # Here, not at the top: the package's own import stays light.

            try:
                given = inspect.signature(entry).bind_partial(trainer, *args, **kwargs).arguments
            except TypeError:  # Lightning's own call reports wrong arguments better
                given = {}
            _check(trainer, [(role, obj) for role, obj in list(given.items())[1:] if obj is not None])
        return entry(trainer, *args, **kwargs)


def guard_trainer(trainer: object) -> None:
    """Check ``fit``/``validate``/``test``/``predict`` arguments (model, datamodule, ...) before Lightning does.

    Lightning checks the model's class first thing in ``fit()``, and refuses a model of the other namespace with
    "`model` must be a `LightningModule` ..., got `M`", which does not say why. The guard, set on this one Trainer
    instance, runs :func:`check_mixed_imports` on the arguments and on what the Trainer holds first, so the error
    names the class, its namespace, its file and the fix. It costs nothing unless both namespaces are loaded, and
    honors ``LIGHTNING_MPI_ENV_MIXED_IMPORTS=ignore``.

    Args:
        trainer: A ``lightning.pytorch`` or ``pytorch_lightning`` Trainer; anything else is left alone.
    """
    if not _is_trainer(trainer) or getattr(trainer, _GUARDED, False):
        return
    for name in _ENTRY_POINTS:
        setattr(trainer, name, _CheckedEntryPoint(trainer, name))
    setattr(trainer, _GUARDED, True)


def guard_constructing_trainer(max_depth: int = 12) -> None:
    """:func:`guard_trainer` on the Trainer whose ``__init__`` is on the stack, if any (else nothing)."""
    for frame in _frames_above(sys._getframe(1), max_depth):
        if frame.f_code.co_name == "__init__":
            candidate = frame.f_locals.get("self")
            if candidate is not None and _is_trainer(candidate):
                guard_trainer(candidate)
                return


# --- unify --------------------------------------------------------------------------------------------------------


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

    ``import pytorch_lightning[.X]`` gives the module object of ``lightning.pytorch[.X]``, and
    ``lightning_fabric[.X]`` that of ``lightning.fabric[.X]``, so old-style code runs on one namespace unchanged.
    Call it at the top of the entry script, before any Lightning import; it imports nothing itself. Calling it
    again is harmless.

    Raises:
        MixedImportError: ``pytorch_lightning`` or ``lightning_fabric`` is already imported (it would stay a second
            copy), ``lightning`` is not installed, or the installed versions of ``lightning``,
            ``pytorch-lightning`` and ``lightning-fabric`` differ.
    """
    already = _loaded_roots(STANDALONE)
    if already:
        both = " and `lightning.pytorch`/`lightning.fabric`" if _loaded_roots(UNIFIED) else ""
        site = _sites.get(STANDALONE)
        by = f" (first imported by {site})" if site is not None else ""
        raise MixedImportError(
            f"unify_imports() was called after {', '.join(f'`{r}`' for r in already)}{both} had been imported{by}; "
            "those module objects already exist and cannot be made the same as `lightning.pytorch`'s.\n"
            "HINT: Call `lightning_mpi_env.unify_imports()` at the very top of your entry script, before any "
            "import of Lightning or of a library that imports it."
        )
    spec = importlib.util.find_spec("lightning")
    version = _installed_version("lightning")
    if spec is None or not spec.submodule_search_locations or version is None:
        raise MixedImportError(
            "unify_imports() needs the unified `lightning` package, which is not installed; "
            "`pytorch_lightning` cannot be redirected to it.\n"
            "HINT: `pip install lightning` (the same version as pytorch-lightning), or do not call unify_imports()."
        )
    for distribution in ("pytorch-lightning", "lightning-fabric"):
        other = _installed_version(distribution)
        if other is not None and other != version:
            raise MixedImportError(
                f"unify_imports(): installed lightning=={version} but {distribution}=={other}; code written for "
                f"{distribution} {other} may not run on lightning {version}.\n"
                f"HINT: `pip install lightning=={other}` or `pip install {distribution}=={version}` so both match."
            )
    from pathlib import Path

    root = Path(next(iter(spec.submodule_search_locations)))
    aliases: dict[str, str] = {}
    for alias_root in _ROOTS[STANDALONE]:
        target_root = _COUNTERPART_PREFIX[alias_root]
        subdir = root / target_root.partition(".")[2]
        for target in _module_names(subdir, target_root):
            aliases[alias_root + target[len(target_root) :]] = target
        # Modules Lightning puts in sys.modules itself (deprecation shims) have no file to find.
        for name in list(sys.modules):
            if name.startswith(target_root + "."):
                aliases.setdefault(alias_root + name[len(target_root) :], name)
    alias_modules(aliases)


_watch_imports()
