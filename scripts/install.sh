#!/usr/bin/env bash
# Installs everything hvd_train needs into the stack's virtualenv (./.venv for the default
# TensorFlow 2.21 on Python 3.11), idempotently: a second run installs nothing. The one install
# path: `make demo`, `make test`, CI and the Dockerfile all call this script.
#
#   scripts/install.sh            # CPU build unless an NVIDIA GPU is present
#   HVD_TRAIN_DEVICE=gpu scripts/install.sh   # force the CUDA build (Docker GPU image)
#   HVD_TRAIN_DEVICE=cpu scripts/install.sh   # the CPU build on a GPU host
#   scripts/install.sh --check-gpu-toolkit    # only find the CUDA 12 toolkit and NCCL a GPU
#                                             # build needs, print what Horovod's build gets, exit
#   HVD_TRAIN_TF=2.15 scripts/install.sh      # TensorFlow 2.15.1 in .venv-tf2.15
#                                             # (2.21, 2.20, 2.19, 2.18, 2.15: scripts/stack.sh)
#   HVD_TRAIN_KERAS_HUB=1 scripts/install.sh  # also KerasHub, for Keras 3 models built from
#                                             # its classes (TensorFlow 2.16+; `make test` sets it)
#   PYTHON=python3.13 scripts/install.sh      # on that Python, in .venv-py3.13 (scripts/stack.sh)
#   HVD_TRAIN_MLFLOW=1 scripts/install.sh     # also MLflow's client, for logging.mlflow: the
#                                             # extra hvd_train[mlflow] (docs/tracking.md)
#   HVD_TRAIN_MLFLOW=server scripts/install.sh  # and a tracking server, for the tests (`make
#                                             # test` sets it): full mlflow, in its own virtualenv
#   HVD_TRAIN_EXPORT=1 scripts/install.sh     # also tf2onnx, onnx and onnxruntime, for `hvd-train
#                                             # export --format onnx`: the extra hvd_train[export]
#   HVD_TRAIN_WANDB=1 scripts/install.sh      # also W&B's client, for logging.wandb: the extra
#                                             # hvd_train[wandb] (docs/tracking.md; `make test` sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "" | --check-gpu-toolkit) mode=${1:-install} ;;
  *) echo "usage: scripts/install.sh [--check-gpu-toolkit]" >&2; exit 2 ;;
esac

# shellcheck source=scripts/stack.sh
. scripts/stack.sh
stack_select || exit 1
VENV=${VENV:-$STACK_VENV}
PY=$STACK_PY
HOROVOD_VERSION=0.28.1

export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
changed=0  # set when this run installed anything; then the build is checked again

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
# apt's and pip's own output (progress, notices about this machine's package mirrors) goes to
# a log; the console gets one line per step, and the log's tail only when a step fails.
LOG=build/install.log
mkdir -p build
quietly() {
  printf '\n$ %s\n' "$*" >> "$LOG"
  if ! "$@" >> "$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    die "failed: $* (full output: $LOG)"
  fi
}

device=${HVD_TRAIN_DEVICE:-}
if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi
case "$device" in cpu|gpu) ;; *) die "HVD_TRAIN_DEVICE must be cpu or gpu, got '$device'";; esac
if [ "$device" = gpu ]; then tf_pkg=tensorflow; tf_req="tensorflow[and-cuda]==$TF_VERSION"
else tf_pkg=tensorflow-cpu; tf_req="tensorflow-cpu==$TF_VERSION"; fi

# --- Horovod's build switches; on GPU, the CUDA 12 toolkit and NCCL it compiles with ---
# Found before anything is downloaded (scripts/gpu_toolkit.sh): without them the GPU install
# would fetch TensorFlow's CUDA wheels (about 2 GB) and then fail compiling Horovod.
HOROVOD_LABELLED=$(bash scripts/horovod_series.sh version) || die "cannot read patches/horovod-$HOROVOD_VERSION/series (see above)"
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
       HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5
