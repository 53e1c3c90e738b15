#!/bin/sh
# The image's entrypoint: runs its arguments, with a HOME this user can write.
#
# `docker run --user UID:GID` with a uid the image has no account for leaves HOME at /, which
# only root can write; horovodrun (~/.horovod), pip and matplotlib write under HOME and fail.
# Such a user gets a HOME of its own under /tmp; mpiuser (uid 1000, the MPI Operator's user,
# whose sessions over ssh never pass through here) keeps /home/mpiuser.
if [ ! -w "${HOME:-/}" ]; then
  HOME="/tmp/home-$(id -u)"
  export HOME
  mkdir -p "$HOME"
fi
exec "$@"
