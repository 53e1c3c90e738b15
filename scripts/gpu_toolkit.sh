# shellcheck shell=bash
# shellcheck disable=SC2034  # GPU_ERROR, GPU_IDENTITY and the *_FOUND variables are for the caller
# The CUDA 12 toolkit and NCCL that Horovod's GPU build compiles against, found before the
# install downloads anything, and the check after it that TensorFlow sees the GPUs and Horovod
# has NCCL. Sourced by scripts/install.sh (and scripts/gpu_test.sh); each function sets
# variables, or returns 1 with the reason in GPU_ERROR, which the caller prints as its one line.
#
# Looked at, in order: HOROVOD_CUDA_HOME (when set, the only toolkit looked at: it is the one
# Horovod's CMake compiles with), CUDA_HOME, nvcc on PATH, then the toolkits in
# HVD_TRAIN_CUDA_DIRS (default /usr/local/cuda*). The first nvcc 12.x wins: every TensorFlow
# stack hvd_train supports is built against CUDA 12, and CUDA 13's nvcc compiles kernels
# TensorFlow's CUDA 12 runtime cannot load.

# `nvcc --version`'s "release 12.4, V12.4.131" as 12.4.131 (12.4 without the V part); empty
# when there is no nvcc there.
nvcc_version() {
  [ -x "$1" ] || return 0
  "$1" --version 2>/dev/null | sed -nE 's/.*release ([0-9][0-9.]*)(, V([0-9][0-9.]*))?.*/\1 \3/p' \
    | head -n 1 | awk '{ print ($2 != "" ? $2 : $1) }'
}

# NCCL's version from its header's NCCL_MAJOR, NCCL_MINOR and NCCL_PATCH (2.21.5).
nccl_version() {
  awk '$1 == "#define" && $2 == "NCCL_MAJOR" { ma = $3 } $1 == "#define" && $2 == "NCCL_MINOR" { mi = $3 }
       $1 == "#define" && $2 == "NCCL_PATCH" { pa = $3 }
       END { if (ma != "") print ma "." mi "." pa }' "$1" 2>/dev/null
}

# Each nvcc worth a look, as "where|path" ("where (none)|" for a place that has none).
cuda_candidates() {
  if [ -n "${HOROVOD_CUDA_HOME:-}" ]; then
    echo "HOROVOD_CUDA_HOME|$HOROVOD_CUDA_HOME/bin/nvcc"
    return
  fi
  if [ -n "${CUDA_HOME:-}" ]; then echo "CUDA_HOME|$CUDA_HOME/bin/nvcc"; else echo "CUDA_HOME (unset)|"; fi
  if command -v nvcc >/dev/null; then echo "nvcc on PATH|$(command -v nvcc)"; else echo "nvcc on PATH (none)|"; fi
  local dir seen=""
  # shellcheck disable=SC2086  # a glob, by design
  for dir in ${HVD_TRAIN_CUDA_DIRS:-/usr/local/cuda*}; do
    [ -x "$dir/bin/nvcc" ] || continue
    # /usr/local/cuda is most often a link to one of the others
    case " $seen " in *" $(readlink -f "$dir/bin/nvcc") "*) continue ;; esac
    seen="$seen $(readlink -f "$dir/bin/nvcc")"
    echo "${HVD_TRAIN_CUDA_DIRS:-/usr/local/cuda*}|$dir/bin/nvcc"
  done
  [ -n "$seen" ] || echo "${HVD_TRAIN_CUDA_DIRS:-/usr/local/cuda*} (none)|"
}

