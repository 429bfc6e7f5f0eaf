#!/bin/sh
# PBS Pro / Torque: qsub examples/jobs/pbs.sh
#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4
#PBS -l walltime=00:30:00
#PBS -j oe
# Rerunnable: on SIGUSR1 every rank checkpoints, rank 0 runs `qrerun`, and the job starts again from the checkpoint.
# PBS sends no signal before the walltime's SIGTERM: send it yourself, `qsig -s USR1 $PBS_JOBID`.
#PBS -r y
# PBS_NODEFILE (one line per slot) names rank 0's host and PBS_JOBID gives the port. The node file exists only
# on the first node (the mother superior), so rank 0's host is read here and passed on as MASTER_ADDR.
set -eu
cd "${PBS_O_WORKDIR:-.}"
PER_NODE="${PER_NODE:-4}"
NODES=$(sort -u "$PBS_NODEFILE" | wc -l)
MPIRUN="${MPIRUN:-mpirun}"
TRAIN="${TRAIN:-python examples/train.py}"  # the training command (Fabric: TRAIN="python examples/fabric_train.py")
export MASTER_ADDR="${MASTER_ADDR:-$(head -n 1 "$PBS_NODEFILE")}"
$MPIRUN -np $((NODES * PER_NODE)) --hostfile "$PBS_NODEFILE" --map-by "ppr:$PER_NODE:node" \
  -x MASTER_ADDR -x PBS_JOBID -x PATH \
  $TRAIN --devices "$PER_NODE" --num-nodes "$NODES"
