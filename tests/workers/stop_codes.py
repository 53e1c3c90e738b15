"""Stops a worker through Horovod's launcher code N times; prints the exit codes it reported.

    python stop_codes.py N

Each time, horovodrun's `safe_shell_exec.execute` runs `env ... python THIS --worker` (the
command horovodrun builds for a local worker) and is told to stop it after the worker is up;
the worker traps SIGTERM, takes 0.3 s to "write its stop checkpoint", and exits 143, as
hvd_train's workers do. Prints one line: the exit codes as JSON, in order.
"""

import json
import signal
import sys
import threading
import time


def worker() -> None:
    def stop(signum, frame):
        time.sleep(0.3)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    print("up", flush=True)
    time.sleep(120)
    sys.exit(0)  # never stopped: the test sees 0 and fails


class UpThenStop:
    """The worker's stdout: sets `stop` at its first line (the worker has its handler)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def write(self, text: str) -> None:
        if "up" in text:
            self.stop.set()

    def flush(self) -> None:
        pass


def main(n: int) -> None:
    from horovod.runner.common.util import safe_shell_exec

    codes = []
    for _ in range(n):
        stop = threading.Event()
        command = f"env STOP_CODES=1 {sys.executable} {__file__} --worker"
        codes.append(safe_shell_exec.execute(command, stdout=UpThenStop(stop), events=[stop]))
    print(json.dumps(codes))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker()
    else:
        main(int(sys.argv[1]))
