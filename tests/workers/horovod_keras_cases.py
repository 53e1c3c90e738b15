"""Horovod v0.28.1's test/parallel/test_tensorflow2_keras.py, case for case, as a Horovod user's
code runs on Keras 3 with `import hvd_train.horovod as hvd` (run by tests/test_horovod_api.py
on every rank of a 2-worker job).

Each case keeps the upstream model, the same calls of Horovod's API with the same arguments,
and the same assertions. What differs, and only that: the import line; what Keras 3 removed
(`experimental_run_tf_function`, `lr=` and `optimizer.lr`, `keras.losses.mean_squared_error`,
`ThresholdedReLU` (now `ReLU(threshold=)`), Embedding's `input_length`, `.ref()`, the legacy
optimizers, OptimizerV2's `_resource_apply_dense` (now `update_step`)); and where a case reads
Keras 2's optimizer internals (`_compute_gradients`, `_agg_helper.counter`), the Keras 3
equivalent: the gradients from a GradientTape, and hvd_train's window count
(`_hvd_count % backward_passes_per_step`). Each case adds one check of its own where it
trains: every rank ends with the same weights.

Rank 0 prints one line per case (case_runner.py).
"""

from __future__ import annotations

import case_runner  # tests/workers/, beside this script
import keras
import numpy as np
import tensorflow as tf
from case_runner import reduction_arguments, same_on_every_rank

import hvd_train.horovod as hvd


def test_train_model_lr_schedule():
    initial_lr = 0.1 * hvd.size()
    opt = keras.optimizers.Adam()
    opt = hvd.DistributedOptimizer(opt)

    def linear_multiplier(epoch):
        return epoch

    model = keras.models.Sequential()
    model.add(keras.layers.Dense(2, input_shape=(3,)))
    model.add(keras.layers.RepeatVector(3))
    model.add(keras.layers.ReLU(threshold=0.5))  # ThresholdedReLU(0.5)
    model.compile(loss=keras.losses.MeanSquaredError(), optimizer=opt,
                  metrics=[keras.metrics.categorical_accuracy])  # fmt: skip
    x = np.random.random((10, 3))
    y = np.random.random((10, 3, 2))

    class StoreLearningRateCallback(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            # test learning rate warmup
            lr = self.model.optimizer.learning_rate.numpy()
            if epoch >= 0 and epoch < 5:
                assert lr <= initial_lr or np.isclose(lr, initial_lr)
            # test learning rate schedule callback
            if epoch > 5 and epoch < 10:
                assert lr <= initial_lr * 1e-1 or np.isclose(lr, initial_lr * 1e-1)
            if epoch > 10 and epoch < 15:
                assert lr < initial_lr * 1e-2 or np.isclose(lr, initial_lr * 1e-2)
            if epoch >= 15 and epoch < 20:
                assert np.isclose(lr, initial_lr * linear_multiplier(epoch))

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=5),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=initial_lr, multiplier=1e-1, start_epoch=5, end_epoch=10),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=initial_lr, multiplier=1e-2, start_epoch=10, end_epoch=15),
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=initial_lr, multiplier=linear_multiplier, start_epoch=15, end_epoch=20),
        StoreLearningRateCallback(),
    ]  # fmt: skip
    train_history = model.fit(x, y, steps_per_epoch=5, callbacks=callbacks, epochs=20,
                              verbose=0)  # fmt: skip

    # test that the metrics average is being respected
    loss_metrics = train_history.history["loss"]
    loss_metrics_tensor = tf.convert_to_tensor(loss_metrics, dtype=tf.float32)
    expected_loss_metrics_tensor = hvd.broadcast(loss_metrics_tensor, root_rank=0)
    np.testing.assert_allclose(expected_loss_metrics_tensor, loss_metrics_tensor)
    same_on_every_rank(model.get_weights())


