"""Lightning's ``callbacks_factory`` entry points for lightning-mpi-env: nothing unless the program uses the package.

Lightning calls them in every ``Trainer(...)`` of every program in the environment, so they live outside the package
and import nothing unless the program already imported ``lightning_mpi_env``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

PACKAGE = "lightning_mpi_env"
"""The package the factories delegate to once the program imported it."""


def _factory(name: str) -> list[Any]:
    if PACKAGE not in sys.modules:  # a program that does not use the package gets exactly Lightning's Trainer
        return []
    factory = getattr(importlib.import_module(f"{PACKAGE}.lightning.callbacks"), name)
    callbacks: list[Any] = factory()
    return callbacks


def unified_callbacks() -> list[Any]:
    """``lightning.pytorch.callbacks_factory``: the package's callback, only for a program that imported it."""
    return _factory("unified_callbacks")


def standalone_callbacks() -> list[Any]:
    """``pytorch_lightning.callbacks_factory``: the package's callback, only for a program that imported it."""
    return _factory("standalone_callbacks")


__all__ = ["PACKAGE", "standalone_callbacks", "unified_callbacks"]
