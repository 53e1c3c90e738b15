"""Ten changes to Horovod 0.28.1, made by install.sh after Horovod is installed; each is
made once, and a second run changes nothing (a file an earlier version of a change patched is
brought up to date).

    python scripts/patch_horovod.py

1. horovodrun exited 0 after it was stopped (Ctrl-C, SIGTERM). It starts each worker through a
"middleman" process that runs `sh -c "env ... python ..."` and reports the shell's exit code.
When horovodrun is stopped, a second thread of the middleman terminates the shell and then
waits for it with psutil, which reaps it (the shell is its child). When that thread reaps
first, the main thread's `Popen.wait()` finds no child and subprocess reports exit code 0: the
worker's 143 is lost. With every rank lost that way, horovodrun exits 0, and a script that runs
it takes an interrupted run for a completed one. Measured here: 34 of 100 stopped workers came
back with exit code 0 (tests/workers/stop_codes.py, which tests/test_horovod_patch.py runs). The
fix waits without reaping (waitid with WNOWAIT), leaving the exit code to the main thread.

2. Every horovodrun job imported TensorFlow once before starting a worker: to check that Horovod
was built with Gloo (or MPI), it forks a process that imports `horovod.tensorflow`, a whole
TensorFlow import (3 s here) that every job, restart and sweep point paid, serially, before its
workers started. The answers are now kept in a file beside Horovod's code (written when the check
first runs: install.sh runs it with `horovodrun --check-build`), keyed by the size and time of
the extension's compiled library and the installed framework's version, so a rebuilt Horovod or
another TensorFlow checks again. `--verbose` (which prints the check) always checks.

3. Every job's first step built each gradient's all-reduce inside a `tf.cond` on "more than one
worker?", both branches, through autograph: 12 gradients of the quickstart's model cost 3.8 s
of its first step here. Outside Horovod Elastic that answer is a constant when the graph is
built (Horovod evaluated it in Python already), so the branch is now chosen in Python: the same
graph, less the branch never taken. Under Elastic the worker count can change after the trace,
and the tf.cond stays.

4. The all-reduce of the gradients and the broadcast of the variables are traced as
`tf.function`s, which autograph rewrites first in every process (0.7 s of the quickstart's
first step here). Their only branches and loops are on Python values, so the rewrite gives the
same graph: they are now traced without it. (hvd_train also tells autograph to leave the rest
of Horovod's code alone: hvd_train/runtime/distributed.py.)

5. A job whose worker failed ended with 15 lines of horovodrun's own Python traceback, after the
workers' own one-line errors. horovodrun now ends such a job in one line, with the same facts
(`horovodrun: process 1 exited first, with code 137 (killed by SIGKILL), and ended the job; ...`);
`--verbose` keeps the traceback, and any other error keeps it. It exits with that worker's exit
code, as horovodrun --mpi (mpirun) does: 2 for bad input, 128 + N for a worker ended by signal N
(143 after a Ctrl-C horovodrun passed on). Horovod exited 1 for any failed worker, so a script
could not tell bad input from a crash or a stop. (The first version of this change kept that 1;
a Horovod it patched is brought up to date.)

6. When a worker failed, horovodrun (Gloo) sent the others SIGTERM, just as after a Ctrl-C: rank 0
could not tell the two apart, and recorded a worker killed in the first epoch as a user's stop.
horovodrun now notes the first failure in its rendezvous server (which the workers already
talk to) before it sends SIGTERM; hvd_train's rank 0 asks for that note when a SIGTERM comes
(hvd_train/train/control.py) and records `failed`, naming the rank, instead of `interrupted`.

7. When horovodrun stopped a worker whose shell ended at that moment (reaped by the middleman's
main thread), the stopping thread's `p.children()` raised NoSuchProcess, and the start of its
traceback was printed as the job ended (`Exception in thread Thread-1 (fn): Traceback ...`),
under the one-line ending of 5: seen once in 700 tests, and in the second of the jobs
tests/test_horovod_patch.py runs, repeated beside 3 busy loops. The stopping thread now
returns when the shell is gone: there is nothing to stop.

8. horovodrun's rendezvous server (Gloo, Elastic included), an HTTP key-value store without
authentication where the workers publish their addresses, listened on all interfaces for the
job's life (`find_port` binds `('', port)`): whoever reached it could read and overwrite the
workers' addresses, on a one-host job too (docs/security.md). It now listens on the one address
its workers are given (HOROVOD_GLOO_RENDEZVOUS_ADDR, the address of the job's interface):
127.0.0.1 when every host is this machine, else the address of `--network-interfaces` or of
the interface horovodrun found. The workers only ever reach it there. Under Elastic, horovodrun
started it before it knew the hosts; it now starts once that address is known (nothing reaches
it before the workers start). And each Elastic worker's notification service, which listened
on all interfaces too, listens on the one address of its interface (HOROVOD_GLOO_IFACE), the
only one it tells horovodrun. Left on all interfaces: the services with which horovodrun
searches for a common interface when hosts on other machines name none (their purpose is to
find which interfaces reach each other; `hvd-train launch` says so in one line). Under MPI: 10.

9. horovodrun imported distutils at start (horovod/runner/js_run.py: `from distutils.spawn
import find_executable`, to ask whether IBM's jsrun is installed). distutils left the standard
library in Python 3.12; on 3.12 and 3.13 the import worked only through the copy setuptools
installs in its place, so a virtualenv without setuptools (Python 3.12's venv no longer brings
it), or SETUPTOOLS_USE_DISTUTILS=stdlib, had no horovodrun at all. The line now imports the
standard library's `shutil.which` under the same name, which answers the same question (is
there a jsrun on PATH?) on every Python 3; made on every Python, so that the install is the same
on all.

10. An Open MPI job on one host (`horovodrun --mpi -H localhost:2`) listened beyond loopback in
two places. The ranks opened Open MPI's TCP transport, on 0.0.0.0:1024+ and [::] whatever
btl_tcp_if_include says, and its libfabric one, on the host's address: when every host is
this machine (a name or address of its own, as horovodrun tells local hosts), horovodrun now
passes `-mca btl_base_include self,vader` (shared memory), as hvd_train's launchers do, unless
the transports were chosen already (a btl parameter in --mpi-args or OMPI_MCA_btl* set). And
mpirun's out-of-band listener binds INADDR_ANY and in6addr_any in Open MPI 4.1 whatever its
parameters say (create_listen in orte/mca/oob/tcp/oob_tcp_listener.c; `--mca oob ^tcp` stops
mpirun): for such a job horovodrun now starts mpirun with a small library first in its
LD_PRELOAD (scripts/loopback_bind.c, which this script compiles beside mpi_run.py), which in
mpirun alone turns a bind to every interface into one to 127.0.0.1 or ::1, and takes itself out
of LD_PRELOAD, so that the ranks never load it. On one host nothing else reaches mpirun: its
ranks talk to it through PMIx, on loopback. Without a C compiler the library is not built; the
install says so, and horovodrun, at each such job, in one line, and mpirun listens as before.
Jobs with a host elsewhere are unchanged.

Exit code 0: patched (now or before); 1: a file is neither Horovod 0.28.1's nor patched.

One change is made to Horovod's source before it is built, for TensorFlow 2.19 and later:

    python scripts/patch_horovod.py --without-xla-ops SOURCE_DIR

Horovod's CMake list always compiles horovod/tensorflow/xla_mpi_ops.cc, the one file that
includes TensorFlow's XLA headers; from TensorFlow 2.19 those include LLVM headers the wheel does
not ship, and 2.20 moved one of them. Nothing else needs it: without that line, Horovod 0.28.1
compiles against 2.19 to 2.21 and its own TensorFlow and Keras tests pass. What is lost: Horovod's
ops inside XLA-compiled functions (HOROVOD_ENABLE_XLA_OPS, off by default). hvd_train's
`runtime.jit_compile` compiles the model's step, not the all-reduce, and keeps working.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import py_compile
import shlex
import struct
import subprocess
import sys
from typing import NamedTuple


class Patch(NamedTuple):
    module: str
    old: str
    new: str
    what: str  # what the patched file now does, for install.sh's line
    earlier: tuple[str, ...] = ()  # what earlier versions of this change left: brought up to date


SHELL_GONE_OLD = """\
    # Terminate children gracefully.
    for child in p.children():
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass

    # Wait for graceful termination.
    gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)
