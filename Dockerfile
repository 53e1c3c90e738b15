# hvd_train image: Horovod 0.28.1 + TensorFlow 2.15.1, installed by scripts/install.sh (the same
# script CI runs), with Open MPI and an sshd the Kubeflow MPI Operator can use.
#
#   GPU (default): docker build -t hvd_train:gpu .
#   CPU:           docker build -t hvd_train:cpu --build-arg BASE_IMAGE=tensorflow/tensorflow:2.15.0 --build-arg DEVICE=cpu .
#   Quickstart:    docker run --rm --gpus all hvd_train:gpu      (CPU: docker run --rm hvd_train:cpu)
#
# NOT BUILT on this project's machines (no Docker engine there); checked by hadolint and by
# tests/test_deploy.py only. See the README before relying on it.

# The official TensorFlow 2.15 GPU image: Ubuntu 22.04 with CUDA 12.2 and cuDNN 8.9, the CUDA
# that TensorFlow 2.15 is built against. install.sh puts TensorFlow 2.15.1 (the version CI tests)
# in a virtualenv on top, created with the image's python3; hvd_train supports Python 3.10-3.11.
ARG BASE_IMAGE=tensorflow/tensorflow:2.15.0-gpu
FROM ${BASE_IMAGE}

# gpu: CUDA TensorFlow and Horovod with NCCL GPU operations; cpu: the CPU wheels.
ARG DEVICE=gpu
# Port of the workers' sshd when running as the non-root user (2222: no privilege needed).
ARG SSH_PORT=2222
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Open MPI (mpirun, and headers for Horovod and mpi4py), ssh, and what Horovod compiles with.
# GPU: nvcc, the CUDA runtime headers and NCCL's headers from the base image's CUDA 12.2 apt
# repository, so Horovod builds with HOROVOD_GPU_OPERATIONS=NCCL against the system NCCL.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      openmpi-bin libopenmpi-dev openssh-server openssh-client \
      python3-venv python3-dev g++ make ca-certificates \
 && if [ "$DEVICE" = gpu ]; then \
      apt-get install -y --no-install-recommends --allow-change-held-packages \
        cuda-nvcc-12-2 cuda-cudart-dev-12-2 libnccl2 libnccl-dev; \
    fi \
 && rm -rf /var/lib/apt/lists/*
ENV HOROVOD_CUDA_HOME=/usr/local/cuda

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

# The project, installed by the one install script (what `make test` and CI run).
COPY --chown=mpiuser:mpiuser . /opt/hvd_train
WORKDIR /opt/hvd_train
# Numeric, so Kubernetes can verify runAsNonRoot; 1000 is mpiuser.
USER 1000:1000
RUN HVD_TRAIN_DEVICE=${DEVICE} bash scripts/install.sh \
 && rm -rf /home/mpiuser/.cache/pip
ENV PATH=/opt/hvd_train/.venv/bin:${PATH}

# No arguments: the quickstart, one worker per visible GPU (or launch.cpu_workers on CPU).
CMD ["launch/single_node.sh", "configs/quickstart.yaml"]
