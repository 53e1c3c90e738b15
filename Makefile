# The two Quick-start commands: `make demo` and `make test`. Each first runs the idempotent
# install (scripts/install.sh: Open MPI, TensorFlow, Horovod compiled against it, this package).
# HVD_TRAIN_TF=2.15 (2.18, 2.19, 2.20) picks another TensorFlow stack, and PYTHON another Python
# than python3 (`PYTHON=python3.13 make demo`); each pair has its own virtualenv
# (scripts/stack.sh): .venv for the default stack on Python 3.11, .venv-py3.13 on 3.13.
export HVD_TRAIN_TF ?= 2.21
# Empty for an unsupported HVD_TRAIN_TF: then the install says why, in one line.
VENV   := $(shell bash scripts/stack.sh venv 2>/dev/null)
PY     := $(VENV)/bin/python
NP     ?= 2
# (Not for a list of stacks, `make gpu-build-check`'s: no venv, and `/bin` would come first.)
export PATH := $(if $(VENV),$(abspath $(VENV))/bin:)$(PATH)

.PHONY: install demo test test-quick test-stack lint format bench clean docker-test slurm-test gpu-test gpu-build-check

install:
	@bash scripts/install.sh

demo: install
	$(VENV)/bin/hvd-train launch --np $(NP) --config configs/quickstart.yaml
	@echo "Results: runs/quickstart (summary.json, metrics.csv, config.yaml, model.keras, tensorboard/, logs/)"

# The multi-node launch tests start private ssh servers: the install adds openssh-server. The
# KerasHub test (tests/test_kerashub.py) needs keras-hub: the install adds it on the stacks with
# Keras 3 (2.16+; HVD_TRAIN_KERAS_HUB=0 leaves it out), TensorFlow staying one wheel. The MLflow
# tests (tests/test_mlflow.py) need the extra hvd_train[mlflow] and a tracking server: the install
# adds both, the server in a virtualenv of its own (HVD_TRAIN_MLFLOW=0 leaves them out). The ONNX
# export tests (tests/test_export.py) need the extra hvd_train[export] (HVD_TRAIN_EXPORT=0: skipped).
# The W&B tests (tests/test_wandb.py, offline) need the extra hvd_train[wandb]: the install adds
# it (HVD_TRAIN_WANDB=0 leaves it out; the tests then skip, saying why).
# Two test files at a time (pytest-xdist; a file's tests stay together, so a fixture that trains
# once serves the whole file): most of a job's time is start-up and waiting, which leaves a core
# idle. The end of the output: the 30 slowest tests, then the time, processes and jobs of each file.
# Beside Keras 3, the binding tests' runs on tf_keras (marked second_keras), and the matrix tests'
# runs whose every value their other runs cover (marked variant), are left to CI's suite on
# Python 3.13, the same TensorFlow and Kerases (tests/harness.py: BINDING_RUNS, variant).
test: export HVD_TRAIN_WITH_SSHD = 1
test: export HVD_TRAIN_KERAS_HUB ?= $(if $(filter 2.15,$(HVD_TRAIN_TF)),0,1)
test: export HVD_TRAIN_MLFLOW ?= server
test: export HVD_TRAIN_EXPORT ?= 1
test: export HVD_TRAIN_WANDB ?= 1
test: install
	$(PY) -m pytest -q -ra --durations=30 -n 2 --dist loadfile -m "not second_keras and not variant" tests

# The edit loop's tier: every test that runs in the test process alone, i.e. every test not
# marked `processes` (tests/conftest.py leaves those out, and fails a test of this tier that
# starts Python or a job). Not a substitute for `make test`.
test-quick: export HVD_TRAIN_TEST_TIER = quick
test-quick: install
	$(PY) -m pytest -q tests

# The short suite (tests marked `stack`: 2-worker training, resume, faults, evaluate, the Keras
# choice, the doctor, the speed knobs): what CI runs on the oldest stack,
# `HVD_TRAIN_TF=2.15 make test-stack`, and on the newest Python, with what `make test` leaves out,
# `PYENV_VERSION=3.13.0 make test-stack STACK_TESTS="stack or variant"`.
STACK_TESTS ?= stack
test-stack: install
	$(PY) -m pytest -q -ra --durations=15 -n 2 --dist loadfile -m "$(STACK_TESTS)" tests

# The Docker image built and run for real (CPU image, its quickstart, a two-container multi-node
# job, a lost host): the image's build took 12 min here with apt's layer cached (54 min with no
# cache on a loaded machine); needs root for dockerd; not part of `make test`.
docker-test:
	bash scripts/docker_test.sh all

# Slurm for real: Debian's slurmctld, slurmd and munge in containers of the CPU image (two
# compute nodes), launch/slurm.sbatch submitted with sbatch: two nodes equal one, a SIGUSR1
# preemption stops with a checkpoint and requeues, a killed node fails the job. Builds the image
# as docker-test does; needs root for dockerd; not part of `make test`.
slurm-test:
	bash scripts/slurm_test.sh all

# The GPU smoke test (scripts/gpu_test.sh), for a host with NVIDIA GPUs and a CUDA 12 toolkit:
# the GPU install, the doctor, the quickstart on one GPU then on every GPU, with mixed precision
# and with XLA, and a throughput table. Refused in one line on a host without a GPU; not part of
# `make test`; not yet run by this project (docs/validation.md).
gpu-test:
	bash scripts/gpu_test.sh

# Horovod's GPU build, checked on a machine without a GPU (scripts/gpu_build_check.py): its C++
# compiled with the CUDA, NCCL and MPI switches against each stack's TensorFlow CUDA wheel and
# the CUDA 12 and NCCL headers of their pip wheels, then every TensorFlow symbol it needs looked
# up in that wheel's libraries; one line a stack. About 600 MB of wheels a stack, downloaded
# once into ~/.cache/hvd_train/gpu-build-check, and minutes of g++ a stack: not part of `make
# test`. Every stack unless HVD_TRAIN_TF names one (`HVD_TRAIN_TF=2.21 make gpu-build-check`).
gpu-build-check:
	HVD_TRAIN_TF=$(if $(filter file,$(origin HVD_TRAIN_TF)),,$(HVD_TRAIN_TF)) $${PYTHON:-python3} scripts/gpu_build_check.py

lint: install
	$(VENV)/bin/ruff check hvd_train tests lab examples
	$(VENV)/bin/ruff format --check hvd_train tests lab examples

format: install
	$(VENV)/bin/ruff format hvd_train tests lab examples
	$(VENV)/bin/ruff check --fix hvd_train tests lab examples

clean:
	rm -rf runs .pytest_cache
