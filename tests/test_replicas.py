"""Every rank holds the same state: one definition of the replicated state (what the checkpoint
saves, less each rank's own), each binding's contract, and the check while the run trains
(where the features that change the state meet: tests/test_replica_matrix.py)."""

from __future__ import annotations

import inspect
import json
import re
import typing

import numpy as np
import pytest
import yaml
from harness import KERASES, PYTHON, QUICKSTART, WORKERS, check, horovodrun, run

from hvd_train.base.errors import ConfigError, ReplicaMismatch, error_class
from hvd_train.config import load_config, rules
from hvd_train.runtime.keras import binding, contract


@pytest.mark.processes
@pytest.mark.multiworker
@pytest.mark.parametrize(
    ("where", "settings", "step"),
    [("checkpoint", ["checkpoint.every_steps=6"], 6),
     ("every_steps", ["runtime.check_replicas_every_steps=5"], 5)],
)  # fmt: skip
def test_a_rank_whose_weights_differ_ends_the_run_naming_the_variable(
    tmp_path, where, settings, step
) -> None:
    """Rank 1's first weight is nudged after step 4 of the run; the next check finds it: the
    one before the checkpoint at step 6 (its fingerprints ride in the random states'
    all-gather), or the one `check_replicas_every_steps` asks at step 5 (gathered alone). Every
    rank ends at that step with one line naming the variable and the rank, exit code 3, the
    record says failed, and no checkpoint is written after the nudge."""
    items = [{"class": "probe_callbacks:NudgeOneWeight", "args": {"rank": 1, "step": 4}}]
    run_dir = tmp_path / "run"
    cmd = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART),
           "--set", "callbacks=" + json.dumps(items),
           *(x for s in ("train.verbose=false", "logging.tensorboard=false", f"run.dir={run_dir}",
                         "train.epochs=2", *settings)
             for x in ("--set", s))]  # fmt: skip
    proc = horovodrun(2, cmd, WORKERS, timeout=240)
    assert proc.returncode == ReplicaMismatch.exit_code, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error_type"] == "ReplicaMismatch", summary
    # The first weight of the quickstart's convnet, and the rank that holds other values.
    assert re.search(rf"epoch 1, step {step}: \S*conv\S*kernel\b.*rank\(s\) 1 hold other values",
                     summary["error"]), summary["error"]  # fmt: skip
    assert not list((run_dir / "checkpoints").glob("ckpt-*")), "a checkpoint after the nudge"
    # The launcher may restart from the last checkpoint (it was checked): nothing says it recurs.
    assert error_class(summary["error_type"]).recurs == ""


# --------------------------------------------------------------------------- in one process


@pytest.fixture(autouse=True)
def _the_binding_active_before_is_active_after():
    """Tests here activate one binding or the other; a test after them in the same process
    must find the binding it found before (test_elastic's make_optimizer asks for it)."""
    with binding.activated(KERASES[0]):
        yield


