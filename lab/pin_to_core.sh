#!/bin/sh
# Pins each worker horovodrun starts to one core of its own (core = local rank), then runs the
# command: `horovodrun -np 2 ... lab/pin_to_core.sh python -m hvd_train ...`. The local
# rank comes from horovodrun's Gloo launcher or from Open MPI (horovodrun --mpi, mpirun).
exec taskset -c "${HOROVOD_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:?not started by horovodrun or mpirun}}" "$@"
