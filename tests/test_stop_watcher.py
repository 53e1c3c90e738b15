"""The stop watcher (control.StopSignals) in a real process receiving real signals: it ends the
process itself when waiting would save nothing, or when the stop outlasts its grace, and leaves
it alone once the run has written its own ending."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from harness import ROOT

SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from hvd_train.control import StopSignals
s = StopSignals(grace_s=0.5)
s.abandon = lambda signum, reason, ran, failed, failed_rank: print(
    f"ABANDON signal={{signum}} ran={{ran}} failed={{failed}}: {{reason}}", flush=True)
s.steps_run = {steps}
s.install()
{before}
os.kill(os.getpid(), signal.SIGTERM)
{after}
time.sleep(60)  # the watcher must end the process long before this
print("NOT ENDED", flush=True)
"""


def run(steps: int = 0, before: str = "", after: str = "", env: dict | None = None):
    code = SCRIPT.format(root=str(ROOT), steps=steps, before=before, after=after)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


def test_a_stop_before_any_step_ends_the_process_at_once_recorded() -> None:
    proc = run(steps=0)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=False failed=False: before any step ran" in proc.stdout


def test_a_stop_that_outlasts_the_grace_ends_the_process_without_a_checkpoint() -> None:
    proc = run(steps=3)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=True failed=False: its stop did not finish" in proc.stdout


def test_a_run_that_wrote_its_ending_is_left_to_end_by_itself() -> None:
    proc = run(steps=3, before="s.done.set()",
               after="time.sleep(2); print('ENDED BY ITSELF'); sys.exit(0)")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ENDED BY ITSELF" in proc.stdout and "ABANDON" not in proc.stdout


def test_mpiruns_kill_sequence_is_recorded_as_a_failure_not_a_stop() -> None:
    """mpirun ends a job with SIGCONT, then SIGTERM: that is not a user's stop."""
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "0"}
    proc = run(steps=3, before="os.kill(os.getpid(), signal.SIGCONT)", env=env)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=True failed=True: mpirun ended the job" in proc.stdout