def test_sparse_as_dense():
    opt = keras.optimizers.RMSprop(learning_rate=0.0001)
    opt = hvd.DistributedOptimizer(opt, sparse_as_dense=True)

    model = keras.models.Sequential()
    model.add(keras.layers.Embedding(1000, 64))
    model.compile(loss=keras.losses.MeanSquaredError(), optimizer=opt)

    x = np.random.randint(1000, size=(32, 10))
    y = np.random.random((32, 10, 64))
    # No assertions upstream: it must not hang. Added: the step was taken.
    model.train_on_batch(x, y)
    assert int(opt.iterations.numpy()) == 1


def test_sparse_as_dense_with_grad_aggregation():
    backward_passes_per_step = 2
    opt = keras.optimizers.RMSprop(learning_rate=0.0001)
    opt = hvd.DistributedOptimizer(
        opt, sparse_as_dense=True, backward_passes_per_step=backward_passes_per_step
    )

    model = keras.models.Sequential()
    model.add(keras.layers.Embedding(1000, 64))
    model.compile(loss=keras.losses.MeanSquaredError(), optimizer=opt)

    x = np.random.randint(1000, size=(32, 10))
    y = np.random.random((32, 10, 64))

    training_steps = 3
    for _ in range(training_steps):
        model.train_on_batch(x, y)

    aggregation_counter = int(opt._hvd_count.numpy()) % backward_passes_per_step
    assert aggregation_counter == training_steps % backward_passes_per_step


def test_grad_aggregation_with_inf_grad():
    backward_passes_per_step = 2
    step_count = tf.Variable(0, trainable=False, dtype=tf.int32)
    opt = keras.optimizers.SGD()
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=backward_passes_per_step, sparse_as_dense=True
    )
    x = keras.Variable(0.0)
    var = [x]

    def loss():
        step_count.assign_add(1)
        return tf.cond(
            pred=tf.greater(step_count, 1),
            true_fn=lambda: x.value,
            false_fn=lambda: x.value * float("inf"),
        )

    for _ in range(2 * backward_passes_per_step):
        # in the first aggregation cycle the gradient is infinite, and it should be cleaned
        # up to zero after apply_gradients and doesn't affect the 2nd aggregation cycle
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, [v.value for v in var])
        grads_and_vars = list(zip(grads, var, strict=False))
        opt.apply_gradients(grads_and_vars)
    assert tf.math.is_finite(grads_and_vars[0][0])
    # hvd_train's equivalent of the helper's cleared buffer: the window's sums are zero.
    assert all(float(tf.reduce_sum(tf.abs(s))) == 0 for s in opt._hvd_sums)


def test_from_config():
    opt = keras.optimizers.Adam()
    hopt = hvd.DistributedOptimizer(opt)
    cfg = hopt.get_config()

    hopt_copy1 = hopt.from_config(cfg)
    assert cfg == hopt_copy1.get_config()

    hopt_copy2 = hopt.__class__.from_config(cfg)
    assert cfg == hopt_copy2.get_config()


def test_elastic_state():
    v = 1.0 if hvd.rank() == 0 else 2.0
    model1 = keras.Sequential([keras.layers.Dense(2, activation="softmax")])
    model1.build((2, 2))
    model1.set_weights([np.array([[v, v], [v, v]], dtype=np.float32),
                        np.array([v, v], dtype=np.float32)])  # fmt: skip

    model2 = keras.Sequential([keras.layers.Dense(2, activation="softmax")])
    model2.build((2, 2))
    model2.set_weights([np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
                        np.array([0.0, 0.0], dtype=np.float32)])  # fmt: skip

    optimizer = keras.optimizers.Adam(0.001 * hvd.size())

    state = hvd.elastic.KerasState(model1, optimizer, batch=20 + hvd.rank(),
                                   epoch=10 + hvd.rank())  # fmt: skip
    state.sync()

    model1_weights = model1.get_weights()
    model2_weights = model2.get_weights()

    # After sync, all values should match the root rank
    for w in state.model.get_weights():
        np.testing.assert_allclose(w, np.ones_like(w))
    assert state.batch == 20
    assert state.epoch == 10

    # Partially modify then restore
    model1.set_weights(model2_weights)
    state.batch = 21
    state.epoch = 11

    state.restore()

    for w1, w2 in zip(model1.get_weights(), model1_weights, strict=True):
        np.testing.assert_allclose(w1, w2)
    assert state.batch == 20
    assert state.epoch == 10

    # Partially modify then commit
    model1.set_weights(model2_weights)
    state.batch = 21
    state.epoch = 11

    state.commit()
    state.restore()

    for w1, w2 in zip(model1.get_weights(), model2_weights, strict=True):
        np.testing.assert_allclose(w1, w2)
    assert state.batch == 21
    assert state.epoch == 11


