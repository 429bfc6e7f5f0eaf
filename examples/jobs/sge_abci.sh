#!/bin/sh
# SGE / ABCI: qsub -g <group> examples/jobs/sge_abci.sh
#$ -l rt_F=2
#$ -l h_rt=0:30:00
#$ -j y
#$ -cwd
# SIGUSR2 60 s (the queue's `notify`) before h_rt's SIGKILL, to the whole job: every rank checkpoints, exits 99,
# and Grid Engine reschedules the job, which resumes from the checkpoint.
#$ -notify
# SGE_JOB_HOSTLIST (one host per line) names rank 0's host and JOB_ID gives the port. The host file may exist
# only on this (the first) node, so rank 0's host is read here and passed on as MASTER_ADDR.
set -eu
trap : USR1 USR2  # -notify's signals: this script stays to exit with mpirun's status (99: reschedule)
PER_NODE="${PER_NODE:-4}"
NODES=$(wc -l < "$SGE_JOB_HOSTLIST")
MPIRUN="${MPIRUN:-mpirun}"
TRAIN="${TRAIN:-python examples/train.py}"  # the training command (Fabric: TRAIN="python examples/fabric_train.py")
export MASTER_ADDR="${MASTER_ADDR:-$(head -n 1 "$SGE_JOB_HOSTLIST")}"
lightning-mpi-env simulate --nodes "$NODES" --per-node "$PER_NODE" --scheduler sge > /dev/null  # rank math check
$MPIRUN -np $((NODES * PER_NODE)) --hostfile "$SGE_JOB_HOSTLIST" --map-by "ppr:$PER_NODE:node" \
  -x MASTER_ADDR -x JOB_ID -x PATH \
  $TRAIN --devices "$PER_NODE" --num-nodes "$NODES"
