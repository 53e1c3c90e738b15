# shellcheck shell=bash
# shellcheck disable=SC2034  # GPU_ERROR, GPU_IDENTITY, CUDA_JIT_NOTE and the *_FOUND variables are for the caller
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

# Sets NCCL_FOUND (nccl.h), NCCL_FOUND_VERSION, NCCL_FOUND_LIB (the library Horovod's CMake
# links: libnccl_static.a, else libnccl.so; the wheel ships libnccl.so.2 alone, linked as
# libnccl.so before the build) and NCCL_FROM (home, include, cuda, system, wheel): NCCL's own
# install, the CUDA toolkit's, the system's, or the nvidia-nccl-cu12 wheel that
# tensorflow[and-cuda] brings, where an earlier install left it in the virtualenv. A header
# without its library is passed over: the build would find the header, then fail to link.
find_nccl() {
  local venv=$1 from what header lib looked=() wheel
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
      lib=$(nccl_library "$from" "$(dirname "$(dirname "$header")")")
      if [ -n "$lib" ]; then
        NCCL_FOUND=$header NCCL_FOUND_VERSION=$(nccl_version "$header") NCCL_FOUND_LIB=$lib
        NCCL_FROM=$from
        return 0
      fi
      looked+=("$what: $header (NCCL $(nccl_version "$header"), no libnccl_static.a or libnccl.so in $(nccl_lib_dirs "$from" "$(dirname "$(dirname "$header")")"))")
      continue
    fi
    case "$from:$header" in home: | include:) looked+=("$what (unset)") ;; *) looked+=("$what${header:+: $header} (none)") ;; esac
  done
  GPU_ERROR="Horovod's GPU build needs NCCL's header (nccl.h) and its library and found none: install NCCL 2 for CUDA 12 (libnccl2 and libnccl-dev from NVIDIA's CUDA repository; the nvidia/cuda devel images have them) or set HOROVOD_NCCL_HOME to an NCCL, or set HVD_TRAIN_DEVICE=cpu for the CPU build; looked at $(join_by '; ' "${looked[@]}")"
  return 1
}

# The folders Horovod's CMake (FindNCCL.cmake) links NCCL from, for NCCL found at $1 whose
# include/ lies in $2: HOROVOD_NCCL_LIB when set, else the install's own lib, the toolkit's, or
# the system's library folders.
nccl_lib_dirs() {
  if [ -n "${HOROVOD_NCCL_LIB:-}" ]; then echo "$HOROVOD_NCCL_LIB"; return; fi
  case $1 in
    home | wheel) echo "$2/lib" "$2/lib64" ;;
    cuda) echo "$CUDA_FOUND/lib64" "$CUDA_FOUND/lib" ;;
    *) echo /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib ;;
  esac
}

# The NCCL library the build links, for NCCL found at $1 under $2 (nccl_lib_dirs); empty for none.
nccl_library() {
  local dir name
  for dir in $(nccl_lib_dirs "$1" "$2"); do
    for name in libnccl_static.a libnccl.so libnccl.so.2; do
      [ ! -e "$dir/$name" ] || { echo "$dir/$name"; return 0; }
    done
  done
}

