"""Loaded by pytest before any test module.

In this process `tf.keras` is what TensorFlow makes it (Keras 3 on 2.16+, Keras 2 on 2.15), as
in a worker under `runtime.keras: auto`; tests of one binding activate it (`each_keras`).

Also the suite's cost report: at the end of a run, per test file, its time, the processes and
the training jobs it started (start-up is what most of the suite's time pays for), and the CPU
seconds spent by the test process itself and by the processes it started and waited for (on a
busy 2-core machine the suite's time follows its CPU, not its waits).

And the tiers. A test that starts a Python process, hvd-train or a job, itself or through its
fixtures, is marked `processes` (on the test, its parameter, or the module's `pytestmark`);
`make test` runs every test, and the quick tier (`make test-quick`,
HVD_TRAIN_TEST_TIER=quick) leaves the `processes` tests out at collection: it is every test
that runs in this process alone. A test of the quick tier that starts such a process fails,
naming the command: its mark is missing.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import subprocess

import pytest
from harness import KERASES

from hvd_train.base import logs
from hvd_train.runtime.keras import binding

QUICK = os.environ.get("HVD_TRAIN_TEST_TIER") == "quick"

_cost = collections.defaultdict(
    lambda: {
        "tests": 0,
        "seconds": 0.0,
        "processes": 0,
        "jobs": 0,
        "cpu_self": 0.0,
        "cpu_children": 0.0,
    }
)
_started = {"processes": 0, "jobs": 0}  # by this process since its last test report
_misplaced: list[str] = []  # the quick tier's processes started since the last test report


def _cpu() -> dict[str, float]:
    """CPU seconds so far of this process, and of its children that have been waited for (a
    job's workers count once horovodrun, their parent, has been: its descendants' included)."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return {
        "cpu_self": own.ru_utime + own.ru_stime,
        "cpu_children": children.ru_utime + children.ru_stime,
    }


_cpu_at_last_report = _cpu()


def _cpu_since_last_report() -> dict[str, float]:
    """The CPU seconds spent since the previous call (the first: since the import)."""
    now = _cpu()
    spent = {k: now[k] - _cpu_at_last_report[k] for k in now}
    _cpu_at_last_report.update(now)
    return spent


_xdist = {"workers": 0}  # pytest-xdist's -n


def pytest_configure(config) -> None:
    _xdist["workers"] = getattr(config.option, "numprocesses", None) or 0
    if not _is_xdist_controller():  # where the tests run: TensorFlow imported as a command does
        logs.quiet_tensorflow()


def _is_xdist_controller() -> bool:
    """pytest-xdist's controlling process, which starts the workers (and runs no test)."""
    return bool(_xdist["workers"]) and not os.environ.get("PYTEST_XDIST_WORKER")


_popen_init = subprocess.Popen.__init__


def _words(args) -> list[str]:
    return [os.path.basename(str(a)) for a in ([args] if isinstance(args, (str, bytes)) else args)]


def _is_job(args) -> bool:
    """A training job: horovodrun, mpirun, `hvd_train launch` or a launch/ script."""
    words = _words(args)
    return any(w in ("horovodrun", "mpirun", "single_node.sh", "multi_node.sh") for w in words) or (
        "hvd_train" in words and "launch" in words
    )


def _is_heavy(args) -> bool:
    """A process that pays seconds of start-up: a job, Python, or hvd-train."""
    return _is_job(args) or any(w.startswith("python") or w == "hvd-train" for w in _words(args))


def _counting_popen_init(self, args, *rest, **kwargs):
    if QUICK and _is_heavy(args) and not _is_xdist_controller():
        said = (
            f"a test of the quick tier started a process ({' '.join(_words(args))[:200]}): "
            "mark the test (or its parameter, or its module) @pytest.mark.processes"
        )
        _misplaced.append(said)  # failed at its report too, were the test to catch this
        raise pytest.fail.Exception(said, pytrace=False)
    _started["processes"] += 1
    _started["jobs"] += _is_job(args)
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _counting_popen_init


def pytest_collection_modifyitems(config, items) -> None:
    """The quick tier: the tests not marked `processes`, the others deselected."""
    if not QUICK:
        return
    kept, left = [], []
    for item in items:
        (left if item.get_closest_marker("processes") else kept).append(item)
    config.hook.pytest_deselected(items=left)
    items[:] = kept


def pytest_collection_finish(session) -> None:
    """Processes started while collecting: a row of their own (not under pytest-xdist, whose
    workers each collect, and report only their tests)."""
    spent = _cpu_since_last_report()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _cost["(collection)"].update(_started)
        _cost["(collection)"].update(spent)
    _started.update(processes=0, jobs=0)
    _misplaced.clear()  # a collection error of its own


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each report carries the processes its phase started: under pytest-xdist the reports
    reach the controlling process, which prints the table, and the counts with them."""
    report = (yield).get_result()
    if _misplaced and not report.failed:
        report.outcome, report.longrepr = "failed", _misplaced[0]
    _misplaced.clear()
    report.user_properties.append(("started", dict(_started)))
    report.user_properties.append(("cpu", _cpu_since_last_report()))
    _started.update(processes=0, jobs=0)


_test_cpu = collections.Counter()  # nodeid: CPU seconds (this process's and its children's)


def pytest_runtest_logreport(report) -> None:
    cost = _cost[report.nodeid.split("::")[0]]
    cost["seconds"] += report.duration
    cost["tests"] += report.when == "call" or (report.when == "setup" and report.skipped)
    for name, value in report.user_properties:
        if name == "started":
            cost["processes"] += value["processes"]
            cost["jobs"] += value["jobs"]
        elif name == "cpu":
            cost["cpu_self"] += value["cpu_self"]
            cost["cpu_children"] += value["cpu_children"]
            _test_cpu[report.nodeid] += value["cpu_self"] + value["cpu_children"]


def pytest_terminal_summary(terminalreporter) -> None:
    rows = sorted(_cost.items(), key=lambda kv: -kv[1]["seconds"])
    if not rows:
        return
    w = terminalreporter
    w.section("time per test file (processes: all started; jobs: horovodrun, mpirun, launchers)")
    w.write_line("CPU seconds: the test process's own, and its children's once waited for")
    head = ("tests", "seconds", "processes", "jobs", "cpu_self", "cpu_children")
    w.write_line(f"{'file':40} {'tests':>5} {'seconds':>8} {'processes':>9} {'jobs':>5} "
                 f"{'cpu self':>8} {'cpu children':>12}")  # fmt: skip
    total = {k: sum(c[k] for _, c in rows) for k in head}
    for name, c in [*rows, ("total", total)]:
        w.write_line(f"{name:40} {c['tests']:5d} {c['seconds']:8.1f} {c['processes']:9d} "
                     f"{c['jobs']:5d} {c['cpu_self']:8.1f} {c['cpu_children']:12.1f}")  # fmt: skip
    w.section("the 15 tests that used the most CPU (setup and teardown included)")
    for nodeid, seconds in _test_cpu.most_common(15):
        w.write_line(f"{seconds:8.1f} s  {nodeid}")
    # Every test's CPU seconds, as JSON, for the suite's record (lab/test-suite-time).
    if os.environ.get("HVD_TRAIN_TEST_CPU_FILE"):
        with open(os.environ["HVD_TRAIN_TEST_CPU_FILE"], "w") as f:
            json.dump(dict(_test_cpu.most_common()), f, indent=1)


@pytest.fixture(params=KERASES)
def each_keras(request):
    """The test once per Keras binding of this stack, with that binding active."""
    with binding.activated(request.param) as active:
        yield active