"""

SHELL_GONE_NEW = """\
    # Terminate children gracefully. (hvd_train's fix, scripts/patch_horovod.py: the shell may
    # end, and be reaped by the middleman's main thread, at any moment; p.children() then
    # raises NoSuchProcess, and its traceback was printed as the job ended.)
    try:
        for child in p.children():
            try:
                child.terminate()
            except psutil.NoSuchProcess:
                pass

        # Wait for graceful termination.
        gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)
    except psutil.NoSuchProcess:
        return
"""

STOPPED_CODE_OLD = """\
    try:
        p.wait(timeout=GRACEFUL_TERMINATION_TIME_S)
    except psutil.TimeoutExpired:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
"""

STOPPED_CODE_NEW = """\
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


BUILT_CHECK_OLD = """\
def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    \"\"\"
    Tries to load the extension in a new process.  If successful, puts fn(ext)
    to the queue or False otherwise.  Mutes all stdout/stderr.
    \"\"\"
"""

BUILT_CHECK_NEW = """\
def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    \"\"\"hvd_train's change (scripts/patch_horovod.py): the answer kept from an earlier check of
    the same compiled extension and framework version; the check itself imports the framework
    (TensorFlow: seconds), which every horovodrun job paid before starting its workers.\"\"\"
    key = None if verbose else _built_check_key(ext_base_name, fn_desc)
    answers = _built_check_answers() if key else {}
    if key in answers:
        return answers[key]
    result = _check_extension_lambda_uncached(ext_base_name, fn, fn_desc, verbose)
    if key and result in (True, False):
        _keep_built_check_answer(key, result)
    return result


_BUILT_CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '.built_checks.json')
_FRAMEWORKS = {'tensorflow': ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu', 'tensorflow-intel'),
               'torch': ('torch',), 'mxnet': ('mxnet',)}


def _built_check_key(ext_base_name, fn_desc):
    \"\"\"What the answer depends on: the extension's compiled library (size, time) and the
    framework's installed version; None when either cannot be read (then no answer is kept).\"\"\"
    import glob
    from importlib import metadata
    libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         ext_base_name, 'mpi_lib*')))
    versions = []
    for name in _FRAMEWORKS.get(ext_base_name, ()):
        try:
            versions.append('%s==%s' % (name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            pass
    if not libs or not versions:
        return None
    stats = ['%s:%d:%d' % (os.path.basename(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in libs]
    return '|'.join([ext_base_name, fn_desc, sys.version.split()[0], *stats, *versions])


def _built_check_answers():
    try:
        with open(_BUILT_CHECKS) as f:
            answers = json.load(f)
        return answers if isinstance(answers, dict) else {}
    except (OSError, ValueError):
        return {}


def _keep_built_check_answer(key, result):
    \"\"\"Written whole (a rename); where Horovod's folder is read-only the check runs each time.\"\"\"
    answers = _built_check_answers()
    answers[key] = result
    tmp = '%s.%d' % (_BUILT_CHECKS, os.getpid())
    try:
        with open(tmp, 'w') as f:
            json.dump(answers, f, indent=1, sort_keys=True)
        os.replace(tmp, _BUILT_CHECKS)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass


def _check_extension_lambda_uncached(ext_base_name, fn, fn_desc, verbose):
    \"\"\"
    Tries to load the extension in a new process.  If successful, puts fn(ext)
    to the queue or False otherwise.  Mutes all stdout/stderr.
    \"\"\"
"""

