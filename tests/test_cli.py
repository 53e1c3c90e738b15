"""The command line is discoverable: `hvd-train --help` lists every command with one line and
every docs page, and every command has its own `--help`, which names its docs page."""

from __future__ import annotations

import re
import subprocess

import pytest
from harness import PYTHON, ROOT, run

from hvd_train.cli import COMMANDS, main

# Every command the product ships; a command added to COMMANDS belongs here too.
SHIPPED = ["train", "evaluate", "predict", "export", "config", "launch", "doctor", "convert-tfrecord", "data-bench", "lr-plot",
           "compare", "sweep", "plan"]  # fmt: skip


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_lists_every_command_with_its_one_line(flag, capsys) -> None:
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hvd-train --config FILE [--set KEY=VALUE ...]\n")
    assert "`hvd-train --config FILE` is `hvd-train train --config FILE`" in out
    listed = [line.split()[0] for line in out.split("commands:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == list(COMMANDS) and sorted(listed) == sorted(SHIPPED)
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name} " in out and summary in out and "\n" not in summary


@pytest.mark.parametrize("name", SHIPPED)
def test_each_command_has_its_own_help(name, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hvd-train {name} ")
    description = out.split("\n\n")[1]  # argparse: usage, description, arguments
    assert description.strip() and not description.startswith(("options:", "positional"))


@pytest.mark.parametrize("name", SHIPPED)
def test_each_command_s_help_names_its_docs_page(name, capsys) -> None:
    """Each command's `--help` ends with the docs page that explains it, a page that exists."""
    with pytest.raises(SystemExit):
        main([name, "--help"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    pages = re.findall(r"docs/[\w-]+\.md", last)
    assert last.startswith("Docs: ") and pages, last
    assert all((ROOT / page).is_file() for page in pages), pages


def test_help_lists_every_docs_page(capsys) -> None:
    """`hvd-train --help` ends with the README and every page of docs/, each with its task."""
    assert main(["--help"]) == 0
    pages = capsys.readouterr().out.split("docs (in the repository):\n")[1].splitlines()
    listed = [line.split()[0] for line in pages]
    assert all(len(line.split()) > 1 for line in pages)
    on_disk = ["README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
    assert sorted(listed) == sorted(on_disk)


def test_help_command_shows_a_command_s_help(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["help", "lr-plot"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: hvd-train lr-plot ")


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        ([], "hvd-train: error: no config; train with --config FILE"),
        (["trian", "--config", "x.yaml"], "hvd-train: error: unknown command 'trian'"),
        (["help", "trian"], "hvd-train: error: unknown command 'trian'"),
    ],
)
def test_no_command_or_an_unknown_one_prints_the_usage_and_exits_2(argv, first_line, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == first_line
    assert "commands:\n  train " in err


def test_without_a_command_the_options_go_to_train(capsys) -> None:
    assert main(["--config", "/nonexistent/c.yaml"]) == 2  # train's config loader answered
    assert "/nonexistent/c.yaml" in capsys.readouterr().err


def run_cli(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`script` (which ends in `cli.run()`) in a Python process of its own, output captured
    (harness.run: its process group killed if it outlives `timeout`)."""
    return run([PYTHON, "-c", script, *args], ROOT, timeout)


@pytest.mark.processes
def test_a_command_exits_with_its_code_after_atexit_and_with_its_output_flushed(tmp_path) -> None:
    """cli.run ends every command with os._exit, skipping the interpreter's teardown (0.7 s of
    CPU in a trained worker, and a hang once after a failure): atexit's handlers (Horovod's
    shutdown, which finalizes MPI) must still run, buffered output must still reach the pipe,
    and the exit code is the command's, 0 or a failure's."""
    marker = tmp_path / "atexit-ran"
    script = (
        "import atexit, sys\n"
        "from hvd_train import cli\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "cli.main = lambda prog: print('buffered, not flushed', end='') or int(sys.argv[1])\n"
        "class Freed:\n"
        "    def __del__(self): sys.stderr.write('interpreter teardown')\n"
        "kept = Freed()\n"
        "cli.run()\n"
    )
    for code in (0, 3):
        marker.unlink(missing_ok=True)
        proc = run_cli(script, str(code), timeout=60)
        assert (proc.returncode, proc.stdout) == (code, "buffered, not flushed"), proc.stderr
        assert marker.read_text() == "ran"
        assert "interpreter teardown" not in proc.stderr, proc.stderr


@pytest.mark.processes
def test_a_failure_exits_with_its_code_past_a_teardown_that_would_hang() -> None:
    """A failure exits through atexit's handlers, not the interpreter's teardown: a thread
    that never ends (which the teardown waits for) holds nothing, and the exit code is the
    failure's own (2), not the watchdog's 1."""
    script = (
        "import threading, time\n"
        "from hvd_train import cli\n"
        "cli.EXIT_WATCHDOG_S = 30.0\n"
        "threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon\n"
        "cli.main = lambda prog: 2\n"
        "cli.run()\n"
    )
    proc = run_cli(script)
    assert proc.returncode == 2 and "Timeout" not in proc.stderr, proc.stderr


@pytest.mark.processes
def test_a_failed_process_whose_exit_hangs_ends_with_every_threads_traceback(tmp_path) -> None:
    """A failure exits through atexit's handlers; one that hangs there (here a handler that
    never returns) is ended by the watchdog: every thread's traceback on stderr, naming where
    it waited, and exit code 1, never a process that holds its job forever."""
    script = (
        "import atexit, sys, time\n"
        "from hvd_train import cli\n"
        "cli.EXIT_WATCHDOG_S = 1.0\n"
        "def stuck_at_exit(): time.sleep(3600)\n"
        "atexit.register(stuck_at_exit)\n"
        "cli.main = lambda prog: 2\n"
        "cli.run()\n"
    )
    proc = run_cli(script)
    assert proc.returncode == 1, proc.stderr
    assert "Timeout (0:00:01)!" in proc.stderr and "stuck_at_exit" in proc.stderr, proc.stderr
