"""Throughput accounting and the speed knobs.

The timeline arithmetic is checked on hand-made events; the knobs on real jobs: one 2-worker job
turns on every knob that does not change the numbers and reports what each did in its worker;
gradient accumulation is checked by its effect (it trains exactly like the larger batch).
"""

from __future__ import annotations

import csv
import json
import os
import pathlib

import numpy as np
import pytest
from harness import KERASES, PYTHON, QUICKSTART, ROOT, WORKERS, check, horovodrun, run

from hvd_train.config import load_config
from hvd_train.runtime.keras.binding import has_keras3
from hvd_train.train.callbacks import perf

# --------------------------------------------------------------------------- timeline arithmetic


def test_covered_share_counts_overlaps_once_and_clips_to_windows() -> None:
    windows = [(10.0, 20.0), (30.0, 40.0)]  # 20 s measured
    intervals = [(9.0, 12.0), (11.0, 13.0), (15.0, 16.0), (19.0, 31.0), (50.0, 60.0)]
    # covered: 10-13 (3) + 15-16 (1) + 19-20 (1) + 30-31 (1) = 6 of 20
    assert perf.covered_share(intervals, windows) == pytest.approx(0.3)
    assert perf.covered_share([], windows) == 0.0
    assert perf.covered_share([(0.0, 100.0)], windows) == pytest.approx(1.0)


def _event(ph: str, ts: int, pid: int, name: str | None = None, **extra) -> dict:
    e = {"ph": ph, "ts": ts, "pid": pid, **extra}
    return {**e, "name": name} if name else e


HAND_MADE = [
    {"name": "process_name", "ph": "M", "pid": 0,
     "args": {"start_time_since_epoch_in_micros": 1_000_000_000}},
    _event("B", 100, 1, "NEGOTIATE_ALLREDUCE"), _event("E", 300, 1),
    _event("B", 300, 1, "ALLREDUCE"), _event("B", 310, 1, "GLOO_ALLREDUCE"),
    _event("E", 390, 1), _event("E", 400, 1, args={"dtype": "float16"}),
]  # fmt: skip


def test_activity_intervals_pair_nested_begin_and_end_in_unix_seconds() -> None:
    base = 1_000_000_000 / 1e6
    assert perf.activity_intervals(HAND_MADE, "ALLREDUCE") == [
        pytest.approx((base + 300e-6, base + 400e-6))
    ]
    assert perf.activity_intervals(HAND_MADE, "GLOO_ALLREDUCE") == [
        pytest.approx((base + 310e-6, base + 390e-6))
    ]


def test_read_timeline_reads_a_file_cut_mid_event(tmp_path: pathlib.Path) -> None:
    whole = json.dumps(HAND_MADE).replace("}, {", "},\n{")
    path = tmp_path / "timeline.json"
    path.write_text(whole[: whole.rfind('{"ph": "E", "ts": 400') + 10])  # a write cut short
    events = perf.read_timeline(str(path), wait_s=0.0)
    assert events == HAND_MADE[:-1]


def test_warmup_is_the_first_epoch_or_the_first_steps_of_a_single_one() -> None:
    load = load_config(QUICKSTART)
    from hvd_train.config import derive

    timer = perf.StepTimer(derive(load, 1, 1438))
    timer.steps = [[5.0, 1.0, 1.0], [1.0, 2.0]]
    timer.seconds, timer.windows = [7.0, 3.0], [(0.0, 7.0), (10.0, 13.0)]
    assert timer.measured() == ([1.0, 2.0], 3.0, [(10.0, 13.0)], "first epoch")
    timer.steps = [[9.0] * 5 + [1.0] * 10]
    timer.seconds, timer.windows = [55.0], [(100.0, 155.0)]
    steps, seconds, windows, left_out = timer.measured()
    assert (steps, seconds, left_out) == ([1.0] * 10, 10.0, "first 5 steps")
    assert windows == [(145.0, 155.0)]


# --------------------------------------------------------------------------- knobs, in process


