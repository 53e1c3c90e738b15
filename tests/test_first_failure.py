"""Which rank failed first, and the verdict line about it: `launch.first_failure` and
`launch.describe`, on what horovodrun (Gloo) and mpirun (MPI) really print.

Each output below was printed by a real `horovodrun -np 2 -H localhost:2 --gloo` or `--mpi` job
(Horovod 0.28.1, Open MPI 4.1) whose workers said what a failing hvd_train rank says (its one
`[rank N] failed: ...` line) and then exited, raised or were killed as the case says; TensorFlow's
start-up lines and the frames of horovodrun's traceback are cut.
"""

from __future__ import annotations

import pytest

from hvd_train.launcher.launch import describe, first_failure

GLOO_TRACEBACK = """\
Traceback (most recent call last):
  File "/work/main/.venv/bin/horovodrun", line 8, in <module>
    sys.exit(run_commandline())
  File "/work/main/.venv/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 284, in launch_gloo
    raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first process to do so was:
Process name: {rank}
Exit code: {code}
"""
# The same ending as Horovod is built with (patches/horovod-0.28.1/0005): one line.
GLOO_ENDING = (
    "horovodrun: process {rank} exited first, with code {code}{how}, and ended the job; its "
    "output is above, and in <run.dir>/logs/rank-{rank}.log for hvd_train\n"
)
MPI_ABORTED = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
"""
MPI_FIRST = """\
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[{job},1],{rank}]
  Exit code:    {code}
--------------------------------------------------------------------------
"""
GLOO_STARTED = """\
[0]<stdout>:[hvd_train] rank 0 started
[1]<stdout>:[hvd_train] rank 1 started
"""
NAN = "TrainingError: loss became NaN or infinite at epoch 2, step 9"
FEW = "DataError: data.train_examples: 40 examples are fewer than one global batch"
KNOCK_ON = "another worker ended first; this rank then saw HorovodInternalError: {}"

OUTPUTS = {
    # Rank 1 killed by SIGKILL: Gloo names it first (137 = 128 + 9), then ends rank 0.
    "gloo-killed": GLOO_STARTED + """\
[1]<stderr>:Killed
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:Terminated
Process 0 exit with status code 143.
""" + GLOO_TRACEBACK.format(rank=1, code=137),
    # The same with rank 0's knock-on line added (and its exit code 1), as a real rank 0 in a
    # training step says it (tests/test_failure_console.py): a killed rank still wins.
    "gloo-killed-with-knock-on": GLOO_STARTED + """\
[1]<stderr>:Killed
[0]<stderr>:[rank 0] failed: another worker ended first; this rank then saw HorovodInternalError: Horovod has been shut down; full log: /tmp/run/logs/rank-0.log
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 1.
""" + GLOO_TRACEBACK.format(rank=1, code=137),
    # The same as horovodrun ends it once patched.
    "gloo-killed-patched": GLOO_STARTED + """\
[1]<stderr>:Killed
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:Terminated
Process 0 exit with status code 143.
""" + GLOO_ENDING.format(rank=1, code=137, how=" (killed by SIGKILL)"),
    # A user error on rank 1 (exit code 2): its own line, and it exited first.
    "gloo-user-error": GLOO_STARTED + """\
[1]<stderr>:[rank 1] failed: DataError: data.train_examples: 40 examples are fewer than one global batch; full log: /tmp/run/logs/rank-1.log
Process 1 exit with status code 2.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:Terminated
Process 0 exit with status code 143.
""" + GLOO_TRACEBACK.format(rank=1, code=2),
    # Rank 1 said its error first, but rank 0 (a knock-on) exited first and Gloo ended rank 1
    # with SIGTERM (143): rank 1's own line wins, with the first exit's code.
    "gloo-cause-exits-last": GLOO_STARTED + """\
[1]<stderr>:[rank 1] failed: TrainingError: loss became NaN or infinite at epoch 2, step 9; full log: /tmp/run/logs/rank-1.log
[0]<stderr>:[rank 0] failed: another worker ended first; this rank then saw HorovodInternalError: Connection reset by peer; full log: /tmp/run/logs/rank-0.log
Process 0 exit with status code 1.
Terminating remaining workers after failure of Process 0.
[1]<stderr>:Terminated
Process 1 exit with status code 143.
""" + GLOO_TRACEBACK.format(rank=0, code=1),
    # The workers never started: no rank said anything of its own.
    "gloo-no-such-program": """\
[1]<stderr>:env: ‘/nonexistent/python’: No such file or directory
[0]<stderr>:env: ‘/nonexistent/python’: No such file or directory
Process 1 exit with status code 127.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 127.
""" + GLOO_TRACEBACK.format(rank=1, code=127),
    # horovodrun refused the job before starting any worker.
    "horovodrun-refused": """\
Traceback (most recent call last):
  File "/work/main/.venv/bin/horovodrun", line 8, in <module>
    sys.exit(run_commandline())
ValueError: Requested more processes (2) than there are available slots (1)
""",
    # Under MPI a killed rank has no exit code in mpirun's report, only its signal.
    "mpi-killed": """\
