#!/bin/sh
# SGE / ABCI: qsub -g <group> examples/jobs/sge_abci.sh
#$ -l rt_F=2
#$ -l h_rt=0:30:00
#$ -j y
#$ -cwd
# SGE_JOB_HOSTLIST (one host per line) names rank 0's host and JOB_ID gives the port: nothing to export by hand.
set -eu
PER_NODE="${PER_NODE:-4}"
NODES=$(wc -l < "$SGE_JOB_HOSTLIST")
MPIRUN="${MPIRUN:-mpirun}"
$MPIRUN -np $((NODES * PER_NODE)) --hostfile "$SGE_JOB_HOSTLIST" --map-by "ppr:$PER_NODE:node" \
  -x SGE_JOB_HOSTLIST -x JOB_ID -x PATH \
  python examples/train.py --devices "$PER_NODE" --num-nodes "$NODES"