ALLREDUCE_COND_OLD = """\
def _allreduce_cond(tensor, *args, process_set=global_process_set, **kwargs):
    def allreduce_fn():
        return allreduce(tensor, *args, process_set=process_set, **kwargs)

    def id_fn():
        return tensor

    with tf.device("cpu"):
        if int(os.environ.get("HOROVOD_ELASTIC", 0)):
            cond = tf.logical_and(
                tf.equal(process_set_included_op(process_set.process_set_id), 1),
                tf.greater(size_op(process_set.process_set_id), 1)
            )
        else:
            cond = tf.convert_to_tensor(process_set.included() and process_set.size() > 1)

    return tf.cond(cond, allreduce_fn, id_fn)


def _grouped_allreduce_cond(tensors, *args, process_set=global_process_set, **kwargs):
    def allreduce_fn():
        return grouped_allreduce(tensors, *args, process_set=process_set, **kwargs)

    def id_fn():
        return tensors

    with tf.device("cpu"):
        if int(os.environ.get("HOROVOD_ELASTIC", 0)):
            cond = tf.logical_and(
                tf.equal(process_set_included_op(process_set.process_set_id), 1),
                tf.greater(size_op(process_set.process_set_id), 1)
            )
        else:
            cond = tf.convert_to_tensor(process_set.included() and process_set.size() > 1)

    return tf.cond(cond, allreduce_fn, id_fn)
"""

ALLREDUCE_COND_NEW = """\
def _allreduce_cond(tensor, *args, process_set=global_process_set, **kwargs):
    def allreduce_fn():
        return allreduce(tensor, *args, process_set=process_set, **kwargs)

    def id_fn():
        return tensor

    return _static_or_cond(process_set, allreduce_fn, id_fn)


def _grouped_allreduce_cond(tensors, *args, process_set=global_process_set, **kwargs):
    def allreduce_fn():
        return grouped_allreduce(tensors, *args, process_set=process_set, **kwargs)

    def id_fn():
        return tensors

    return _static_or_cond(process_set, allreduce_fn, id_fn)


def _static_or_cond(process_set, allreduce_fn, id_fn):
    \"\"\"hvd_train's change (scripts/patch_horovod.py): outside Horovod Elastic the answer to
    "all-reduce?" is a constant when the graph is built, so the branch is chosen here; a tf.cond
    on it built both branches for every gradient (seconds of every job's first step). Under
    Elastic the number of workers can change after the trace, so the tf.cond stays.\"\"\"
    if not int(os.environ.get("HOROVOD_ELASTIC", 0)):
        return allreduce_fn() if process_set.included() and process_set.size() > 1 else id_fn()
    with tf.device("cpu"):
        cond = tf.logical_and(
            tf.equal(process_set_included_op(process_set.process_set_id), 1),
            tf.greater(size_op(process_set.process_set_id), 1)
        )

    return tf.cond(cond, allreduce_fn, id_fn)
"""

