#!/usr/bin/env bash
# The Docker image, built and run for real (`make docker-test`; not part of `make test`).
#
#   scripts/docker_test.sh [all | engine | base | bases | build-cpu | build-gpu | quickstart
#                           | multinode | mirror]
#
# engine:     a Docker engine: reuses one that answers `docker info`, else starts dockerd as root
#             (Debian's docker.io; log in /var/log/hvd_train-dockerd.log).
# base:       the base image made here (Docker Hub is not reachable): debootstrap bookworm from
#             apt's own Debian mirror, imported as $DEBIAN_IMAGE; then $TEST_BASE, which adds this
#             machine's CA bundle and apt sources so pip and apt in containers reach the package
#             registries. The project's Dockerfile never sees them: they are build arguments.
# bases:      the stages' bases as the engine resolves the Dockerfile's arguments: by default,
#             CUDA's devel image to build and its runtime image to run; BASE_IMAGE alone, both.
# build-cpu:  docker build --build-arg BASE_IMAGE=$TEST_BASE --build-arg DEVICE=cpu (timed, sized).
# build-gpu:  the same with DEVICE=gpu on $GPU_BASE (default $TEST_BASE, which has no nvcc: the
#             build fails there, see docs/docker.md): `horovodrun --check-build` must list NCCL.
#             Not part of `all`.
# quickstart: `docker run` with no arguments trains the quickstart into a mounted volume, owned
#             by the invoking user; the final val_accuracy must reach $MIN_ACCURACY.
# multinode:  two containers, each its own sshd on 127.0.0.1 (ports 2222, 2223, host names node1
#             and node2): launch/multi_node.sh and horovodrun -H start one worker in each; the
#             result must equal the same job on one host; `docker kill` of one mid-run must end
#             the job within 60 s naming the lost host, and a rerun must resume.
# mirror:     prints the Debian mirror `base` would debootstrap from, and nothing else. Apt's
#             sources are read under $APT_SOURCES_ROOT/etc/apt (default: /etc/apt; the tests
#             point it at a folder of their own).
#
# Every container and volume it starts carries the label $LABEL and is removed on exit; nothing
# else is touched. Figures go to build/docker-test/figures.txt, logs beside it.
#
# Sourced (scripts/slurm_test.sh), it defines the functions and runs no step; DOCKER_TEST_OUT
# then names the folder of figures and logs, DOCKER_TEST_NAME the prefix of its lines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

DEBIAN_IMAGE=${DEBIAN_IMAGE:-hvd_train-debian:bookworm}
TEST_BASE=${TEST_BASE:-hvd_train-testbase:bookworm}
IMAGE_CPU=${IMAGE_CPU:-hvd_train:cpu}
IMAGE_GPU=${IMAGE_GPU:-hvd_train:gpu}
STATE=${HVD_TRAIN_DOCKER_STATE:-/var/lib/hvd_train-docker}  # the debootstrap tree
APT=${APT_SOURCES_ROOT:-}/etc/apt  # where apt's sources are read
LABEL=hvd_train.docker_test=$$
MIN_ACCURACY=${MIN_ACCURACY:-0.95}
OUT=${DOCKER_TEST_OUT:-$ROOT/build/docker-test}
FIGURES=$OUT/figures.txt
mkdir -p "$OUT"

