#!/bin/sh
# torchrun once per node, started by mpirun: the node count, node rank and main address come from the launcher.
#
#   sh examples/torchrun_per_node.sh [WORKERS_PER_NODE] [NODES]
#   MPIRUN="mpirun --hostfile hosts" MASTER_ADDR=nodea sh examples/torchrun_per_node.sh 4 2   # no scheduler
#
# Under Slurm or LSF the main address comes from the job's host list (SLURM_JOB_NODELIST, LSB_MCPU_HOSTS); for a
# plain mpirun, SGE or PBS, export MASTER_ADDR=<first host> first. `sh -c` delays the $(...) until each node runs it.
set -eu
WORKERS_PER_NODE="${1:-4}"
NODES="${2:-2}"
MPIRUN="${MPIRUN:-mpirun}"
# shellcheck disable=SC2016  # the single quotes are on purpose: each node expands $(...) itself
$MPIRUN -np "$NODES" --map-by ppr:1:node -x MASTER_ADDR -x PATH \
  sh -c 'torchrun $(lightning-mpi-env torchrun-args --nproc-per-node '"$WORKERS_PER_NODE"') examples/ddp_plain.py'
