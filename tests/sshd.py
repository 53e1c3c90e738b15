"""Private ssh servers for the multi-node tests: no system sshd, no change to ~/.ssh.

Each server runs the Debian `sshd` binary with its own config, host key and authorized key in
a temporary folder, on a high port, optionally inside a network namespace (a second "host" with
its own address) or a mount namespace (a host whose files differ). Tests skip, saying why, only
when sshd cannot run here at all.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import time

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def unavailable() -> str | None:
    """Why private sshd servers cannot run here, or None when they can."""
    if not os.path.exists(SSHD):
        return "sshd not installed (apt-get install openssh-server; scripts/install.sh does)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "ssh client not installed (apt-get install openssh-client)"
    if os.geteuid() != 0:
        return "sshd needs root here (privilege separation folder /run/sshd)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_keys(folder: pathlib.Path) -> pathlib.Path:
    """A client key pair in `folder`; returns the private key (its .pub is authorized)."""
    key = folder / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


@contextlib.contextmanager
def sshd(folder: pathlib.Path, address: str, port: int, client_key: pathlib.Path,
         netns: str | None = None, wrap: tuple[str, ...] = ()):  # fmt: skip
    """Runs sshd on `address:port` for the key `client_key` until the block ends.

    Args:
        netns: network namespace to run it in (a second host with its own address).
        wrap: command words to start sshd under, e.g. `unshare --mount ... sh -c`.
    """
    prefix = in_netns(netns)
    folder.mkdir(parents=True, exist_ok=True)
    host_key = folder / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {host_key}\n"
        f"PidFile {folder}/sshd.pid\nAuthorizedKeysFile {client_key}.pub\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nLogLevel INFO\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation folder
    log = open(folder / "sshd.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*prefix, *wrap, SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        _wait_listening(proc, address, port, prefix, folder / "sshd.log")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def in_netns(netns: str | None) -> list[str]:
    """The command prefix that runs a program inside `netns` (nothing for the host's own)."""
    return ["ip", "netns", "exec", netns] if netns else []


def _wait_listening(proc, address: str, port: int, prefix, log: pathlib.Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {log.read_text()}")
        probe = [*prefix, "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"sshd did not listen on {address}:{port}: {log.read_text()}")


def ssh_ok(address: str, port: int, key: pathlib.Path, netns: str | None = None):
    """`ssh address true` with the options multi_node.sh uses."""
    return subprocess.run(
        [*in_netns(netns), "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", str(port),
         "-i", str(key), address, "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
