#!/bin/sh
# Runs the command in ./rank$HOROVOD_RANK, so that what each rank writes can be told apart.
set -e
mkdir -p "rank${HOROVOD_RANK:?not started by horovodrun}"
cd "rank${HOROVOD_RANK}"
exec "$@"