# Sets CUDA_FOUND (the toolkit's folder, above bin/nvcc) and CUDA_FOUND_VERSION.
find_cuda() {
  local line what nvcc version looked=()
  while IFS= read -r line; do
    what=${line%%|*} nvcc=${line#*|}
    if [ -z "$nvcc" ]; then looked+=("$what"); continue; fi
    version=$(nvcc_version "$nvcc")
    looked+=("$what: $nvcc (${version:+CUDA }${version:-no nvcc})")
    if [ "${version%%.*}" = 12 ]; then
      CUDA_FOUND=$(dirname "$(dirname "$nvcc")") CUDA_FOUND_VERSION=$version
      return 0
    fi
  done < <(cuda_candidates)
  GPU_ERROR="Horovod's GPU build needs a CUDA 12 toolkit (nvcc 12.x: TensorFlow ${TF_VERSION:-} is built against CUDA 12) and found none: install CUDA 12's toolkit (NVIDIA's cuda-toolkit-12-x package) and set HOROVOD_CUDA_HOME to it, or set HVD_TRAIN_DEVICE=cpu for the CPU build; looked at $(join_by '; ' "${looked[@]}")"
  return 1
}

# Sets NCCL_FOUND (nccl.h), NCCL_FOUND_VERSION and NCCL_FROM (home, include, cuda, system,
# wheel): NCCL's own install, the CUDA toolkit's, the system's, or the nvidia-nccl-cu12 wheel
# that tensorflow[and-cuda] brings, where an earlier install left it in the virtualenv.
find_nccl() {
  local venv=$1 from what header looked=() wheel
  wheel=$(compgen -G "$venv/lib/python3*/site-packages/nvidia/nccl/include/nccl.h" | head -n 1 || true)
  for from in home include cuda system wheel; do
    case $from in
      home) header=${HOROVOD_NCCL_HOME:+$HOROVOD_NCCL_HOME/include/nccl.h}; what=HOROVOD_NCCL_HOME ;;
      include) header=${HOROVOD_NCCL_INCLUDE:+$HOROVOD_NCCL_INCLUDE/nccl.h}; what=HOROVOD_NCCL_INCLUDE ;;
      cuda) header=$CUDA_FOUND/include/nccl.h; what="the CUDA toolkit" ;;
      system) header=/usr/include/nccl.h; what="the system" ;;
      wheel) header=$wheel; what="the nvidia-nccl-cu12 wheel in $venv" ;;
    esac
    if [ -n "$header" ] && [ -f "$header" ] && [ -n "$(nccl_version "$header")" ]; then
      NCCL_FOUND=$header NCCL_FOUND_VERSION=$(nccl_version "$header") NCCL_FROM=$from
      return 0
    fi
    case "$from:$header" in home: | include:) looked+=("$what (unset)") ;; *) looked+=("$what${header:+: $header} (none)") ;; esac
  done
  GPU_ERROR="Horovod's GPU build needs NCCL's header (nccl.h) and found none: install NCCL 2 for CUDA 12 (libnccl-dev from NVIDIA's CUDA repository; the nvidia/cuda devel images have it) or set HOROVOD_NCCL_HOME to an NCCL, or set HVD_TRAIN_DEVICE=cpu for the CPU build; looked at $(join_by '; ' "${looked[@]}")"
  return 1
}

join_by() {
  local sep=$1 out=$2 part
  shift 2
  for part in "$@"; do out="$out$sep$part"; done
  printf '%s' "$out"
}

# Finds both, exports them to Horovod's build and sets GPU_IDENTITY, the line the Horovod
# wheel's cache key adds on a GPU build: a wheel compiled with one CUDA or NCCL is never
# installed for another.
gpu_toolkit() {
  find_cuda || return 1
  find_nccl "$1" || return 1
  export HOROVOD_CUDA_HOME=$CUDA_FOUND HOROVOD_GPU_OPERATIONS=NCCL
  local include
  include=$(dirname "$NCCL_FOUND")
  case $NCCL_FROM in
    home | include) ;;  # the user's own settings, as given
    cuda)
      export HOROVOD_NCCL_INCLUDE=$include
      [ ! -d "$CUDA_FOUND/lib64" ] || export HOROVOD_NCCL_LIB=$CUDA_FOUND/lib64
      ;;
    system) export HOROVOD_NCCL_INCLUDE=$include ;;  # the library: where the linker looks
    wheel) HOROVOD_NCCL_HOME=$(dirname "$include") && export HOROVOD_NCCL_HOME ;;
  esac
  GPU_IDENTITY="cuda=$CUDA_FOUND_VERSION nccl=$NCCL_FOUND_VERSION"
}

# After a GPU install: TensorFlow lists the GPUs nvidia-smi does ($2; 0: none visible here, as
# in `docker build`, and then only NCCL is checked) and Horovod reports NCCL. $1: the
# virtualenv's python.
gpu_install_check() {
  local python=$1 gpus=$2 seen tf_gpus nccl cuda missing=()
  seen=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" - 2>/dev/null <<'PYEOF'
import tensorflow as tf
import horovod.tensorflow as hvd
cuda = tf.sysconfig.get_build_info().get("cuda_version") or "none"
print(len(tf.config.list_physical_devices("GPU")), int(bool(hvd.nccl_built())), cuda)
PYEOF
  ) || { GPU_ERROR="after the install, TensorFlow or Horovod does not import (run: $python -c 'import horovod.tensorflow')"; return 1; }
  read -r tf_gpus nccl cuda <<< "$(tail -n 1 <<< "$seen")"
  [ -n "${cuda:-}" ] || { GPU_ERROR="after the install, the check of TensorFlow's GPUs and Horovod's NCCL printed '$seen'"; return 1; }
  if [ "$gpus" -gt 0 ] && [ "$tf_gpus" -lt "$gpus" ]; then
    missing+=("TensorFlow lists $tf_gpus of the $gpus GPUs nvidia-smi lists (its build's CUDA: $cuda; \`hvd-train doctor\` says which library did not load)")
  fi
  [ "$nccl" = 1 ] || missing+=("Horovod was built without NCCL (horovod.tensorflow.nccl_built() is false)")
  [ "${#missing[@]}" = 0 ] && return 0
  GPU_ERROR="after the GPU install, $(join_by ', and ' "${missing[@]}")"
  return 1
}