SUBGRAPH_OLD = """\
def _make_subgraph(f):
    return tf.function(f)
"""

SUBGRAPH_NEW = """\
def _make_subgraph(f):
    # hvd_train's change (scripts/patch_horovod.py): the functions made into subgraphs (the
    # gradients' all-reduce, the variables' broadcast) branch and loop on Python values only;
    # autograph would rewrite them in every process (0.7 s of the first step here) into the
    # same graph.
    return tf.function(f, autograph=False)
"""

ENDING_OLD = """\
def run_commandline():
    args = parse_args()

    if args.log_level:
        logging.addLevelName(logging.NOTSET, 'TRACE')
        logging.basicConfig(level=logging.getLevelName(args.log_level))

    _run(args)
"""

ENDING_NEW = """\
def run_commandline():
    args = parse_args()

    if args.log_level:
        logging.addLevelName(logging.NOTSET, 'TRACE')
        logging.basicConfig(level=logging.getLevelName(args.log_level))

    try:
        _run(args)
    except RuntimeError as e:
        # hvd_train's change (scripts/patch_horovod.py): a failed worker ends the job in one
        # line, not in a traceback of horovodrun's own code (--verbose keeps it), and with that
        # worker's exit code, as mpirun ends a job (2: bad input; 128 + N: ended by signal N).
        failed = _failed_job(str(e))
        if failed is None:
            raise
        line, code = failed
        if args.verbose:
            import traceback
            traceback.print_exc()
        else:
            print(line, file=sys.stderr, flush=True)
        sys.exit(code)


def _failed_job(message):
    \"\"\"(one line, exit code) for the RuntimeError that ends a job whose worker failed; None for
    another.\"\"\"
    import re
    import signal
    m = re.search(r'Process name: (\\S+)\\s+Exit code: (-?\\d+)', message)
    if m:
        code = int(m.group(2))
        signum = code - 128 if code > 128 else -code
        how = ''
        if signum > 0:
            try:
                how = ' (killed by %s)' % signal.Signals(signum).name
            except ValueError:
                pass
        return ('horovodrun: process %s exited first, with code %d%s, and ended the job; its '
                'output is above, and in <run.dir>/logs/rank-%s.log for hvd_train'
                % (m.group(1), code, how, m.group(1))), _exit_status(code)
    m = re.match(r'mpirun failed with exit code (-?\\d+)$', message)
    if m:
        return ('horovodrun: mpirun failed with exit code %s; its report and the output of '
                'the workers are above' % m.group(1)), _exit_status(int(m.group(1)))
    return None


def _exit_status(code):
    \"\"\"A worker's exit code as horovodrun's own: a signal's -N as 128 + N, as a shell reports
    it; 1 for a code no exit status holds.\"\"\"
    code = 128 - code if code < 0 else code
    return code if 0 < code < 256 else 1
"""

ENDING_V1 = """\
def run_commandline():
    args = parse_args()

    if args.log_level:
        logging.addLevelName(logging.NOTSET, 'TRACE')
        logging.basicConfig(level=logging.getLevelName(args.log_level))

    try:
        _run(args)
    except RuntimeError as e:
        # hvd_train's change (scripts/patch_horovod.py): a failed worker ends the job in one
        # line, not in a traceback of horovodrun's own code (--verbose keeps it).
        line = None if args.verbose else _failed_job_line(str(e))
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)


def _failed_job_line(message):
    \"\"\"One line for the RuntimeError that ends a job whose worker failed; None for another.\"\"\"
    import re
    import signal
    m = re.search(r'Process name: (\\S+)\\s+Exit code: (-?\\d+)', message)
    if m:
        code = int(m.group(2))
        signum = code - 128 if code > 128 else -code
        how = ''
        if signum > 0:
            try:
                how = ' (killed by %s)' % signal.Signals(signum).name
            except ValueError:
                pass
        return ('horovodrun: process %s exited first, with code %d%s, and ended the job; its '
                'output is above, and in <run.dir>/logs/rank-%s.log for hvd_train'
                % (m.group(1), code, how, m.group(1)))
    m = re.match(r'mpirun failed with exit code (-?\\d+)$', message)
    if m:
        return ('horovodrun: mpirun failed with exit code %s; its report and the output of '
                'the workers are above' % m.group(1))
    return None
"""

FIRST_FAILURE_OLD = """\
        if exit_code != 0 and terminate_all_event:
            if not any(ev.is_set() for ev in all_events):
                print('Terminating remaining workers after failure of Process {idx}.'.format(idx=index))
            terminate_all_event.set()
        return exit_code, time.time()

    return _exec_command
"""