def _gradient_aggregation(average_aggregated_gradients):
    class TestingOptimizer(keras.optimizers.Optimizer):
        """Custom optimizer we use for testing gradient aggregation."""

        def update_step(self, gradient, variable, learning_rate):
            variable.assign_add(gradient)

    backward_passes_per_step = 4
    hvd_optimizer = hvd.DistributedOptimizer(
        optimizer=TestingOptimizer(learning_rate=1.0, name="test"),
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        sparse_as_dense=True,
    )
    _ = hvd_optimizer.iterations

    x_0 = 0.0
    y_0, y_1 = 1.0, 2.0
    x = keras.Variable([x_0])
    y = keras.Variable([y_0, y_1])
    variables = [x, y]

    def loss():
        """loss = x - y * e1 where e1 = [1.0, 0.0]"""
        # Gather the first row of y (tf.gather: an IndexedSlices gradient).
        gathered_y_1 = tf.gather(y.value, [0])
        return x.value - gathered_y_1

    def compute_expected_value(batch_id):
        """dloss/dx = 1.0 and dloss/dy = [-1.0, 0.0]: each update adds 1 to x and [-1, 0] to
        y (the optimizer adds the gradient), times the passes unless averaged."""
        num_of_steps = (batch_id + 1) // backward_passes_per_step
        gradient_of_x = num_of_steps * 1.0
        gradient_of_y_0 = num_of_steps * -1.0
        if not average_aggregated_gradients:
            gradient_of_x *= backward_passes_per_step
            gradient_of_y_0 *= backward_passes_per_step
        expected_x = x_0 + gradient_of_x
        expected_y_0 = y_0 + gradient_of_y_0
        expected_y_1 = y_1  # its gradient is always 0
        return np.array(expected_x), np.array([expected_y_0, expected_y_1])

    @tf.function
    def compute_and_apply_gradients_in_tf_function():
        # As model.fit() does it: in a tf.function (its variables by closure: a Keras 3
        # Variable passed in would arrive as a tensor).
        var_list = variables
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, [v.value for v in var_list])
        hvd_optimizer.apply_gradients(zip(grads, var_list, strict=False))

    total_num_of_steps = 10
    for idx in range(total_num_of_steps):
        compute_and_apply_gradients_in_tf_function()
        expected_x, expected_y = compute_expected_value(idx)
        updated_x = variables[0].numpy()
        updated_y = variables[1].numpy()
        assert np.isclose(updated_x, expected_x), (idx, updated_x, expected_x)
        assert np.isclose(updated_y, expected_y).all(), (idx, updated_y, expected_y)
        assert idx + 1 == hvd_optimizer.iterations.numpy()

    aggregation_counter = int(hvd_optimizer._hvd_count.numpy()) % backward_passes_per_step
    assert aggregation_counter == total_num_of_steps % backward_passes_per_step


def test_gradient_aggregation_0():
    _gradient_aggregation(True)


def test_gradient_aggregation_1():
    _gradient_aggregation(False)


