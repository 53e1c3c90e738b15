#!/usr/bin/env bash
# Several machines over ssh, after a pre-flight check of every host.
#
#   launch/multi_node.sh --hostfile FILE CONFIG [--set key=value ...] [--ssh-port P] [--ssh-identity-file F] [--network-interface IF[,IF]] [--mpi | --gloo] [--no-preflight] [--dry-run]
#
# FILE has one `HOST slots=N` line per machine (N workers there, usually its GPU count);
# `#` comments and blank lines are ignored. Every host must have this project at the same path,
# with the same Python, and accept key-based ssh from this machine (as horovodrun needs).
# Pre-flight: each host must answer over ssh within HVD_TRAIN_PREFLIGHT_TIMEOUT seconds (60)
# and report the same hvd_train, TensorFlow and Horovod versions as this machine, with nothing
# that stops training (`hvd-train doctor --versions`). Exit codes: 2 bad arguments, hostfile
# or config; 3 pre-flight failed; otherwise the job's.
set -euo pipefail
PROG=multi_node.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() { printf 'usage: %s\n' "$(sed -n '4p' "${BASH_SOURCE[0]}" | sed 's/^#  *//')" >&2; exit 2; }

# parse_hostfile FILE: fills HOSTS and SLOTS; a bad line fails naming its number.
parse_hostfile() {
  local file=$1 n=0 line host
  HOSTS=() SLOTS=()
  [ -f "$file" ] || die "$file: hostfile not found"
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%%#*}
    line=$(sed 's/^[[:space:]]*//; s/[[:space:]]*$//' <<<"$line")
    [ -n "$line" ] || continue
    [[ $line =~ ^([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)[[:space:]]+slots=([1-9][0-9]*)$ ]] ||
      die "$file:$n: expected 'HOST slots=N' with N >= 1, got '$line'"
    host=${BASH_REMATCH[1]}
    for h in "${HOSTS[@]}"; do [ "$h" != "$host" ] || die "$file:$n: host $host is listed twice"; done
    HOSTS+=("$host") SLOTS+=("${BASH_REMATCH[3]}")
  done <"$file"
  [ ${#HOSTS[@]} -gt 0 ] || die "$file: no hosts; expected lines 'HOST slots=N'"
}

# preflight: every host answers over ssh with the versions this machine has; all are checked
# at once, and every host that fails is named.
preflight() {
  local dir timeout=${HVD_TRAIN_PREFLIGHT_TIMEOUT:-60} i host remote
  dir=$(mktemp -d)
  # What horovodrun runs remotely: cd to this folder, the same PYTHONPATH, the same Python.
  remote="cd $(printf %q "$PWD") >/dev/null 2>&1; "
  [ -z "${PYTHONPATH:-}" ] || remote+="PYTHONPATH=$(printf %q "$PYTHONPATH") "
  remote+="TF_CPP_MIN_LOG_LEVEL=3 $(printf %q "$PY") -m hvd_train doctor --versions"
  # And the address the host's own name resolves to (see check_host).
  # shellcheck disable=SC2016  # expanded on the remote host
  remote+=' && echo "name=$(hostname) address=$(getent ahosts "$(hostname)" | awk "NR==1{print \$1}")"'
  say "pre-flight: ssh to ${#HOSTS[@]} host(s), comparing hvd_train, TensorFlow and Horovod versions"
  (rc=0; "$PY" -m hvd_train doctor --versions >"$dir/local.out" 2>"$dir/local.err" || rc=$?
   echo "$rc" >"$dir/local.rc") &
  for i in "${!HOSTS[@]}"; do
    host=${HOSTS[$i]}
    (rc=0; timeout "$timeout" ssh "${SSH_OPTS[@]}" -o ConnectTimeout="$timeout" "$host" "$remote" \
       >"$dir/$i.out" 2>"$dir/$i.err" </dev/null || rc=$?
     echo "$rc" >"$dir/$i.rc") &
  done
  wait
  local here failures=0
  [ "$(cat "$dir/local.rc")" = 0 ] || {
    printf '%s: error: this machine cannot train:\n' "$PROG" >&2; cat "$dir/local.err" >&2
    rm -rf "$dir"; exit 3; }
  here=$(tail -n1 "$dir/local.out")
  for i in "${!HOSTS[@]}"; do
    if ! check_host "${HOSTS[$i]}" "$(cat "$dir/$i.rc")" "$dir/$i.out" "$dir/$i.err" "$here" "$timeout"; then
      failures=$((failures + 1))
    fi
  done
  rm -rf "$dir"
  [ "$failures" = 0 ] || { printf '%s: error: pre-flight failed on %d host(s)\n' "$PROG" "$failures" >&2; exit 3; }
  say "pre-flight: all ${#HOSTS[@]} host(s) answer with $here"
}

# check_host HOST RC OUT ERR HERE TIMEOUT: one host's verdict, as one line naming it.
check_host() {
  local host=$1 rc=$2 out=$3 err=$4 here=$5 timeout=$6 there why
  why=$(grep -v '^[[:space:]]*$' "$err" | tail -n3 | tr '\n' ' ' || true)
  case "$rc" in
    0) ;;
    124) fail_host "$host" "no answer within ${timeout} s"; return 1 ;;
    255) fail_host "$host" "not reachable over ssh: ${why:-ssh exited 255}"; return 1 ;;
    1) fail_host "$host" "cannot train there (hvd-train doctor): ${why}"; return 1 ;;
    *) fail_host "$host" "the check failed there (exit $rc): ${why}"; return 1 ;;
  esac
  there=$(grep -v '^name=' "$out" | tail -n1)
  if [ "$there" != "$here" ]; then
    fail_host "$host" "versions differ: $there there, $here here (every host needs the same install)"
    return 1
  fi
  # Horovod 0.28.1's Gloo sets up its process-set contexts on the address the host's own name
  # resolves to, not on HOROVOD_GLOO_IFACE (gloo_context.cc, InitializeForProcessSet). A name
  # that resolves to loopback (Debian's 127.0.1.1 default) makes peers connect to themselves.
  local name address
  read -r name address < <(grep '^name=' "$out" | sed 's/^name=//; s/ address=/ /')
  if [ "$controller" = gloo ] && [ "${#HOSTS[@]}" -gt 1 ] && ! is_loopback "$host" &&
     { [ -z "${address:-}" ] || is_loopback "$address"; }; then
    fail_host "$host" "its name '$name' resolves to ${address:-nothing}, not to its address on the job's network: Horovod's Gloo controller needs that (map the name in /etc/hosts, or use --mpi)"
    return 1
  fi
}

