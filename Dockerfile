# hvd_train image: Horovod 0.28.1 + TensorFlow 2.21.0 with tf_keras (or another stack:
# --build-arg TF=2.15), installed by scripts/install.sh (the same script CI runs), with Open MPI and an sshd
# the Kubeflow MPI Operator can use.
#
#   CPU:        docker build -t hvd_train:cpu --build-arg BASE_IMAGE=debian:bookworm-slim --build-arg DEVICE=cpu .
#   CPU, TF 2.15: the same with --build-arg TF=2.15
#   GPU:        docker build -t hvd_train:gpu .
#               (compiled on CUDA 12.5's devel image, run on its runtime image: no nvcc, headers
#               or cuDNN, which TensorFlow's CUDA wheels bring; --build-arg CUDA_ARCHS=90 for
#               H100s alone)
#   Quickstart: docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/runs:/opt/hvd_train/runs" hvd_train:cpu
#   On GPUs:    docker run --rm --gpus all --ipc=host --user "$(id -u):$(id -g)" -v "$PWD/runs:/opt/hvd_train/runs" hvd_train:gpu
#               (--ipc=host, or --shm-size=8g: NCCL and the all-reduce keep their buffers in
#               /dev/shm, of which Docker gives 64 MB: docs/docker.md)
#
# Two stages: `build` has the compilers and headers and compiles Horovod; the image is the
# runtime stage, with the virtualenv copied from it and only the runtime libraries (Open MPI,
# ssh, Python).
#
# Built and run on this project's machine by `make docker-test` (scripts/docker_test.sh): the CPU
# image, its quickstart and a two-container multi-node job. The GPU image is not built there
# (no nvcc can be installed from the registries it reaches): see docs/docker.md.

# BASE_IMAGE, the build stage's base. GPU (default): a CUDA 12 devel image (nvcc, the CUDA
# runtime, Ubuntu 22.04's Python 3.10) of the CUDA the stack's TensorFlow is built against: 12.5
# for 2.18 to 2.21 (not built here), 12.2 for 2.15 (--build-arg
# BASE_IMAGE=nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04 --build-arg
# RUNTIME_IMAGE=nvidia/cuda:12.2.2-runtime-ubuntu22.04). CPU: any Debian or Ubuntu with a Python
# the stack has wheels for (scripts/stack.sh).
ARG BASE_IMAGE
# The runtime stage's base: RUNTIME_IMAGE when given; else BASE_IMAGE when given (a CPU build
# runs on the image it built on); else, for the default GPU build, CUDA 12.5's runtime image of
# the same Ubuntu. Defaults that follow other arguments (Docker expands a variable inside `:-`'s
# word); `make docker-test`'s `bases` step checks what the engine makes of them.
ARG RUNTIME_IMAGE
ARG BUILD_FROM=${BASE_IMAGE:-nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04}
ARG RUNTIME_FROM=${RUNTIME_IMAGE:-${BASE_IMAGE:-nvidia/cuda:12.5.1-runtime-ubuntu22.04}}

# --- build: compilers and headers, TensorFlow, and Horovod compiled against it -------------
FROM ${BUILD_FROM} AS build