@pytest.fixture
def float32_policy_after(each_keras):
    yield each_keras
    each_keras.set_precision("float32")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_computes_in_16_bits_with_float32_weights_and_output(
    policy: str, float32_policy_after
) -> None:
    import tensorflow as tf

    from hvd_train.runtime import tuning
    from hvd_train.train.models import build_model

    active = float32_policy_after
    keras = active.keras
    cfg = load_config(
        QUICKSTART, [f"runtime.mixed_precision={policy}", f"runtime.keras={active.NAME}"]
    )
    model = build_model(cfg, (8, 8, 1), 10)
    half = policy.removeprefix("mixed_")
    layers = [layer for layer in model.layers if layer.weights]
    assert [layer.compute_dtype for layer in layers[:-1]] == [half] * (len(layers) - 1)
    assert layers[-1].compute_dtype == "float32"  # the softmax and the loss stay in float32
    assert {tf.as_dtype(w.dtype) for w in model.weights} == {tf.float32}  # Keras 3: "float32"
    assert model(tf.zeros((2, 8, 8, 1))).dtype == tf.float32
    opt = tuning.distributed_optimizer(keras.optimizers.SGD(0.1), cfg)
    # loss scaling only where float16's range needs it
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer) == (half == "float16")
    if active.NAME == "tf_keras":  # Horovod's optimizer inside the loss scaler
        assert type(getattr(opt, "inner_optimizer", opt)).__module__ == "horovod._keras"
    else:  # the all-reduce outside it: every rank checks the same averaged gradients
        assert type(opt).__mro__[1].__name__ == "Averaging", type(opt).__mro__
        assert isinstance(getattr(opt, "inner_optimizer", opt), keras.optimizers.SGD)


# --------------------------------------------------------------------------- knobs, real jobs


def read_metrics(run_dir: pathlib.Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def trained_weights(run_dir: pathlib.Path) -> list[np.ndarray]:
    """The weights of the run's exported model.keras."""
    import tensorflow as tf

    return tf.keras.models.load_model(run_dir / "model.keras").get_weights()


def gradient_allreduces(run_dir: pathlib.Path) -> dict[str, list[str]]:
    """For each gradient tensor in rank 0's timeline: the dtype of each of its all-reduces."""
    events = perf.read_timeline(str(run_dir / "timeline.json"))
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and "name" in e.get("args", {})}  # fmt: skip
    stacks: dict[int, list[str]] = {}
    out: dict[str, list[str]] = {}
    for e in events:
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append(e["name"])
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            # the DistributedOptimizer's ops live under "Distributed<Optimizer>_Allreduce/"
            if stacks[e["pid"]].pop() == "ALLREDUCE" and "_Allreduce/" in names[e["pid"]]:
                out.setdefault(names[e["pid"]], []).append(e.get("args", {}).get("dtype"))
    return out


def expected_cores(local_rank: int, local_size: int) -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // local_size
    return (
        cores[local_rank * per : (local_rank + 1) * per]
        if per
        else [cores[local_rank % len(cores)]]
    )


def test_jit_compile_takes_the_whole_step_only_where_horovod_has_its_xla_ops(
    tmp_path, monkeypatch
) -> None:
    """runtime.jit_compile on a GPU whose Horovod has its XLA all-reduce (CUDA builds for
    TensorFlow 2.15 and 2.18), registered as its library loaded (HOROVOD_ENABLE_XLA_OPS=1): the
    whole train step; anywhere else (CPU, Horovod built for 2.19+ without xla_mpi_ops.cc, or a
    library loaded before the variable was set) XLA auto-clustering around the all-reduce,
    never a whole-step compile that would fail on the HorovodAllreduce op. (No GPU here: the
    choice is tested, the GPU compile is not.)"""
    from hvd_train.base import xla_env as xla

    assert [xla.whole_step_xla(gpu, ops) for gpu in (False, True) for ops in (False, True)] == [
        False, False, False, True,
    ]  # fmt: skip
    with_ops, without = tmp_path / "with.so", tmp_path / "without.so"
    with_ops.write_bytes(b"\0ELF...XLA_REGISTER CallbackHVDAllreduce\0...")
    without.write_bytes(b"\0ELF...HorovodAllreduce\0...")
    assert xla.horovod_has_xla_ops(with_ops) and not xla.horovod_has_xla_ops(without)
    assert not xla.horovod_has_xla_ops()  # this machine's CPU build has none
    monkeypatch.setattr(xla, "horovod_has_xla_ops", lambda lib=None: True)
    monkeypatch.delenv(xla.ENV, raising=False)
    assert not xla.whole_step(True, gpu=True)  # the library loaded without it: not registered
    monkeypatch.setenv(xla.ENV, "1")
    assert xla.whole_step(True, gpu=True)
    assert not xla.whole_step(False, gpu=True) and not xla.whole_step(True, gpu=False)