NAME=${DOCKER_TEST_NAME:-docker_test}
say() { printf '[%s] %s\n' "$NAME" "$*"; }
die() { printf '[%s] error: %s\n' "$NAME" "$*" >&2; exit 1; }
figure() { say "$*"; printf '%s\n' "$*" >>"$FIGURES"; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (run: sudo $0 $STEP)"; }

# --- the engine ---------------------------------------------------------------------------
engine() {
  if docker info >/dev/null 2>&1; then say "engine: reusing the running Docker engine"; return; fi
  need_root "starting dockerd"
  if ! command -v dockerd >/dev/null 2>&1; then
    say "engine: installing docker.io from apt"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  # No default bridge: every build and container here uses --network host (all on 127.0.0.1).
  say "engine: starting dockerd (log: /var/log/hvd_train-dockerd.log)"
  nohup dockerd --bridge=none --iptables=false >>/var/log/hvd_train-dockerd.log 2>&1 &
  local _
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 1; done
  die "dockerd did not answer within 60 s: see /var/log/hvd_train-dockerd.log"
}

# --- the base images ----------------------------------------------------------------------
# The Debian mirror apt is configured with, on one line: the first in deb822 sources (a URIs
# line may list several), else in a classic sources.list, else deb.debian.org. No pipeline: under
# pipefail a missing file or grep -m1's early exit failed one, and a fallback added a 2nd line.
debian_mirror() {
  local f files=()
  for f in "$APT"/sources.list.d/*.sources "$APT"/sources.list "$APT"/sources.list.d/*.list; do
    if [ -f "$f" ] && [ -r "$f" ]; then files+=("$f"); fi  # an unmatched glob stays literal
  done
  # /dev/null first: given no file, awk would read stdin. `[...]` are a classic line's options.
  awk '
    function take(uri) { if (uri ~ /\/debian\/?$/) { print uri; found = 1; exit } }
    FILENAME ~ /\.sources$/ && tolower($1) == "uris:" { for (i = 2; i <= NF; i++) take($i) }
    FILENAME !~ /\.sources$/ && $1 == "deb" { sub(/\[[^]]*\]/, ""); take($2) }
    END { if (!found) print "http://deb.debian.org/debian" }' /dev/null "${files[@]}"
}

base() {
  if ! docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
    need_root "debootstrap"
    command -v debootstrap >/dev/null 2>&1 || {
      say "base: installing debootstrap from apt"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    local mirror tree=$STATE/rootfs
    mirror=$(debian_mirror)
    if [ ! -x "$tree/bin/bash" ] || [ ! -e "$tree/.complete" ]; then
      say "base: debootstrap --variant=minbase bookworm from $mirror (a few minutes)"
      rm -rf "$tree"; mkdir -p "$STATE"
      debootstrap --variant=minbase bookworm "$tree" "$mirror" >"$OUT/debootstrap.log" 2>&1 ||
        { tail -n 20 "$OUT/debootstrap.log" >&2; die "debootstrap failed (log: $OUT/debootstrap.log)"; }
      touch "$tree/.complete"
    fi
    say "base: importing $tree as $DEBIAN_IMAGE"
    tar -C "$tree" --exclude=./.complete -c . | docker import - "$DEBIAN_IMAGE" >/dev/null
  fi
  # The test base: this machine's CA bundle (the registries are reached through it) and apt
  # sources. Rebuilt when they change; the docker build cache makes that a no-op otherwise.
  local ctx=$OUT/testbase
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
  if [ -f "$APT/sources.list.d/debian.sources" ]; then
    cp "$APT/sources.list.d/debian.sources" "$ctx/debian.sources"
  else
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$(debian_mirror)" >"$ctx/debian.sources"
  fi
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $DEBIAN_IMAGE
COPY host-ca.crt /etc/ssl/host-ca.crt
COPY debian.sources /etc/apt/sources.list.d/debian.sources
RUN rm -f /etc/apt/sources.list
ENV PIP_CERT=/etc/ssl/host-ca.crt REQUESTS_CA_BUNDLE=/etc/ssl/host-ca.crt SSL_CERT_FILE=/etc/ssl/host-ca.crt
DOCKERFILE
  say "base: $TEST_BASE (FROM $DEBIAN_IMAGE, plus this machine's CA bundle and apt sources)"
  DOCKER_BUILDKIT=0 docker build -q --network host -t "$TEST_BASE" "$ctx" >/dev/null 2>&1 ||
    die "docker build of $TEST_BASE failed"
}

# --- the images ---------------------------------------------------------------------------
# build DEVICE IMAGE: docker build from this checkout on the test base, timed; the image's size.
build() {
  local device=$1 image=$2 start end log=$OUT/build-$1.log base=$TEST_BASE
  # The GPU image needs nvcc 12: GPU_BASE=nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04 where it can be pulled.
  [ "$device" = cpu ] || base=${GPU_BASE:-$TEST_BASE}
  say "build: $image (DEVICE=$device, BASE_IMAGE=$base; log: $log)"
  start=$(date +%s)
  # The classic builder: Debian's docker.io has no buildx. --network host: no bridge addresses.
  if ! DOCKER_BUILDKIT=0 docker build --network host ${DOCKER_TEST_NO_CACHE:+--no-cache} \
        --build-arg BASE_IMAGE="$base" --build-arg DEVICE="$device" -t "$image" . >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "docker build of $image failed (log: $log)"
  fi
  end=$(date +%s)
  figure "build $image: $((end - start)) s (docker build --network host --build-arg BASE_IMAGE=$base --build-arg DEVICE=$device${DOCKER_TEST_NO_CACHE:+ --no-cache})"
  figure "size $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.2f GB (%.0f bytes)", $1/1e9, $1}')"
  # TensorFlow's start-up lines (its import in the check's forks) only if the check fails.
  if ! docker run --rm --network host "$image" horovodrun --check-build \
        >"$OUT/check-build-$device.txt" 2>"$OUT/check-build-$device.err"; then
    cat "$OUT/check-build-$device.txt" "$OUT/check-build-$device.err" >&2
    die "$image: horovodrun --check-build failed"
  fi
  sed -n '/Tensor Operations/,$p' "$OUT/check-build-$device.txt" | grep -q '\[X\] Gloo' ||
    die "$image: horovodrun --check-build does not list Gloo: $(cat "$OUT/check-build-$device.txt")"
  if [ "$device" = gpu ]; then
    grep -q '\[X\] NCCL' "$OUT/check-build-$device.txt" ||
      die "$image: horovodrun --check-build does not list NCCL: $(cat "$OUT/check-build-$device.txt")"
  fi
  figure "check-build $image: $(grep -o '\[X\] [A-Za-z]*' "$OUT/check-build-$device.txt" | cut -c5- | tr '\n' ' ')"
}

# bases: the two stages' bases as this engine resolves the Dockerfile's own arguments (its lines
# before the first FROM, under a probe stage that labels what they came to): the default GPU
# build compiles on CUDA's devel image and runs on its runtime image; BASE_IMAGE alone is both
# stages' base (the CPU build); RUNTIME_IMAGE is the runtime stage's over it. Nothing is pulled.
bases() {
  local dir=$OUT/bases
  mkdir -p "$dir"
  { sed '/^FROM /,$d' Dockerfile
    # shellcheck disable=SC2016  # Docker's variables, for the probe to expand
    printf '%s\n' "FROM $DEBIAN_IMAGE" 'ARG BUILD_FROM' 'ARG RUNTIME_FROM' \
      'LABEL build_from=${BUILD_FROM} runtime_from=${RUNTIME_FROM}'; } >"$dir/Dockerfile"
  resolves "nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04 nvidia/cuda:12.5.1-runtime-ubuntu22.04"
  resolves "debian:bookworm-slim debian:bookworm-slim" --build-arg BASE_IMAGE=debian:bookworm-slim
  resolves "nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04 nvidia/cuda:12.2.2-runtime-ubuntu22.04" \
    --build-arg BASE_IMAGE=nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04 \
    --build-arg RUNTIME_IMAGE=nvidia/cuda:12.2.2-runtime-ubuntu22.04
}

# resolves "BUILD RUNTIME" [BUILD-ARG...]: the probe of `bases`, built with those arguments.
resolves() {
  local want=$1 id got
  shift
  if ! id=$(DOCKER_BUILDKIT=0 docker build -q "$@" "$OUT/bases" 2>"$OUT/bases/build.err"); then
    cat "$OUT/bases/build.err" >&2
    die "bases: the probe build failed ($*)"
  fi
  got=$(docker image inspect -f '{{index .Config.Labels "build_from"}} {{index .Config.Labels "runtime_from"}}' "$id")
  docker rmi "$id" >/dev/null
  [ "$got" = "$want" ] || die "bases: with '${*:-no arguments}' the stages are on '$got', not '$want'"
  say "bases: ${*:-no arguments}: build on ${got% *}, run on ${got#* }"
}

# --- containers: every one labelled, all removed on exit ----------------------------------
cleanup() {
  local ids=()
  mapfile -t ids < <(docker ps -aq --filter "label=$LABEL" 2>/dev/null || true)
  [ ${#ids[@]} = 0 ] || docker rm -f "${ids[@]}" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# container ARGS...: `docker run` with the label, on the host's network.
container() { docker run --label "$LABEL" --network host "$@"; }

# The invoking user (under sudo: the one who ran sudo). Root here: a non-root uid stands in, so
# the test shows files owned by the container's --user, not by root.
invoking_ids() {
  local uid=${SUDO_UID:-$(id -u)} gid=${SUDO_GID:-$(id -g)}
  [ "$uid" != 0 ] || { uid=4242; gid=4242; }
  echo "$uid:$gid"
}

# --- the quickstart -----------------------------------------------------------------------
quickstart() {
  local ids runs=$OUT/quickstart-runs log=$OUT/quickstart.log start end acc
  ids=$(invoking_ids)
  rm -rf "$runs"; mkdir -p "$runs"; chown "$ids" "$runs"
  say "quickstart: docker run --rm --user $ids -v $runs:/opt/hvd_train/runs $IMAGE_CPU (no arguments; log: $log)"
  start=$(date +%s)
  container --rm --user "$ids" -v "$runs:/opt/hvd_train/runs" "$IMAGE_CPU" >"$log" 2>&1 ||
    { tail -n 30 "$log" >&2; die "the quickstart failed in $IMAGE_CPU (log: $log)"; }
  end=$(date +%s)
  [ -f "$runs/quickstart/model.keras" ] || die "no model in the mounted volume: $runs/quickstart"
  local foreign
  foreign=$(find "$runs" ! -user "${ids%%:*}" | head -n 3)
  [ -z "$foreign" ] || die "files in the volume not owned by uid ${ids%%:*}: $foreign"
  acc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["final_metrics"]["val_accuracy"])' "$runs/quickstart/summary.json")
  python3 -c 'import sys; sys.exit(float(sys.argv[1]) < float(sys.argv[2]))' "$acc" "$MIN_ACCURACY" ||
    die "quickstart val_accuracy $acc < $MIN_ACCURACY"
  figure "quickstart in $IMAGE_CPU: val_accuracy $acc (>= $MIN_ACCURACY), $((end - start)) s for docker run, results owned by uid ${ids%%:*} in the mounted volume ($(grep -m1 'done in' "$log" | sed 's/^\[hvd_train\] //'))"
}

# --- two containers as two hosts ------------------------------------------------------------
# Both on the host's network: node1 is 127.0.0.2, node2 127.0.0.3 (loopback, but not this
# machine's interface address 127.0.0.1, so horovodrun and mpirun reach them over ssh instead of
# starting the workers locally). Each runs sshd as mpiuser, as MPI Operator workers do, with
# the keys mounted read-only at ~/.ssh; a third container is the launcher.
MN=$OUT/multinode
LAUNCHER=hvd_train-test-launcher-$$  # the launcher container
HOSTS=(--add-host node1:127.0.0.2 --add-host node2:127.0.0.3 --add-host launcher:127.0.0.4)
# One intra-op thread per worker in every run: by default a worker takes cores / local workers,
# so one worker per host would run 2 threads here and one host's two workers 1 each, and a
# different thread count sums in a different order (results equal to about 1e-7, not bit for bit).
JOB=(configs/quickstart.yaml --set run.dir=/results/RUN --set runtime.intra_op_threads=1)

ssh_keys() {
  local keys=$MN/keys
  rm -rf "$keys"; mkdir -p "$keys"; chown 1000:1000 "$keys"
  container --rm --user 1000:1000 -v "$keys:/k" "$IMAGE_CPU" ssh-keygen -q -t rsa -b 3072 -N '' -f /k/id_rsa
  cp "$keys/id_rsa.pub" "$keys/authorized_keys"
  printf '%s\n' 'Host node1' '    Port 2222' 'Host node2' '    Port 2223' >"$keys/config"
  chown -R 1000:1000 "$keys"; chmod 600 "$keys"/*
}

# worker NAME ADDRESS PORT: a worker container running only sshd, on ADDRESS:PORT.
worker() {
  container -d --name "hvd_train-test-$1-$$" --hostname "$1" "${HOSTS[@]}" --user 1000:1000 \
    -v "$MN/keys:/home/mpiuser/.ssh:ro" -v "$MN/results:/results" "$IMAGE_CPU" \
    /usr/sbin/sshd -De -f /home/mpiuser/.sshd_config -o "ListenAddress=$2" -p "$3" >/dev/null
}

# on_launcher LOG CMD...: runs CMD in the launcher container; its output into LOG.
on_launcher() {
  local log=$1; shift
  docker exec "$LAUNCHER" "$@" >"$log" 2>&1
}

# same_result RUN_A RUN_B: metrics.csv's training columns and the final weights, bit for bit
# (read in the container $LAUNCHER, where the results are at /results).
same_result() {
  docker exec -i "$LAUNCHER" python - "/results/$1" "/results/$2" <<'PYEOF'
import csv, sys
import numpy as np
from hvd_train.runtime.keras.binding import KERAS2, has_keras3, of_saved
if of_saved(f"{sys.argv[1]}/model.keras") == KERAS2 and has_keras3():
    import tf_keras as keras  # a runtime.keras: tf_keras run
else:
    import keras  # Keras 3 (the default on TensorFlow 2.16+), or 2.15's Keras 2
cols = ["epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"]
rows = [[[r[c] for c in cols] for r in csv.DictReader(open(f"{d}/metrics.csv"))] for d in sys.argv[1:]]
assert rows[0] == rows[1], f"metrics.csv differ:\n{rows[0]}\n{rows[1]}"
w = [keras.models.load_model(f"{d}/model.keras", compile=False).get_weights() for d in sys.argv[1:]]
assert len(w[0]) == len(w[1]) and all(np.array_equal(a, b) for a, b in zip(*w)), "weights differ"
print(f"identical: {len(rows[0])} epochs of metrics.csv, {len(w[0])} weight arrays; final val_accuracy {rows[0][-1][4]}")
PYEOF
}

multinode() {
  rm -rf "$MN"; mkdir -p "$MN/results"; chown 1000:1000 "$MN/results"
  ssh_keys
  printf '%s\n' 'node1 slots=1' 'node2 slots=1' >"$MN/results/hosts.txt"
  worker node1 127.0.0.2 2222
  worker node2 127.0.0.3 2223
  container -d --name "$LAUNCHER" --hostname launcher "${HOSTS[@]}" --user 1000:1000 \
    -v "$MN/keys:/home/mpiuser/.ssh:ro" -v "$MN/results:/results" "$IMAGE_CPU" sleep infinity >/dev/null
  local one two out
  # 1. launch/multi_node.sh, Open MPI (the MPI Operator's path), against one host at -np 2.
  one=(launch/single_node.sh "${JOB[@]/RUN/single-mpi}" --np 2 --mpi)
  two=(launch/multi_node.sh --hostfile /results/hosts.txt "${JOB[@]/RUN/two-mpi}" --mpi --network-interface lo)
  say "multinode: ${two[*]}"
  on_launcher "$MN/two-mpi.log" "${two[@]}" || { tail -n 40 "$MN/two-mpi.log" >&2; die "multi_node.sh failed (log: $MN/two-mpi.log)"; }
  grep -q 'pre-flight: all 2 host(s) answer' "$MN/two-mpi.log" || die "no pre-flight in $MN/two-mpi.log"
  say "multinode: the same job on one host: ${one[*]}"
  docker exec "hvd_train-test-node1-$$" "${one[@]}" >"$MN/single-mpi.log" 2>&1 ||
    { tail -n 40 "$MN/single-mpi.log" >&2; die "the one-host job failed (log: $MN/single-mpi.log)"; }
  out=$(same_result single-mpi two-mpi) || die "two hosts and one host differ: $out"
  figure "multinode: multi_node.sh --mpi on node1+node2 vs single_node.sh --np 2 --mpi on one host: $out"
  # 2. horovodrun -H itself, Gloo.
  one=(horovodrun -np 2 -H localhost:2 --gloo --network-interfaces lo python -m hvd_train --config "${JOB[@]/RUN/single-gloo}")
  two=(horovodrun -np 2 -H "node1:1,node2:1" --gloo --network-interfaces lo python -m hvd_train --config "${JOB[@]/RUN/two-gloo}")
  say "multinode: ${two[*]}"
  on_launcher "$MN/two-gloo.log" "${two[@]}" || { tail -n 40 "$MN/two-gloo.log" >&2; die "horovodrun -H failed (log: $MN/two-gloo.log)"; }
  docker exec "hvd_train-test-node1-$$" "${one[@]}" >"$MN/single-gloo.log" 2>&1 ||
    { tail -n 40 "$MN/single-gloo.log" >&2; die "the one-host Gloo job failed (log: $MN/single-gloo.log)"; }
  out=$(same_result single-gloo two-gloo) || die "two hosts and one host differ (Gloo): $out"
  figure "multinode: horovodrun -H node1:1,node2:1 --gloo vs -H localhost:2 --gloo: $out"
  lost_host
}

# record RUN: "STATUS: ERROR" from RUN's summary.json, once it no longer says `running` (rank 0's
# keeper writes the end a moment after the job; 30 s at most).
record() {
  python3 - "$MN/results/$1/summary.json" <<'PYEOF'
import json, sys, time
for _ in range(300):
    s = json.load(open(sys.argv[1]))
    if s.get("status") != "running":
        break
    time.sleep(0.1)
print(f"{s.get('status')}: {s.get('error') or s.get('failure') or 'no error'}"[:240])
PYEOF
}

# lost_host: `docker kill` node2 mid-run; the job must end by itself within 60 s naming node2,
# and the same command again (node2 back) must resume from the last checkpoint.
lost_host() {
  local cmd log=$MN/lost.log pid killed ended start
  cmd=(launch/multi_node.sh --hostfile /results/hosts.txt "${JOB[@]/RUN/lost}" --set train.epochs=40 --mpi --network-interface lo)
  say "lost host: ${cmd[*]}, then docker kill node2 after epoch 5"
  docker exec "$LAUNCHER" "${cmd[@]}" >"$log" 2>&1 &
  pid=$!
  start=$(date +%s)
  until grep -qi 'epoch 5/40' "$log"; do
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$log" >&2; die "the job ended before epoch 5 (log: $log)"; }
    [ $(($(date +%s) - start)) -lt 300 ] || die "no epoch 5 within 300 s (log: $log)"
    sleep 0.2
  done
  docker kill "hvd_train-test-node2-$$" >/dev/null
  killed=$(date +%s.%N)
  local rc=0
  # The job must end by itself: 60 s, then this test gives up on it.
  timeout 90 tail --pid="$pid" -f /dev/null || true
  wait "$pid" || rc=$?
  ended=$(date +%s.%N)
  local took
  took=$(python3 -c "print(f'{$ended - $killed:.1f}')")
  python3 -c "import sys; sys.exit($ended - $killed > 60)" || die "the job took $took s (> 60) to end after node2 was killed (log: $log)"
  [ "$rc" != 0 ] || die "the job exited 0 although node2 was killed (log: $log)"
  grep -q 'node2' <(sed -n '/epoch 5\/40/I,$p' "$log") || { tail -n 30 "$log" >&2; die "the job's end does not name node2 (log: $log)"; }
  local named
  named=$(sed -n '/epoch 5\/40/I,$p' "$log" | grep -m1 'node2' | sed 's/^[[:space:]]*//' | cut -c1-200)
  figure "lost host: docker kill node2 after epoch 5/40: the job ended by itself in $took s (exit $rc), naming it: $named"
  # The run record must not lie: no `running` (nor `completed`) for a job that lost a host.
  local record
  record=$(record lost) || die "after node2 was lost: $record"
  case "$record" in failed*|interrupted*) ;; *) die "after node2 was lost, summary.json says: $record";; esac
  figure "lost host: summary.json says: $record"
  # The same command again, node2 back.
  docker rm -f "hvd_train-test-node2-$$" >/dev/null
  worker node2 127.0.0.3 2223
  on_launcher "$MN/resume.log" "${cmd[@]}" || { tail -n 40 "$MN/resume.log" >&2; die "the rerun failed (log: $MN/resume.log)"; }
  local resumed
  resumed=$(grep -m1 'resuming from' "$MN/resume.log" | sed 's/^.*\(resuming from\)/\1/; s/\[[0-9]*,[0-9]*\]<std[a-z]*>://g') ||
    die "the rerun did not resume (log: $MN/resume.log)"
  grep -qi 'epoch 40/40' "$MN/resume.log" || die "the rerun did not finish (log: $MN/resume.log)"
  record=$(record lost) || die "after the rerun: $record"
  case "$record" in completed*) ;; *) die "after the rerun, summary.json says: $record";; esac
  figure "lost host: the same command again: $resumed; finished epoch 40/40; summary.json says: $record"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced: the functions only
STEP=${1:-all}
case "$STEP" in
  engine) engine ;;
  base) engine; base ;;
  bases) engine; base; bases ;;
  build-cpu) engine; base; build cpu "$IMAGE_CPU" ;;
  build-gpu) engine; base; build gpu "$IMAGE_GPU" ;;
  quickstart) engine; quickstart ;;
  multinode) engine; multinode ;;
  mirror) trap - EXIT; debian_mirror ;;  # reads apt's sources only: no container to remove
  all)
    : >"$FIGURES"
    figure "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?'): bash scripts/docker_test.sh all"
    engine; base; bases; build cpu "$IMAGE_CPU"; quickstart; multinode
    say "all passed; figures in $FIGURES" ;;
  *) die "unknown step '$STEP'" ;;
esac