# Sets CUDA_ARCHS_FOUND, the compute capabilities Horovod's CUDA kernels are compiled for, as
# HOROVOD_BUILD_CUDA_CC_LIST takes them (80,86,90), and CUDA_ARCHS_FROM, where they came from:
# HVD_TRAIN_CUDA_ARCHS (80;86;89;90, or with commas) when set; else the GPUs nvidia-smi lists
# here (--query-gpu=compute_cap); else, with none visible (a `docker build`), the default
# CUDA_ARCHS_DEFAULT. Left to itself, Horovod compiles every architecture the first nvcc on
# PATH knows, twice. An architecture newer than this nvcc knows (a B200's 100 under CUDA 12.4)
# becomes the newest it does: Horovod adds that one's PTX, which the driver compiles for the
# GPU at first use (CUDA_JIT_NOTE says so).
CUDA_ARCHS_DEFAULT="80;86;89;90"
cuda_archs() {
  local nvcc=$CUDA_FOUND/bin/nvcc given known known_list wanted=() arch newest chosen=() seen=" "
  known=$("$nvcc" --list-gpu-arch 2>/dev/null | sed -nE 's/^compute_([0-9]+)$/\1/p' | sort -n | tr '\n' ' ')
  [ -n "$known" ] || { GPU_ERROR="$nvcc --list-gpu-arch lists no architecture: is it a whole CUDA 12 toolkit?"; return 2; }
  known_list=${known% }
  newest=${known_list##* }
  if [ -n "${HVD_TRAIN_CUDA_ARCHS:-}" ]; then
    given=${HVD_TRAIN_CUDA_ARCHS//;/,}
    [[ $given =~ ^[0-9]{2,3}(,[0-9]{2,3})*$ ]] \
      || { GPU_ERROR="HVD_TRAIN_CUDA_ARCHS='$HVD_TRAIN_CUDA_ARCHS': expected compute capabilities without the dot, separated by ';' (80;86;89;90: an A100, A10, L4 and H100)"; return 2; }
    IFS=, read -r -a wanted <<< "$given"
    CUDA_ARCHS_FROM=HVD_TRAIN_CUDA_ARCHS
  else
    read -r -a wanted <<< "$(nvidia_smi_archs)"
    CUDA_ARCHS_FROM="this host's GPUs (nvidia-smi)"
    if [ "${#wanted[@]}" = 0 ]; then
      IFS=';' read -r -a wanted <<< "$CUDA_ARCHS_DEFAULT"
      CUDA_ARCHS_FROM="the default, no GPU visible here (HVD_TRAIN_CUDA_ARCHS chooses)"
    fi
  fi
  CUDA_JIT_NOTE=""
  for arch in "${wanted[@]}"; do
    arch=$((10#$arch))
    if [[ " $known " != *" $arch "* ]]; then
      if [ "$arch" -lt "$newest" ]; then
        GPU_ERROR="compute capability $arch ($CUDA_ARCHS_FROM): nvcc $CUDA_FOUND_VERSION compiles for ${known_list// /, } only"
        return 2
      fi
      CUDA_JIT_NOTE="compute capability $arch is newer than nvcc $CUDA_FOUND_VERSION compiles for: Horovod's kernels are built as $newest's PTX, which the driver compiles at first use"
      arch=$newest
    fi
    [[ $seen == *" $arch "* ]] || { chosen+=("$arch"); seen="$seen$arch "; }
  done
  CUDA_ARCHS_FOUND=$(printf '%s\n' "${chosen[@]}" | sort -n | paste -sd, -)
}

# This host's GPUs' compute capabilities, without the dot, once each (9.0 twice: 90).
nvidia_smi_archs() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
    | sed -nE 's/^ *([0-9]+)\.([0-9]) *$/\1\2/p' | sort -nu | tr '\n' ' '
}

# nvcc compiles an empty CUDA file with the host compiler Horovod's CMake will use ($CXX, else
# c++): nvcc refuses a GCC newer than its toolkit supports (12.4 and 12.5 take GCC 13 at most),
# and that refusal is the range itself, to the patch level. Skipped without a C++ compiler: the
# install then puts Debian's g++ there, which every CUDA 12 accepts.
host_compiler_check() {
  local cxx out tmp
  cxx=$(command -v "${CXX:-c++}" 2>/dev/null) || return 0
  tmp=$(mktemp -d)
  if out=$("$CUDA_FOUND/bin/nvcc" -ccbin "$cxx" -x cu -c /dev/null -o "$tmp/empty.o" 2>&1); then
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$tmp"
  # host_config.h's "#error -- unsupported GNU version! gcc versions later than 13 are not
  # supported! The nvcc flag ..." (its advice, to override the check, left out); else nvcc's
  # first error line.
  out=$(grep -m 1 -iE 'error' <<< "$out" || head -n 1 <<< "$out")
  out=${out#*#error -- }
  out=${out%% The nvcc flag*}
  GPU_ERROR="nvcc $CUDA_FOUND_VERSION does not accept the host compiler $cxx ($("$cxx" -dumpfullversion 2>/dev/null || echo '?')): $out; install a compiler it supports and set CXX to it (CXX=g++-12), or set HVD_TRAIN_DEVICE=cpu for the CPU build"
  return 2
}

join_by() {
  local sep=$1 out=$2 part
  shift 2
  for part in "$@"; do out="$out$sep$part"; done
  printf '%s' "$out"
}

# Finds the toolkit and NCCL, checks the host compiler, chooses the architectures, exports them
# to Horovod's build and sets GPU_IDENTITY, the line the Horovod wheel's cache key adds on a GPU
# build: a wheel compiled with one CUDA or NCCL is never installed for another (the
# architectures are in the key as HOROVOD_BUILD_CUDA_CC_LIST). Returns 1 when a toolkit or NCCL
# is missing, 2 when what is there is refused.
gpu_toolkit() {
  find_cuda || return 1
  find_nccl "$1" || return 1
  host_compiler_check || return 2
  cuda_archs || return 2
  export HOROVOD_CUDA_HOME=$CUDA_FOUND HOROVOD_GPU_OPERATIONS=NCCL
  export HOROVOD_BUILD_CUDA_CC_LIST=$CUDA_ARCHS_FOUND
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

# The PATH Horovod's build runs with: the toolkit found first. Horovod's setup takes its
# -gencode list from the first nvcc on PATH while CMake compiles with HOROVOD_CUDA_HOME's: with
# conda's, 11.8's or 13's first, the CUDA 12 build dies on an architecture one knows and the
# other does not.
gpu_build_path() { printf '%s' "${CUDA_FOUND:+$CUDA_FOUND/bin:}$1"; }

# The GPUs CUDA shows a process here, from `nvidia-smi -L` on stdin: each whole GPU, and of all
# the MIG instances one (CUDA shows a process one MIG instance at most; workers are each pinned
# to theirs by UUID, base/gpus.py). Counting `^GPU ` lines, 8 GPUs split into instances made
# "TensorFlow lists 1 of 8" abort the install.
cuda_visible_gpus() {
  awk '/^GPU /{ if (gpu && !mig) whole++; gpu=1; mig=0; next }
       /^ +MIG /{ mig=1; any=1 }
       END { if (gpu && !mig) whole++; print whole + (any ? 1 : 0) }'
}

# After a GPU install: TensorFlow lists the GPUs CUDA shows here ($2, cuda_visible_gpus; 0: none
# visible, as in `docker build`, and then only NCCL is checked), runs a matmul and a convolution
# on each, and Horovod reports NCCL. $1: the virtualenv's python. Listing alone passed with a
# driver too old for the CUDA 12 runtime, or a PTX JIT that fails (a GPU newer than TensorFlow's
# machine code): both show only at the first op. Where the ops fail, the line names the driver
# found and CUDA 12's floor (525.60.13: NVIDIA's CUDA 12 minor-version compatibility).
CUDA_12_DRIVER_FLOOR=525.60.13
gpu_install_check() {
  local python=$1 gpus=$2 seen tf_gpus nccl cuda ran failure driver missing=()
  seen=$(TF_CPP_MIN_LOG_LEVEL=3 CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296} "$python" - 2>/dev/null <<'PYEOF'
import tensorflow as tf
import horovod.tensorflow as hvd
cuda = tf.sysconfig.get_build_info().get("cuda_version") or "none"
gpus = tf.config.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
ran, failure = 0, ""
for i in range(len(gpus)):
    try:
        with tf.device(f"/GPU:{i}"):
            a = tf.random.stateless_normal([512, 512], seed=[1, i])
            image = tf.random.stateless_normal([4, 32, 32, 16], seed=[2, i])
            kernel = tf.random.stateless_normal([3, 3, 16, 32], seed=[3, i])
            total = tf.reduce_sum(tf.matmul(a, a)) + tf.reduce_sum(tf.nn.conv2d(image, kernel, 1, "SAME"))
        if not tf.math.is_finite(total):
            raise ArithmeticError(f"a matmul and a convolution gave {float(total)}")
        ran += 1
    except Exception as e:  # the first failure, in one line
        failure = failure or f"GPU {i}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
print("hvd-check", len(gpus), int(bool(hvd.nccl_built())), cuda, ran)
print("hvd-check-failure", failure)
PYEOF
  ) || { GPU_ERROR="after the install, TensorFlow or Horovod does not import (run: $python -c 'import horovod.tensorflow')"; return 1; }
  read -r _ tf_gpus nccl cuda ran <<< "$(grep -m 1 '^hvd-check ' <<< "$seen")"
  failure=$(sed -n 's/^hvd-check-failure //p' <<< "$seen")
  [ -n "${ran:-}" ] || { GPU_ERROR="after the install, the check of TensorFlow's GPUs and Horovod's NCCL printed '$seen'"; return 1; }
  if [ "$gpus" -gt 0 ] && [ "$tf_gpus" -lt "$gpus" ]; then
    missing+=("TensorFlow lists $tf_gpus of the $gpus GPUs nvidia-smi lists (its build's CUDA: $cuda; \`hvd-train doctor\` says which library did not load)")
  elif [ "$ran" -lt "$tf_gpus" ]; then
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    missing+=("a matmul and a convolution ran on $ran of TensorFlow's $tf_gpus GPUs (${failure:-no reason given}); driver ${driver:-unknown} found, TensorFlow's CUDA $cuda needs $CUDA_12_DRIVER_FLOOR or newer, and a GPU newer than its machine code (sm_90) a driver that can compile its PTX")
  fi
  [ "$nccl" = 1 ] || missing+=("Horovod was built without NCCL (horovod.tensorflow.nccl_built() is false)")
  [ "${#missing[@]}" = 0 ] && return 0
  GPU_ERROR="after the GPU install, $(join_by ', and ' "${missing[@]}")"
  return 1
}