@pytest.mark.processes
def test_xla_ops_are_enabled_before_horovods_library_loads(tmp_path) -> None:
    """A worker started as `hvd-train train` starts, with runtime.jit_compile on a host made to
    look like a GPU host whose Horovod has its XLA all-reduce, has HOROVOD_ENABLE_XLA_OPS=1 in
    its environment when horovod.tensorflow.mpi_ops (the import that loads Horovod's library,
    whose registrars read it) is imported, and trains. What XLA then does with the all-reduce
    needs a GPU and a CUDA build of Horovod: not run here."""
    proc = check(run([
        PYTHON, str(WORKERS / "xla_env_at_load.py"), "--config", str(QUICKSTART),
        "--set", "run.dir=out", "--set", "runtime.jit_compile=true", "--set", "train.epochs=1",
        "--set", "train.steps_per_epoch=1", "--set", "train.verbose=false",
        "--set", "logging.tensorboard=false", "--set", "model.name=mlp",
    ], cwd=tmp_path))  # fmt: skip
    assert "AT_LOAD ['1'] CODE 0" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.processes
@pytest.mark.parametrize("command", ["train", "data-bench"])
def test_xla_flags_are_set_before_tensorflow_is_imported(tmp_path, command) -> None:
    """With runtime.jit_compile on a CPU host, XLA auto-clustering's flag is in TF_XLA_FLAGS
    when a worker first imports TensorFlow, which may read XLA's flags then, once (it was set
    after the import)."""
    proc = check(run([
        PYTHON, str(WORKERS / "state_at_tf_import.py"), command, "--config",
        str(QUICKSTART), "--set", "run.dir=out", "--set", "runtime.jit_compile=true",
    ], cwd=tmp_path))  # fmt: skip
    at_import = [ln for ln in proc.stdout.splitlines() if ln.startswith("AT_IMPORT ")]
    assert at_import, proc.stdout + proc.stderr
    flags = json.loads(at_import[0].removeprefix("AT_IMPORT "))["TF_XLA_FLAGS"]
    assert "--tf_xla_cpu_global_jit" in (flags or ""), proc.stdout + proc.stderr