# shellcheck source=scripts/gpu_toolkit.sh
. scripts/gpu_toolkit.sh
GPU_IDENTITY=""
if [ "$device" = gpu ]; then
  # 1: no toolkit or NCCL found; 2: what is there is refused (the host compiler, the architectures)
  gpu_rc=0
  gpu_toolkit "$VENV" || gpu_rc=$?
  [ "$gpu_rc" = 0 ] || { printf '[install] error: %s\n' "$GPU_ERROR" >&2; exit "$gpu_rc"; }
  say "gpu: CUDA $CUDA_FOUND_VERSION ($CUDA_FOUND/bin/nvcc) and NCCL $NCCL_FOUND_VERSION ($NCCL_FOUND, $NCCL_FOUND_LIB) for Horovod's build, its kernels for compute capability $HOROVOD_BUILD_CUDA_CC_LIST ($CUDA_ARCHS_FROM)"
  [ -z "$CUDA_JIT_NOTE" ] || say "gpu: $CUDA_JIT_NOTE"
fi
# What the compiled Horovod wheel's cache key is made of (below), with $1 the Python it is for:
# the series, TensorFlow, the Python and machine, the build flags, and on GPU the CUDA and NCCL
# versions (GPU_IDENTITY; NCCL's paths left out: the wheel's lies in each virtualenv).
wheel_key_input() {
  echo "horovod==$HOROVOD_LABELLED $tf_pkg==$TF_VERSION device=$device"
  "$1" -c 'import platform, sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform(), platform.libc_ver())'
  env | grep -E '^(HOROVOD_|CMAKE_POLICY)' | grep -vE '^HOROVOD_NCCL_(HOME|INCLUDE|LIB)=' | sort
  [ -z "$GPU_IDENTITY" ] || echo "$GPU_IDENTITY"
}
wheel_key() { wheel_key_input "$VENV/bin/python" | sha256sum | cut -c1-16; }
if [ "$mode" = --check-gpu-toolkit ]; then
  [ "$device" = gpu ] || say "cpu: no CUDA toolkit needed (HVD_TRAIN_DEVICE=gpu, or an nvidia-smi that lists a GPU, asks for one)"
  env | grep -E '^HOROVOD_' | sort
  [ "$device" = cpu ] || echo "nvcc for Horovod's build: $(PATH=$(gpu_build_path "$PATH") command -v nvcc)"
  key_python="$VENV/bin/python"
  [ -x "$key_python" ] || key_python=$PY
  echo "wheel cache key $(wheel_key_input "$key_python" | sha256sum | cut -c1-16), of:"
  wheel_key_input "$key_python"
  exit 0
fi

# --- the stack's own virtualenv, on a Python its TensorFlow has wheels for ---
stamp="$VENV/.hvd_train-stack"
held=$(cat "$stamp" 2>/dev/null || echo 2.15)  # a virtualenv made before the stamp: 2.15's
if [ -x "$VENV/bin/python" ] && [ "$held" != "$TF_STACK" ]; then
  # e.g. a .venv made when 2.15 was the default, which now installs into .venv-tf2.15
  held_venv=$(HVD_TRAIN_TF=$held stack_select 2>/dev/null && echo "$STACK_VENV")
  die "$VENV holds the TensorFlow $held stack, not HVD_TRAIN_TF=$TF_STACK's${held_venv:+ (HVD_TRAIN_TF=$held installs into $held_venv)}: remove $VENV, or unset VENV"
fi
# A PYTHON that does not run would otherwise fall back to the virtualenv of python3's version.
[ -n "$PY_MINOR" ] || [ -z "${PYTHON:-}" ] \
  || die "no Python at '$PY': set PYTHON to a Python ${STACK_PYTHONS// /, }"
minor='import sys; print("%d.%d" % sys.version_info[:2])'
py_minor=$("$VENV/bin/python" -c "$minor" 2>/dev/null || "$PY" -c "$minor" 2>/dev/null) \
  || die "no Python at '$PY': set PYTHON to a Python ${STACK_PYTHONS// /, }"
if [ -n "$PY_MINOR" ] && [ "$py_minor" != "$PY_MINOR" ]; then
  # e.g. a .venv made with PYTHON=python3.12 before each Python had its own virtualenv
  die "$VENV holds Python $py_minor, not $PY ($PY_MINOR): remove $VENV, or set PYTHON to a Python $py_minor"
