#!/usr/bin/env bash
# Installs everything hvd_train needs into ./.venv, idempotently: a second run
# installs nothing. The one install path: `make demo`, `make test`, CI and the
# Dockerfile all call this script.
#
#   scripts/install.sh            # CPU build unless an NVIDIA GPU is present
#   HVD_TRAIN_DEVICE=gpu scripts/install.sh   # force the CUDA build (Docker GPU image)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
TF_VERSION=2.15.1
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

# --- system packages: Open MPI (mpirun, headers for Horovod and mpi4py) ---
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicxx >/dev/null 2>&1; then
  say "installing Open MPI from apt"; changed=1
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  quietly $SUDO apt-get update -qq
  quietly $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libopenmpi-dev openmpi-bin g++ make
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
fi
pip() { quietly "$VENV/bin/python" -m pip "$@"; }
have() { "$VENV/bin/python" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    if version(name) != want:
        sys.exit(1)
PYEOF
}

# --- TensorFlow: the CPU wheel, or the CUDA one where a GPU is present ---
if [ "$device" = gpu ]; then tf_pkg=tensorflow; tf_req="tensorflow[and-cuda]==$TF_VERSION"
else tf_pkg=tensorflow-cpu; tf_req="tensorflow-cpu==$TF_VERSION"; fi
if ! have "$tf_pkg==$TF_VERSION"; then
  say "installing $tf_req"; changed=1
  pip install -q "$tf_req"
fi

# --- Horovod, compiled against that TensorFlow ---
# --no-build-isolation: the build must see the installed TensorFlow.
# cmake<4: CMake 4 rejects the Gloo that Horovod 0.28.1 bundles.
if ! have "horovod==$HOROVOD_VERSION" || ! "$VENV/bin/python" -c "import horovod.tensorflow as h; assert h.gloo_built()" 2>/dev/null; then
  say "building horovod $HOROVOD_VERSION against TensorFlow $TF_VERSION (2-3 minutes on 2 cores)"; changed=1
  pip install -q "cmake>=3.13,<4"
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
         HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5
  if [ "$device" = gpu ]; then
    # Not run on this project's machines (no GPU): NCCL all-reduce, from the system (the CUDA
    # Docker base images) or from the nvidia-nccl wheel that tensorflow[and-cuda] installs.
    export HOROVOD_GPU_OPERATIONS=NCCL
    if [ -z "${HOROVOD_NCCL_HOME:-}" ] && [ ! -e /usr/include/nccl.h ]; then
      nccl=$("$VENV/bin/python" -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
      ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"  # the wheel ships only the versioned name
      export HOROVOD_NCCL_HOME="$nccl"
    fi
  fi
  PATH="$PWD/$VENV/bin:$PATH" pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
fi

# --- this package and the rest of its pinned dependencies ---
# Reinstalled whenever pyproject.toml (the pinned dependencies) changes.
deps_stamp="$VENV/.hvd_train-deps.sha256"
deps_sha=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_sha" ]; then
  say "installing hvd_train and its dependencies"; changed=1
  pip install -q -e ".[$device,dev]"
  echo "$deps_sha" > "$deps_stamp"
fi

# --- the check the whole install stands on ---
check="$VENV/horovod-check-build.txt"
if [ "$changed" = 1 ] || [ ! -s "$check" ]; then
  "$VENV/bin/horovodrun" --check-build > "$check.new"
  mv "$check.new" "$check"
fi
if ! grep -q '\[X\] TensorFlow' "$check"; then
  cat "$check" >&2
  rm -f "$check"
  die "Horovod was built without TensorFlow support; remove $VENV and run again"
fi
ops=$(sed -n '/Tensor Operations/,$p' "$check" | grep -o '\[X\] [A-Za-z]*' | cut -c5- | tr '\n' ' ' | sed 's/ $//')
[ "$changed" = 1 ] && what="installed" || what="nothing to install"
say "$what: horovod $HOROVOD_VERSION with TensorFlow $TF_VERSION ($device); tensor operations: $ops"
