"""Custom training loops on Keras 3 with Horovod's `horovod.tensorflow` TF2 API under one changed
import line (`import hvd_train.horovod as hvd`): Horovod v0.28.1's tensorflow2_mnist.py and its
synthetic benchmark's GradientTape, keras.io's training loop from scratch and its DCGAN's
two-optimizer `train_step`, gradient accumulation, mixed_float16's loss scaling, and the cases
of Horovod's test_tensorflow.py for these names, every one in one real 2-worker Horovod job
(tests/workers/horovod_tape_cases.py says what differs from each source; docs/horovod.md lists
the cases)."""

from __future__ import annotations

import json
import pathlib

import pytest
from harness import PYTHON, WORKERS, check, horovod_cases, run

from hvd_train.runtime.keras import binding

pytestmark = [
    pytest.mark.multiworker,
    pytest.mark.skipif(not binding.has_keras3(), reason="Keras 3 (TensorFlow 2.16+)"),
]

# Horovod's examples and keras.io's guides, mirrored; then Horovod v0.28.1's
# test_tensorflow.py cases, by their names; then hvd_train's own.
MIRRORED = [
    "example_tensorflow2_mnist",
    "example_tensorflow2_synthetic_benchmark",
    "keras_io_training_loop_from_scratch",
    "keras_io_dcgan_train_step_two_optimizers",
    "accumulated_gradients_over_two_batches",
    "mixed_float16_loss_scale_skips_alike",
    "test_partial_distributed_gradient_tape",
    "test_model_parallel_model",
    "test_broadcast_object",
    "test_broadcast_object_fn",
    "test_allgather_object",
]
OWN = ["own_tape_arguments_reduce_as_horovod_says"]


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, dict]:
    """Every case, in one 2-worker job (start-up paid once): each one's outcome by name."""
    root = tmp_path_factory.mktemp("horovod_tape_cases")
    found = horovod_cases("horovod_tape_cases.py", root, timeout=600)
    assert [c["name"] for c in found] == MIRRORED + OWN, found
    return {c["name"]: c for c in found}


@pytest.mark.processes
@pytest.mark.parametrize("name", MIRRORED + OWN)
def test_custom_loop_case_passes_on_keras3(cases, name) -> None:
    """The case passed on both ranks, ending with the same weights on both (a case that failed
    on either is reported failed)."""
    assert cases[name]["ok"], cases[name]["error"]


def test_the_custom_loop_cases_are_named_in_the_docs() -> None:
    """docs/horovod.md's custom-loop section names every case."""
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "horovod.md").read_text()
    for name in MIRRORED:
        assert name in doc, name


@pytest.mark.processes
def test_every_name_of_horovods_tensorflow2_api_is_there() -> None:
    """The names of `horovod.tensorflow` that Horovod's TF2 examples and test_tensorflow.py's
    TF2 cases use, with Horovod's argument names."""
    script = (
        "import inspect, json, hvd_train.horovod as hvd; "
        "names = ['DistributedGradientTape', 'PartialDistributedGradientTape', "
        "'broadcast_variables', 'broadcast_object', 'broadcast_object_fn', "
        "'allgather_object', 'alltoall', 'Compression', 'Adasum']; "
        "missing = [n for n in names if not hasattr(hvd, n)]; "
        "params = list(inspect.signature(hvd.DistributedGradientTape).parameters); "
        "local = 'local_layers' in inspect.signature(hvd.PartialDistributedGradientTape)"
        ".parameters; "
        "print(json.dumps([missing, params, local]))"
    )
    out = check(run([PYTHON, "-c", script], pathlib.Path(__file__).parent)).stdout
    missing, params, local = json.loads(out.strip().splitlines()[-1])
    assert missing == [], missing
    assert params == [
        "gradtape", "device_dense", "device_sparse", "compression", "sparse_as_dense", "op",
        "gradient_predivide_factor", "num_groups", "groups", "process_set",
        "scale_local_gradients",
    ]  # fmt: skip
    assert local


@pytest.mark.processes
def test_the_unchanged_import_fails_in_one_line_naming_hvd_train(tmp_path) -> None:
    """Horovod's tensorflow2_mnist.py training step with `import horovod.tensorflow as hvd` left
    as it is, on Keras 3 (one worker: Horovod's tape keys its sources by `.ref()` at any size):
    the patched Horovod (patches/horovod-0.28.1/0017) ends it with one TypeError line naming
    the call and hvd_train.horovod, not upstream's `no attribute 'ref'` from inside the tape."""
    proc = run([PYTHON, str(WORKERS / "horovod_tape_import_unchanged.py")], tmp_path)
    assert proc.returncode != 0, proc.stdout
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1].strip()
    assert last.startswith("TypeError: horovod.tensorflow.DistributedGradientTape.gradient:"), last
    assert "import hvd_train.horovod as hvd" in last, last
    assert "no attribute 'ref'" not in proc.stderr, proc.stderr[-2000:]