def _gradient_aggregation_with_local_vars(average_aggregated_gradients):
    class TestingOptimizer(keras.optimizers.Optimizer):
        """Custom optimizer we use for testing gradient aggregation."""

        def update_step(self, gradient, variable, learning_rate):
            variable.assign_add(gradient)

    backward_passes_per_step = 4
    hvd_optimizer = hvd.DistributedOptimizer(
        optimizer=TestingOptimizer(learning_rate=1.0, name="test"),
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        sparse_as_dense=True,
    )
    _ = hvd_optimizer.iterations

    total_num_variables = 8
    num_local_vars = 4
    X_0 = [0.0] * total_num_variables  # noqa: N806 - upstream's names
    Y_0, Y_1 = [1.0] * total_num_variables, [2.0] * total_num_variables  # noqa: N806
    X = [keras.Variable([x_0]) for x_0 in X_0]  # noqa: N806
    Y = [keras.Variable([y_0, y_1]) for y_0, y_1 in zip(Y_0, Y_1, strict=True)]  # noqa: N806
    variables = [*X, *Y]  # upstream [X, Y]: Keras 2 flattened it

    for i in range(num_local_vars):
        hvd_optimizer.register_local_var(X[i])
        hvd_optimizer.register_local_var(Y[i])

    def loss():
        """loss = x - y * er where er = [float(hvd.rank()+1), 0.0]"""
        gathered_y_1 = tf.gather([y.value for y in Y], [0], axis=1)
        return tf.stack([x.value for x in X]) - (float(hvd.rank() + 1) * gathered_y_1)

    def compute_expected_value(batch_id):
        """dloss/dx = 1.0, dloss/dy = [-(rank+1), 0.0]: a shared variable's gradient is the
        ranks' mean, a local one's its own over size."""
        num_of_steps = (batch_id + 1) // backward_passes_per_step
        gradient_of_x = num_of_steps * 1.0
        gradient_of_y_multiplier = float(hvd.size() + 1) / 2
        gradient_of_y_0 = num_of_steps * gradient_of_y_multiplier * -1.0
        if not average_aggregated_gradients:
            gradient_of_x *= backward_passes_per_step
            gradient_of_y_0 *= backward_passes_per_step
        expected_x = np.array(X_0)
        for i in range(len(X_0)):
            if i < num_local_vars:
                expected_x[i] += gradient_of_x / hvd.size()
            else:
                expected_x[i] += gradient_of_x
        expected_y_0 = np.array(Y_0)
        for i in range(len(Y_0)):
            if i < num_local_vars:  # recover the gradient of local vars
                expected_y_0[i] += (
                    (gradient_of_y_0 / gradient_of_y_multiplier) * float(hvd.rank() + 1)
                ) / hvd.size()
            else:
                expected_y_0[i] += gradient_of_y_0
        expected_y_1 = np.array(Y_1)  # its gradient is always 0
        expected_y = [[ey0, ey1] for ey0, ey1 in zip(expected_y_0, expected_y_1, strict=True)]
        return np.reshape(expected_x, (-1, 1)), np.array(expected_y)

    @tf.function
    def compute_and_apply_gradients_in_tf_function():
        var_list = variables
        with tf.GradientTape() as tape:
            value = loss()
        grads = tape.gradient(value, [v.value for v in var_list])
        hvd_optimizer.apply_gradients(zip(grads, var_list, strict=True))

    total_num_of_steps = 10
    for idx in range(total_num_of_steps):
        compute_and_apply_gradients_in_tf_function()
        expected_x, expected_y = compute_expected_value(idx)
        updated_x = np.array([x.numpy() for x in X])
        updated_y = np.array([y.numpy() for y in Y])
        assert np.isclose(updated_x, expected_x).all(), (idx, updated_x, expected_x)
        assert np.isclose(updated_y, expected_y).all(), (idx, updated_y, expected_y)
        assert idx + 1 == hvd_optimizer.iterations.numpy()

    aggregation_counter = int(hvd_optimizer._hvd_count.numpy()) % backward_passes_per_step
    assert aggregation_counter == total_num_of_steps % backward_passes_per_step


def test_gradient_aggregation_with_local_vars_0():
    _gradient_aggregation_with_local_vars(True)


