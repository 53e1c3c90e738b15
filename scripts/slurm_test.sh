#!/usr/bin/env bash
# Slurm for real (`make slurm-test`; not part of `make test`): Debian 12's Slurm 22.05 and munge
# in containers of the project's CPU image, and launch/slurm.sbatch submitted with sbatch.
#
#   scripts/slurm_test.sh [all | image | same | mpi | gpu-shape | preempt | lost-node | up]
#
# image:     the CPU image (scripts/docker_test.sh's engine, base and build: its functions,
#            sourced), then $IMAGE_SLURM: that image plus Debian's slurmctld, slurmd, slurm-client
#            and munge.
# The cluster, started by every step below: three containers on the host's network (all on
# loopback), each with its own munged (the image's key): `ctl` runs slurmctld (port 6817) and is
# where sbatch and scontrol run, as mpiuser (uid 1000); `node1` and `node2` each run
# `slurmd -N <name>` (ports 6818 and 6819) and no sshd: horovodrun's workers on the other node
# are started by srun (hvd_train/launcher/srun_ssh.py). Each node's own name is 127.0.0.1 in its
# /etc/hosts, as a real node's name is one of its own addresses: horovodrun starts the batch
# node's workers itself and the other node's through its `ssh`, which is srun. /results is shared, as a cluster's
# file system is.
# same:      a 2-node job of launch/slurm.sbatch (--nodes=2 --ntasks-per-node=1) trains the
#            quickstart (3 epochs); the same script on one node with 2 workers (--nodes=1
#            --ntasks-per-node=2): metrics.csv and the final weights must be identical.
# mpi:       the same two jobs under MPI (`hvd-train launch --slurm --mpi`: Open MPI's mpirun
#            starts its daemon on the other node as a step of the job, through srun, no sshd):
#            both complete, identical, and summary.json says controller mpi.
# preempt:   a 2-node job of 40 epochs; after epoch 5, `scancel --signal=USR1 --batch`: the record
#            must say interrupted, stopped_by SIGUSR1, with a checkpoint; the script requeues the
#            job, which must resume from that checkpoint and complete (Slurm: COMPLETED, 1 restart).
# lost-node: a 2-node job of 40 epochs; after epoch 5, `docker kill node2` (its slurmd and
#            worker): the job must end by itself within 60 s, recorded failed.
# gpu-shape: a GPU-shaped job on the same cluster, without GPUs: each node declares 2 GPUs to
#            Slurm (gres `gpu`, device files made with mknod: Slurm only reads their numbers) and
#            carries a stand-in nvidia-smi listing 2 GPUs nearest a core each, put first on the
#            job's PATH; `sbatch --nodes=2 --gpus-per-node=2 --cpus-per-gpu=1
#            --ntasks-per-node=1` must compose one worker per GPU (horovodrun -np 4 -H
#            node1:2,node2:2 from Slurm's SLURM_GPUS_ON_NODE, not the one task a node), each bound
#            to its own core, and train to completion; on the CPU (runtime.device: cpu), as this
#            machine's TensorFlow sees no GPU.
# up:        the cluster alone, until Ctrl-C, to submit jobs to by hand.
#
# Every container carries the label $LABEL and is removed on exit. Figures go to
# build/slurm-test/figures.txt, logs beside it (the jobs' output in results/slurm-<job>.out,
# the daemons' in logs/).
set -euo pipefail
DOCKER_TEST_OUT=$(cd "$(dirname "$0")/.." && pwd)/build/slurm-test
DOCKER_TEST_NAME=slurm_test
# shellcheck source=scripts/docker_test.sh
source "$(dirname "$0")/docker_test.sh"

IMAGE_SLURM=${IMAGE_SLURM:-hvd_train-slurm:cpu}
MN=$OUT  # docker_test.sh's ssh_keys writes $MN/keys
RESULTS=$OUT/results
CTL=hvd_train-slurm-ctl-$$
LAUNCHER=$CTL  # docker_test.sh's same_result reads /results there
# What every job trains: the quickstart, one intra-op thread per worker (see docker_test.sh's
# JOB: one host's two workers and two hosts' one each then sum in the same order), on loopback.
JOB=(configs/quickstart.yaml --set runtime.intra_op_threads=1 --network-interface lo)

