"""horovodrun keeps a stopped worker's exit code (scripts/patch_horovod.py, which install.sh
applies to Horovod 0.28.1). Unpatched, 34 of 100 stops here came back as exit code 0, so 20
stops that all keep their 143 would happen by chance about once in 4,000 runs."""

from __future__ import annotations

import json
import subprocess

from harness import PYTHON, ROOT, WORKERS


def test_a_stopped_worker_keeps_its_exit_code() -> None:
    proc = subprocess.run([PYTHON, str(WORKERS / "stop_codes.py"), "20"], cwd=WORKERS,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [143] * 20


def test_the_patch_is_applied_and_applies_once() -> None:
    patch = [PYTHON, str(ROOT / "scripts" / "patch_horovod.py")]
    proc = subprocess.run(patch, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")  # already patched