FIRST_FAILURE_NEW = """\
        if exit_code != 0 and terminate_all_event:
            if not any(ev.is_set() for ev in all_events):
                print('Terminating remaining workers after failure of Process {idx}.'.format(idx=index))
                _note_first_failure(index, exit_code)
            terminate_all_event.set()
        return exit_code, time.time()

    return _exec_command


# hvd_train's change (scripts/patch_horovod.py): the rendezvous server of the running job, where
# the first failure is noted for the workers before they are sent SIGTERM (as after a Ctrl-C).
_RENDEZVOUS = []


def _note_first_failure(rank, exit_code):
    \"\"\"GET /hvd_train/first_failure on the rendezvous server: {"rank": R, "exit_code": C}.\"\"\"
    value = ('{"rank": %d, "exit_code": %d}' % (rank, exit_code)).encode()
    for rendezvous in _RENDEZVOUS:
        httpd = getattr(rendezvous, '_httpd', None)
        if httpd is not None:
            with httpd.cache_lock:
                httpd.cache.setdefault('hvd_train', {})['first_failure'] = value
"""

RENDEZVOUS_OLD = """\
    global_rendezv_port = rendezvous.start()
    rendezvous.init(host_alloc_plan)
    run_command = get_run_command(command, server_ip, nics, global_rendezv_port)
"""

RENDEZVOUS_NEW = """\
    global_rendezv_port = rendezvous.start()
    rendezvous.init(host_alloc_plan)
    _RENDEZVOUS[:] = [rendezvous]  # hvd_train's change: see _note_first_failure
    run_command = get_run_command(command, server_ip, nics, global_rendezv_port)
"""

# Change 8: what horovodrun and its workers listen on.
RENDEZVOUS_ADDRESS_OLD = """\
class RendezvousServer:
    def __init__(self, verbose=0):
        self._httpd = None
        self._listen_thread = None
        self._verbose = verbose

    # Rendezvous function finds a available port, create http socket,
    # and start listening loop to handle request
    # self.httpd.init needs to be called after server start
    def start(self, handler_cls=RendezvousHandler):
        self._httpd, port = find_port(
            lambda addr: RendezvousHTTPServer(
                addr, handler_cls, self._verbose))
"""

RENDEZVOUS_ADDRESS_NEW = """\
class RendezvousServer:
    def __init__(self, verbose=0, address=''):
        self._httpd = None
        self._listen_thread = None
        self._verbose = verbose
        # hvd_train's change (scripts/patch_horovod.py): the address it listens on, which
        # horovodrun sets to the one its workers are given (HOROVOD_GLOO_RENDEZVOUS_ADDR);
        # '' is every interface, as before, for any other caller.
        self.address = address

    # Rendezvous function finds a available port, create http socket,
    # and start listening loop to handle request
    # self.httpd.init needs to be called after server start
    def start(self, handler_cls=RendezvousHandler):
        self._httpd, port = find_port(
            lambda addr: RendezvousHTTPServer(
                (self.address, addr[1]), handler_cls, self._verbose))
"""

STATIC_RENDEZVOUS_OLD = """\
    # start global rendezvous server and get port that it is listening on
    rendezvous = RendezvousServer(settings.verbose)

    # allocate processes into slots
"""

STATIC_RENDEZVOUS_NEW = """\
    # start global rendezvous server and get port that it is listening on
    # (hvd_train's change, scripts/patch_horovod.py: on server_ip alone, the address the workers
    # are given; it listened on every interface)
    rendezvous = RendezvousServer(settings.verbose, address=server_ip)

    # allocate processes into slots
"""

ELASTIC_RENDEZVOUS_OLD = """\
    handler = create_rendezvous_handler(driver)
    global_rendezv_port = rendezvous.start(handler)
    driver.wait_for_available_slots(settings.num_proc)

    nics = get_common_interfaces(driver)
    server_ip = network.get_driver_ip(nics)
"""

ELASTIC_RENDEZVOUS_NEW = """\
    handler = create_rendezvous_handler(driver)
    driver.wait_for_available_slots(settings.num_proc)

    nics = get_common_interfaces(driver)
    server_ip = network.get_driver_ip(nics)
    # hvd_train's change (scripts/patch_horovod.py): the rendezvous server starts once the
    # address the workers are given is known, and listens there alone (it started before the
    # hosts were known, on every interface). Nothing reaches it before the workers start.
    rendezvous.address = server_ip
    global_rendezv_port = rendezvous.start(handler)
"""

SERVICE_ADDRESS_OLD = """\
        self._nics = nics
        self._server, _ = find_port(
            lambda addr: socketserver.ThreadingTCPServer(
                addr, self._make_handler()))
        self._server._block_on_close = True
        self._port = self._server.socket.getsockname()[1]
        self._addresses = self._get_local_addresses()
        self._thread = in_thread(target=self._server.serve_forever)
"""