[1,0]<stdout>:[hvd_train] rank 0 started[1,0]<stdout>:
[1,1]<stdout>:[hvd_train] rank 1 started
""" + MPI_ABORTED + """\
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------
""",
    # Open MPI's --tag-output may leave a tag after the line's end: the log's path absorbs it.
    "mpi-user-error": """\
[1,0]<stdout>:[hvd_train] rank 0 started
[1,1]<stdout>:[hvd_train] rank 1 started[1,1]<stdout>:
[1,1]<stderr>:[rank 1] failed: DataError: data.train_examples: 40 examples are fewer than one global batch; full log: /tmp/run/logs/rank-1.log[1,1]<stderr>:
""" + MPI_ABORTED + MPI_FIRST.format(job=20736, rank=1, code=2),
    "mpi-cause-exits-last": """\
[1,1]<stdout>:[hvd_train] rank 1 started
[1,0]<stdout>:[hvd_train] rank 0 started
[1,1]<stderr>:[rank 1] failed: TrainingError: loss became NaN or infinite at epoch 2, step 9; full log: /tmp/run/logs/rank-1.log
[1,0]<stderr>:[rank 0] failed: another worker ended first; this rank then saw HorovodInternalError: Connection reset by peer; full log: /tmp/run/logs/rank-0.log
""" + MPI_ABORTED + MPI_FIRST.format(job=21172, rank=0, code=1),
}  # fmt: skip

KILLED = "rank 1 failed first (exit code 137, killed by SIGKILL)"
# output name -> (rank, rank_exit_code, error): first_failure's answer; then horovodrun's exit
# code and describe's line.
CASES = {
    "gloo-killed": (1, 137, None, 1, KILLED),
    "gloo-killed-with-knock-on": (1, 137, None, 1, KILLED),
    "gloo-killed-patched": (1, 137, None, 137, KILLED),
    "gloo-user-error": (1, 2, FEW, 1, f"rank 1 failed first: {FEW}"),
    "gloo-cause-exits-last": (1, 1, NAN, 1, f"rank 1 failed first: {NAN}"),
    "gloo-no-such-program": (1, 127, None, 1, "rank 1 failed first (exit code 127)"),
    "horovodrun-refused": (None, None, None, 1, "horovodrun exited with code 1 (no rank reported)"),
    "mpi-killed": (1, 137, None, 137, KILLED),
    "mpi-user-error": (1, 2, FEW, 2, f"rank 1 failed first: {FEW}"),
    "mpi-cause-exits-last": (1, 1, NAN, 1, f"rank 1 failed first: {NAN}"),
}


@pytest.mark.parametrize("name", CASES)
def test_first_failure_names_the_rank_whose_own_error_came_first(name: str) -> None:
    rank, code, error, _, _ = CASES[name]
    assert first_failure(OUTPUTS[name]) == {"rank": rank, "rank_exit_code": code, "error": error}


@pytest.mark.parametrize("name", CASES)
def test_describe_says_it_in_one_line(name: str) -> None:
    *_, exit_code, line = CASES[name]
    assert describe({**first_failure(OUTPUTS[name]), "exit_code": exit_code}) == line


@pytest.mark.parametrize(
    ("failure", "host", "line"),
    [
        ({"rank": 3, "rank_exit_code": 1, "error": NAN}, "node-b",
         f"rank 3 on node-b failed first: {NAN}"),
        # Its own report wins over the SIGTERM that ended it.
        ({"rank": 0, "rank_exit_code": 143, "error": FEW}, None, f"rank 0 failed first: {FEW}"),
        ({"rank": 1, "rank_exit_code": 143, "error": None}, "localhost",
         "rank 1 on localhost failed first (exit code 143, killed by SIGTERM)"),
        # Python's subprocess gives a signal as a negative code.
        ({"rank": 1, "rank_exit_code": -9, "error": None}, None,
         "rank 1 failed first (exit code -9, killed by SIGKILL)"),
        ({"rank": 0, "rank_exit_code": 1, "error": None}, None, "rank 0 failed first (exit code 1)"),
        # Above 128 but no signal's number: only the code.
        ({"rank": 0, "rank_exit_code": 255, "error": None}, None,
         "rank 0 failed first (exit code 255)"),
        ({"rank": None, "rank_exit_code": None, "error": None, "exit_code": 143}, "localhost",
         "horovodrun exited with code 143 (no rank reported)"),
    ],
)  # fmt: skip
def test_describe_names_the_host_and_the_signal(failure: dict, host: str | None, line: str) -> None:
    assert describe(failure, host) == line


def test_a_knock_on_line_alone_never_names_its_rank() -> None:
    # Only rank 0's knock-on line, and no report of who exited first (the launcher was
    # stopped before horovodrun's own report): nobody is named.
    output = f"[0]<stderr>:[rank 0] failed: {KNOCK_ON.format('Horovod has been shut down')}\n"
    assert first_failure(output) == {"rank": None, "rank_exit_code": None, "error": None}
