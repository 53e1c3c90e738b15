"""Fixes horovodrun exiting 0 after it was stopped (Ctrl-C, SIGTERM) in Horovod 0.28.1. Run by
install.sh after Horovod is installed; does nothing twice.

    python scripts/patch_horovod.py

horovodrun starts each worker through a "middleman" process that runs `sh -c "env ... python
..."` and reports the shell's exit code. When horovodrun is stopped, a second thread of the
middleman terminates the shell and then waits for it with psutil, which reaps it (the shell is
its child). When that thread reaps first, the main thread's `Popen.wait()` finds no child and
subprocess reports exit code 0: the worker's 143 is lost. With every rank lost that way,
horovodrun exits 0, and a script that runs it takes an interrupted run for a completed one.
Measured here: 34 of 100 stopped workers came back with exit code 0 (tests/workers/stop_codes.py,
which tests/test_horovod_patch.py runs). The fix waits without reaping (waitid with WNOWAIT),
leaving the exit code to the main thread.

Exit code 0: patched (now or before); 1: the file is neither Horovod 0.28.1's nor patched.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

MODULE = "horovod.runner.common.util.safe_shell_exec"

OLD = """\
    try:
        p.wait(timeout=GRACEFUL_TERMINATION_TIME_S)
    except psutil.TimeoutExpired:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
"""

NEW = """\
    # hvd_train's fix (scripts/patch_horovod.py): wait without reaping; the middleman's main
    # thread reaps the shell for its exit code (reaped here first, it would read 0).
    if not _exited_unreaped(pid, GRACEFUL_TERMINATION_TIME_S):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _exited_unreaped(pid, timeout):
    \"\"\"Whether the child `pid` exits within `timeout` s; it is left for its wait() to reap.\"\"\"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # reaped already
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
"""


def main() -> int:
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        print(f"patch_horovod: {MODULE} is not installed", file=sys.stderr)
        return 1
    path = pathlib.Path(spec.origin)
    text = path.read_text()
    if NEW in text:
        return 0
    if text.count(OLD) != 1:
        print(f"patch_horovod: {path} is not Horovod 0.28.1's: not patched", file=sys.stderr)
        return 1
    tmp = path.with_suffix(".py.hvd_train")
    tmp.write_text(text.replace(OLD, NEW))
    tmp.replace(path)  # whole or not at all
    print(f"patched {path}: horovodrun keeps a stopped worker's exit code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
