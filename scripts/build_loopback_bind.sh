#!/usr/bin/env bash
# Builds scripts/loopback_bind.c into RUNNER_DIR/hvd_train_loopback_bind.so, beside a copy of its
# source, where Horovod's mpi_run.py (as patches/horovod-0.28.1/0010 leaves it) looks for it:
# the installed horovod/runner/ folder. Again only when that source changed. The library is
# the one piece of that change that is not Python; scripts/install.sh runs this after it
# installs Horovod.
#
#   bash scripts/build_loopback_bind.sh RUNNER_DIR
#
# Without a C compiler (CC, else cc), or when it fails, says so in one line and builds
# nothing: horovodrun then keeps mpirun's listener where Open MPI puts it, and says so at each
# such job. Exit code 0 either way: the install goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d "${1:-}" ] || { echo "usage: build_loopback_bind.sh RUNNER_DIR" >&2; exit 2; }
source=scripts/loopback_bind.c
lib="$1/hvd_train_loopback_bind.so" kept="$1/hvd_train_loopback_bind.c"
[ -f "$lib" ] && cmp -s "$source" "$kept" && exit 0
not_built() {
  echo "not built $lib ($1): an Open MPI job on one host keeps mpirun's listener on all interfaces, and horovodrun says so at each such job (docs/security.md)"
  rm -f "$lib.tmp"
  exit 0
}
read -r -a cc <<< "${CC:-cc}"
command -v "${cc[0]}" >/dev/null 2>&1 || not_built "no C compiler: ${cc[*]}"
if ! said=$("${cc[@]}" -shared -fPIC -O2 -o "$lib.tmp" "$source" -ldl 2>&1); then
  said=$(printf '%s\n' "$said" | tail -n 1)
  not_built "${cc[*]} failed: ${said:-no message}"
fi
mv "$lib.tmp" "$lib"  # whole or not at all
cp "$source" "$kept"
echo "built $lib: mpirun listens on loopback alone for a job on one host"
