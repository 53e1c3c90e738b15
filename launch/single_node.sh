#!/usr/bin/env bash
# One machine: one worker per GPU (nvidia-smi -L), or launch.cpu_workers workers without a GPU.
#
#   launch/single_node.sh CONFIG [--np N] [--set key=value ...] [--mpi | --gloo] [--dry-run]
#
# The controller is horovod.controller from the config (by default Open MPI without a GPU, else
# Gloo); --mpi or --gloo wins.
# The command is `hvd-train launch --print-command`'s, the same job `hvd-train launch` starts. The exact horovodrun command is printed
# before it runs; the exit code is the job's (2 with one line for a bad config).
set -euo pipefail
# shellcheck disable=SC2034  # PROG and DRY_RUN are read by _common.sh
PROG=single_node.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() { sed -n '4p' "${BASH_SOURCE[0]}" | sed 's/^#  *//' >&2; exit 2; }

config="" np="" controller="" sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --np) [ $# -ge 2 ] || usage; np=$2; shift 2 ;;
    --np=*) np=${1#--np=}; shift ;;
    --set) [ $# -ge 2 ] || usage; sets+=(--set "$2"); shift 2 ;;
    --set=*) sets+=(--set "${1#--set=}"); shift ;;
    --mpi) controller=mpi; shift ;;
    --gloo) controller=gloo; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (usage: $(sed -n '4p' "${BASH_SOURCE[0]}" | sed 's/^#  *//'))" ;;
    *) [ -z "$config" ] || die "one CONFIG expected, got '$config' and '$1'"; config=$1; shift ;;
  esac
done
[ -n "$config" ] || usage
[ -z "$np" ] || is_positive_int "$np" || die "--np expects a positive integer, got '$np'"

check_python
args=("$config" "${sets[@]}")
[ -z "$np" ] || args+=(--np "$np")
[ -z "$controller" ] || args+=("--$controller")
launch_command "${args[@]}"
say "$(gpu_count) GPU(s) on this machine: $NP worker(s), $CONTROLLER controller"
run_printed "${CMD[@]}"