SERVICE_ADDRESS_NEW = """\
        self._nics = nics
        host = self._listen_address()
        self._server, _ = find_port(
            lambda addr: socketserver.ThreadingTCPServer(
                (host, addr[1]), self._make_handler()))
        self._server._block_on_close = True
        self._port = self._server.socket.getsockname()[1]
        self._addresses = self._get_local_addresses()
        self._thread = in_thread(target=self._server.serve_forever)

    def _listen_address(self):
        \"\"\"Where the service listens: '' is every interface, as before. hvd_train's change
        (scripts/patch_horovod.py): a service may narrow it to _only_address().\"\"\"
        return ''

    def _only_address(self):
        \"\"\"The IPv4 address of the interfaces `nics` when they have exactly one (then the
        only address addresses() gives clients), else ''.\"\"\"
        found = {addr.address for intf, addrs in psutil.net_if_addrs().items()
                 if self._nics and intf in self._nics
                 for addr in addrs if addr.family == socket.AF_INET}
        return found.pop() if len(found) == 1 else ''
"""

WORKER_SERVICE_OLD = """\
    def __init__(self, key, nic, manager):
        super(WorkerNotificationService, self).__init__(WorkerNotificationService.NAME,
                                                        key,
                                                        nic)
        self._manager = manager
"""

WORKER_SERVICE_NEW = """\
    def __init__(self, key, nic, manager):
        super(WorkerNotificationService, self).__init__(WorkerNotificationService.NAME,
                                                        key,
                                                        nic)
        self._manager = manager

    def _listen_address(self):
        # hvd_train's change (scripts/patch_horovod.py): the one address of this worker's
        # interface (HOROVOD_GLOO_IFACE), the one horovodrun is told to reach it at; it
        # listened on every interface.
        return self._only_address()
"""

JS_RUN_OLD = """\
from distutils.spawn import find_executable
"""

JS_RUN_NEW = """\
# hvd_train's change (scripts/patch_horovod.py): distutils left the standard library in Python 3.12.
from shutil import which as find_executable
"""


# Change 10: an Open MPI job on one host listens on loopback alone.
MPI_TRANSPORTS_OLD = """\
    # On large cluster runs (e.g. Summit), we need extra settings to work around OpenMPI issues
    host_names, host_to_slots = hosts.parse_hosts_and_slots(settings.hosts)
"""

MPI_TRANSPORTS_NEW = """\
    # On large cluster runs (e.g. Summit), we need extra settings to work around OpenMPI issues
    host_names, host_to_slots = hosts.parse_hosts_and_slots(settings.hosts)
    # hvd_train's change (scripts/patch_horovod.py): an Open MPI job whose hosts are all this
    # machine listens on loopback alone. Its ranks talk through shared memory (Open MPI's TCP
    # transport listens on every interface whatever btl_tcp_if_include says, its libfabric one
    # on the host's address), unless the transports were chosen already; mpirun's own
    # listener: _on_loopback.
    on_this_host = mpi == _OMPI_IMPL and _all_on_this_host(host_names)
    if on_this_host and not _transports_chosen(settings.extra_mpi_args, env):
        mpi_impl_flags.append('-mca btl_base_include self,vader')
"""

MPI_LISTENER_OLD = """\
    # Execute the mpirun command.
    if settings.run_func_mode:
        exit_code = safe_shell_exec.execute(mpirun_command, env=env, stdout=stdout, stderr=stderr)
        if exit_code != 0:
            raise RuntimeError("mpirun failed with exit code {exit_code}".format(exit_code=exit_code))
    else:
        os.execve('/bin/sh', ['/bin/sh', '-c', mpirun_command], env)
"""

# Horovod's lines kept whole, after the one that starts mpirun with the library.
MPI_LISTENER_NEW = (
    """\
    if on_this_host:
        env = _on_loopback(env)  # hvd_train's change: mpirun's own listener

"""
    + MPI_LISTENER_OLD
    + """

# hvd_train's change (scripts/patch_horovod.py): built by the install from hvd_train's
# scripts/loopback_bind.c, where a C compiler is.
_LOOPBACK_BIND = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hvd_train_loopback_bind.so')


def _all_on_this_host(host_names):
    \"\"\"Whether every host is this machine: a name or address of one of its interfaces
    (localhost, 127.x, its own name), as horovodrun tells local hosts from remote ones.\"\"\"
    from horovod.runner.util.network import filter_local_addresses
    return bool(host_names) and not filter_local_addresses(host_names)


def _transports_chosen(extra_mpi_args, env):
    \"\"\"Whether Open MPI's transports were chosen already (a btl parameter in --mpi-args,
    or OMPI_MCA_btl* in the environment): the choice stays.\"\"\"
    import re
    return (re.search(r'\\bbtl', extra_mpi_args or '') is not None
            or any(key.startswith('OMPI_MCA_btl') for key in env or {}))


def _on_loopback(env):
    \"\"\"`env` with _LOOPBACK_BIND first in LD_PRELOAD: in mpirun it turns a bind to every
    interface into one to loopback (Open MPI 4.1's out-of-band listener binds INADDR_ANY and
    in6addr_any whatever its parameters say), and leaves LD_PRELOAD, so the ranks never load
    it. Without it, says so in one line, and mpirun listens as before.\"\"\"
    if not os.path.isfile(_LOOPBACK_BIND):
        print('horovodrun: mpirun listens on all interfaces, not on loopback alone: %s was not '
              'built (the install builds it with a C compiler; hvd_train: docs/security.md)'
              % _LOOPBACK_BIND, file=sys.stderr, flush=True)
        return env
    preload = env.get('LD_PRELOAD', '')
    return dict(env, LD_PRELOAD=_LOOPBACK_BIND + (':' + preload if preload else ''))
"""
)


