"""Pytest fixtures for the real launchers and schedulers of :mod:`tests.clusters` (loaded by ``conftest.py``)."""