def _model(keras_name: str, accumulation: int, loss_scale: bool):
    """A small model (Dense, BatchNormalization, Dropout, Dense) compiled with the binding's
    distributed optimizer and built for training, in a fresh process's binding."""
    active = binding.activate(keras_name)
    keras = active.keras
    active.seed(1)
    inputs = keras.Input((4,))
    x = keras.layers.Dense(3)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dropout(0.5)(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    model.compile(active.distributed_optimizer(keras.optimizers.Adam(1e-3), False, accumulation,
                                               loss_scale), "mse")  # fmt: skip
    active.build_for_training(model, (4,), 2)
    return active, model


@pytest.mark.parametrize("keras", KERASES)
def test_the_replicated_state_is_what_the_checkpoint_saves_less_each_ranks_own(keras) -> None:
    """Weights, slots, step counter, moving statistics and the window's counter (Keras 3) or
    the dynamic loss scale (tf_keras, which keeps it out of `.variables`) are in it; the
    dropout generators' states and the accumulation sums are not."""
    from hvd_train.runtime import replicas

    accumulation, loss_scale = (2, False) if keras == binding.KERAS3 else (1, True)
    active, model = _model(keras, accumulation, loss_scale)
    named = replicas.replicated_variables(model)
    names = [n for n, _ in named]
    ids = {id(v) for _, v in named}
    assert len(set(names)) == len(names), names
    for weight in model.weights:
        assert id(replicas.tf_variable(weight)) in ids, weight.name
    assert any("moving_mean" in n for n in names), names
    assert any(n.endswith("iteration") for n in names), names
    if keras == binding.KERAS3:
        assert "hvd_count" in names, names
        sums = active.accumulation_sums(model)
        assert len(sums) == len(model.trainable_variables)
        assert not ids & {id(v) for v in sums}
    else:
        assert any("current_loss_scale" in n for n in names), names
    own = active.random_states(model)
    assert own and not ids & {id(replicas.tf_variable(v)) for v in own}


@pytest.mark.parametrize("keras", KERASES)
def test_moving_statistics_are_batch_norms_without_sync(keras) -> None:
    active, model = _model(keras, 1, False)
    found = {id(v) for v in active.moving_statistics(model)}
    bn = next(layer for layer in model.layers if "batch_normalization" in layer.name)
    assert found == {id(bn.moving_mean), id(bn.moving_variance)}
    synced = active.SyncBatchNormalization()
    synced.build((None, 3))
    assert not active.moving_statistics(active.keras.Sequential([synced]))


def test_fingerprints_differ_with_one_bit_and_with_two_values_swapped() -> None:
    from hvd_train.runtime import replicas

    tf = pytest.importorskip("tensorflow")
    values = np.arange(7, dtype=np.float32)  # 28 bytes: the last word is padded
    v = tf.Variable(values)
    before = replicas.fingerprint(v)
    assert replicas.fingerprint(tf.Variable(values.copy())) == before
    flipped = values.copy()
    flipped.view(np.uint32)[6] ^= 1  # the lowest bit of the last value
    assert replicas.fingerprint(tf.Variable(flipped)) != before
    swapped = values[[2, 1, 0, 3, 4, 5, 6]]  # the same values, two words' halves swapped
    assert replicas.fingerprint(tf.Variable(swapped)) != before
    assert replicas.fingerprint(tf.Variable(values[[1, 0, 2, 3, 4, 5, 6]])) != before


def _two_sums(values: np.ndarray) -> tuple[int, int]:
    """The fingerprint as replicas.py defines it, in Python's integers: the bytes as 64-bit
    words (the last zero-padded), their sum, and their sum weighted 1, 2, 3, ..., modulo 2^64."""
    data = values.tobytes()
    data += bytes(-len(data) % 8)
    words = np.frombuffer(data, np.uint64).tolist()
    weighted = sum(i * w for i, w in enumerate(words, start=1))
    return sum(words) % 2**64, weighted % 2**64


def test_a_fingerprint_is_the_plain_and_the_weighted_sum_of_the_variables_words() -> None:
    """Whatever the dtype and shape, each variable's two sums are its own, as defined: a long
    one (over a million words) summed a chunk at a time, and an empty variable's are zero."""
    from hvd_train.runtime import replicas

    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2**63, (n,), np.int64).view(np.float64) for n in (1, 3, 1000)]
    arrays += [rng.random((3, 5), np.float32), np.array([True, False, True]),
               np.array(7, np.int64), np.zeros((0,), np.float32),
               rng.integers(0, 2**63, (2_500_000,), np.int64)]  # fmt: skip
    for values in arrays:
        assert replicas.fingerprint(tf.Variable(values)) == _two_sums(values), values.dtype


@pytest.mark.parametrize("keras", KERASES)
def test_a_models_fingerprints_are_each_variables_own_sums(keras) -> None:
    """A model's fingerprints, taken all at once from host memory or a group at a time on a
    device (`joined=True`), are each variable's own two sums, as defined."""
    from hvd_train.runtime import replicas

    _, model = _model(keras, 2, keras == binding.KERAS2)
    expected = [_two_sums(v.numpy()) for _, v in replicas.Fingerprints(model).named]
    for joined in (False, True):
        mine = replicas.Fingerprints(model, joined=joined).mine()
        assert [tuple(p) for p in mine.view(np.uint64).reshape(-1, 2).tolist()] == expected


@pytest.mark.parametrize("keras", KERASES)
def test_a_models_fingerprints_taken_at_once_are_each_variables_own(keras) -> None:
    """`Fingerprints.mine` on a device joins the variables' bytes a group at a time (taken
    here on the CPU with `joined=True`): each slice is the variable's own fingerprint, whatever
    its dtype (float32 weights, the int64 step counter, tf_keras' loss scale), and a change to
    one variable changes its alone."""
    from hvd_train.runtime import replicas

    _, model = _model(keras, 2, keras == binding.KERAS2)
    prints = replicas.Fingerprints(model, joined=True)
    mine = prints.mine()
    pairs = mine.view(np.uint64).reshape(-1, 2)  # two sums a variable
    assert [tuple(p) for p in pairs.tolist()] == [replicas.fingerprint(v) for _, v in prints.named]
    assert len({v.dtype for _, v in prints.named}) > 1
    name, weight = prints.named[0]
    weight.assign_add(np.ones(weight.shape, weight.dtype.as_numpy_dtype))
    changed = (prints.mine().reshape(-1, 2) != mine.reshape(-1, 2)).any(axis=1)
    assert list(np.nonzero(changed)[0]) == [0], name