# gpu: CUDA TensorFlow and Horovod with NCCL GPU operations; cpu: the CPU wheels.
ARG DEVICE=gpu
# The TensorFlow stack (scripts/stack.sh): 2.21 (TensorFlow 2.21.0 with tf_keras), 2.20, 2.19,
# 2.18 or 2.15. Kept in the environment, so that install.sh, make and launch/*.sh in the
# container all pick the image's one stack.
ARG TF=2.21
# GPU only: the CUDA toolkit Horovod compiles its kernels with (bin/nvcc must exist there).
ARG CUDA_HOME=/usr/local/cuda
# GPU only: the compute capabilities Horovod's kernels are compiled for, as HVD_TRAIN_CUDA_ARCHS
# takes them (no GPU is visible to `docker build`): A100, A10/A40, L4/L40 and H100/H200.
ARG CUDA_ARCHS=80;86;89;90
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 HVD_TRAIN_TF=${TF}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Open MPI (mpirun, and headers for Horovod and mpi4py), and what Horovod compiles with
# (`patch` applies hvd_train's series to its source: patches/horovod-0.28.1).
# NCCL: the CUDA devel image's libnccl-dev (/usr/include/nccl.h), which install.sh finds, with
# nvcc, before it downloads anything (scripts/gpu_toolkit.sh).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      openmpi-bin libopenmpi-dev openssh-client \
      python3-venv python3-dev g++ make patch ca-certificates procps \
 && rm -rf /var/lib/apt/lists/*

# The install, from only what it reads (the pinned dependencies, the install scripts and
# Horovod's patch series), so that editing the code, configs, launch scripts or tests does not
# rebuild TensorFlow and Horovod (the slow layer: Horovod compiles for minutes).
WORKDIR /opt/hvd_train
COPY pyproject.toml ./
COPY scripts/install.sh scripts/stack.sh scripts/gpu_toolkit.sh scripts/horovod_series.sh scripts/build_loopback_bind.sh scripts/loopback_bind.c scripts/
COPY patches/ patches/
# HOROVOD_CUDA_HOME only for the GPU build: set, Horovod's CMake requires nvcc there.
# The package is installed editable, so an empty hvd_train/ and README.md (pyproject.toml names
# it) suffice here: the real ones arrive with the project below, in the place the install
# points to. The stack's virtualenv (.venv-tf2.15 for TF=2.15; .venv-py3.10 on the CUDA image's
# Python 3.10: scripts/stack.sh) is also reachable as .venv, the one name PATH holds. pip's cache and the compiled Horovod wheel stay in this stage.
RUN mkdir hvd_train && touch hvd_train/__init__.py README.md \
 && if [ "$DEVICE" = gpu ]; then export HOROVOD_CUDA_HOME="$CUDA_HOME"; fi \
 && HVD_TRAIN_CUDA_ARCHS="${CUDA_ARCHS}" HVD_TRAIN_DEVICE=${DEVICE} bash scripts/install.sh \
 && { [ -e .venv ] || ln -s "$(bash scripts/stack.sh venv)" .venv; } \
 && rm -rf build

# --- runtime: what a job runs with, and the virtualenv built above --------------------------
FROM ${RUNTIME_FROM}

ARG TF=2.21
ARG DEVICE=gpu
# Port of the workers' sshd when running as the non-root user (2222: no privilege needed).
ARG SSH_PORT=2222
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 HVD_TRAIN_TF=${TF}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Open MPI's mpirun and libraries, ssh, and the Python the virtualenv was made with: no
# compilers, headers or build caches. On GPU, the InfiniBand user-space libraries NCCL opens for
# its IB transport (libibverbs, the adapters' providers, librdmacm): without them NCCL sends
# between hosts over TCP sockets without a word (run with --device /dev/infiniband:
# docs/docker.md).
# hadolint ignore=DL3008
RUN rdma=() \
 && if [ "$DEVICE" = gpu ]; then rdma=(libibverbs1 ibverbs-providers librdmacm1); fi \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      openmpi-bin openssh-server openssh-client python3 ca-certificates procps "${rdma[@]}" \
 && rm -rf /var/lib/apt/lists/*

# ssh for the MPI Operator. The launcher reaches workers it has never seen, with keys the
# operator mounts from a Secret (read-only): no host-key prompts, no known_hosts writes, and no
# permission checks on the mounted files (StrictModes no). /var/run/sshd lets sshd run as root.
RUN mkdir -p /var/run/sshd \
 && printf '%s\n' 'Host *' '    StrictHostKeyChecking no' '    UserKnownHostsFile /dev/null' \
      '    LogLevel ERROR' "    Port ${SSH_PORT}" > /etc/ssh/ssh_config.d/hvd_train.conf \
 && printf '%s\n' 'StrictModes no' "Port ${SSH_PORT}" 'PasswordAuthentication no' \
      'PermitRootLogin prohibit-password' > /etc/ssh/sshd_config.d/hvd_train.conf

# The non-root user. MPI Operator v2 runs as it when the MPIJob sets
# `sshAuthMountPath: /home/mpiuser/.ssh`; workers then start
# `/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config` (no root needed on port 2222).
RUN useradd --create-home --uid 1000 --shell /bin/bash mpiuser \
 && printf '%s\n' "Port ${SSH_PORT}" 'PidFile /home/mpiuser/sshd.pid' \
      'HostKey /home/mpiuser/.ssh/id_rsa' 'StrictModes no' 'UsePAM no' \
      'PasswordAuthentication no' > /home/mpiuser/.sshd_config \
 && chown mpiuser:mpiuser /home/mpiuser/.sshd_config

WORKDIR /opt/hvd_train
# Numeric, so Kubernetes can verify runAsNonRoot; 1000 is mpiuser.
USER 1000:1000
# The virtualenv at the path it was made at (its scripts name it), owned by mpiuser.
COPY --from=build --chown=1000:1000 /opt/hvd_train /opt/hvd_train
ENV PATH=/opt/hvd_train/.venv/bin:${PATH}

# The rest of the project: configs, launch scripts, examples, tests.
COPY --chown=1000:1000 . /opt/hvd_train

# Any uid: `docker run --user "$(id -u):$(id -g)"` gets a writable HOME (see the script).
ENTRYPOINT ["/opt/hvd_train/scripts/docker_entrypoint.sh"]
# No arguments: the quickstart, one worker per visible GPU (or launch.cpu_workers on CPU), its
# results in /opt/hvd_train/runs/quickstart (mount a volume there to keep them).
CMD ["launch/single_node.sh", "configs/quickstart.yaml"]
