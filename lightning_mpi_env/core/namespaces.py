"""The two Lightning namespaces (``lightning.*``, ``pytorch_lightning``) as one table; nothing here imports either."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple


class Namespace(NamedTuple):
    """One Lightning namespace."""

    key: str
    """``"lightning"`` or ``"pytorch_lightning"``: how this package names the namespace."""
    trainer: str
    """The package with ``Trainer`` and its strategies."""
    fabric: str
    """The package with ``Fabric``, its strategies and the ``ClusterEnvironment`` ABC."""
    distribution: str
    fabric_distribution: str
    import_line: str
    """A regular expression matching a source line that imports this namespace (to find the importer later)."""

    @property
    def top_level(self) -> str:
        """The top-level module to look for or import: ``lightning`` or ``pytorch_lightning``."""
        return self.trainer.partition(".")[0]

    @property
    def roots(self) -> tuple[str, str]:
        """The trainer and fabric packages."""
        return (self.trainer, self.fabric)

    @property
    def label(self) -> str:
        """``"lightning.pytorch / lightning.fabric"``, for messages."""
        return f"{self.trainer} / {self.fabric}"

    @property
    def cluster_environment_module(self) -> str:
        """Where this namespace defines its ``ClusterEnvironment`` ABC."""
        return f"{self.fabric}.plugins.environments.cluster_environment"

    @property
    def strategy_packages(self) -> tuple[str, str]:
        """The trainer's and the fabric's ``strategies`` packages, each with its own ``StrategyRegistry``."""
        return (f"{self.trainer}.strategies", f"{self.fabric}.strategies")


UNIFIED = Namespace(
    key="lightning",
    trainer="lightning.pytorch",
    fabric="lightning.fabric",
    distribution="lightning",
    fabric_distribution="lightning",
    import_line=r"^\s*(?:from|import)\s+lightning(?:\.(?:pytorch|fabric))?(?:\s|,|$)",
)
STANDALONE = Namespace(
    key="pytorch_lightning",
    trainer="pytorch_lightning",
    fabric="lightning_fabric",
    distribution="pytorch-lightning",
    fabric_distribution="lightning-fabric",
    import_line=r"^\s*(?:from|import)\s+(?:pytorch_lightning|lightning_fabric)\b",
)

NAMESPACES: tuple[Namespace, ...] = (UNIFIED, STANDALONE)
"""Both namespaces; the unified one first, as the one Lightning recommends."""

NAMESPACES_BY_KEY: Mapping[str, Namespace] = MappingProxyType({row.key: row for row in NAMESPACES})

COUNTERPART: Mapping[str, str] = MappingProxyType(
    {
        **{a: b for a, b in zip(UNIFIED.roots, STANDALONE.roots, strict=True)},
        **{b: a for a, b in zip(UNIFIED.roots, STANDALONE.roots, strict=True)},
    }
)
"""Each package's twin in the other namespace: ``lightning.pytorch`` <-> ``pytorch_lightning``, ..."""


def package_of(module_name: str) -> str | None:
    """The Lightning package (a trainer or fabric package, or the unified root) a module belongs to, or ``None``.

    >>> [package_of(n) for n in ("pytorch_lightning.core", "lightning.fabric", "lightning_mpi_env", "lightning")]
    ['pytorch_lightning', 'lightning.fabric', None, 'lightning']
    """
    for package in COUNTERPART:
        if module_name == package or module_name.startswith(package + "."):
            return package
    top = module_name.partition(".")[0]
    return UNIFIED.key if top == UNIFIED.key else None


def namespace_of(module_name: str) -> str | None:
    """The key (``"lightning"`` or ``"pytorch_lightning"``) of the namespace a module belongs to, or ``None``."""
    package = package_of(module_name)
    if package is None:
        return None
    return STANDALONE.key if package in STANDALONE.roots else UNIFIED.key


def other(key: str) -> Namespace:
    """The other namespace than the one named ``key``."""
    return STANDALONE if key == UNIFIED.key else UNIFIED


def of_trainer_package(package: str) -> Namespace:
    """The namespace whose trainer or fabric package is ``package``; a ``KeyError`` (a bug of ours) for any other."""
    for namespace in NAMESPACES:
        if package in namespace.roots:
            return namespace
    raise KeyError(package)
