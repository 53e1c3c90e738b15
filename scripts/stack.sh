# shellcheck shell=bash disable=SC2034  # the variables are read by the sourcing script
# The TensorFlow stack HVD_TRAIN_TF names, in one place: sourced by scripts/install.sh and
# launch/_common.sh; `bash scripts/stack.sh venv` prints the stack's virtualenv (the Makefile).
#
#   HVD_TRAIN_TF=2.21 (default)  TensorFlow 2.21.0, Keras 2 as tf_keras 2.21.0  Python 3.10-3.13  .venv
#   HVD_TRAIN_TF=2.20            TensorFlow 2.20.0, Keras 2 as tf_keras 2.20.1  Python 3.10-3.13  .venv-tf2.20
#   HVD_TRAIN_TF=2.19            TensorFlow 2.19.1, Keras 2 as tf_keras 2.19.0  Python 3.10-3.12  .venv-tf2.19
#   HVD_TRAIN_TF=2.18            TensorFlow 2.18.1, Keras 2 as tf_keras 2.18.0  Python 3.10-3.12  .venv-tf2.18
#   HVD_TRAIN_TF=2.15 (oldest)   TensorFlow 2.15.1, its built-in Keras 2       Python 3.10-3.11  .venv-tf2.15
#
# The Python is the machine's `python3`, or PYTHON (PYTHON=python3.13). The virtualenvs above
# are for Python 3.11, the one this project's whole suite runs on; another Python gets its own,
# named after it (.venv-py3.13, .venv-tf2.20-py3.12), so that one clone holds several Pythons of
# one stack (CI runs the default stack on 3.11 and on 3.13) and installing one never overwrites
# another.
#
# numpy: 2 on 2.18 and later (as far as each TensorFlow allows: 2.0 on 2.18, 2.1 on 2.19); 1 on
# 2.15, whose TensorFlow does not run on numpy 2. pyproject.toml allows both; install.sh keeps
# the stack's.
#
# From 2.19, Horovod 0.28.1 is built without its XLA ops (XLA_OPS=no): its xla_mpi_ops.cc
# includes TensorFlow's XLA headers, which from 2.19 include LLVM headers the wheel does not
# ship (2.20 also moved one); patches/horovod-0.28.1/0011-without-xla-ops.patch drops that one
# file from Horovod's CMake list before the build (its `series` line is guarded XLA_OPS=no).
#
# TensorFlow 2.16+ makes Keras 3 the default, which hvd_train trains (hvd_train/runtime/keras/v3.py);
# Keras 2 ships beside it as the tf_keras package (hvd_train/runtime/keras/v2.py, runtime.keras).

# stack_select: sets, from HVD_TRAIN_TF, TF_STACK, TF_VERSION, KERAS_REQ (empty: built into
# TensorFlow), NUMPY_REQ, STACK_PYTHONS (the Python minor versions the stack's TensorFlow has
# wheels for), XLA_OPS (no: Horovod is built without its XLA ops), TB_REQ (TensorBoard, which
# TensorFlow 2.21 no longer installs; empty: TensorFlow brings it); and, from PYTHON (default
# python3), STACK_PY (that command), PY_MINOR (its version, 3.13; empty when it does not run) and
# STACK_VENV (the stack's virtualenv for that Python). An unknown stack is one line on stderr and
# status 1.
stack_select() {
  TF_STACK=${HVD_TRAIN_TF:-2.21}
  XLA_OPS=no TB_REQ="" NUMPY_REQ="numpy>=2.0,<3"
  case "$TF_STACK" in
    2.21) TF_VERSION=2.21.0 KERAS_REQ=tf_keras==2.21.0 STACK_VENV=.venv STACK_PYTHONS="3.10 3.11 3.12 3.13" TB_REQ=tensorboard==2.21.0 ;;
    2.20) TF_VERSION=2.20.0 KERAS_REQ=tf_keras==2.20.1 STACK_VENV=.venv-tf2.20 STACK_PYTHONS="3.10 3.11 3.12 3.13" ;;
    2.19) TF_VERSION=2.19.1 KERAS_REQ=tf_keras==2.19.0 STACK_VENV=.venv-tf2.19 STACK_PYTHONS="3.10 3.11 3.12" NUMPY_REQ="numpy>=2.0,<2.2" ;;
    2.18) TF_VERSION=2.18.1 KERAS_REQ=tf_keras==2.18.0 STACK_VENV=.venv-tf2.18 STACK_PYTHONS="3.10 3.11 3.12" NUMPY_REQ="numpy>=2.0,<2.1" XLA_OPS=yes ;;
    2.15) TF_VERSION=2.15.1 KERAS_REQ="" STACK_VENV=.venv-tf2.15 STACK_PYTHONS="3.10 3.11" NUMPY_REQ="numpy>=1.23.5,<2" XLA_OPS=yes ;;
    *)
      printf 'HVD_TRAIN_TF=%s is not supported: choose 2.21, 2.20, 2.19, 2.18 or 2.15\n' "$TF_STACK" >&2
      return 1 ;;
  esac
  STACK_PY=${PYTHON:-python3}
  PY_MINOR=$("$STACK_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || PY_MINOR=""
  # 3.11 keeps the names the virtualenvs had before there was a choice of Python.
  case "$PY_MINOR" in 3.11|"") ;; *) STACK_VENV="$STACK_VENV-py$PY_MINOR" ;; esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    venv) stack_select && echo "$STACK_VENV" ;;
    *) echo "usage: bash scripts/stack.sh venv" >&2; exit 2 ;;
  esac
fi
