# shellcheck shell=bash disable=SC2034  # CMD, NP, CONTROLLER are read by the sourcing script
# Shared by single_node.sh and multi_node.sh (sourced, not run). The horovodrun command is not
# built here: `hvd-train launch --print-command` builds it from the config, as for every launcher.

HVD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }

# The project's virtualenv for the stack HVD_TRAIN_TF names (.venv by default), so the scripts
# work from any folder.
# shellcheck source=scripts/stack.sh
. "$HVD_ROOT/scripts/stack.sh"
if [ -z "${HVD_TRAIN_PYTHON:-}" ]; then stack_select || exit 2; fi
PY=${HVD_TRAIN_PYTHON:-$HVD_ROOT/${STACK_VENV:-}/bin/python}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

say() { printf '[%s] %s\n' "$PROG" "$*"; }

check_python() {
  [ -x "$PY" ] || die "no Python at $PY: run scripts/install.sh, or set HVD_TRAIN_PYTHON"
  HOROVODRUN=${HVD_TRAIN_HOROVODRUN:-$(dirname "$PY")/horovodrun}
  [ -x "$HOROVODRUN" ] || die "no horovodrun at $HOROVODRUN: run scripts/install.sh"
}

# launch_command CONFIG [ARG...]: the job's horovodrun command, built by the one builder every
# launcher uses (hvd_train/launcher/horovodrun.py, through `hvd-train launch --print-command`), into the
# array CMD; NP and CONTROLLER are read back from it. A bad config ends the script with the
# loader's one-line error and its exit code (2).
launch_command() {
  local line rc=0
  line=$("$PY" -m hvd_train launch --print-command --config "$@") || rc=$?
  [ "$rc" = 0 ] || exit "$rc"
  # One shell-quoted line (Python's shlex.join): its words, as a POSIX shell reads them.
  eval "CMD=($line)"
  NP=${CMD[2]} CONTROLLER=gloo
  local word
  for word in "${CMD[@]}"; do [ "$word" != --mpi ] || CONTROLLER=mpi; done
  return 0
}

# gpu_count: GPUs on this machine, as the builder counts them (nvidia-smi -L, narrowed by
# CUDA_VISIBLE_DEVICES).
gpu_count() { "$PY" -c 'from hvd_train.launcher.horovodrun import count_gpus; print(count_gpus())'; }

is_loopback() { [[ $1 == localhost || $1 == 127.* || $1 == ::1 ]]; }

is_positive_int() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

# run_printed CMD...: prints the exact command (shell-quoted, `+ ` first), then runs it under
# the supervisor (hvd_train/launcher/supervise.py), which passes SIGTERM/SIGINT on to the workers (under
# MPI, horovodrun and mpirun do not); the script's exit code is the job's.
run_printed() {
  local quoted
  quoted=$(printf '%q ' "$@")
  printf '+ %s\n' "${quoted% }"
  [ "${DRY_RUN:-0}" = 1 ] && exit 0
  exec "$PY" -m hvd_train.launcher.supervise -- "$@"
}
