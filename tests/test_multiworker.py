"""Real 2-worker jobs through horovodrun (Gloo, localhost): no mock of Horovod anywhere."""

from __future__ import annotations

import csv
import json
import pathlib
import re

import numpy as np
import pytest
import yaml
from harness import (
    BIN,
    BINDING_RUNS,
    PYTHON,
    QUICKSTART,
    ROOT,
    SERIES_VERSION,
    WORKERS,
    check,
    horovodrun,
    load_model,
    run,
)

from hvd_train.config import load_config
from hvd_train.data.sources import load_source
from hvd_train.runtime.keras import binding

pytestmark = [pytest.mark.multiworker, pytest.mark.processes]

README_VAL_ACCURACY = 0.95  # the quickstart accuracy the README promises


def read_metrics(run_dir: pathlib.Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """The shipped quickstart, unchanged, at 2 workers; each rank in a folder of its own."""
    root = tmp_path_factory.mktemp("quickstart")
    proc = check(horovodrun(2, [
        str(WORKERS / "in_rank_dir.sh"), PYTHON, str(WORKERS / "train_and_compare_weights.py"),
        str(QUICKSTART), "run.dir=out",
    ], cwd=root))  # fmt: skip
    return root, proc.stdout


@pytest.mark.stack
def test_all_ranks_end_with_identical_weights(quickstart) -> None:
    _, out = quickstart
    lines = re.findall(r"rank (\d): weights identical on 2 ranks: ([0-9a-f]+)", out)
    assert sorted(r for r, _ in lines) == ["0", "1"], out[-3000:]
    assert len({d for _, d in lines}) == 1


@pytest.mark.stack
def test_only_rank_zero_wrote_files(quickstart) -> None:
    root, _ = quickstart
    written = {p.name for p in (root / "rank0" / "out").iterdir()}
    assert {"config.yaml", "metrics.csv", "summary.json", "model.keras", "tensorboard",
            "checkpoints"} <= written  # fmt: skip
    # Every rank keeps its own output log (in run.dir on its own host); nothing else.
    rank1 = sorted(str(p.relative_to(root / "rank1")) for p in (root / "rank1").rglob("*"))
    assert rank1 == ["out", "out/logs", "out/logs/rank-1.log"], f"rank 1 wrote {rank1}"


@pytest.mark.stack
def test_loss_goes_down(quickstart) -> None:
    rows = read_metrics(quickstart[0] / "rank0" / "out")
    assert len(rows) == load_config(QUICKSTART).train.epochs
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], rows
    assert rows[-1]["val_loss"] < rows[0]["val_loss"], rows


@pytest.mark.stack
def test_summary_is_complete_and_consistent(quickstart) -> None:
    run_dir = quickstart[0] / "rank0" / "out"
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = load_config(QUICKSTART)
    assert summary["status"] == "completed"
    assert summary["world_size"] == 2
    assert summary["controller"] == "gloo"
    assert summary["per_worker_batch_size"] == cfg.train.batch_size
    assert summary["global_batch_size"] == summary["per_worker_batch_size"] * 2
    assert summary["epochs_completed"] == cfg.train.epochs
    assert summary["train_examples_per_sec"] > 0
    assert summary["wall_time_s"] > 0
    assert set(summary["versions"]) == {"python", "tensorflow", "keras", "horovod"}
    # The default Keras: Keras 3 on 2.16+ ("keras 3.15.1"), TensorFlow's own Keras 2 on 2.15.
    package, keras_version = summary["versions"]["keras"].split()
    tf_minor = summary["versions"]["tensorflow"].split(".")[:2]
    assert package == "keras", summary["versions"]
    expected = ["3"] if binding.has_keras3() else tf_minor
    assert keras_version.split(".")[: len(expected)] == expected, summary["versions"]
    assert summary["versions"]["horovod"] == SERIES_VERSION  # 0.28.1 and hvd_train's patches
    final = summary["final_metrics"]
    assert final["val_accuracy"] >= README_VAL_ACCURACY, final
    rows = read_metrics(run_dir)
    assert final["val_accuracy"] == pytest.approx(rows[-1]["val_accuracy"], abs=1e-5)
    # all workers' rate, the first (tracing) epoch left out
    steps, g = summary["steps_per_epoch"], summary["global_batch_size"]
    expected = (len(rows) - 1) * steps * g / sum(r["epoch_time_s"] for r in rows[1:])
    assert summary["train_examples_per_sec"] == pytest.approx(expected, rel=1e-3)


