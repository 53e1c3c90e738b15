"""A user's own Keras 3 `model.fit` script with `hvd_train.keras3` (examples/keras3_fit.py), in
a real 2-worker horovodrun job: the distributed optimizer, the initial broadcast, the metric
averaging, the warm-up, sync batch norm, and the export that loads without hvd_train.

One job serves every test that reads it (tests/workers/run_keras3_fit.py runs the example
unchanged and writes what each rank's `fit` did); the ranks start from different random
weights and train on different examples.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

import numpy as np
import pytest
from harness import PYTHON, ROOT, WORKERS, check, horovodrun, run

from hvd_train.runtime.keras import binding

pytestmark = pytest.mark.stack
keras3_only = pytest.mark.skipif(not binding.has_keras3(), reason="TensorFlow 2.15: no Keras 3")
EXAMPLE = ROOT / "examples" / "keras3_fit.py"
BASE_LR = 1e-3  # the example's hvdk.warmup(1e-3, ...)


def test_importing_it_without_keras_3_fails_in_one_line(monkeypatch) -> None:
    """On TensorFlow 2.15 (the installed version read from its package metadata, here made
    2.15.1), before TensorFlow, Keras or Horovod is imported."""
    monkeypatch.setattr(binding, "installed_tensorflow", lambda: "2.15.1")
    monkeypatch.delitem(sys.modules, "hvd_train.keras3", raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module("hvd_train.keras3")
    assert str(raised.value) == (
        "hvd_train.keras3 needs Keras 3, which comes with TensorFlow 2.16 or later; this is "
        "TensorFlow 2.15.1: for tf.keras (Keras 2) use horovod.tensorflow.keras"
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[pathlib.Path, list[dict], list[list[np.ndarray]]]:
    """The example at 2 workers: its directory, each rank's report and weights (initial, then
    final, as lists of arrays)."""
    root = tmp_path_factory.mktemp("keras3_fit")
    proc = check(horovodrun(2, [PYTHON, str(WORKERS / "run_keras3_fit.py"), str(EXAMPLE)],
                            cwd=root, timeout=600))  # fmt: skip
    assert "Epoch 4/4" in proc.stdout, proc.stdout[-3000:]
    reports = [json.loads((root / f"rank-{r}.json").read_text()) for r in (0, 1)]
    weights = []
    for r in (0, 1):
        with np.load(root / f"rank-{r}.npz") as saved:
            weights.append([saved[f"arr_{i}"] for i in range(len(saved.files))])
    return root, reports, weights


def _halves(arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(initial, final) weights, as the worker saved them one after the other."""
    half = len(arrays) // 2
    return arrays[:half], arrays[half:]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_both_ranks_end_with_identical_weights_from_different_starts(job) -> None:
    """Different random weights before `fit` (no seed), the same after: the broadcast, then
    averaged gradients, and the global batch's statistics in the batch norm's moving mean and
    variance (weights too)."""
    _, reports, weights = job
    (start0, end0), (start1, end1) = _halves(weights[0]), _halves(weights[1])
    assert not _same(start0, start1), "the ranks started alike: the test proves nothing"
    assert _same(end0, end1), "the ranks' weights differ after fit"
    assert not _same(start0, end0)
    assert reports[0]["layers"][2] == "SyncBatchNormalization", reports[0]["layers"]


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_each_epoch_s_metrics_are_the_ranks_mean_and_the_same_on_both(job) -> None:
    """The ranks' own losses differ (different examples); MetricAverage gives both ranks the
    mean of their loss and accuracy, which History (and the console) then see."""
    _, reports, _ = job
    local = [r["local_logs"] for r in reports]
    history = [r["history"] for r in reports]
    assert history[0] == history[1]
    assert sorted(history[0]) == ["accuracy", "loss"] and len(history[0]["loss"]) == 4
    for epoch in range(4):
        assert local[0][epoch]["loss"] != local[1][epoch]["loss"], epoch
        for key in ("loss", "accuracy"):
            mean = (local[0][epoch][key] + local[1][epoch][key]) / 2
            assert history[0][key][epoch] == pytest.approx(mean, rel=1e-6), (epoch, key)


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_the_rate_warms_up_from_base_to_base_times_the_workers(job) -> None:
    """`warmup(1e-3, warmup_steps=2 epochs)`: 1e-3 at the first step, 2e-3 (x 2 workers) at the
    end of 4 epochs; the optimizer is Adam under its own name (it saves as plain Adam)."""
    _, reports, _ = job
    for r in reports:
        assert r["rate_at_step_0"] == pytest.approx(BASE_LR)
        assert r["steps"] > r["warmup_steps"] > 0, r
        assert r["rate_at_end"] == pytest.approx(2 * BASE_LR)
        assert r["optimizer"] == "keras.src.optimizers.adam.Adam"


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_the_saved_model_loads_in_plain_keras_3_with_rank_0_s_weights(job) -> None:
    """`hvdk.plain_model(model).save(...)` on rank 0: loaded where importing hvd_train or
    Horovod fails, with Keras' own BatchNormalization in place of SyncBatchNormalization."""
    root, _, weights = job
    script = """
import sys
sys.modules["hvd_train"] = sys.modules["horovod"] = None  # any import of them now fails
import keras, numpy as np
model = keras.models.load_model("keras3_fit.keras")
print([f"{type(x).__module__}.{type(x).__name__}" for x in model.layers])
np.savez("loaded.npz", *model.get_weights())
"""
    out = check(run([PYTHON, "-c", script], cwd=root)).stdout
    assert "'keras.src.layers.normalization.batch_normalization.BatchNormalization'" in out, out
    assert "SyncBatchNormalization" not in out, out
    with np.load(root / "loaded.npz") as saved:
        loaded = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert _same(loaded, _halves(weights[0])[1])


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_broadcast_initial_state_turns_off_xla_which_cannot_compile_the_all_reduce(job) -> None:
    """A model compiled with `jit_compile=True` trains at 2 workers, without XLA and with a
    warning that names the callback the script gave `fit` and says why (unguarded, its first step fails: no XLA kernel for
    HorovodGroupedAllreduce in this Horovod)."""
    _, reports, _ = job
    for r in reports:
        assert r["xla_after_fit"] is False
        assert r["xla_warnings"] == [
            "hvd_train.keras3.BroadcastInitialState: jit_compile turned off: XLA cannot compile "
            "Horovod's all-reduce in this build; pass jit_compile=False to compile()"
        ]


