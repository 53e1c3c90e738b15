"""A real MLflow tracking server for the tests: `mlflow server` on 127.0.0.1, on a free port,
with its SQLite store and its artifacts in a test's folder; no traffic leaves the machine.

The server is full `mlflow`, in a virtualenv of its own that the install links as
`<virtualenv>/mlflow-server` (`HVD_TRAIN_MLFLOW=server make install`; `make test` does): its
pandas, pyarrow and Flask stay out of the training's virtualenv, which holds the client alone
(the extra hvd_train[mlflow]). Tests skip, saying why, where either is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

from sshd import free_port

SERVER = pathlib.Path(sys.prefix) / "mlflow-server" / "bin" / "mlflow"
# MLflow's usage reports stay off, in the server as in every hvd_train process; and requests to
# the server go straight to it, past any proxy the environment names.
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
         "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}  # fmt: skip


def unavailable(server: bool = True) -> str | None:
    """Why the MLflow tests (those of the client alone: `server=False`) cannot run here, or
    None when they can."""
    if importlib.util.find_spec("mlflow") is None:
        return "MLflow's client is not installed: HVD_TRAIN_MLFLOW=1 make install"
    if server and not SERVER.exists():
        return f"no tracking server at {SERVER}: HVD_TRAIN_MLFLOW=server make install"
    return None


class Server:
    """`mlflow server` on 127.0.0.1:`port`, keeping its runs in `folder` (mlflow.db, and the
    artifacts it is sent); `start` and `kill` as often as a test needs, on the same port and
    store."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> None:
        """Starts it and waits for its /health to answer."""
        self.folder.mkdir(parents=True, exist_ok=True)
        cmd = [str(SERVER), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.db",
               "--artifacts-destination", str(self.folder / "artifacts")]  # fmt: skip
        log = open(self.folder / "server.log", "a")  # noqa: SIM115 - the server's, for failures
        # No job runner beside it (MLflow 3's huey consumer, for its GenAI jobs): one process.
        env = {**os.environ, **QUIET, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"mlflow server did not start:\n{self.log()[-4000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL to the server and its workers (its process group), at once."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")

    def _healthy(self) -> bool:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with direct.open(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


@contextlib.contextmanager
def server(folder: pathlib.Path):
    """A started Server, killed when the block ends, however it ends."""
    s = Server(folder)
    try:
        s.start()
        yield s
    finally:
        s.kill()
