"""Horovod's own Keras code on Keras 3 with one import line changed (`import hvd_train.horovod as
hvd`): Horovod v0.28.1's test/parallel/test_tensorflow2_keras.py case for case, and its
examples/tensorflow2/tensorflow2_keras_mnist.py, its elastic
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py and
examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py, each run by a real 2-worker
Horovod job
(tests/workers/horovod_keras_cases.py and horovod_keras_mnist.py say what differs from
upstream, and docs/horovod.md lists the cases)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from harness import BIN, PYTHON, WORKERS, check, horovod_cases, horovodrun, run, two_local_hosts

from hvd_train.runtime.keras import binding

pytestmark = [
    pytest.mark.multiworker,
    pytest.mark.skipif(not binding.has_keras3(), reason="Keras 3 (TensorFlow 2.16+)"),
]

# Horovod v0.28.1's test_tensorflow2_keras.py, its cases as the worker names them (a
# parameterized case once per parameter), and the one left out with its reason.
MIRRORED = [
    "test_train_model_lr_schedule",
    "test_sparse_as_dense",
    "test_sparse_as_dense_with_grad_aggregation",
    "test_grad_aggregation_with_inf_grad",
    "test_from_config",
    "test_elastic_state",
    "test_gradient_aggregation_0",
    "test_gradient_aggregation_1",
    "test_gradient_aggregation_with_local_vars_0",
    "test_gradient_aggregation_with_local_vars_1",
    "test_broadcast_global_variables_callback_with_local_vars",
    "test_horovod_syncbn_cpu",  # of test_tensorflow.py
]
LEFT_OUT = {
    "test_partial_distributed_optimizer": "horovod.keras.PartialDistributedOptimizer (Keras 2's "
    "standalone Keras package) is not one of hvd_train.horovod's names",
}
OWN = ["own_momentum_correction_is_refused_not_ignored",
       "own_load_model_wraps_the_optimizer_with_its_state",
       "own_groups_predivide_and_sum_reduce_as_horovod_says"]  # fmt: skip


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    """Every case, in one 2-worker job (start-up paid once): each one's outcome by name."""
    root = tmp_path_factory.mktemp("horovod_cases")
    found = horovod_cases("horovod_keras_cases.py", root, timeout=900)
    assert [c["name"] for c in found] == MIRRORED + OWN, found
    return {c["name"]: c for c in found}


@pytest.mark.processes
@pytest.mark.parametrize("name", MIRRORED + OWN)
def test_horovods_keras_case_passes_on_keras3(cases, name) -> None:
    """The case passed on both ranks (a case that failed on either is reported failed)."""
    assert cases[name]["ok"], cases[name]["error"]


def test_the_cases_left_out_are_named_in_the_docs() -> None:
    """docs/horovod.md's table has every mirrored case and each one left out with its reason."""
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "horovod.md").read_text()
    for name in [*MIRRORED, *LEFT_OUT]:
        assert re.sub(r"_[01]$", "", name) in doc, name


@pytest.mark.processes
def test_horovods_keras_mnist_example_trains_alike_on_every_rank(tmp_path) -> None:
    """Horovod's tensorflow2_keras_mnist.py with its import changed: the warm-up reaches the
    scaled rate (0.001 x 2) at its third epoch, as its callback says; rank 0 writes a
    checkpoint an epoch; both ranks end with the same weights."""
    proc = check(horovodrun(2, [PYTHON, str(WORKERS / "horovod_keras_mnist.py"),
                                str(tmp_path)], tmp_path, timeout=900))  # fmt: skip
    assert "Epoch 3: finished gradual learning rate warmup to 0.002." in proc.stdout, proc.stdout
    digests = dict(re.findall(r"WEIGHTS rank (\d) (\w+) lr 0.002", proc.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, proc.stdout
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.keras")) == [
        "checkpoint-1.keras", "checkpoint-2.keras", "checkpoint-3.keras",
    ]  # fmt: skip
    # The checkpoint loads in plain Keras, without hvd_train or Horovod.
    script = (
        "import sys; sys.modules['horovod'] = None; import keras; "
        f"m = keras.models.load_model({str(tmp_path / 'checkpoint-3.keras')!r}); "
        "print(type(m.optimizer).__name__)"
    )
    assert check(run([PYTHON, "-c", script], tmp_path)).stdout.split() == ["Adam"]


@pytest.mark.processes
def test_every_name_of_horovods_keras_api_is_there() -> None:
    """The names issue 61 lists, as Horovod's `horovod.tensorflow.keras` has them."""
    names = {
        "": ["init", "shutdown", "size", "rank", "local_rank", "local_size", "cross_rank",
             "cross_size", "is_initialized", "allreduce", "allgather", "broadcast", "Average",
             "Sum", "Compression", "DistributedOptimizer", "load_model",
             "SyncBatchNormalization"],
        "callbacks": ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                      "LearningRateWarmupCallback", "LearningRateScheduleCallback",
                      "BestModelCheckpoint"],
        "elastic": ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
                    "UpdateEpochStateCallback", "run"],
    }  # fmt: skip
    script = (
        "import hvd_train.horovod as hvd, json; "
        f"names = {names!r}; "
        "print(json.dumps([f'{m}.{n}' for m, ns in names.items() for n in ns "
        "if not hasattr(getattr(hvd, m) if m else hvd, n)]))"
    )
    out = check(run([PYTHON, "-c", script], pathlib.Path(__file__).parent)).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [], out


@pytest.mark.processes
def test_horovods_elastic_keras_mnist_example_trains_alike_on_every_rank(tmp_path) -> None:
    """Horovod's elastic tensorflow2_keras_mnist_elastic.py with its import changed, under
    `horovodrun --min-np 1 --max-np 2` and a discovery script offering two one-slot hosts: it
    trains its 3 epochs (the state's epoch count says 3), rank 0 writes a checkpoint an
    epoch, and both ranks end with the same weights (elastic.run synchronizes the state from
    rank 0 before training, so the ranks' different initial weights do not survive)."""
    discover = two_local_hosts(tmp_path)
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover), "--gloo", PYTHON,
           str(WORKERS / "horovod_keras_mnist_elastic.py"), str(tmp_path)]  # fmt: skip
    proc = check(run(cmd, tmp_path, timeout=900))
    digests = dict(re.findall(r"WEIGHTS rank (\d) (\w+) epoch 3", proc.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, proc.stdout
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.keras")) == [
        "checkpoint-1.keras", "checkpoint-2.keras", "checkpoint-3.keras",
    ]  # fmt: skip


@pytest.mark.processes
def test_horovods_synthetic_benchmark_runs_with_fp16_all_reduce(tmp_path) -> None:
    """Horovod's tensorflow2_keras_synthetic_benchmark.py with its import changed, run small
    through its own options (MobileNetV3Small, batch 4, 3 iterations of 2 batches, CPU,
    `--fp16-allreduce`): it prints its throughput table, and both ranks end with the same
    trainable weights (the gradients averaged in float16 are the same bits everywhere)."""
    cmd = [PYTHON, str(WORKERS / "horovod_keras_synthetic_benchmark.py"), "--model",
           "MobileNetV3Small", "--batch-size", "4", "--num-batches-per-iter", "2",
           "--num-iters", "3", "--no-cuda", "--fp16-allreduce"]  # fmt: skip
    proc = check(horovodrun(2, cmd, tmp_path, timeout=900))
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+", proc.stdout), proc.stdout
    digests = dict(re.findall(r"WEIGHTS rank (\d) (\w+)", proc.stdout))
    assert sorted(digests) == ["0", "1"] and len(set(digests.values())) == 1, proc.stdout