PATCHES = [
    Patch(
        "horovod.runner.common.util.safe_shell_exec",
        STOPPED_CODE_OLD,
        STOPPED_CODE_NEW,
        "horovodrun keeps a stopped worker's exit code",
    ),
    Patch(
        "horovod.runner.common.util.safe_shell_exec",
        SHELL_GONE_OLD,
        SHELL_GONE_NEW,
        "horovodrun stops a worker without a traceback when its shell has just ended",
    ),
    Patch(
        "horovod.common.util",
        BUILT_CHECK_OLD,
        BUILT_CHECK_NEW,
        "horovodrun checks once, not at every job, that Horovod was built with Gloo and MPI",
    ),
    Patch(
        "horovod.tensorflow",
        ALLREDUCE_COND_OLD,
        ALLREDUCE_COND_NEW,
        "a gradient's all-reduce is built without a tf.cond outside Horovod Elastic",
    ),
    Patch(
        "horovod.tensorflow.util",
        SUBGRAPH_OLD,
        SUBGRAPH_NEW,
        "the all-reduce and broadcast subgraphs are traced without autograph",
    ),
    Patch(
        "horovod.runner.launch",
        ENDING_OLD,
        ENDING_NEW,
        "horovodrun ends a job whose worker failed in one line, not a traceback, and with that "
        "worker's exit code",
        (ENDING_V1,),
    ),
    Patch(
        "horovod.runner.gloo_run",
        FIRST_FAILURE_OLD,
        FIRST_FAILURE_NEW,
        "horovodrun (Gloo) notes the first failure for the workers before it stops them",
    ),
    Patch(
        "horovod.runner.gloo_run",
        RENDEZVOUS_OLD,
        RENDEZVOUS_NEW,
        "horovodrun (Gloo) keeps its rendezvous server for that note",
    ),
    Patch(
        "horovod.runner.http.http_server",
        RENDEZVOUS_ADDRESS_OLD,
        RENDEZVOUS_ADDRESS_NEW,
        "horovodrun's rendezvous server can listen on one address",
    ),
    Patch(
        "horovod.runner.gloo_run",
        STATIC_RENDEZVOUS_OLD,
        STATIC_RENDEZVOUS_NEW,
        "horovodrun (Gloo) listens on the address its workers are given, not on all",
    ),
    Patch(
        "horovod.runner.gloo_run",
        ELASTIC_RENDEZVOUS_OLD,
        ELASTIC_RENDEZVOUS_NEW,
        "horovodrun (Elastic) listens on the address its workers are given, not on all",
    ),
    Patch(
        "horovod.runner.common.util.network",
        SERVICE_ADDRESS_OLD,
        SERVICE_ADDRESS_NEW,
        "Horovod's services can listen on one address",
    ),
    Patch(
        "horovod.runner.elastic.worker",
        WORKER_SERVICE_OLD,
        WORKER_SERVICE_NEW,
        "an Elastic worker listens on its interface's address, not on all",
    ),
    Patch(
        "horovod.runner.js_run",
        JS_RUN_OLD,
        JS_RUN_NEW,
        "horovodrun starts without distutils (gone from Python 3.12's standard library)",
    ),
    Patch(
        "horovod.runner.mpi_run",
        MPI_TRANSPORTS_OLD,
        MPI_TRANSPORTS_NEW,
        "horovodrun --mpi on one host: the ranks talk through shared memory, not TCP",
    ),
    Patch(
        "horovod.runner.mpi_run",
        MPI_LISTENER_OLD,
        MPI_LISTENER_NEW,
        "horovodrun --mpi on one host: mpirun listens on loopback alone",
    ),
]

# Change 10's library, built into Horovod's runner folder beside mpi_run.py, which loads it.
LOOPBACK_BIND_SOURCE = pathlib.Path(__file__).with_name("loopback_bind.c")
LOOPBACK_BIND = "hvd_train_loopback_bind.so"
NOT_BUILT = (
    "not built {lib} ({why}): an Open MPI job on one host keeps mpirun's listener on all "
    "interfaces, and horovodrun says so at each such job (docs/security.md)"
)


XLA_OPS_OLD = """\
list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")
"""

