#!/bin/sh
# PBS Pro / Torque: qsub examples/jobs/pbs.sh
#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4
#PBS -l walltime=00:30:00
#PBS -j oe
# PBS_NODEFILE (one line per slot) names rank 0's host and PBS_JOBID gives the port. The node file exists only
# on the first node (the mother superior), so rank 0's host is read here and passed on as MASTER_ADDR.
set -eu
cd "${PBS_O_WORKDIR:-.}"
PER_NODE="${PER_NODE:-4}"
NODES=$(sort -u "$PBS_NODEFILE" | wc -l)
MPIRUN="${MPIRUN:-mpirun}"
export MASTER_ADDR="${MASTER_ADDR:-$(head -n 1 "$PBS_NODEFILE")}"
$MPIRUN -np $((NODES * PER_NODE)) --hostfile "$PBS_NODEFILE" --map-by "ppr:$PER_NODE:node" \
  -x MASTER_ADDR -x PBS_JOBID -x PATH \
  python examples/train.py --devices "$PER_NODE" --num-nodes "$NODES"
