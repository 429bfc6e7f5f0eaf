"""Refuse objects built on the other Lightning namespace than the Trainer's, naming each one and its fix.

A class that inherits from ``pytorch_lightning`` is no instance of ``lightning.pytorch``'s base classes (and the
reverse): a Trainer refuses such an object, or silently ignores it.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from lightning_mpi_env.core.errors import MixedImportError
from lightning_mpi_env.core.namespaces import (
    COUNTERPART,
    NAMESPACES_BY_KEY,
    STANDALONE,
    UNIFIED,
    namespace_of,
    package_of,
)
from lightning_mpi_env.imports.sites import MODE_VARIABLE


@dataclass(frozen=True)
class Offender:
    """An object built on the other namespace than the reference (the Trainer's)."""

    role: str
    """What the object is to the Trainer: ``callback``, ``logger``, ``object``, ..."""
    cls: type
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


def _accepted_by(cls: type, key: str) -> bool:
    """Whether ``cls`` passes ``isinstance`` checks of namespace ``key``: it inherits, or is registered, there."""
    bases = _lightning_bases(cls)
    if any(namespace_of(base.__module__) == key for base in bases):
        return True
    for base in bases:
        package = package_of(base.__module__)
        if package is None or package not in COUNTERPART:
            continue
        counterpart_module = COUNTERPART[package] + base.__module__[len(package) :]
        counterpart = getattr(sys.modules.get(counterpart_module), base.__qualname__, None)
        if isinstance(counterpart, type) and issubclass(cls, counterpart):
            return True
    return False


def _find_offenders(held: Iterable[tuple[str, object]], key: str) -> list[Offender]:
    offenders = []
    seen: set[int] = set()
    for role, obj in held:
        cls = _class_of(obj)
        if id(obj) in seen or _is_ours(cls):
            continue
        seen.add(id(obj))
        bases = _lightning_bases(cls)
        if not bases or _accepted_by(cls, key):
            continue
        foreign = next(base for base in bases if namespace_of(base.__module__) != key)
        offenders.append(Offender(role, cls, foreign))
    return offenders


def _attribute(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a property that cannot answer yet holds nothing to check
        return None


def held_by(trainer: object) -> Iterator[tuple[str, object]]:
    """What a Trainer holds, as ``(role, object)``: callbacks, loggers, strategy and its plugins, profiler, data."""
    for role, name in (("callback", "callbacks"), ("logger", "loggers")):
        items = _attribute(trainer, name)
        if isinstance(items, (list, tuple)):
            for item in items:
                yield role, item
    strategy = _attribute(trainer, "strategy")
    single = [
        ("strategy", strategy),
        ("accelerator", _attribute(strategy, "accelerator")),
        ("cluster environment", _attribute(strategy, "cluster_environment")),
        ("precision plugin", _attribute(strategy, "precision_plugin")),
        ("checkpoint IO plugin", _attribute(strategy, "checkpoint_io")),
        ("profiler", _attribute(trainer, "profiler")),
        ("datamodule", _attribute(trainer, "datamodule")),
        ("model", _attribute(strategy, "lightning_module")),
    ]
    for role, obj in single:
        if obj is not None:
            yield role, obj


def _fix(offender: Offender, reference_package: str) -> str:
    wrong = offender.package
    right = COUNTERPART.get(wrong, reference_package)
    where = offender.defined_in.rpartition(":")[0] if offender.defined_in.count(":") else offender.defined_in
    fix = f"in {where}, import from `{right}` instead of `{wrong}`"
    if namespace_of(wrong) == STANDALONE.key:
        fix += " (or, if you cannot edit it, call `lightning_mpi_env.unify_imports()` before any Lightning import)"
    return fix


def check_mixed_imports(*objects: object, trainer: object | None = None) -> None:
    """Refuse objects built on the other Lightning namespace than the Trainer's (or than the first object's).

    Checks every object or class given and everything the Trainer holds (:func:`held_by`). An object counts as the
    Trainer's when it inherits from, or is registered with, a class of its namespace; objects with no Lightning base
    (and everything from ``lightning_mpi_env``) are neutral.

    Raises:
        MixedImportError: Naming every offender, the file that defines it, and the fix.
    """
    check_roles(trainer, [("object", obj) for obj in objects])


def check_roles(trainer: object | None, given: Iterable[tuple[str, object]]) -> None:
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
    reference_package = NAMESPACES_BY_KEY[reference].trainer
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
    raise MixedImportError(
        "\n".join(lines),
        f"Use one namespace throughout: `{UNIFIED.trainer}`/`{UNIFIED.fabric}` or "
        f"`{STANDALONE.trainer}`/`{STANDALONE.fabric}`, never both. To skip this check at launch, set "
        f"{MODE_VARIABLE}=ignore.",
    )
