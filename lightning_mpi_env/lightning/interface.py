"""Lightning's ``ClusterEnvironment`` interface, declared here so the environment needs neither namespace to exist."""

from __future__ import annotations

from abc import ABC, abstractmethod


class ClusterEnvironmentInterface(ABC):
    """Lightning's ``ClusterEnvironment`` contract, stated here so no namespace is imported to state it."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether the launcher, not Lightning, starts the processes."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Host through which all processes meet."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port on the main address."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this environment applies to the current process."""

    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Lightning's proposal for the world size."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process in the job."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Lightning's proposal for the global rank."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Index of this process's node."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:  # noqa: B027 (optional, as in Lightning)
        """Check the Trainer's ``devices`` and ``num_nodes`` against the launched world."""

    def teardown(self) -> None:  # noqa: B027 (optional, as in Lightning)
        """Clean up after the run."""