# --- the image ------------------------------------------------------------------------------
slurm_image() {
  local ctx=$OUT/image log=$OUT/build-slurm.log start
  rm -rf "$ctx"; mkdir -p "$ctx"
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $IMAGE_CPU
USER root
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      slurmctld slurmd slurm-client munge >/dev/null \\
 && rm -rf /var/lib/apt/lists/* \\
 && { [ -s /etc/munge/munge.key ] || mungekey --create; } \\
 && chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key \\
 && mkdir -p /var/spool/slurmd /var/spool/slurmctld
ENTRYPOINT []
DOCKERFILE
  say "image: $IMAGE_SLURM (FROM $IMAGE_CPU, plus Debian's slurmctld, slurmd, slurm-client, munge; log: $log)"
  start=$(date +%s)
  DOCKER_BUILDKIT=0 docker build --network host -t "$IMAGE_SLURM" "$ctx" >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "docker build of $IMAGE_SLURM failed (log: $log)"; }
  figure "image $IMAGE_SLURM: $(($(date +%s) - start)) s; $(docker run --rm "$IMAGE_SLURM" slurmd -V), munge $(docker run --rm "$IMAGE_SLURM" dpkg-query -W -f '${Version}' munge)"
}

# --- the cluster ----------------------------------------------------------------------------
slurm_conf() {
  cat <<CONF
ClusterName=hvdtest
SlurmctldHost=ctl(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/logs/slurmctld.log
SlurmdLogFile=/logs/slurmd-%n.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
# No cgroups in a container: processes are tracked by their parents.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
KillWait=10
MinJobAge=600
JobRequeue=1
# How long a requeued job waits before it may start again (default 120 s).
AuthInfo=cred_expire=10
# Two GPUs a node for the gpu-shape job (gres.conf: device files, no GPU behind them); the others
# ask for none.
GresTypes=gpu
NodeName=node1 NodeHostname=node1 NodeAddr=127.0.0.1 Port=6818 CPUs=$(nproc) RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName=node2 NodeHostname=node2 NodeAddr=127.0.0.1 Port=6819 CPUs=$(nproc) RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
}

# Each node's two GPUs, to Slurm: character devices of the NVIDIA driver's major number (195),
# made in the node's own /dev (mknod, in `node`). Slurm reads their numbers and sets each job's
# CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE; nothing opens them.
gres_conf() {
  echo "NodeName=node[1-2] Name=gpu File=/dev/nvidia[0-1]"
}

# The stand-in nvidia-smi of `gpu-shape` (in /opt/standin, first on that job's PATH alone): two
# GPUs as `nvidia-smi -L` lists them, GPU 0 nearest core 0 and GPU 1 nearest core 1 in `topo -m`
# (every machine has those two cores).
stand_in_nvidia_smi() {
  cat <<'SMI'
#!/bin/sh
if [ "$1" = -L ]; then
  echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5e1b0c2a-0000-4000-8000-000000000000)"
  echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5e1b0c2a-0000-4000-8000-000000000001)"
  exit 0
fi
if [ "$1 $2" = "topo -m" ]; then
  printf '\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n'
  printf 'GPU0\t X \tNV18\t0\t0\t\tN/A\n'
  printf 'GPU1\tNV18\t X \t1\t0\t\tN/A\n'
  exit 0
fi
exit 6
SMI
}

# hosts SELF: /etc/hosts of a container whose own name is SELF (127.0.0.1, as a real node's
# name is one of its addresses); the other nodes at the addresses their sshd listens on.
hosts() {
  printf '%s\n' "127.0.0.1 localhost $1"
  local name addr
  for name in ctl node1 node2; do
    case $name in ctl) addr=127.0.0.4 ;; node1) addr=127.0.0.2 ;; node2) addr=127.0.0.3 ;; esac
    [ "$name" = "$1" ] || printf '%s %s\n' "$addr" "$name"
  done
}

# daemon NAME CMD: a container named NAME (its host name too) running munged, then CMD.
daemon() {
  local name=$1; shift
  hosts "$name" >"$OUT/etc/hosts-$name"
  container -d --name "hvd_train-slurm-$name-$$" --hostname "$name" \
    -v "$OUT/etc/hosts-$name:/etc/hosts:ro" -v "$OUT/etc/slurm.conf:/etc/slurm/slurm.conf:ro" \
    -v "$OUT/etc/gres.conf:/etc/slurm/gres.conf:ro" -v "$OUT/standin:/opt/standin:ro" \
    -v "$OUT/keys:/home/mpiuser/.ssh:ro" -v "$RESULTS:/results" -v "$OUT/logs:/logs" \
    -w /opt/hvd_train "$IMAGE_SLURM" bash -c \
    "install -d -o munge -g munge /run/munge && runuser -u munge -- /usr/sbin/munged && $*" >/dev/null
}

# node NAME: slurmd alone, no sshd: Slurm starts the other node's workers (srun, in place of
# horovodrun's ssh: hvd_train/launcher/srun_ssh.py), as on clusters that block ssh between nodes.
node() {
  daemon "$1" "mknod -m 666 /dev/nvidia0 c 195 0 && mknod -m 666 /dev/nvidia1 c 195 1 && exec slurmd -D -N $1"
}

# no_sshd: no sshd runs in any container of the cluster (what `same` and the others rely on).
no_sshd() {
  local name
  for name in ctl node1 node2; do
    ! docker exec "hvd_train-slurm-$name-$$" pgrep -x sshd >/dev/null || die "an sshd runs in $name"
  done
}

cluster_up() {
  cleanup
  rm -rf "$RESULTS" "${OUT:?}/logs" "${OUT:?}/etc"; mkdir -p "$RESULTS" "$OUT/logs" "$OUT/etc"
  chown 1000:1000 "$RESULTS"
  [ -s "$OUT/keys/id_rsa" ] || ssh_keys
  slurm_conf >"$OUT/etc/slurm.conf"
  gres_conf >"$OUT/etc/gres.conf"
  rm -rf "${OUT:?}/standin"; mkdir -p "$OUT/standin"
  stand_in_nvidia_smi >"$OUT/standin/nvidia-smi"; chmod 755 "$OUT/standin/nvidia-smi"
  daemon ctl "exec slurmctld -D -i"
  node node1
  node node2
  local _ state
  for _ in $(seq 60); do
    state=$(on_ctl sinfo -h -N -o '%N=%T' 2>/dev/null | sort | tr '\n' ' ' || true)
    [ "$state" != "node1=idle node2=idle " ] || { say "cluster: $state"; return; }
    sleep 1
  done
  tail -n 20 "$OUT"/logs/*.log >&2 || true
  die "the nodes are not idle after 60 s: ${state:-no answer from slurmctld} (logs: $OUT/logs)"
}

# on_ctl CMD...: CMD on the controller, as mpiuser (the jobs' owner), in the project's folder.
on_ctl() { docker exec --user 1000:1000 -w /opt/hvd_train "$CTL" "$@"; }

# submit RUN [SBATCH_OPTION...] -- [ARG...]: sbatch launch/slurm.sbatch with the quickstart into
# /results/RUN; prints the job id.
submit() {
  local run=$1 opts=() ; shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift || true
  on_ctl sbatch --parsable --output=/results/slurm-%j.out "${opts[@]}" launch/slurm.sbatch \
    "${JOB[@]}" --set "run.dir=/results/$run" "$@"
}

# job_state JOB: Slurm's state of the job (RUNNING, PENDING, COMPLETED, FAILED, ...).
job_state() { on_ctl scontrol show job -o "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }
job_field() { on_ctl scontrol show job -o "$1" | grep -o " $2=[^ ]*" | cut -d= -f2 || true; }

# wait_ended JOB SECONDS: until the job has ended (not PENDING/RUNNING/...); prints its state.
wait_ended() {
  local start state
  start=$(date +%s)
  while :; do
    state=$(job_state "$1")
    case $state in PENDING|RUNNING|CONFIGURING|COMPLETING|REQUEUED|REQUEUE_FED|REQUEUE_HOLD|RESIZING|SUSPENDED) ;; *) echo "$state"; return ;; esac
    [ $(($(date +%s) - start)) -lt "$2" ] || die "job $1 still $state after $2 s (output: $RESULTS/slurm-$1.out)"
    sleep 1
  done
}

# wait_for JOB PATTERN SECONDS: until the job's output has a line matching PATTERN (grep -i).
wait_for() {
  local out=$RESULTS/slurm-$1.out start
  start=$(date +%s)
  until grep -qi -- "$2" "$out" 2>/dev/null; do
    [ $(($(date +%s) - start)) -lt "$3" ] || { tail -n 30 "$out" >&2 || true; die "no '$2' in job $1's output within $3 s ($out)"; }
    sleep 0.2
  done
}

# summary RUN KEY...: the keys of RUN's summary.json (or of the file RUN), as `key=value` (JSON
# for what is not text).
summary() {
  local file=$RESULTS/$1/summary.json
  [ ! -f "$1" ] || file=$1
  python3 - "$file" "${@:2}" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k in sys.argv[2:] for v in [s.get(k)]))
PYEOF
}

check_completed() {  # check_completed JOB RUN: Slurm and the record both say completed
  local state
  state=$(wait_ended "$1" 600)
  [ "$state" = COMPLETED ] || { tail -n 30 "$RESULTS/slurm-$1.out" >&2; die "job $1 ended $state (output: $RESULTS/slurm-$1.out)"; }
  [ "$(summary "$2" status)" = status=completed ] || die "job $1: $RESULTS/$2/summary.json says $(summary "$2" status)"
}

# --- the scenarios --------------------------------------------------------------------------
same() {
  local two one out t0 hosts2 hosts1
  no_sshd
  t0=$(date +%s)
  two=$(submit two --nodes=2 --ntasks-per-node=1 -- --set train.epochs=3)
  check_completed "$two" two
  local t1; t1=$(date +%s)
  one=$(submit one --nodes=1 --ntasks-per-node=2 -- --set train.epochs=3)
  check_completed "$one" one
  hosts2=$(grep -o -- '-H [^ ]*' "$RESULTS/slurm-$two.out" | head -n1 || true)
  hosts1=$(grep -o -- '-H [^ ]*' "$RESULTS/slurm-$one.out" | head -n1 || true)
  [ "$hosts2" = "-H node1:1,node2:1" ] || die "the 2-node job ran horovodrun $hosts2, not -H node1:1,node2:1"
  no_sshd  # still none: node2's worker was a step of the job (srun)
  [[ $hosts1 =~ ^-H\ node[12]:2$ ]] || die "the 1-node job ran horovodrun $hosts1"
  out=$(same_result one two) || die "the 2-node job and the 1-node job differ: $out"
  figure "same: sbatch --nodes=2 --ntasks-per-node=1 (horovodrun $hosts2; job $two, $((t1 - t0)) s from sbatch to COMPLETED) vs --nodes=1 --ntasks-per-node=2 ($hosts1; job $one, $(($(date +%s) - t1)) s): $out"
}

preempt() {
  local job t0 stopped out state
  job=$(submit preempt --nodes=2 --ntasks-per-node=1 -- --set train.epochs=40)
  say "preempt: job $job; scancel --signal=USR1 --batch after epoch 5/40"
  wait_for "$job" 'epoch 5/40' 300
  on_ctl scancel --signal=USR1 --batch "$job"
  t0=$(date +%s.%N)
  # The record of the stop, before the requeued job (a few seconds later) starts its own.
  local rec=$RESULTS/preempt/summary.json
  until python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1])).get("status") != "interrupted")' "$rec" 2>/dev/null; do
    python3 -c "import sys,time; sys.exit(time.time() - $t0 > 90)" || die "no interrupted record 90 s after SIGUSR1 (output: $RESULTS/slurm-$job.out)"
    sleep 0.1
  done
  stopped=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  local stop=$OUT/preempt-interrupted.json ckpt
  cp "$rec" "$stop"
  ckpt=$(summary "$stop" last_checkpoint | cut -d= -f2)
  [ -d "$RESULTS/${ckpt#/results/}" ] || [ -d "$RESULTS/preempt/$ckpt" ] || die "the stop's checkpoint $ckpt is not there"
  out=$(summary "$stop" status stopped_by stopped_at epochs_completed last_checkpoint)
  [[ $out == *"status=interrupted stopped_by=SIGUSR1 "* ]] || die "after SIGUSR1 summary.json says: $out"
  figure "preempt: scancel --signal=USR1 --batch $job after epoch 5/40: summary.json said, $stopped s later: $out"
  wait_for "$job" 'exited 138' 60
  wait_for "$job" 'scontrol requeue' 60
  wait_for "$job" 'start 2 ' 300
  check_completed "$job" preempt
  local resumed restarts
  resumed=$(grep -m1 'resuming from' "$RESULTS/slurm-$job.out" | sed 's/^.*\(resuming from\)/\1/') ||
    die "the requeued job did not resume (output: $RESULTS/slurm-$job.out)"
  grep -qi 'epoch 40/40' "$RESULTS/slurm-$job.out" || die "the requeued job did not finish epoch 40/40"
  restarts=$(job_field "$job" Restarts)
  [ "$restarts" = 1 ] || die "Slurm counts $restarts restarts of job $job, not 1"
  out=$(summary preempt status epochs_completed earlier_jobs | sed 's/"train_examples_per_sec": [0-9.e+-]*, //g')
  figure "preempt: the job requeued itself (scontrol requeue; Slurm: Restarts=$restarts, COMPLETED, $(python3 -c "import time; print(f'{time.time() - $t0:.0f}')") s after SIGUSR1): $resumed; summary.json: ${out:0:400}"
  state=$(grep -m2 -h '\[slurm.sbatch\] job\|exited' "$RESULTS/slurm-$job.out" | tr '\n' ' ' || true)
  say "preempt: $state"
}

lost_node() {
  local job t0 failed_s state ended_s out
  job=$(submit lost --nodes=2 --ntasks-per-node=1 -- --set train.epochs=40)
  say "lost node: job $job; docker kill node2 (slurmd, its worker) after epoch 5/40"
  wait_for "$job" 'epoch 5/40' 300
  docker kill "hvd_train-slurm-node2-$$" >/dev/null
  t0=$(date +%s.%N)
  while :; do
    out=$(summary lost status 2>/dev/null || true)
    state=$(job_state "$job")
    [ -n "${failed_s:-}" ] || [ "$out" = status=running ] || failed_s=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    [ "$state" = RUNNING ] || { ended_s=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')"); break; }
    python3 -c "import sys,time; sys.exit(time.time() - $t0 > 90)" || die "job $job still RUNNING 90 s after node2 was killed"
    sleep 0.2
  done
  python3 -c "import sys; sys.exit($ended_s > 60)" || die "job $job took $ended_s s (> 60) to end after node2 was killed"
  out=$(summary lost status failure error | cut -c1-300)
  [[ $out == status=failed* ]] || die "after node2 was killed, summary.json says: $out"
  local left=$state code
  code=$(job_field "$job" ExitCode)
  # COMPLETING until Slurm gives up on node2's epilog (SlurmdTimeout, 30 s here): its last word.
  state=$(wait_ended "$job" 300)
  local final_s; final_s=$(python3 -c "import time; print(f'{time.time() - $t0:.0f}')")
  case $state in FAILED|NODE_FAIL) ;; *) die "job $job ended $state after node2 was killed" ;; esac
  figure "lost node: docker kill node2 after epoch 5/40: summary.json said failed after ${failed_s:-?} s; Slurm's job left RUNNING after $ended_s s (JobState=$left, ExitCode=$code), JobState=$state after $final_s s (node2: $(on_ctl sinfo -h -n node2 -o %T)); $out"
}

mpi() {
  local two one out
  no_sshd
  two=$(submit mpi-two --nodes=2 --ntasks-per-node=1 -- --set train.epochs=3 --mpi)
  check_completed "$two" mpi-two
  one=$(submit mpi-one --nodes=1 --ntasks-per-node=2 -- --set train.epochs=3 --mpi)
  check_completed "$one" mpi-one
  no_sshd  # mpirun's daemon on the other node was started through Slurm, not ssh
  [ "$(summary mpi-two controller world_size)" = "controller=mpi world_size=2" ] ||
    die "the --mpi job's summary.json says $(summary mpi-two controller world_size)"
  out=$(same_result mpi-one mpi-two) || die "under MPI, the 2-node job and the 1-node job differ: $out"
  figure "mpi: sbatch --nodes=2 --ntasks-per-node=1 ... --mpi (job $two) vs --nodes=1 --ntasks-per-node=2 ... --mpi (job $one), no sshd: $(summary mpi-two controller world_size); $out"
}

gpu_shape() {
  local job out hosts path cores r
  path=$(on_ctl printenv PATH)
  job=$(submit gpu --nodes=2 --gpus-per-node=2 --cpus-per-gpu=1 --ntasks-per-node=1 \
    "--export=ALL,PATH=/opt/standin:$path" -- --set train.epochs=1 --set runtime.device=cpu)
  check_completed "$job" gpu
  out=$RESULTS/slurm-$job.out
  hosts=$(grep -o -- '-np [0-9]* .*-H [^ ]*' "$out" | head -n1 | sed 's/ --.* -H / -H /' || true)
  [ "$hosts" = "-np 4 -H node1:2,node2:2" ] ||
    die "2 nodes x 2 GPUs, one task a node: horovodrun got '$hosts', not -np 4 -H node1:2,node2:2 ($out)"
  grep -q 'one worker per GPU, 2 a node' "$out" || die "no line saying the GPUs won over the one task a node ($out)"
  ! grep -q 'ask for --cpus-per-gpu' "$out" || die "slurm.sbatch warned of shared CPUs under --cpus-per-gpu=1 ($out)"
  # Each rank's binding, from its log (the console gives one rank's lines once): ranks 0 and 1
  # on node1, 2 and 3 on node2.
  for r in 0 1 2 3; do
    cores[r]=$(grep -o "bound to cores \[[0-9, ]*\]" "$RESULTS/gpu/logs/rank-$r.log" | head -n1 | sed 's/bound to cores //' || true)
    [ -n "${cores[r]}" ] || die "rank $r did not say which cores it is bound to ($RESULTS/gpu/logs/rank-$r.log)"
  done
  if [ "${cores[0]}" = "${cores[1]}" ] || [ "${cores[2]}" = "${cores[3]}" ]; then
    die "two workers of one node share cores: ranks 0-3 bound to ${cores[*]} ($out)"
  fi
  figure "gpu-shape: sbatch --nodes=2 --gpus-per-node=2 --cpus-per-gpu=1 --ntasks-per-node=1 (gres gpu:2 a node, stand-in nvidia-smi; job $job COMPLETED): horovodrun $hosts; ranks 0-3 bound to cores ${cores[0]} ${cores[1]} | ${cores[2]} ${cores[3]}; $(summary gpu status world_size device)"
}

STEP=${1:-all}
case "$STEP" in
  image) engine; base; build cpu "$IMAGE_CPU"; slurm_image ;;
  same) engine; cluster_up; same ;;
  preempt) engine; cluster_up; preempt ;;
  lost-node) engine; cluster_up; lost_node ;;
  mpi) engine; cluster_up; mpi ;;
  gpu-shape) engine; cluster_up; gpu_shape ;;
  up) engine; cluster_up; say "up until Ctrl-C: docker exec --user 1000 -w /opt/hvd_train $CTL sbatch ..."; sleep infinity & wait ;;
  all)
    : >"$FIGURES"
    figure "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?'): bash scripts/slurm_test.sh all"
    engine; base; build cpu "$IMAGE_CPU"; slurm_image
    cluster_up; same; mpi; gpu_shape; preempt; lost_node
    say "all passed; figures in $FIGURES" ;;
  *) die "unknown step '$STEP'" ;;
esac
