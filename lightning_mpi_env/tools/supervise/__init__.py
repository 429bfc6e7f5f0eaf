"""``lightning-mpi-env run``: a supervisor that relaunches a failed job step inside its allocation (issue 24).

Pure parts so far: the user's ``srun`` line and its exclusions (:mod:`.srun_line`), when to relaunch and how long
to wait (:mod:`.policy`), and the timeline of events (:mod:`.timeline`); the user's ``mpirun``/``mpiexec`` line
(:mod:`.mpirun_line`, by the tables of :mod:`.mpirun_options`) and the hosts it may use (:mod:`.allocation`). The
adapter :mod:`.mpirun_family` asks the launcher which family it is.
"""