fail_host() { printf '%s: error: host %s: %s\n' "$PROG" "$1" "$2" >&2; }

hostfile="" config="" controller="" nics="" preflight=1 sets=() SSH_OPTS=() RUN_SSH=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) [ $# -ge 2 ] || usage; hostfile=$2; shift 2 ;;
    --set) [ $# -ge 2 ] || usage; sets+=(--set "$2"); shift 2 ;;
    --ssh-port) [ $# -ge 2 ] || usage; is_positive_int "$2" || die "--ssh-port expects a port number, got '$2'"
      SSH_OPTS+=(-p "$2"); RUN_SSH+=(--ssh-port "$2"); shift 2 ;;
    --ssh-identity-file) [ $# -ge 2 ] || usage; [ -r "$2" ] || die "--ssh-identity-file: cannot read '$2'"
      SSH_OPTS+=(-i "$2"); RUN_SSH+=(--ssh-identity-file "$2"); shift 2 ;;
    --network-interface|--network-interfaces) [ $# -ge 2 ] || usage
      # Horovod pastes the names into a shell command line (mpirun's): names only.
      [[ $2 =~ ^[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$ ]] ||
        die "--network-interface expects interface names (eth0 or eth0,eth1), got '$2'"
      nics=$2; shift 2 ;;
    --mpi) controller=mpi; shift ;;
    --gloo) controller=gloo; shift ;;
    --no-preflight) preflight=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$config" ] || die "one CONFIG expected, got '$config' and '$1'"; config=$1; shift ;;
  esac
done
if [ -z "$hostfile" ] || [ -z "$config" ]; then usage; fi
# The options horovodrun's own ssh uses, plus no prompt, no known_hosts writes and quiet.
SSH_OPTS=(-o BatchMode=yes -o PasswordAuthentication=no -o StrictHostKeyChecking=no
          -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "${SSH_OPTS[@]}")

check_python
parse_hostfile "$hostfile"
np=0 hosts=""
for i in "${!HOSTS[@]}"; do
  np=$((np + SLOTS[i])); hosts+="${hosts:+,}${HOSTS[$i]}:${SLOTS[$i]}"
done
args=("$config" "${sets[@]}" --np "$np" --hosts "$hosts" "${RUN_SSH[@]}")
[ -z "$nics" ] || args+=(--network-interface "$nics")
[ -z "$controller" ] || args+=("--$controller")
launch_command "${args[@]}"
controller=$CONTROLLER
say "${#HOSTS[@]} host(s), $np worker(s), $controller controller"
[ "$preflight" = 0 ] || [ "${DRY_RUN:-0}" = 1 ] || preflight
run_printed "${CMD[@]}"
