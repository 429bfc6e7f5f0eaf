#!/bin/sh
# Plain mpirun, no scheduler: name the hosts and the main address yourself.
#
#   HOSTS=nodea,nodeb sh examples/jobs/mpirun.sh
set -eu
HOSTS="${HOSTS:-nodea,nodeb}"
PER_NODE="${PER_NODE:-4}"
NODES=$(echo "$HOSTS" | tr ',' '\n' | wc -l)
MPIRUN="${MPIRUN:-mpirun}"
TRAIN="${TRAIN:-python examples/train.py}"  # the training command (Fabric: TRAIN="python examples/fabric_train.py")
export MASTER_ADDR="${MASTER_ADDR:-${HOSTS%%,*}}"  # rank 0 runs on the first host
lightning-mpi-env simulate --nodes "$NODES" --per-node "$PER_NODE" --launcher openmpi > /dev/null  # rank math check
$MPIRUN -np $((NODES * PER_NODE)) --host "$(echo "$HOSTS" | sed "s/\(,\|$\)/:$PER_NODE\1/g")" \
  --map-by "ppr:$PER_NODE:node" -x MASTER_ADDR -x PATH \
  $TRAIN --devices "$PER_NODE" --num-nodes "$NODES"
