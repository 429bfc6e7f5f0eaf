#!/bin/sh
# PBS Pro / Torque: qsub examples/jobs/pbs.sh
#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4
#PBS -l walltime=00:30:00
#PBS -j oe
# PBS_NODEFILE (one line per slot) names rank 0's host and PBS_JOBID gives the port.
set -eu
cd "${PBS_O_WORKDIR:-.}"
PER_NODE="${PER_NODE:-4}"
NODES=$(sort -u "$PBS_NODEFILE" | wc -l)
MPIRUN="${MPIRUN:-mpirun}"
$MPIRUN -np $((NODES * PER_NODE)) --hostfile "$PBS_NODEFILE" --map-by "ppr:$PER_NODE:node" \
  -x PBS_NODEFILE -x PBS_JOBID -x PATH \
  python examples/train.py --devices "$PER_NODE" --num-nodes "$NODES"