def test_gradient_aggregation_with_local_vars_1():
    _gradient_aggregation_with_local_vars(False)


def test_broadcast_global_variables_callback_with_local_vars():
    root_rank = hvd.size() - 1

    X = np.random.random((1, 3))  # noqa: N806 - upstream's names
    Y = np.random.random((1, 3, 3))  # noqa: N806

    # every layer non-trainable, so that the values after fit are the broadcast's
    model = keras.models.Sequential()
    initializer = keras.initializers.Constant(hvd.rank())
    model.add(keras.layers.Dense(3, input_shape=(3,), kernel_initializer=initializer,
                                 bias_initializer=initializer, trainable=False))  # fmt: skip
    for _ in range(3):
        model.add(keras.layers.Dense(3, kernel_initializer=initializer,
                                     bias_initializer=initializer, trainable=False))  # fmt: skip
    model.add(keras.layers.RepeatVector(3))
    model.add(keras.layers.Dense(3, kernel_initializer=initializer,
                                 bias_initializer=initializer, trainable=False))  # fmt: skip
    model.compile(loss=keras.losses.MeanSquaredError(),
                  metrics=[keras.metrics.categorical_accuracy])  # fmt: skip

    # deem first layer's variables as local
    local_variables = list(model.layers[0].variables)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(
        root_rank=root_rank, local_variables=local_variables)]  # fmt: skip
    model.fit(X, Y, callbacks=callbacks, verbose=0)
    local_ids = {id(var) for var in local_variables}
    for var in model.variables:
        if id(var) in local_ids:
            # local variables keep this rank's value
            np.testing.assert_allclose(var.numpy(), np.full(var.shape, float(hvd.rank())))
        else:
            # the others hold the root rank's
            np.testing.assert_allclose(var.numpy(), np.full(var.shape, float(root_rank)))


def test_horovod_syncbn_cpu():
    """Horovod v0.28.1's test/parallel/test_tensorflow.py test_horovod_syncbn_cpu: each rank's
    SyncBatchNormalization on its own row gives what BatchNormalization gives on all the
    ranks' rows together, and the same moving statistics, within assertAllClose's default
    tolerances (1e-6). Keras 3: eager calls in place of the graph's initializer and evaluate;
    BatchNormalization has no `fused`."""
    with tf.device("/cpu:0"):
        x_list = [
            tf.convert_to_tensor(np.stack([
                np.array([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]],
                         dtype=np.float32)
                for r in range(hvd.size())
            ]), np.float32),
            tf.convert_to_tensor(np.stack([
                np.array([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]], dtype=np.float32)
                for r in range(hvd.size())
            ]), np.float32),
        ]  # fmt: skip
        for x in x_list:
            bn = keras.layers.BatchNormalization(axis=1)
            sync_bn = hvd.SyncBatchNormalization(axis=1)
            bn_out = bn(x, training=True).numpy()
            sync_bn_out = sync_bn(tf.expand_dims(x[hvd.rank()], 0), training=True).numpy()
            np.testing.assert_allclose(sync_bn_out, np.expand_dims(bn_out[hvd.rank()], 0),
                                       rtol=1e-6, atol=1e-6)  # fmt: skip
            np.testing.assert_allclose(sync_bn.moving_mean.numpy(), bn.moving_mean.numpy(),
                                       rtol=1e-6, atol=1e-6)  # fmt: skip
            np.testing.assert_allclose(sync_bn.moving_variance.numpy(),
                                       bn.moving_variance.numpy(), rtol=1e-6, atol=1e-6)  # fmt: skip


# --------------------------------------------------------------------------- hvd_train's own