XLA_OPS_NEW = """\
# hvd_train's change (scripts/patch_horovod.py --without-xla-ops): xla_mpi_ops.cc is not built;
# it includes TensorFlow's XLA headers, which TensorFlow 2.19+ wheels cannot compile.
"""

WITHOUT_XLA_OPS = Patch(
    "horovod/tensorflow/CMakeLists.txt",
    XLA_OPS_OLD,
    XLA_OPS_NEW,
    "Horovod is built without its XLA ops (xla_mpi_ops.cc)",
)


def apply(patch: Patch, path: pathlib.Path | None = None) -> int:
    """Patches one file (Horovod's `patch.module`, or `path`): 0 when it is patched (now or
    before; a file an earlier version of the change patched is brought up to date), 1 when it
    is not 0.28.1's."""
    installed = path is None  # not Horovod's source folder before its build
    path = path or _module_file(patch.module)
    if path is None or not path.is_file():
        print(f"patch_horovod: {path or patch.module} is not there", file=sys.stderr)
        return 1
    text = path.read_text()
    if patch.new in text:
        if installed:
            _compile(path)
        return 0
    found = [old for old in (patch.old, *patch.earlier) if text.count(old) == 1]
    if not found:
        print(f"patch_horovod: {path} is not Horovod 0.28.1's: not patched", file=sys.stderr)
        return 1
    tmp = path.with_name(path.name + ".hvd_train")
    tmp.write_text(text.replace(found[0], patch.new))
    tmp.replace(path)  # whole or not at all
    if installed:
        _compile(path)
    print(f"patched {path}: {patch.what}")
    return 0


def _compile(path: pathlib.Path) -> None:
    """Writes the patched file's bytecode where pip wrote the original's, when it is out of
    date: Python would otherwise compile the file again in every process that imports it, where
    it may not write bytecode (PYTHONDONTWRITEBYTECODE, a read-only install).

    Out of date as Python's import judges it: by the source's time and size (compileall looks
    at the time alone, and two changes to one file within a second keep it)."""
    stat = path.stat()
    cached = pathlib.Path(importlib.util.cache_from_source(str(path)))
    header = importlib.util.MAGIC_NUMBER + struct.pack(
        "<III", 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF
    )
    try:
        if cached.read_bytes()[:16] == header:
            return
    except OSError:
        pass  # none yet
    try:
        py_compile.compile(str(path), cfile=str(cached), doraise=True)
    except (OSError, py_compile.PyCompileError):
        pass  # not writable: Python compiles it at each import, as before


def _module_file(module: str) -> pathlib.Path | None:
    """The file of Horovod's `module`, found without importing it (importing horovod.tensorflow
    would import TensorFlow: seconds)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = pathlib.Path(spec.submodule_search_locations[0], *module.split(".")[1:])
    found = [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return found[0] if found else None


def build_loopback_bind(runner: pathlib.Path | None = None) -> int:
    """Compiles scripts/loopback_bind.c into Horovod's runner folder (or `runner`), beside a
    copy of its source: again only when that source changed. Without a C compiler (`CC`, else
    `cc`), or when it fails, says so in one line and builds nothing: horovodrun then keeps
    mpirun's listener where Open MPI puts it. 0, as the install goes on either way."""
    if runner is None:
        mpi_run = _module_file("horovod.runner.mpi_run")
        if mpi_run is None:
            print("patch_horovod: horovod.runner.mpi_run is not there", file=sys.stderr)
            return 1
        runner = mpi_run.parent
    lib, kept = runner / LOOPBACK_BIND, (runner / LOOPBACK_BIND).with_suffix(".c")
    source = LOOPBACK_BIND_SOURCE.read_text()
    if lib.is_file() and kept.is_file() and kept.read_text() == source:
        return 0
    tmp = lib.with_name(lib.name + ".hvd_train")
    cc = shlex.split(os.environ.get("CC") or "cc")
    try:
        proc = subprocess.run([*cc, "-shared", "-fPIC", "-O2", "-o", str(tmp),
                               str(LOOPBACK_BIND_SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        print(NOT_BUILT.format(lib=lib, why=f"no C compiler: {shlex.join(cc)}: {e}"))
        return 0
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        print(NOT_BUILT.format(lib=lib, why=f"{shlex.join(cc)} failed: {said}"))
        tmp.unlink(missing_ok=True)
        return 0
    tmp.replace(lib)  # whole or not at all
    kept.write_text(source)
    print(f"built {lib}: mpirun listens on loopback alone for a job on one host")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--without-xla-ops"] and len(argv) == 2:
        return apply(WITHOUT_XLA_OPS, pathlib.Path(argv[1], WITHOUT_XLA_OPS.module))
    if argv:
        print("usage: patch_horovod.py [--without-xla-ops SOURCE_DIR]", file=sys.stderr)
        return 2
    return max(max(apply(patch) for patch in PATCHES), build_loopback_bind())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