@pytest.mark.stack
def test_learning_rate_after_warmup_is_the_scaled_rate(quickstart) -> None:
    run_dir = quickstart[0] / "rank0" / "out"
    rows = read_metrics(run_dir)
    steps = json.loads((run_dir / "summary.json").read_text())["steps_per_epoch"]
    o = load_config(QUICKSTART).optimizer
    assert (o.lr_scaling, o.warmup_epochs) == ("linear", 2)
    # logged: the rate of the epoch's last step, index steps-1 of a 2-epoch linear ramp
    mid_ramp = o.learning_rate * (1 + (steps - 1) / (2 * steps))
    assert rows[0]["learning_rate"] == pytest.approx(mid_ramp, rel=1e-5)
    for row in rows[2:]:
        assert row["learning_rate"] == pytest.approx(o.learning_rate * 2, rel=1e-5)


def test_resolved_config_is_written(quickstart) -> None:
    written = quickstart[0] / "rank0" / "out" / "config.yaml"
    assert load_config(written) == load_config(QUICKSTART, ["run.dir=out"])


@pytest.mark.stack
def test_saved_model_loads_without_horovod(quickstart) -> None:
    """The exported model loads and predicts with Horovod and hvd_train made unimportable, with
    the Keras a user has: `import keras` (Keras 3 on TensorFlow 2.16+, Keras 2 on 2.15)."""
    run_dir = quickstart[0] / "rank0" / "out"
    summary = json.loads((run_dir / "summary.json").read_text())
    src = load_source(load_config(QUICKSTART))
    np.save(run_dir.parent / "x_val.npy", src.x_val)
    script = f"""
import sys
from importlib.metadata import version
sys.modules["horovod"] = sys.modules["hvd_train"] = None  # any import of them now fails
import numpy as np
import keras
model = keras.models.load_model({str(run_dir / "model.keras")!r})
package = type(model).__module__.split(".")[0]
print("loaded by", package, version(package))
np.save("predicted.npy", np.argmax(model.predict(np.load("x_val.npy"), verbose=0), -1))
"""
    env = ["env", "-u", "TF_USE_LEGACY_KERAS", "-u", "PYTHONPATH"]
    out = check(run([*env, PYTHON, "-c", script], cwd=run_dir.parent)).stdout
    assert (
        f"loaded by {summary['versions']['keras']}" in out
    ), out  # "keras 3.15.1" ("keras 2.15.0" on 2.15)
    acc = float(np.mean(np.load(run_dir.parent / "predicted.npy") == src.y_val))
    assert acc == pytest.approx(summary["final_metrics"]["val_accuracy"], abs=1e-6)


# What float64 rounding of the batch sums can do to the trained weights, and what a real
# difference does (see the test below): 10^5 above the one, 10^5 below the other.
FLOAT64_WEIGHTS_REL = 1e-9


def test_two_workers_at_batch_b_train_like_one_worker_at_2b(tmp_path: pathlib.Path) -> None:
    """Synchronous data parallelism is large-batch training: same global batches, same rate,
    so the same weights up to the rounding of the batch sums. Also runs one worker without
    horovodrun.

    Where the runs differ: only in the order of the gradient sums. One worker adds 64
    per-example gradients in one sum; two workers add 32 each, and Horovod's average adds the
    two and halves (exact for 2 ranks: a + b = b + a, and /2 is exact). Each run repeats itself
    bit for bit (fixed data order, one intra-op thread, CPU kernels), so this test has one
    outcome per machine; the tolerance only has to separate rounding from a real difference.

    Why float64 (`tests/workers/float64_models.py`, convnet7 layer for layer): in float32 the
    gradients differ by ~1e-6 relative, and after ~20 steps a ReLU input lying within that of 0
    switches sides in one run only; that unit's gradient then differs wholly and the runs part. In
    float64 the gradients differ by ~1e-14, no ReLU switches in the run, and Adam, whose step is
    lr x m/sqrt(v), does not compound a relative error: the weights end a few units of their
    last place apart, as after the first step. Whereas other batches, another rate or a sum
    instead of a mean change a weight by a whole step, ~lr = 1e-3 (~4e-3 of the largest weights
    of 0.25). FLOAT64_WEIGHTS_REL = 1e-9 lies 10^5 from each.

    The logged training loss is Keras' float32 running mean: each of the epoch's `steps` batch
    losses is rounded to float32 and added, then divided (and averaged over the workers):
    at most 2 x steps + 2 roundings of 2^-24 in each run.
    """
    factory = f"{WORKERS / 'float64_models.py'}:convnet7_float64"
    common = ["--config", str(QUICKSTART), "--set", "train.batch_size_mode=global",
              "--set", "train.batch_size=64", "--set", "train.epochs=4",
              "--set", "model.dropout=0", "--set", "logging.tensorboard=false",
              "--set", f"model.factory={factory}", "--set", "runtime.intra_op_threads=1",
              "--set", "train.verbose=false"]  # fmt: skip
    two_worker = [*common, "--set", "run.dir=two", "--set", "horovod.timeline=true"]
    check(horovodrun(2, [PYTHON, "-m", "hvd_train", *two_worker], tmp_path))
    check(run([PYTHON, "-m", "hvd_train", *common, "--set", "run.dir=one"], tmp_path))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert (s1["per_worker_batch_size"], s2["per_worker_batch_size"]) == (64, 32)
    assert s1["global_batch_size"] == s2["global_batch_size"] == 64
    steps = s1["steps_per_epoch"]
    assert s2["steps_per_epoch"] == steps
    w1, w2 = trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")
    assert [w.dtype for w in w1] == [np.float64] * len(w1)
    for a, b in zip(w1, w2, strict=True):
        assert np.abs(b - a).max() <= FLOAT64_WEIGHTS_REL * np.abs(a).max(), (a.shape, b - a)
    f1, f2 = s1["final_metrics"], s2["final_metrics"]
    assert f2["val_loss"] == pytest.approx(f1["val_loss"], rel=FLOAT64_WEIGHTS_REL), (f1, f2)
    loss_rel = 2 * (2 * steps + 2) * 2**-24
    for a, b in zip(one, two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=loss_rel), (one, two)
        # metrics.csv prints val_loss to 6 digits: values a rounding apart may print one unit
        # of the last digit apart (<= 1e-5 relative; twice that allows for the decimal parse)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=2e-5), (one, two)
        assert b["val_accuracy"] == a["val_accuracy"], (one, two)
        assert b["learning_rate"] == a["learning_rate"], (one, two)  # the same float32 schedule
    # horovod.timeline=true: Horovod's own trace of the gradient all-reduces, in the run dir
    assert "ALLREDUCE" in (tmp_path / "two" / "timeline.json").read_text()


