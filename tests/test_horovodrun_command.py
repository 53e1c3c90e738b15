"""What `hvd-train launch` hands horovodrun: the discovery script as one checked, quoted word.

The config's `elastic.discovery_script` reaches a shell: horovodrun runs it with Horovod's
`safe_shell_exec` (`Popen(command, shell=True)`). These tests run the value through that very
code, with shell syntax planted in the value and in the folder around it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

from hvd_train.config import load_config
from hvd_train.errors import ConfigError
from hvd_train.launch import horovodrun_command

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ARGS = argparse.Namespace(config="c.yaml", hosts=None, controller=None)


def elastic(script: str):
    return load_config(QUICKSTART, ["elastic.enabled=true", f"elastic.discovery_script={script}"])


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def write_script(path: pathlib.Path, text: str = "echo localhost:2\n") -> pathlib.Path:
    path.write_text(f"#!/bin/sh\n{text}")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "tail",
    ["; touch {m}", " && touch {m}", " | tee {m}", "$(touch {m})", "`touch {m}`", "\ntouch {m}",
     " {m}", "'; touch {m}; '"],
    ids=["semicolon", "and", "pipe", "dollar-paren", "backquote", "newline", "argument", "quote"],
)  # fmt: skip
def test_discovery_script_with_shell_syntax_fails_at_load_and_runs_nothing(tmp_path, tail) -> None:
    script = write_script(tmp_path / "discover.sh")
    marker = tmp_path / "pwned"
    item = f"elastic.discovery_script={script}{tail.format(m=marker)}"
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_train", "launch", "--config", str(QUICKSTART),
         "--set", "elastic.enabled=true", "--set", item],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()  # one line: the override (shortened), the key, what is expected
    assert line.startswith("hvd_train: error: --set elastic.discovery_script="), line
    assert "\n" not in line and "horovodrun" not in proc.stdout + proc.stderr
    assert (
        ": elastic.discovery_script: expected the path of one executable (no spaces, arguments "
        "or shell syntax: put those inside the script), got "
    ) in line
    assert not marker.exists()


def test_discovery_script_reaches_horovods_shell_as_one_word(tmp_path, monkeypatch) -> None:
    # A relative script in a folder whose name is shell syntax: the absolute path horovodrun
    # gets holds it, and Horovod's own discovery (the shell included) must still read it as a
    # file name.
    folder = tmp_path / "runs; touch pwned; $(touch pwned2) `touch pwned3` 'x"
    folder.mkdir()
    write_script(folder / "discover.sh", "echo localhost:2\necho 127.0.0.1:1\n")
    monkeypatch.chdir(folder)
    cmd = horovodrun_command(elastic("discover.sh"), ARGS, 2, [])
    value = flag(cmd, "--host-discovery-script")
    from horovod.runner.elastic.discovery import HostDiscoveryScript

    found = HostDiscoveryScript(value, slots=1).find_available_hosts_and_slots()
    assert found == {"localhost": 2, "127.0.0.1": 1}
    assert not list(tmp_path.rglob("pwned*")), "the folder's name ran as a command"


def test_discovery_script_must_be_an_executable_file_on_the_launching_host(tmp_path) -> None:
    missing = tmp_path / "nope.sh"
    with pytest.raises(ConfigError) as info:
        horovodrun_command(elastic(str(missing)), ARGS, 2, [])
    assert str(info.value) == (
        f"elastic.discovery_script: {missing}: no such file on this host, which runs it for "
        "horovodrun"
    )
    plain = write_script(tmp_path / "plain.sh")
    plain.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        horovodrun_command(elastic(str(plain)), ARGS, 2, [])
    assert str(info.value) == f"elastic.discovery_script: {plain}: not executable; chmod +x it"


def test_workers_load_a_discovery_script_that_only_the_launcher_has() -> None:
    # On Kubernetes only the launcher pod has /etc/mpi/discover_hosts.sh; every worker loads
    # the same config, so the loader checks the form of the value, not the file.
    cfg = elastic("/nonexistent/etc/mpi/discover_hosts.sh")
    assert cfg.elastic.discovery_script == "/nonexistent/etc/mpi/discover_hosts.sh"
