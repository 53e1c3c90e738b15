#!/usr/bin/env bash
# The GPU smoke test, `make gpu-test`, for a host with NVIDIA GPUs and a CUDA 12 toolkit: what
# truly needs a GPU, in one script. Not run by this project yet: it has no such host
# (docs/validation.md). In order, stopping at the first failure:
#
#   1. the install with HVD_TRAIN_DEVICE=gpu (it finds the CUDA 12 toolkit and NCCL before any
#      download, and checks after it that TensorFlow lists the GPUs and Horovod has NCCL);
#   2. `hvd-train doctor`;
#   3. the quickstart on one GPU, then on every GPU (the launcher's default: one worker a GPU),
#      then on every GPU with mixed precision (runtime.mixed_precision: mixed_float16) and with
#      XLA (runtime.jit_compile: true), each in runs/gpu-test/<name> (GPU_TEST_DIR), anew;
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
quickstart one-gpu --np 1
quickstart every-gpu
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