fi
case " $STACK_PYTHONS " in *" $py_minor "*) ;; *)
  die "Python $py_minor: TensorFlow $TF_VERSION has wheels for Python ${STACK_PYTHONS// /, } only; set PYTHON=python3.11 (or another of those)";;
esac

# --- system packages: Open MPI (mpirun, headers for Horovod and mpi4py), and patch ---
# `patch` applies hvd_train's series to Horovod's source (scripts/horovod_series.sh).
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicxx >/dev/null 2>&1 \
   || ! command -v patch >/dev/null 2>&1; then
  say "installing Open MPI and patch from apt"; changed=1
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  quietly $SUDO apt-get update -qq
  quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libopenmpi-dev openmpi-bin g++ make patch
fi

# --- ssh: multi_node.sh and horovodrun reach other hosts with it ---
# The server too under CI (or HVD_TRAIN_WITH_SSHD=1): the multi-node tests start private sshd
# servers (tests/sshd.py); a workstation's `make demo` should not get an ssh server.
ssh_pkgs=""
command -v ssh >/dev/null 2>&1 || ssh_pkgs="openssh-client"
if { [ -n "${CI:-}" ] || [ "${HVD_TRAIN_WITH_SSHD:-0}" = 1 ]; } && [ ! -x /usr/sbin/sshd ]; then
  ssh_pkgs="$ssh_pkgs openssh-server"
fi
if [ -n "$ssh_pkgs" ]; then
  say "installing$ssh_pkgs from apt"; changed=1
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  quietly $SUDO apt-get update -qq
  # shellcheck disable=SC2086  # a list of package names
  quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $ssh_pkgs
fi

# --- the virtualenv ---
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"; changed=1
  quietly "$PY" -m venv "$VENV"
  quietly "$VENV/bin/python" -m pip install -q --upgrade "pip==24.3.1" "setuptools==75.6.0" wheel
  echo "$TF_STACK" > "$stamp"
fi
pip() { quietly "$VENV/bin/python" -m pip "$@"; }
have() { "$VENV/bin/python" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
from packaging.requirements import Requirement  # TensorFlow's dependency, and pip's
for spec in sys.argv[1:]:
    req = Requirement(spec)
    if not req.specifier.contains(version(req.name), prereleases=True):
        sys.exit(1)
PYEOF
}

# extra_reqs NAME: the pins of the extra hvd_train[NAME], from the installed package's metadata
# (pyproject.toml's optional-dependencies), as one space-separated list; empty when the metadata
# predates the extra.
extra_reqs() {
  "$VENV/bin/python" - "$1" <<'PYEOF'
import sys
from importlib.metadata import requires
extra = f'extra == "{sys.argv[1]}"'
print(" ".join(r.split(";")[0].replace(" ", "") for r in requires("hvd_train") if extra in r))
PYEOF
}

# installed_version DIST: the version of DIST in the virtualenv.
installed_version() {
  "$VENV/bin/python" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1"
}

# --- TensorFlow: the CPU wheel, or the CUDA one where a GPU is present ---
if [ "$device" = gpu ] && have tensorflow-cpu; then
  # A CPU TensorFlow left by an earlier install would train on the CPU. Both wheels write the
  # one tensorflow/ package, so neither is left half overwritten: the CUDA one goes in anew.
  say "replacing tensorflow-cpu with $tf_req (a GPU host)"; changed=1
  pip uninstall -q -y tensorflow-cpu tensorflow
fi
if ! have "$tf_pkg==$TF_VERSION"; then
  say "installing $tf_req"; changed=1
  pip install -q "$tf_req" "$NUMPY_REQ"
fi
# numpy 2 from 2.18 (scripts/stack.sh); a virtualenv made when every stack had numpy 1 moves to it.
numpy_what="numpy $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("numpy"))' 2>/dev/null || echo '?')"
if ! have "$NUMPY_REQ"; then
  say "installing $NUMPY_REQ (was $numpy_what)"; changed=1
  pip install -q "$NUMPY_REQ"