def test_groups_keep_the_order_and_each_fits_the_limit() -> None:
    from hvd_train.runtime.replicas import groups

    assert groups([3, 1, 1, 4, 2, 2, 1], 4) == [[0, 1], [2], [3], [4, 5], [6]]
    assert groups([5, 2], 4) == [[0], [1]]  # a size over the limit is alone
    assert groups([], 0) == []


@pytest.mark.parametrize("keras", KERASES)
def test_the_check_copies_at_most_the_largest_variable_at_once(keras, monkeypatch) -> None:
    """The fingerprints are taken a group of variables at a time, each group no larger than the
    largest variable: no tensor of the whole model's size is built (the check once joined every
    replicated variable on the device, doubling the model's memory for a moment). The
    fingerprints are the same as one variable at a time."""
    tf = pytest.importorskip("tensorflow")
    from hvd_train.runtime import replicas

    _, model = _model(keras, 1, False)
    joined: list[int] = []
    concat = tf.concat

    def spy(values, axis, name="concat"):
        joined.append(sum(v.shape.num_elements() for v in values))  # bytes: _as_words's uint8
        return concat(values, axis, name=name)

    monkeypatch.setattr(tf, "concat", spy)
    prints = replicas.Fingerprints(model, joined=True)  # a device's path, taken on the CPU
    mine = prints.mine()
    sizes = [-(-v.shape.num_elements() * v.dtype.size // 8) * 8 for _, v in prints.named]
    assert len(sizes) > 2 and joined, "a model of several variables, joined in groups"
    assert max(joined) == max(sizes) < sum(sizes)
    pairs = mine.view(np.uint64).reshape(-1, 2)
    assert [tuple(p) for p in pairs.tolist()] == [replicas.fingerprint(v) for _, v in prints.named]


@pytest.mark.parametrize("keras", KERASES)
def test_variables_in_host_memory_are_read_one_at_a_time_without_a_traced_function(
    keras, monkeypatch
) -> None:
    """A CPU worker's variables are already in host memory: each is read as it is, with no
    function traced to join them (tracing cost a CPU worker's first check more than the check),
    and the fingerprints are those the joined groups give."""
    tf = pytest.importorskip("tensorflow")
    from hvd_train.runtime import replicas

    _, model = _model(keras, 1, False)
    expected = replicas.Fingerprints(model, joined=True).mine()
    traced: list[object] = []
    function = tf.function
    monkeypatch.setattr(tf, "function", lambda *a, **k: traced.append(a) or function(*a, **k))
    prints = replicas.Fingerprints(model)
    assert prints.mine().tolist() == expected.tolist()
    assert traced == [] and len(prints.named) > 2


def test_a_disagreement_names_the_first_variable_that_differs_and_the_ranks() -> None:
    """Every rank reads the same gathered table, so every rank writes the same line; ranks
    that agree with rank 0 are not named, and nothing is said when all agree."""
    from hvd_train.runtime import replicas

    names = ["dense/kernel", "dense/bias", "adam/iterations"]
    same = np.array([7, 8, 9], np.int64)
    assert replicas.disagreement(names, [same, same.copy(), same.copy()]) is None
    found = replicas.disagreement(names, [same, same.copy(), np.array([7, 0, 1], np.int64)])
    assert found == "dense/bias and 1 more of 3 variables: rank(s) 2 hold other values than rank 0"
    found = replicas.disagreement(names, [same, np.array([7, 8, 0]), np.array([7, 8, 0])])
    assert found == "adam/iterations: rank(s) 1, 2 hold other values than rank 0"


@pytest.mark.parametrize("name", KERASES)
def test_each_keras_binding_satisfies_the_binding_contract(name) -> None:
    """Every member `contract.KerasBinding` declares is in the binding, with the same
    parameters (as Keras checks every backend against one op list)."""
    module = binding.activate(name)
    members = [m for m in dir(contract.KerasBinding) if not m.startswith("_")]
    assert members, "the contract declares nothing"
    hints = typing.get_type_hints(contract.KerasBinding)
    for member in members:
        assert hasattr(module, member), f"{module.__name__} lacks {member}"
        declared = getattr(contract.KerasBinding, member)
        if callable(declared) and not isinstance(declared, type):
            got = list(inspect.signature(getattr(module, member)).parameters)
            want = [p for p in inspect.signature(declared).parameters if p != "self"]
            assert got == want, f"{module.__name__}.{member}{got}: the contract says {want}"
    for attribute in hints:
        assert hasattr(module, attribute), f"{module.__name__} lacks {attribute}"
    assert isinstance(module, contract.KerasBinding)


def test_keras2_mixed_float16_with_accumulation_is_refused_at_load(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "runtime": {"keras": "tf_keras", "mixed_precision": "mixed_float16"},
        "train": {"gradient_accumulation_steps": 2},
    }))  # fmt: skip
    with pytest.raises(ConfigError, match="refused on Keras 2"):
        rules.check(load_config(str(config)), 2)
    rules.check(load_config(str(config), ["runtime.keras=keras"]), 2)
    rules.check(load_config(str(config), ["runtime.mixed_precision=mixed_bfloat16"]), 2)


