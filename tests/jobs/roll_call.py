"""Run the roll call alone (no Lightning) as every rank of a real launch, and print its summary on rank 0.

The layout and the settings come from the launcher's variables, as in the plugin; this package's errors are shown as
one line per rank (the plugin's display).
"""

import os
import sys


def main():
    from lightning_mpi_env.core.layout import from_env
    from lightning_mpi_env.core.report import install_excepthook
    from lightning_mpi_env.core.settings import Settings
    from lightning_mpi_env.rollcall.claims import Claim
    from lightning_mpi_env.rollcall.store import rendezvous

    install_excepthook()
    layout = from_env(os.environ)  # sys.argv[1:]: a tag for the test to find leftover ranks by
    settings = Settings.from_env(os.environ)
    claim = Claim.here(
        rank=layout.rank,
        world_size=layout.world_size,
        local_rank=layout.local_rank,
        main_address=layout.main_address,
        main_port=layout.main_port,
    )
    result = rendezvous(
        claim, timeout=settings.rendezvous_timeout, expected_node=lambda rank: rank // layout.local_size
    )
    if layout.rank == 0:
        print(result.summary, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
