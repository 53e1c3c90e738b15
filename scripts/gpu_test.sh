#!/usr/bin/env bash
# The GPU smoke test, `make gpu-test`, for a host with NVIDIA GPUs and a CUDA 12 toolkit: what
# truly needs a GPU, in one script. Not run by this project yet: it has no such host
# (docs/validation.md). In order, stopping at the first failure:
#
#   1. the install with HVD_TRAIN_DEVICE=gpu (it finds the CUDA 12 toolkit and NCCL before any
#      download, and checks after it that TensorFlow lists the GPUs and Horovod has NCCL);
#   2. `hvd-train doctor`, the driver's and CUDA's versions (nvidia-smi's, TensorFlow's
#      build's), and `horovodrun --check-build`, which must list NCCL;
#   3. the quickstart on one GPU, then on every GPU (the launcher's default: one worker a GPU),
#      watched: every worker's process must hold a context on one GPU only and no GPU two
#      workers' (nvidia-smi's compute apps, by pid, sampled while it runs), and NCCL must
#      initialise once per rank (NCCL_DEBUG=INFO's "Init COMPLETE" lines); with 2 GPUs or more,
#      a 2-worker run, whose ranks' replicated state runtime.check_replicas compares at each
#      epoch's end (exit 3 on a difference: docs/faults.md); then every GPU with mixed
#      precision (runtime.mixed_precision: mixed_float16) and with XLA (runtime.jit_compile:
#      true), each in runs/gpu-test/<name> (GPU_TEST_DIR), anew;
#   4. a table of the runs: status, workers, device, examples/s (summary.json's
#      train_examples_per_sec) and the last val_accuracy. Each run must record `completed` on
#      the GPU, or the script exits 1.
#
# A host whose nvidia-smi lists no GPU is refused in one line (exit 2) before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[gpu-test] %s\n' "$*"; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -lt 1 ]; then
  echo "[gpu-test] error: no GPU here (nvidia-smi is missing or lists none): make gpu-test needs a host with NVIDIA GPUs and a CUDA 12 toolkit" >&2
  exit 2
fi
say "$gpus GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"

HVD_TRAIN_DEVICE=gpu bash scripts/install.sh
venv=$(bash scripts/stack.sh venv)
export PATH="$PWD/$venv/bin:$PATH"
hvd-train doctor
say "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1), its CUDA $(nvidia-smi | sed -nE 's/.*CUDA Version: *([0-9.]+).*/\1/p' | head -n 1); TensorFlow built for CUDA $(python -c 'import tensorflow as tf; print(tf.sysconfig.get_build_info().get("cuda_version"))' 2>/dev/null)"
horovodrun --check-build | tee "${TMPDIR:-/tmp}/gpu-test-check-build.txt"
grep -q '\[X\] NCCL' "${TMPDIR:-/tmp}/gpu-test-check-build.txt" || { echo "[gpu-test] error: horovodrun --check-build lists no NCCL" >&2; exit 1; }

out=${GPU_TEST_DIR:-runs/gpu-test}
names=()
# The quickstart as NAME, with the launch options and --set overrides that follow it.
quickstart() {
  local name=$1
  shift
  say "$name: hvd-train launch --config configs/quickstart.yaml $*"
  rm -rf "${out:?}/$name"
  hvd-train launch --config configs/quickstart.yaml --set "run.dir=$out/$name" "$@"
  names+=("$name")
}
# The quickstart on every GPU, watched (above): NAME, then what `quickstart` takes.
watched() {
  local name=$1 apps="$out/$1.compute-apps.txt" log="$out/$1.console.txt" job
  mkdir -p "$out"
  : > "$apps"
  NCCL_DEBUG=INFO quickstart "$@" > "$log" 2>&1 &
  job=$!
  while kill -0 "$job" 2>/dev/null; do
    nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader >> "$apps" 2>/dev/null || true
    sleep 1
  done
  wait "$job" || { cat "$log" >&2; echo "[gpu-test] error: $name failed (its console above)" >&2; exit 1; }
  names+=("$name")
  python - "$apps" "$log" "$gpus" "$name" "$out/$name" <<'PYEOF'
import collections
import glob
import re
import sys

apps, log, gpus, name, run_dir = sys.argv[1:6]
gpus = int(gpus)
held = collections.defaultdict(set)  # pid -> GPUs its process holds a context on
for line in open(apps):
    pid, _, uuid = line.strip().partition(", ")
    if pid.isdigit():
        held[int(pid)].add(uuid)
workers = collections.defaultdict(set)  # GPU -> pids
for pid, uuids in held.items():
    for uuid in uuids:
        workers[uuid].add(pid)
problems = [f"pid {p} holds {len(u)} GPUs" for p, u in held.items() if len(u) > 1]
problems += [f"GPU {u} holds {len(p)} processes" for u, p in workers.items() if len(p) > 1]
if len(held) < gpus:
    problems.append(f"{len(held)} processes seen on the GPUs, {gpus} expected")
# NCCL's lines: each rank's log (run.dir/logs/rank-N.log, its whole output), else the console.
text = "".join(open(f).read() for f in glob.glob(f"{run_dir}/logs/rank-*.log") or [log])
inits = collections.Counter(
    m.group(1) for m in re.finditer(r"rank (\d+) nranks \d+ .*Init COMPLETE", text)
)
if sorted(inits) != sorted(str(r) for r in range(gpus)) or set(inits.values()) != {1}:
    problems.append(f"NCCL initialised per rank: {dict(inits)} (once each of {gpus} expected)")
print(f"[gpu-test] {name}: {len(held)} worker processes, one GPU each; NCCL initialised once per rank"
      if not problems else f"[gpu-test] error: {name}: " + "; ".join(problems))
sys.exit(1 if problems else 0)
PYEOF
}

quickstart one-gpu --np 1
watched every-gpu
[ "$gpus" -lt 2 ] || quickstart two-workers --np 2
quickstart mixed-float16 --set runtime.mixed_precision=mixed_float16
quickstart xla --set runtime.jit_compile=true

# The table, from each run's summary.json; exit 1 unless every run completed on the GPU.
python - "$out" "${names[@]}" <<'PYEOF'
import json
import sys

out, names = sys.argv[1], sys.argv[2:]
print(f"{'run':<14} {'status':<10} {'workers':>7} {'device':>6} {'examples/s':>11} {'val_accuracy':>12}")
ok = True
for name in names:
    s = json.load(open(f"{out}/{name}/summary.json"))
    acc = s.get("final_metrics", {}).get("val_accuracy", float("nan"))
    print(f"{name:<14} {s['status']:<10} {s['world_size']:>7} {s.get('device', '?'):>6} "
          f"{s.get('train_examples_per_sec', float('nan')):>11.0f} {acc:>12.4f}")
    ok = ok and s["status"] == "completed" and s.get("device") == "gpu"
sys.exit(0 if ok else 1)
PYEOF