def own_momentum_correction_is_refused_not_ignored():
    """Keras 3 compiles SGD's momentum into the step: Horovod's momentum correction cannot be
    done, and the warm-up says so, naming the argument, instead of training differently."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(loss="mse", optimizer=opt)
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    try:
        model.fit(np.zeros((4, 3)), np.zeros((4, 2)), callbacks=[warmup], verbose=0)
    except ValueError as e:
        assert "momentum_correction" in str(e), e
    else:
        raise AssertionError("momentum_correction=True with momentum trained without a word")
    quiet = hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=0.1, warmup_epochs=2, momentum_correction=False
    )
    model.fit(np.zeros((4, 3)), np.zeros((4, 2)), callbacks=[quiet], verbose=0)


def own_load_model_wraps_the_optimizer_with_its_state():
    """hvd.load_model (Horovod's test_keras.py test_load_model, on Keras 3): the saved
    optimizer comes back distributed, with its step count and slots, and training goes on
    averaged (every rank ends alike)."""
    import os
    import tempfile

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    x, y = np.random.random((8, 3)), np.random.random((8, 2))
    cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(x, y, batch_size=4, epochs=1, callbacks=cbs, verbose=0)
    path = os.path.join(tempfile.mkdtemp(), f"model-{hvd.rank()}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    assert type(loaded.optimizer).__name__ == "Adam", type(loaded.optimizer)
    assert hasattr(loaded.optimizer, "_hvd_average"), "the loaded optimizer is not distributed"
    assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    xr, yr = np.random.random((8, 3)) * (hvd.rank() + 1), np.random.random((8, 2))
    loaded.fit(xr, yr, batch_size=4, epochs=1, verbose=0)  # each rank its own data
    same_on_every_rank(loaded.get_weights())


def own_groups_predivide_and_sum_reduce_as_horovod_says():
    """The collectives give Horovod's results; and DistributedOptimizer's `groups` (a number, or lists of variables) and
    `gradient_predivide_factor` give the ranks' mean, `op=hvd.Sum` their sum: each rank's
    gradient is rank + 1, and an optimizer that adds the gradient shows what came back."""

    class Adding(keras.optimizers.Optimizer):
        def update_step(self, gradient, variable, learning_rate):
            variable.assign_add(gradient)

    # The collectives, as Horovod's Keras module has them.
    mine = np.arange(4.0) + hvd.rank()
    np.testing.assert_allclose(hvd.allreduce(mine), np.arange(4.0) + (hvd.size() - 1) / 2)
    np.testing.assert_allclose(hvd.allreduce(mine, op=hvd.Sum), hvd.size() * np.arange(4.0)
                               + sum(range(hvd.size())))  # fmt: skip
    np.testing.assert_allclose(hvd.broadcast(mine, root_rank=0), np.arange(4.0))
    assert hvd.allgather(mine).shape == (4 * hvd.size(),)
    part = hvd.reducescatter(np.ones((2 * hvd.size(), 3)), op=hvd.Sum)
    np.testing.assert_allclose(part, np.full((2, 3), float(hvd.size())))
    for kwargs, (a, b, c), expected in reduction_arguments(keras):
        opt = hvd.DistributedOptimizer(Adding(learning_rate=1.0), **kwargs)
        grads = [tf.fill(v.shape, float(hvd.rank() + 1)) for v in (a, b, c)]
        opt.apply_gradients(zip(grads, [a, b, c], strict=True))
        for v in (a, b, c):
            np.testing.assert_allclose(v.numpy(), np.full(v.shape, expected), err_msg=str(kwargs))


CASES = [
    test_train_model_lr_schedule,
    test_sparse_as_dense,
    test_sparse_as_dense_with_grad_aggregation,
    test_grad_aggregation_with_inf_grad,
    test_from_config,
    test_elastic_state,
    test_gradient_aggregation_0,
    test_gradient_aggregation_1,
    test_gradient_aggregation_with_local_vars_0,
    test_gradient_aggregation_with_local_vars_1,
    test_broadcast_global_variables_callback_with_local_vars,
    test_horovod_syncbn_cpu,
    own_momentum_correction_is_refused_not_ignored,
    own_load_model_wraps_the_optimizer_with_its_state,
    own_groups_predivide_and_sum_reduce_as_horovod_says,
]


if __name__ == "__main__":
    case_runner.main(CASES)