@pytest.mark.processes
@keras3_only
@pytest.mark.multiworker
def test_the_script_chooses_no_keras_for_the_rest_of_hvd_train(job) -> None:
    """Importing hvd_train.keras3, `plain_model` included, leaves hvd_train's binding unchosen."""
    _, reports, _ = job
    assert [r["binding_chosen"] for r in reports] == [None, None]


@keras3_only
def test_warmup_ramps_from_the_base_rate_to_the_scaled_one_and_refuses_what_it_cannot_do():
    """In this process: no Horovod job needed when `workers` is given."""
    from hvd_train.runtime.keras import v3 as keras3

    schedule = keras3.warmup(0.1, workers=4, warmup_steps=10)
    assert [round(float(schedule(s)), 6) for s in (0, 5, 10, 99)] == [0.1, 0.25, 0.4, 0.4]
    decaying = keras3.warmup(0.1, workers=2, warmup_steps=2, decay="cosine", total_steps=11)
    assert float(decaying(10)) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match=r"decay must be one of .*received: decay='step'"):
        keras3.warmup(0.1, workers=2, decay="step")
    with pytest.raises(ValueError, match="received: total_steps=0, warmup_steps=5"):
        keras3.warmup(0.1, workers=2, warmup_steps=5, decay="cosine")


@keras3_only
def test_under_mixed_float16_the_loss_scaler_goes_inside_the_averaging() -> None:
    """compile() would put a LossScaleOptimizer around the distributed optimizer, whose inf/NaN
    check would then see each rank's own gradients (a rank alone skipping a step hangs the
    job): DistributedOptimizer puts it inside, around the user's optimizer."""
    import keras

    from hvd_train.runtime.keras import v3 as keras3

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        optimizer = keras3.DistributedOptimizer(keras.optimizers.SGD(0.1))
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    finally:
        keras.mixed_precision.set_global_policy(before)
    model.compile(optimizer, "mse")
    assert model.optimizer is optimizer  # compile found its loss scaler
    assert isinstance(optimizer, keras3.Averaging)
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert type(optimizer.inner_optimizer) is keras.optimizers.SGD
    plain = keras3.DistributedOptimizer(keras.optimizers.SGD(0.1))  # float32: no loss scaling
    assert not isinstance(plain, keras.optimizers.LossScaleOptimizer)
