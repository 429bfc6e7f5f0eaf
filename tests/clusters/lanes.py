"""Lanes for the real launcher jobs: which jobs may run side by side, and which one at a time.

A lane is one xdist group and one file lock (:func:`tests.clusters.fixtures.real_launch_lock`): its jobs run one
after another, and the lanes run at once. Jobs in different lanes seldom clash: each ``mpirun`` derives its main
port from its own ``PMIX_NAMESPACE`` and Slurm's jobs from their job and step ids, into the 10,000 ports of
``DERIVED_PORT_RANGE``, and the Hydra tests take a free port above those or a fixed one of their own. Two jobs of
different lanes that run at once still derive the same port about once in 10,000 pairs: the second one's rank 0
cannot serve its roll call ("port ... is already in use") and its other ranks join the first job's ("Duplicate
rank"). Loopback addresses do not keep lanes apart, since torch's store listens on its port on every address
(``*:PORT``). Standard library only.
"""

from __future__ import annotations

from collections.abc import Collection

OPEN_MPI_LANES = 3
"""Lanes for the Open MPI jobs: with the two Slurm clusters' and the Hydras', six lanes on the suite's 4 xdist workers.
Their jobs overlap each other's waits (roll-call and stall timeouts, requeues)."""

SLURM_LANE = "slurm"
"""Every job on the two-node Slurm cluster: one cluster per pytest process, started by the worker that holds this
lane."""

SLURM_SPARE_LANE = "slurm-spare"
"""Every job on the three-node Slurm cluster (``slurm_cluster_with_spare``): its own daemons and ports, so its jobs
run beside the two-node cluster's."""

HYDRA_LANE = "hydra"
"""MPICH's and Intel MPI's ``mpiexec`` jobs (and their launcher installs)."""


def lane_of(fixtures: Collection[str], marks: Collection[str], dealt: int) -> str:
    """The lane of a real launcher test.

    Args:
        fixtures: The test's fixture names.
        marks: The names of the test's marks.
        dealt: How many Open MPI tests were dealt a lane before this one (round-robin).

    >>> lane_of(["slurm_cluster", "tmp_path"], {"mpi"}, 7), lane_of([], {"mpi", "hydra"}, 7)
    ('slurm', 'hydra')
    >>> lane_of(["slurm_cluster_with_spare"], {"mpi", "slurm"}, 7)
    'slurm-spare'
    >>> [lane_of(["cluster"], {"mpi"}, dealt) for dealt in range(4)]
    ['openmpi-0', 'openmpi-1', 'openmpi-2', 'openmpi-0']
    """
    if "slurm_cluster_with_spare" in fixtures:
        return SLURM_SPARE_LANE
    if "slurm_cluster" in fixtures or "slurm" in marks:
        return SLURM_LANE
    if "hydra_cluster" in fixtures or "hydra" in marks:
        return HYDRA_LANE
    return f"openmpi-{dealt % OPEN_MPI_LANES}"


__all__ = ["HYDRA_LANE", "OPEN_MPI_LANES", "SLURM_LANE", "SLURM_SPARE_LANE", "lane_of"]
