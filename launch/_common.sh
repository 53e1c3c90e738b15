# shellcheck shell=bash disable=SC2034  # CFG_* and the flags are read by the sourcing script
# Shared by single_node.sh and multi_node.sh (sourced, not run). Reads the config only through
# `python -m hvd_train.config --get` (the trainer's own loader) and turns its Horovod section
# into horovodrun flags.

HVD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The project's virtualenv by default, so the scripts work from any folder.
PY=${HVD_TRAIN_PYTHON:-$HVD_ROOT/.venv/bin/python}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 2; }
say() { printf '[%s] %s\n' "$PROG" "$*"; }

check_python() {
  [ -x "$PY" ] || die "no Python at $PY: run scripts/install.sh, or set HVD_TRAIN_PYTHON"
  HOROVODRUN=${HVD_TRAIN_HOROVODRUN:-$(dirname "$PY")/horovodrun}
  [ -x "$HOROVODRUN" ] || die "no horovodrun at $HOROVODRUN: run scripts/install.sh"
}

# read_config CONFIG [--set k=v ...]: sets CFG_* from the resolved config. A bad config ends
# the script with the loader's one-line error and its exit code (2).
read_config() {
  local config=$1; shift
  local values rc=0
  values=$("$PY" -m hvd_train.config --config "$config" "$@" \
    --get horovod.controller --get horovod.fusion_threshold_mb --get horovod.cycle_time_ms \
    --get horovod.timeline --get horovod.autotune --get launch.cpu_workers --get run.dir) || rc=$?
  [ "$rc" = 0 ] || exit "$rc"
  local lines=()
  mapfile -t lines <<<"$values"
  CFG_CONTROLLER=${lines[0]} CFG_FUSION_MB=${lines[1]} CFG_CYCLE_MS=${lines[2]}
  CFG_TIMELINE=${lines[3]} CFG_AUTOTUNE=${lines[4]} CFG_CPU_WORKERS=${lines[5]}
  CFG_RUN_DIR=${lines[6]}
}

# horovod_flags: the config's Horovod knobs as horovodrun flags, into the array HVD_FLAGS.
# The trainer applies the same knobs itself when started without them (plain mpirun).
horovod_flags() {
  HVD_FLAGS=()
  [ -n "$CFG_FUSION_MB" ] && HVD_FLAGS+=(--fusion-threshold-mb "$CFG_FUSION_MB")
  [ -n "$CFG_CYCLE_MS" ] && HVD_FLAGS+=(--cycle-time-ms "$CFG_CYCLE_MS")
  # Rank 0 writes it; an absolute path, as workers on other hosts resolve it too.
  [ "$CFG_TIMELINE" = true ] && HVD_FLAGS+=(--timeline-filename "$(realpath -m "$CFG_RUN_DIR")/timeline.json")
  [ "$CFG_AUTOTUNE" = true ] && HVD_FLAGS+=(--autotune)
  return 0
}

# controller_flags CONTROLLER GPUS [MPI_ARG...]: --gloo, or --mpi with one --mpi-args (horovodrun
# keeps only its last) holding the flags a shared CPU needs and the given ones.
controller_flags() {
  local controller=$1 gpus=$2
  shift 2
  CTRL_FLAGS=()
  if [ "$controller" = mpi ]; then
    # horovodrun --mpi already adds --allow-run-as-root (containers run as root), -bind-to none
    # and -map-by slot. Without GPUs the workers share the cores with TensorFlow's threads:
    # Open MPI must yield while it waits instead of busy-polling a core per rank.
    local mpi_args=()
    [ "$gpus" = 0 ] && mpi_args+=(--mca mpi_yield_when_idle 1)
    mpi_args+=("$@")
    CTRL_FLAGS+=(--mpi)
    [ ${#mpi_args[@]} = 0 ] || CTRL_FLAGS+=("--mpi-args=${mpi_args[*]}")
  else
    CTRL_FLAGS+=(--gloo)
  fi
  return 0
}

# network_flags NICS HOST...: the interfaces the job binds to and talks on, as horovodrun flags
# (NET_FLAGS) and Open MPI flags for controller_flags (NET_MPI_ARGS); the same rule as
# hvd_train/launch.py network_flags. Named interfaces (--network-interface) win: Horovod sets
# Gloo's interface, btl_tcp_if_include and NCCL_SOCKET_IFNAME from them, and mpirun's own
# traffic follows oob_tcp_if_include. Else, when every host is this machine's loopback: lo, and
# under MPI only the shared-memory transports, so no rank listens on TCP (Open MPI's TCP
# transport listens on all interfaces whatever btl_tcp_if_include says).
network_flags() {
  local nics=$1 host loopback=1
  shift
  for host in "$@"; do is_loopback "$host" || loopback=0; done
  NET_FLAGS=() NET_MPI_ARGS=()
  if [ -n "$nics" ]; then
    NET_FLAGS=(--network-interfaces "$nics") NET_MPI_ARGS=(--mca oob_tcp_if_include "$nics")
  elif [ "$loopback" = 1 ]; then
    NET_FLAGS=(--network-interfaces lo) NET_MPI_ARGS=(--mca btl_base_include "self,vader")
  fi
  return 0
}

is_loopback() { [[ $1 == localhost || $1 == 127.* || $1 == ::1 ]]; }

# count_gpus: GPUs on this machine (nvidia-smi -L), narrowed by CUDA_VISIBLE_DEVICES if set.
count_gpus() {
  local n=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  fi
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ] && [ "$n" -gt 0 ]; then
    local visible=${CUDA_VISIBLE_DEVICES//[[:space:]]/}
    if [ -z "$visible" ] || [ "$visible" = -1 ]; then n=0
    else n=$(tr ',' '\n' <<<"$visible" | grep -c .); fi
  fi
  echo "$n"
}

is_positive_int() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

# run_printed CMD...: prints the exact command (shell-quoted, `+ ` first), then runs it under
# the supervisor (hvd_train/supervise.py), which passes SIGTERM/SIGINT on to the workers (under
# MPI, horovodrun and mpirun do not); the script's exit code is the job's.
run_printed() {
  local quoted
  quoted=$(printf '%q ' "$@")
  printf '+ %s\n' "${quoted% }"
  [ "${DRY_RUN:-0}" = 1 ] && exit 0
  exec "$PY" -m hvd_train.supervise -- "$@"
}