def _allreduce_ops(jit_compile: bool, monkeypatch) -> set[str]:
    """The Horovod ops in a Keras 3 train step traced as `fit` traces it (`tf.function` with
    the model's `jit_compile`), as one of 2 workers: traced only, neither compiled nor run."""
    import tensorflow as tf

    from hvd_train.runtime.keras import v3 as keras3

    # 2 workers, without Horovod's init: tracing asks only for the size
    monkeypatch.setattr(keras3.hvd_tf, "size", lambda: 2)
    monkeypatch.setattr(keras3.hvd_tf.global_process_set, "size", lambda: 2)
    keras = keras3.keras
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(5)(inputs)))
    model.compile(
        optimizer=keras3.DistributedOptimizer(keras.optimizers.SGD(0.1)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    keras3.build_for_training(model, (4,), 3)
    step = tf.function(model.train_step, jit_compile=model.jit_compile)
    specs = (tf.TensorSpec((2, 4), tf.float32), tf.TensorSpec((2,), tf.int64))
    graph = step.get_concrete_function(specs).graph.as_graph_def()
    ops = {n.op for n in graph.node}
    for f in graph.library.function:
        ops |= {n.op for n in f.node_def}
    return {op for op in ops if op.startswith("Horovod")}


@pytest.mark.skipif(not has_keras3(), reason="Keras 3 (TensorFlow 2.16+)")
def test_a_whole_step_xla_compile_all_reduces_tensor_by_tensor(monkeypatch) -> None:
    """Horovod's XLA kernel is for HorovodAllreduce alone: in a Keras 3 step compiled whole
    (jit_compile=True) the gradients are all-reduced one by one, with no
    HorovodGroupedAllreduce; without XLA, in one grouped all-reduce. (Traced on CPU; compiling
    and running it needs a GPU and Horovod's CUDA build: not run here.)"""
    assert _allreduce_ops(True, monkeypatch) == {"HorovodAllreduce"}
    assert _allreduce_ops(False, monkeypatch) == {"HorovodGroupedAllreduce"}


@pytest.mark.processes
@pytest.mark.stack  # runtime.jit_compile, mixed precision: on every stack
@pytest.mark.multiworker
def test_speed_knobs_are_applied_in_every_worker(tmp_path: pathlib.Path) -> None:
    epochs, steps = 2, 8
    # Keras 2 refuses mixed_float16 with accumulation (docs/faults.md#the-replicated-state):
    # on a stack whose Keras is Keras 2 (TensorFlow 2.15), one batch an update.
    accumulation = 2 if KERASES[0] == "keras" else 1
    proc = check(horovodrun(2, [
        PYTHON, str(WORKERS / "report_knobs.py"), str(QUICKSTART), "run.dir=out",
        f"train.epochs={epochs}", f"train.steps_per_epoch={steps}", "train.verbose=false",
        "runtime.mixed_precision=mixed_float16", "horovod.compression=fp16",
        f"train.gradient_accumulation_steps={accumulation}",
        "runtime.bind_cores=true", "runtime.jit_compile=true", "horovod.timeline=true",
        "logging.profile_steps=[3,4]", "logging.tensorboard=false",
        "model.name=mlp", "model.dense_units=[64]",  # float16 convolutions crawl on CPU
    ], cwd=tmp_path))  # fmt: skip
    reports = [json.loads(line.split("KNOBS ", 1)[1])
               for line in proc.stdout.splitlines() if "KNOBS " in line]  # fmt: skip
    assert sorted(r["rank"] for r in reports) == [0, 1], proc.stdout[-3000:]
    for r in reports:
        assert r["policy"] == "mixed_float16"
        assert [c for c, _ in r["layers"]] == ["float16"] * (len(r["layers"]) - 1) + ["float32"]
        assert {v for _, v in r["layers"]} == {"float32"} and r["output_dtype"] == "float32"
        # the loss scaler and the averaging in the order that keeps the ranks alike (Keras 3:
        # averaging outside, Keras 2: Horovod's optimizer inside; test_faults proves it)
        assert r["keras"] == KERASES[0]  # the default Keras of this stack
        assert r["loss_scale_optimizer"] and r["averaging_optimizer"]
        assert r["accumulation"] == accumulation
        cores = expected_cores(r["local_rank"], 2)
        assert r["thread_affinities"] == [cores], f"rank {r['rank']}: threads not all bound: {r}"
        assert r["horovod_thread_affinity"] == ",".join([str(cores[0])] * 2)
        assert r["intra_op_threads"] == len(cores)
        # one op at a time on a core of its own: a second thread would only time-slice it
        assert r["inter_op_threads"] == min(2, len(cores))
        assert r["jit"] == "autoclustering"
        assert r["horovod_cycle_time"] is None  # 2 workers: Horovod's default 1 ms
        assert r["weights_finite"] and r["final_loss"] == pytest.approx(r["final_loss"])  # not NaN
    run_dir = tmp_path / "out"
    # fp16 compression: every gradient went over the wire as float16; accumulation: once for
    # every 2 batches (Keras 3)
    grads = gradient_allreduces(run_dir)
    assert grads, "no gradient all-reduce in the timeline"
    for name, dtypes in grads.items():
        assert dtypes == ["float16"] * (epochs * steps // accumulation), name
    # the profiler traced the window on rank 0
    assert list((run_dir / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert "profiler: steps 3-4 traced" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["allreduce_time_share"] < 1
    assert 0 <= summary["negotiation_time_share"] <= 1
    assert summary["effective_batch_size"] == accumulation * summary["global_batch_size"]
    assert summary["train_examples_per_sec_per_worker"] * 2 == pytest.approx(
        summary["train_examples_per_sec"]
    )


def test_a_lone_worker_cycles_every_10_ms_unless_configured(monkeypatch) -> None:
    from hvd_train.config import HorovodConfig
    from hvd_train.runtime.distributed import cycle_time_ms

    for key in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "HOROVOD_ELASTIC"):
        monkeypatch.delenv(key, raising=False)
    assert cycle_time_ms(HorovodConfig()) == 10  # no launcher: one worker
    assert cycle_time_ms(HorovodConfig(cycle_time_ms=3)) == 3
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    assert cycle_time_ms(HorovodConfig()) == 10
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")  # may grow: Horovod's default
    assert cycle_time_ms(HorovodConfig()) is None
    monkeypatch.delenv("HOROVOD_ELASTIC")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    assert cycle_time_ms(HorovodConfig()) is None


LOCAL_SIZES = ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE")  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "launcher", "bound"),
    [
        (None, {"HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}, True),  # horovodrun
        (None, {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, True),
        (None, {"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1"}, False),  # alone here
        (None, {}, False),  # python -m hvd_train: no launcher
        (False, {"HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}, False),
        (True, {}, True),
    ],
)
def test_cpu_workers_sharing_a_host_bind_to_their_cores_unless_configured(
    monkeypatch, setting, launcher, bound
) -> None:
    from hvd_train.runtime import cores

    for key in LOCAL_SIZES:
        monkeypatch.delenv(key, raising=False)
    for key, value in launcher.items():
        monkeypatch.setenv(key, value)
    assert cores.wanted(setting) is bound  # no GPU on the machines that run this


FLOAT64_CONVNET = f"{WORKERS / 'float64_models.py'}:convnet7_float64"
FLOAT64_WEIGHTS_REL = 1e-9  # as in test_multiworker.py, which says why


@pytest.fixture(scope="module")
def accumulation_runs(tmp_path_factory) -> pathlib.Path:
    """One worker accumulating 2 batches of 32, and one worker taking batches of 64.

    The two add the same per-example gradients in another order (two sums of 32, added and
    halved, against one sum of 64): in float32 that differs in the last bits, and one ReLU
    input within such a difference of 0 makes the runs part (see
    test_two_workers_at_batch_b_train_like_one_worker_at_2b in test_multiworker.py). So, as
    there, convnet7 in float64 with one intra-op thread: each run repeats itself bit for bit,
    and the two differ only by float64 rounding. The all-reduce count with accumulation across
    two workers is checked in the knobs job.
    """
    root = tmp_path_factory.mktemp("accumulation")
    common = ["--config", str(QUICKSTART), "--set", "train.epochs=2",
              "--set", "optimizer.name=sgd", "--set", "optimizer.learning_rate=0.05",
              "--set", "optimizer.lr_scaling=none", "--set", "optimizer.warmup_epochs=0",
              "--set", "model.dropout=0", "--set", "logging.tensorboard=false",
              "--set", "train.verbose=false", "--set", f"model.factory={FLOAT64_CONVNET}",
              "--set", "runtime.intra_op_threads=1"]  # fmt: skip
    check(run([PYTHON, "-m", "hvd_train", *common, "--set", "run.dir=acc",
               "--set", "train.batch_size=32",
               "--set", "train.gradient_accumulation_steps=2"], root))  # fmt: skip
    check(run([PYTHON, "-m", "hvd_train", *common, "--set", "run.dir=big",
               "--set", "train.batch_size=64"], root))  # fmt: skip
    return root


@pytest.mark.processes
def test_accumulating_two_batches_trains_exactly_like_one_twice_as_large(
    accumulation_runs: pathlib.Path,
) -> None:
    """Equal weights up to float64 rounding (tolerance: FLOAT64_WEIGHTS_REL, argued in
    test_multiworker.py). The logged loss is Keras' float32 running mean: at most 2 x steps + 2
    roundings of 2^-24 in each run (44 steps of 32 here, 22 of 64 there)."""
    acc, big = read_metrics(accumulation_runs / "acc"), read_metrics(accumulation_runs / "big")
    assert len(acc) == len(big) == 2
    s = json.loads((accumulation_runs / "acc" / "summary.json").read_text())
    s_big = json.loads((accumulation_runs / "big" / "summary.json").read_text())
    assert (s["accumulation_steps"], s["global_batch_size"], s["effective_batch_size"]) == (
        2,
        32,
        64,
    )
    assert s["steps_per_epoch"] == 2 * s_big["steps_per_epoch"]
    for a, b in zip(
        trained_weights(accumulation_runs / "acc"),
        trained_weights(accumulation_runs / "big"),
        strict=True,
    ):
        assert np.abs(a - b).max() <= FLOAT64_WEIGHTS_REL * np.abs(b).max(), (b.shape, a - b)
    loss_rel = (2 * s["steps_per_epoch"] + 2 + 2 * s_big["steps_per_epoch"] + 2) * 2**-24
    for a, b in zip(acc, big, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=loss_rel), (acc, big)
        # metrics.csv prints val_loss to 6 digits (see test_multiworker.py)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=2e-5), (acc, big)
        assert a["val_accuracy"] == b["val_accuracy"]


@pytest.mark.processes
def test_step_time_and_per_worker_rate_are_recorded(accumulation_runs: pathlib.Path) -> None:
    for name in ("acc", "big"):
        run_dir = accumulation_runs / name
        rows = read_metrics(run_dir)
        s = json.loads((run_dir / "summary.json").read_text())
        for row in rows:
            assert row["step_time_ms"] > 0
            assert row["examples_per_sec_per_worker"] == pytest.approx(
                row["examples_per_sec"], rel=1e-3
            )  # one worker
        assert s["warmup_excluded"] == "first epoch"
        assert s["train_examples_per_sec_per_worker"] == s["train_examples_per_sec"] > 0
        medians = [r["step_time_ms"] for r in rows[1:]]  # the pooled median lies between them
        assert min(medians) * 0.9999 <= s["step_time_ms"] <= max(medians) * 1.0001
        assert s["allreduce_time_share"] is None  # no timeline asked for


@pytest.mark.processes
@pytest.mark.multiworker
def test_epoch_time_leaves_out_waiting_for_rank_0s_epoch_end(tmp_path: pathlib.Path) -> None:
    """Rank 0 ends each epoch slowly, after the collectives (tests/workers/slow_chief.py), as
    a slow checkpoint would; rank 1 must not count that wait as training time in the next
    epoch. Checked by order, not by clock: rank 1's epoch clock must not start while rank 0
    is still ending the previous epoch (a clock started then would run through rank 0's
    delay, and its first step's all-reduce would wait for rank 0 to start). The worker only
    reports what happened first, so a slow machine cannot make this fail."""
    proc = check(horovodrun(2, [
        PYTHON, str(WORKERS / "slow_chief.py"), str(QUICKSTART), "run.dir=out",
        "train.epochs=3", "train.steps_per_epoch=4", "train.verbose=false",
        "logging.tensorboard=false", "model.name=mlp", "model.dense_units=[32]",
    ], cwd=tmp_path))  # fmt: skip
    order = [line.split("ORDER ", 1)[1] for line in proc.stdout.splitlines() if "ORDER " in line]
    assert order == [
        f"epoch {n}: rank 1 started its clock after rank 0 ended the previous epoch" for n in (2, 3)
    ], proc.stdout[-3000:]
    rows = read_metrics(tmp_path / "out")
    assert [r["epoch"] for r in rows] == [1, 2, 3]


def test_resnet50_config_builds_the_model_of_horovods_synthetic_benchmark() -> None:
    import tensorflow as tf

    from hvd_train.train.models import build_model

    cfg = load_config(ROOT / "configs" / "resnet50_synthetic.yaml", ["data.image_size=[32,32]"])
    model = build_model(cfg, (32, 32, 3), cfg.data.num_classes)  # through model.factory
    reference = tf.keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3))
    assert model.count_params() == reference.count_params()
    assert model.output.dtype == tf.float32 and model.output.shape[-1] == 1000