fi
# TensorFlow 2.16+ brings Keras 3, which hvd_train trains by default; Keras 2 beside it is
# tf_keras (runtime.keras: tf_keras). --no-deps: it requires the `tensorflow` package, which
# would install a second copy beside tensorflow-cpu.
keras_what="keras $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("keras"))' 2>/dev/null || echo '?')"
if [ -n "$KERAS_REQ" ]; then
  keras_what="$keras_what, ${KERAS_REQ/==/ }"
  if ! have "$KERAS_REQ"; then
    say "installing $KERAS_REQ"; changed=1
    pip install -q --no-deps "$KERAS_REQ"
  fi
fi

# TensorFlow 2.21 no longer brings TensorBoard (2.20 still required it), which
# logging.tensorboard (on by default) needs.
if [ -n "$TB_REQ" ] && ! have "$TB_REQ"; then
  say "installing $TB_REQ"; changed=1
  pip install -q "$TB_REQ"
fi

# --- Horovod, compiled against that TensorFlow, from its source with hvd_train's patches ---
# Horovod 0.28.1's pristine sdist (cached once per machine, SHA-256 checked) with the series of
# patches/horovod-0.28.1 applied before the build (scripts/horovod_series.sh; each patch's
# header says what and why): the wheel built is the Horovod that runs, labelled with its series
# (0.28.1+hvdtrain.g<hash>). --no-build-isolation: the build must see the installed TensorFlow.
# cmake<4: CMake 4 rejects the Gloo that Horovod 0.28.1 bundles. The compiled wheel is kept in a
# cache outside the clone ($HVD_TRAIN_CACHE, default ~/.cache/hvd_train), keyed by everything
# that changes the build: the series (its version label, a hash of the applied diffs), the
# TensorFlow package and version, the Python's version and ABI (sys.implementation.cache_tag:
# cpython-311, cpython-313), the machine, CPU or GPU and the build flags; not numpy, which
# Horovod's extension does not compile against. A second clone, or a second virtualenv of the
# same stack and Python, installs it in seconds; a changed key (a changed patch) builds again.
# (pip's own wheel cache is keyed by the source alone, so it would hand a build for one
# TensorFlow to another: --no-cache-dir.) The key's parts: wheel_key_input, above.
horovod_version() { "$VENV/bin/python" -c 'from importlib.metadata import version; print(version("horovod"))' 2>/dev/null; }
built_against() { "$VENV/bin/python" -c 'import horovod, json, os; print(json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))["tensorflow"])' 2>/dev/null; }
horovod_dir() { "$VENV/bin/python" -c 'import importlib.util; print(importlib.util.find_spec("horovod").submodule_search_locations[0])' 2>/dev/null; }
held_horovod=$(horovod_version || true)
# Reinstalled when it is not this series' build (another series, or a Horovod that an earlier
# install patched in site-packages after pip installed it: plain 0.28.1), was built for
# another TensorFlow, or on GPU without NCCL (a CPU build left by an earlier install).
if [ "$held_horovod" != "$HOROVOD_LABELLED" ] || [ "$(built_against)" != "$TF_VERSION" ] \
   || ! "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.gloo_built()" 2>/dev/null \
   || { [ "$device" = gpu ] && ! "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.nccl_built()" 2>/dev/null; }; then
  changed=1
  wheels="${HVD_TRAIN_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/hvd_train}/horovod-wheels/$(wheel_key)"
  wheel=$(ls "$wheels"/horovod-"$HOROVOD_LABELLED"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    say "building horovod $HOROVOD_LABELLED (0.28.1 and patches/horovod-$HOROVOD_VERSION) against TensorFlow $TF_VERSION (2-3 minutes on 2 cores; cached in $wheels)"
    began=$SECONDS
    pip install -q "cmake>=3.13,<4"
    if [ "$device" = gpu ] && [ "$NCCL_FROM" = wheel ]; then
      # the wheel ships only the versioned name, and CMake links libnccl.so
      ln -sf libnccl.so.2 "$HOROVOD_NCCL_HOME/lib/libnccl.so"
    fi
    sdist=$(bash scripts/horovod_series.sh sdist "$VENV/bin/python" 2>> "$LOG") \
      || die "cannot download Horovod $HOROVOD_VERSION's sdist (full output: $LOG)"
    mkdir -p "$wheels"
    tmp=$(mktemp -d "$wheels/.build.XXXXXX")
    tar -xzf "$sdist" -C "$tmp" --no-same-owner
    quietly bash scripts/horovod_series.sh apply "$tmp/horovod-$HOROVOD_VERSION"
    PATH="$(gpu_build_path "$PWD/$VENV/bin:$PATH")" pip wheel -q --no-deps --no-cache-dir --no-build-isolation \
      -w "$tmp" "$tmp/horovod-$HOROVOD_VERSION"
    built=$(ls "$tmp"/horovod-*.whl)
    mv "$built" "$wheels/"  # a rename: another install never sees half a wheel
    rm -rf "$tmp"
    wheel="$wheels/$(basename "$built")"
    say "built $(basename "$wheel") in $((SECONDS - began)) s"
  else
    say "installing horovod $HOROVOD_LABELLED built earlier against TensorFlow $TF_VERSION ($wheel)"
  fi
  if [ -n "$held_horovod" ]; then
    old_dir=$(cd "$(horovod_dir)" 2>/dev/null && pwd -P || true)
    pip uninstall -q -y horovod
    # What pip does not know it installed: the files an earlier install's post-install patching
    # wrote (hand-written bytecode, the loopback library), and the build check's answers.
    # Only inside this virtualenv (never, say, the source folder of an editable Horovod).
    case "$old_dir" in "$(cd "$VENV" && pwd -P)"/*) rm -rf "$old_dir" ;; esac
  fi
  pip install -q "$wheel"
fi
# The one piece of patch 0010 that is not Python: the library with which horovodrun keeps
# mpirun's listener on loopback, built beside mpi_run.py, where it looks (without a C compiler,
# one line, and the install goes on).
loopback=$(bash scripts/build_loopback_bind.sh "$(horovod_dir)/runner")
[ -z "$loopback" ] || say "$loopback"

# --- this package and the rest of its pinned dependencies ---
# Reinstalled whenever pyproject.toml (the pinned dependencies) changes.
deps_stamp="$VENV/.hvd_train-deps.sha256"
deps_sha=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_sha" ]; then
  say "installing hvd_train and its dependencies"; changed=1
  # TensorFlow is not a dependency: the stack's, installed above, stays; so does its numpy.
  pip install -q -e ".[dev]" "$NUMPY_REQ"
  echo "$deps_sha" > "$deps_stamp"
fi
# An editable install writes no bytecode for hvd_train: each process would compile what it
# imports, and keep none of it where Python writes none (PYTHONDONTWRITEBYTECODE, as on this
# project's machines): 0.1 CPU s a worker. Written here, again for a file changed since.
"$VENV/bin/python" -m compileall -q hvd_train || say "hvd_train does not compile (see above): the install goes on"

# --- the check the whole install stands on ---
check="$VENV/horovod-check-build.txt"
if [ "$changed" = 1 ] || [ ! -s "$check" ]; then
  # Keras 2 as tf_keras where the stack has it (2.18); TensorFlow 2.15 honours the variable
  # too, and without tf_keras installed its tf.keras would then not import.
  # It imports TensorFlow in forks, whose C++ start-up lines (TensorFlow 2.21 prints them
  # whatever TF_CPP_MIN_LOG_LEVEL says) are shown only if the check fails.
  if ! env ${KERAS_REQ:+TF_USE_LEGACY_KERAS=1} "$VENV/bin/horovodrun" --check-build \
      > "$check.new" 2> "$check.err"; then
    cat "$check.new" "$check.err" >&2
    die "horovodrun --check-build failed (its output above); remove $VENV and run again"
  fi
  rm -f "$check.err"
  mv "$check.new" "$check"
fi
if ! grep -q '\[X\] TensorFlow' "$check"; then
  cat "$check" >&2
  rm -f "$check"
  die "Horovod was built without TensorFlow support; remove $VENV and run again"
fi
ops=$(sed -n '/Tensor Operations/,$p' "$check" | grep -o '\[X\] [A-Za-z]*' | cut -c5- | tr '\n' ' ' | sed 's/ $//')
if [ "$device" = gpu ]; then
  # Every time, not once: a driver or library that changed since shows here first.
  gpus=$(nvidia-smi -L 2>/dev/null | cuda_visible_gpus)
  gpu_install_check "$VENV/bin/python" "${gpus:-0}" || die "$GPU_ERROR"
  [ "${gpus:-0}" -gt 0 ] || say "gpu: Horovod has NCCL; TensorFlow's GPUs not checked (nvidia-smi lists none here)"
fi

# --- optional: KerasHub (HVD_TRAIN_KERAS_HUB=1), keeping TensorFlow one wheel ---
# keras-hub's own requirements would install tensorflow-text, which requires the `tensorflow`
# wheel: a second TensorFlow beside tensorflow-cpu (and numpy 2). --no-deps, and exactly what
# `import keras_hub` needs beyond what Keras 3 brings: regex and tokenizers. Left out: what its
# text models (tensorflow-text, sentencepiece) and hub presets (kagglehub, kagglesdk; hvd_train
# downloads nothing) need, and tokenizers' huggingface-hub, which only its downloads import.
KERAS_HUB_REQS="keras-hub==0.32.0 regex==2026.11.19 tokenizers==0.23.3"
hub_what=""
if [ "${HVD_TRAIN_KERAS_HUB:-0}" = 1 ]; then
  keras3=$("$VENV/bin/python" -c 'from importlib.metadata import version; v = version("keras"); print(v if tuple(map(int, v.split(".")[:2])) >= (3, 15) else "")' 2>/dev/null || true)
  [ -n "$keras3" ] || die "HVD_TRAIN_KERAS_HUB=1: keras-hub 0.32.0 needs Keras 3.15 or later, and TensorFlow $TF_VERSION brings $keras_what; choose a TensorFlow 2.16+ stack (HVD_TRAIN_TF=2.21)"
  # shellcheck disable=SC2086  # a list of requirements
  if ! have $KERAS_HUB_REQS; then
    say "installing ${KERAS_HUB_REQS// /, } (--no-deps: TensorFlow stays $tf_pkg alone)"; changed=1
    pip install -q --no-deps $KERAS_HUB_REQS
    TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import keras_hub' >> "$LOG" 2>&1 \
      || die "keras_hub does not import (full output: $LOG)"
  fi
  tf_wheels=$("$VENV/bin/python" -c 'from importlib import metadata
names = {d.metadata["Name"].lower().replace("_", "-") for d in metadata.distributions()}
print(" ".join(sorted(names & {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel"})))')
  [ "$tf_wheels" = "$tf_pkg" ] \
    || die "TensorFlow should be one wheel, $tf_pkg; $VENV has: $tf_wheels. Remove $VENV and run again"
  hub_what="; keras-hub 0.32.0"
fi
# --- optional: MLflow (HVD_TRAIN_MLFLOW=1 or server) ---
# 1: the extra hvd_train[mlflow] (pyproject.toml): mlflow-skinny, MLflow's client without its
# server and UI, and SQLAlchemy and Alembic for its local default store (sqlite:///mlflow.db).
# server: also the tests' tracking server, full mlflow (pandas, pyarrow, scipy, Flask: 850 MB),
# in a virtualenv of its own kept in the cache outside the clone, as Horovod's wheels are (once
# per machine), and linked as $VENV/mlflow-server: none of it enters the training's virtualenv.
mlflow_what=""
case "${HVD_TRAIN_MLFLOW:-0}" in
  0|"") ;;
  1|server)
    # The extra's pins, from the installed package's metadata (pyproject.toml, `mlflow = [...]`).
    mlflow_reqs=$(extra_reqs mlflow)
    # shellcheck disable=SC2086  # a list of requirements
    if ! have $mlflow_reqs; then
      say "installing hvd_train[mlflow]: ${mlflow_reqs// /, }"; changed=1
      began=$SECONDS
      pip install -q -e ".[mlflow]"
      TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import mlflow' >> "$LOG" 2>&1 \
        || die "mlflow does not import (full output: $LOG)"
      say "installed hvd_train[mlflow] in $((SECONDS - began)) s"
    fi
    mlflow_version=$(installed_version mlflow-skinny)
    mlflow_what="; mlflow-skinny $mlflow_version"
    if [ "$HVD_TRAIN_MLFLOW" = server ]; then
      server="${HVD_TRAIN_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/hvd_train}/mlflow-server/mlflow-$mlflow_version-py$py_minor"
      if [ ! -e "$server/.complete" ]; then  # made last: a half-made one is made again
        say "installing mlflow $mlflow_version, the tests' tracking server, into a virtualenv of its own ($server; once per machine)"
        changed=1
        began=$SECONDS
        rm -rf "$server"
        mkdir -p "$(dirname "$server")"
        quietly "$VENV/bin/python" -m venv "$server"
        quietly "$server/bin/python" -m pip install -q "pip==24.3.1"
        quietly "$server/bin/python" -m pip install -q "mlflow==$mlflow_version"
        touch "$server/.complete"
        say "installed the tracking server in $((SECONDS - began)) s ($(du -sm "$server" | cut -f1) MB)"
      fi
      ln -sfn "$server" "$VENV/mlflow-server"
      mlflow_what="$mlflow_what, and its server ($VENV/mlflow-server)"
    fi
    ;;
  *) die "HVD_TRAIN_MLFLOW must be 1 (the client) or server (also a tracking server, for the tests), got '$HVD_TRAIN_MLFLOW'";;
esac
# --- optional: ONNX export (HVD_TRAIN_EXPORT=1) ---
# The extra hvd_train[export] (pyproject.toml): tf2onnx, which Keras' ONNX export calls, onnx, and
# onnxruntime, which checks each export; TensorFlow, numpy and protobuf stay as they are.
export_what=""
case "${HVD_TRAIN_EXPORT:-0}" in
  0|"") ;;
  1)
    export_reqs=$(extra_reqs export)
    # shellcheck disable=SC2086  # a list of requirements
    if [ -z "$export_reqs" ] || ! have $export_reqs; then  # empty: metadata from before the extra
      say "installing hvd_train[export]: ${export_reqs// /, }"; changed=1
      pip install -q -e ".[export]"
      TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import tf2onnx, onnx, onnxruntime' >> "$LOG" 2>&1 \
        || die "tf2onnx, onnx or onnxruntime does not import (full output: $LOG)"
    fi
    export_what="; onnx export (tf2onnx $(installed_version tf2onnx))"
    ;;
  *) die "HVD_TRAIN_EXPORT must be 1 (tf2onnx, onnx, onnxruntime) or 0, got '$HVD_TRAIN_EXPORT'";;
esac
# --- optional: Weights & Biases (HVD_TRAIN_WANDB=1) ---
# The extra hvd_train[wandb] (pyproject.toml): W&B's client, whose service (wandb-core, a binary)
# ships inside its wheel: nothing is downloaded when a run starts. protobuf stays the one
# TensorFlow brought (a constraint): a stack whose protobuf wandb cannot take fails here.
wandb_what=""
case "${HVD_TRAIN_WANDB:-0}" in
  0|"") ;;
  1)
    wandb_reqs=$(extra_reqs wandb)
    # shellcheck disable=SC2086  # a list of requirements
    if [ -z "$wandb_reqs" ] || ! have $wandb_reqs; then  # empty: metadata from before the extra
      say "installing hvd_train[wandb]: ${wandb_reqs// /, }"; changed=1
      began=$SECONDS
      keep="$(mktemp)"
      "$VENV/bin/python" -c 'from importlib.metadata import version; print("protobuf==" + version("protobuf"))' > "$keep"
      pip install -q -e ".[wandb]" -c "$keep" \
        || die "hvd_train[wandb] does not install beside TensorFlow $TF_VERSION's $(cat "$keep") (full output: $LOG)"
      rm -f "$keep"
      TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import wandb' >> "$LOG" 2>&1 \
        || die "wandb does not import (full output: $LOG)"
      say "installed hvd_train[wandb] in $((SECONDS - began)) s"
    fi
    wandb_what="; wandb $(installed_version wandb)"
    ;;
  *) die "HVD_TRAIN_WANDB must be 1 (W&B's client) or 0, got '$HVD_TRAIN_WANDB'";;
esac
[ "$changed" = 1 ] && what="installed" || what="nothing to install"
numpy_what="numpy $(installed_version numpy)"
say "$what: horovod $HOROVOD_LABELLED with TensorFlow $TF_VERSION, $keras_what and $numpy_what ($device, Python $py_minor) in $VENV; tensor operations: $ops$hub_what$mlflow_what$export_what$wandb_what"