@pytest.mark.stack
@pytest.mark.parametrize("keras", BINDING_RUNS)
def test_sync_batch_norm_at_2_workers_trains_like_batch_norm_at_1_on_the_global_batch(
    tmp_path: pathlib.Path, keras: str
) -> None:
    """With `model.sync_batch_norm`, each step's batch statistics are the global batch's: two
    workers at 32 (float64, as above) end with the weights and moving statistics of one worker
    at 64 with Keras' own BatchNormalization; local statistics (32 examples each) would part the
    runs at the first step. On Keras 3 and Keras 2 (each binding has its own layer). The export
    has plain BatchNormalization again."""
    factory = f"{WORKERS / 'float64_models.py'}:bn_net_float64"
    common = ["--config", str(QUICKSTART), "--set", "train.batch_size_mode=global",
              "--set", "train.batch_size=64", "--set", "train.epochs=2",
              "--set", "logging.tensorboard=false", "--set", f"model.factory={factory}",
              "--set", "runtime.intra_op_threads=1", "--set", "train.verbose=false",
              "--set", f"runtime.keras={keras}"]  # fmt: skip
    sync = [*common, "--set", "run.dir=two", "--set", "model.sync_batch_norm=true"]
    check(horovodrun(2, [PYTHON, "-m", "hvd_train", *sync], tmp_path))
    check(run([PYTHON, "-m", "hvd_train", *common, "--set", "run.dir=one"], tmp_path))
    w1, w2 = trained_weights(tmp_path / "one"), trained_weights(tmp_path / "two")
    assert len(w1) == len(w2) == 12  # 2 x (conv kernel, BN gamma, beta, moving mean, var) + dense
    for a, b in zip(w1, w2, strict=True):
        assert np.abs(b - a).max() <= FLOAT64_WEIGHTS_REL * np.abs(a).max(), (a.shape, b - a)
    exported = load_model(tmp_path / "two" / "model.keras")
    kinds = {
        type(layer).__name__ for layer in exported.layers if "Normalization" in type(layer).__name__
    }
    assert kinds == {"BatchNormalization"}, kinds


def trained_weights(run_dir: pathlib.Path) -> list[np.ndarray]:
    """The weights of the run's exported model.keras."""
    return load_model(run_dir / "model.keras").get_weights()


@pytest.mark.stack
def test_bad_input_exits_2_with_one_line(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"source": "digits"}, "train": {"batch_size": 5000}}))
    proc = run([PYTHON, "-m", "hvd_train", "--config", str(cfg)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hvd_train: error:")]
    assert errors == [
        "hvd_train: error: data: 1438 training examples are fewer than one global batch of "
        "5000 (1 workers x 5000); lower train.batch_size"
    ]


@pytest.mark.stack
def test_bad_config_exits_2_before_loading_tensorflow(tmp_path: pathlib.Path) -> None:
    bad = str(ROOT / "tests/invalid_configs/unknown_key.yaml")
    for command in ([PYTHON, "-m", "hvd_train"], [PYTHON, "-m", "hvd_train.config"],
                    [str(BIN / "hvd-train")]):  # fmt: skip
        proc = run([*command, "--config", bad], tmp_path, timeout=60)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"hvd_train: error: {ROOT}/tests/invalid_configs/unknown_key.yaml: train.batchsize: "
            "unknown key; did you mean train.batch_size?"
        ]