def test_replica_checks_every_n_steps_need_the_check_on(tmp_path) -> None:
    off = ["runtime.check_replicas=off", "runtime.check_replicas_every_steps=5"]
    with pytest.raises(ConfigError, match="check_replicas is off"):
        rules.check(load_config(None, off), 1)
    rules.check(load_config(None, off[1:]), 1)
    assert load_config(None).runtime.check_replicas == "epoch"


@pytest.mark.processes
@pytest.mark.skipif(binding.KERAS3 not in KERASES, reason="Keras 3 (TensorFlow 2.16+)")
def test_keras3_accumulation_leaves_a_weight_without_gradient_alone(tmp_path) -> None:
    """AdamW with weight decay, accumulation over 2 batches: a weight whose gradient is None in
    every step is neither updated nor decayed (a zero gradient would decay it), the other one
    is updated once per window, and a step the loss scaler skips counts as a batch (a fresh
    process: Horovod's state is global)."""
    script = """
import numpy as np, tensorflow as tf, keras, horovod.tensorflow as hvd
hvd.init()
from hvd_train.runtime.keras import v3 as keras3
used, unused = keras.Variable(np.ones(3, np.float32)), keras.Variable(np.ones(3, np.float32))
opt = keras3.DistributedOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.5), accumulation=2)
opt.build([used, unused])
for _ in range(4):
    opt.apply([tf.ones(3), None], [used, unused])
print("unused", unused.numpy().tolist(), "moved", bool(np.all(used.numpy() < 1)),
      "iterations", int(opt.iterations.numpy()))
scaled = keras3.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
w = keras.Variable(np.ones(2, np.float32))
scaled.build([w])
scaled.apply([tf.constant([np.inf, 1.0])], [w])
print("skipped", w.numpy().tolist(), "iterations", int(scaled.iterations.numpy()))
"""
    out = check(run([PYTHON, "-c", script], cwd=tmp_path, timeout=120)).stdout
    assert "unused [1.0, 1.0, 1.0] moved True iterations 4" in out, out
    assert "skipped [1.0, 1.0] iterations 1" in out, out


@pytest.mark.processes
def test_keras2_accumulation_trains_an_embedding(tmp_path) -> None:
    """tf_keras (Keras 2) with accumulation over 2 batches and an Embedding, whose gradient is
    sparse: Horovod's accumulation takes it made dense (it fails at trace time otherwise), and
    the window's sums exist before the first step (a fresh process: Horovod's state is
    global)."""
    script = """
import numpy as np
from hvd_train.runtime.keras import binding
binding.prepare("tf_keras"); binding.import_tensorflow()
import horovod.tensorflow as hvd
hvd.init()
active = binding.activate("tf_keras")
keras = active.keras
model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                          keras.layers.Flatten(), keras.layers.Dense(2)])
model.compile(active.distributed_optimizer(keras.optimizers.SGD(0.1), False, 2, False),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
active.build_for_training(model, (3,), 2)
print("sums", len(active.accumulation_sums(model)), "before", active.mid_window(model))
before = model.layers[0].embeddings.numpy().copy()
model.fit(np.arange(24).reshape(8, 3) % 20, np.arange(8) % 2, batch_size=2, epochs=1, verbose=0)
print("moved", bool(np.any(model.layers[0].embeddings.numpy() != before)),
      "iterations", int(active.inner_optimizer(model.optimizer).iterations.numpy()),
      "after", active.mid_window(model))
"""
    out = check(run([PYTHON, "-c", script], cwd=tmp_path, timeout=120)).stdout
    assert "sums 3 before False" in out, out  # the embedding, the kernel and the bias
    assert "moved True iterations 4 after False" in out, out
