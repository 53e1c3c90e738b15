"""Built-in models by name, and users' own models through `model.factory: "module:function"`.

Built in: `convnet` and `mlp` for small inputs; `mobilenet_v2`, `resnet50` and
`efficientnet_b0`, Keras Applications bases (optionally with pretrained weights from a local
file) under a configurable head, built with the active Keras (runtime/keras/binding.py). A factory's
model is trained with its own Keras. Any functional model can have its BatchNormalization layers
swapped for the binding's SyncBatchNormalization (`model.sync_batch_norm`), and swapped back
for export (`plain_clone`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hvd_train.base.errors import ConfigError, users_frame
from hvd_train.config import Config, ModelConfig
from hvd_train.runtime import tuning
from hvd_train.runtime.keras import binding
from hvd_train.runtime.keras.contract import Model


def build_model(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> Model:
    """The uncompiled model: `model.factory` if set, else the built-in `model.name`, built
    under the precision policy (`runtime.mixed_precision`) and the active binding's seed.

    A factory that returns a model of the other Keras (under `runtime.keras: auto`) makes that
    Keras the active one; the model is then built again, seeded and under the policy as a run
    that chose that Keras would have built it. With `model.sync_batch_norm` its
    BatchNormalization layers become the binding's SyncBatchNormalization (after Horovod's
    init).

    Raises:
        ConfigError: the factory returned no Keras model, or one of another Keras than
            `runtime.keras` names.
    """
    active = binding.active()
    active.set_precision(tuning.precision_policy(cfg.runtime))  # layers take the policy in force
    model = _build(cfg, input_shape, num_classes)
    found = binding.of_model(model)
    if found != active.NAME:
        _check_keras(cfg, model, found)
        active = binding.activate(found)
        active.seed(cfg.runtime.seed)
        active.set_precision(tuning.precision_policy(cfg.runtime))
        model = _build(cfg, input_shape, num_classes)
    return to_sync_batch_norm(model) if cfg.model.sync_batch_norm else model


def _check_keras(cfg: Config, model: object, found: str | None) -> None:
    """A factory's model: a Keras model, of the Keras `runtime.keras` names (any, for auto)."""
    spec = cfg.model.factory or cfg.model.name
    if found is None:
        raise ConfigError(
            f"model.factory: {spec} returned {type(model).__name__}, expected a Keras model "
            "(Model, or tf_Model)"
        )
    if cfg.runtime.keras != "auto":
        raise ConfigError(
            f"runtime.keras is {cfg.runtime.keras}, but model.factory {spec} returned a {found} "
            f"model ({binding.describe(found)}); build it with {cfg.runtime.keras} "
            f"(`import {cfg.runtime.keras}`), or set runtime.keras: auto to train each model with "
            "its own Keras"
        )


def weights_note(m: ModelConfig) -> str | None:
    """The line that says which weights file `build_model` loaded, or None when it loaded none."""
    if m.factory or m.name not in BASES or m.weights == "none":
        return None
    return f"model.weights: loaded {os.path.abspath(m.weights)} into the {m.name} base"


def _build(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> Model:
    m = cfg.model
    if m.factory:
        return _from_factory(cfg, input_shape, num_classes)
    if m.name == "convnet":
        return convnet(input_shape, num_classes, m)
    if m.name == "mlp":
        return mlp(input_shape, num_classes, m)
    return application(input_shape, num_classes, m)


def convnet(input_shape: tuple[int, ...], num_classes: int, m: ModelConfig) -> Model:
    """A small convnet (Keras' classic CIFAR-10 example), for small images, shaped by the
    `model` section's `filters`, `dense_units`, `dropout` and `from_logits`.

    Layer by layer, with the default widths (`model.filters: [32, 32, 64, 64]`,
    `model.dense_units: [256]`):

    1. Conv2D 32 filters, 3x3, padding `same`, ReLU.
    2. Conv2D 32, 3x3, `same`, ReLU; then MaxPooling2D 2x2 and Dropout(`model.dropout`).
    3. Conv2D 64, 3x3, `same`, ReLU.
    4. Conv2D 64, 3x3, `same`, ReLU; then MaxPooling2D 2x2 and Dropout.
    5. Flatten.
    6. Dense 256, ReLU; then Dropout.
    7. Dense to the classes (softmax, or logits with `from_logits`), float32.

    Its depth follows the config: one convolution per `filters` entry and one dense layer per
    `dense_units` entry, then the classifier (six weighted layers with the defaults; seven with
    two `dense_units` entries, as `convnet7`, its old name, promised). A pool follows every
    second convolution. All convolutions pad `same`,
    so it fits inputs as small as 4x4 (2-D inputs are taken as one-channel images). At 32x32x3
    it has about 1.1 M weights; wide `dense_units` (for example [2816, 256]) make the 12 M-weight
    gradient-heavy variant.
    """
    keras = binding.keras()
    layers = keras.layers
    x = inputs = keras.Input(shape=input_shape)
    if len(input_shape) == 2:  # grey images given as height x width
        x = layers.Reshape((*input_shape, 1))(x)
    for i, width in enumerate(m.filters):
        x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        if i % 2 == 1:
            x = layers.MaxPooling2D(2)(x)
            x = layers.Dropout(m.dropout)(x) if m.dropout else x
    x = layers.Flatten()(x)
    for units in m.dense_units:
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(m.dropout)(x) if m.dropout else x
    outputs = _head(x, num_classes, m.from_logits)
    return keras.Model(inputs, outputs, name="convnet")


def mlp(input_shape: tuple[int, ...], num_classes: int, m: ModelConfig) -> Model:
    """A multilayer perceptron over the flattened input: the `model` section's `dense_units`,
    each with `dropout`, then the classifier (`from_logits`)."""
    keras = binding.keras()
    layers = keras.layers
    x = inputs = keras.Input(shape=input_shape)
    x = layers.Flatten()(x)
    for units in m.dense_units:
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(m.dropout)(x) if m.dropout else x
    return keras.Model(inputs, _head(x, num_classes, m.from_logits), name="mlp")


def _head(x: Any, num_classes: int, from_logits: bool) -> Any:
    # float32 output keeps the loss stable under mixed precision.
    activation = None if from_logits else "softmax"
    return binding.keras().layers.Dense(num_classes, activation=activation, dtype="float32")(x)


def _from_factory(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> Model:
    """Calls the user's `fn(cfg)`, or `fn(cfg, input_shape, num_classes)` if it takes them."""
    spec = cfg.model.factory
    module_name, _, fn_name = spec.rpartition(":")
    module = import_user_module(module_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"model.factory: {module_name!r} has no function {fn_name!r}")
    params = inspect.signature(fn).parameters
    wants_shape = "input_shape" in params and "num_classes" in params
    model = fn(cfg, input_shape=input_shape, num_classes=num_classes) if wants_shape else fn(cfg)
    return model


def import_user_module(name: str, key: str = "model.factory"):
    """`package.module` from the working directory or PYTHONPATH, or a `path/to/file.py`: the
    one way a config imports the user's code (`model.factory`, `callbacks[i].class`). Errors
    name `key`."""
    if name.endswith(".py"):
        if not os.path.isfile(name):
            raise ConfigError(
                f"{key}: file {name!r} not found (paths are relative to the working "
                f"directory, {os.getcwd()})"
            )
        spec = importlib.util.spec_from_file_location(
            os.path.basename(name).removesuffix(".py"), name
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path:  # the working directory, as `python -m` would have it
        sys.path.insert(0, "")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        where = users_frame(e)  # the user's module imports what is missing
        at = f" at {where}" if where else ""
        raise ConfigError(
            f"{key}: cannot import module {name!r} ({e}{at}); it must be importable "
            "from the working directory or PYTHONPATH, or be given as path/to/file.py"
        ) from None


# --------------------------------------------------------------------------- Keras Applications

# How inputs in [0, 1] become what each base was trained on (Keras' `preprocess_input`):
# (scale, offset per output channel, reverse RGB to BGR). MobileNetV2: [-1, 1]. ResNet50
# ("caffe" style): BGR in [0, 255] minus the ImageNet mean. EfficientNetB0: [0, 255] (the
# model rescales and normalises inside itself).
PREPROCESS = {
    "mobilenet_v2": (2.0, (-1.0, -1.0, -1.0), False),
    "resnet50": (255.0, (-103.939, -116.779, -123.68), True),
    "efficientnet_b0": (255.0, (0.0, 0.0, 0.0), False),
}
BASES = {  # name -> the class in keras.applications
    "mobilenet_v2": "MobileNetV2",
    "resnet50": "ResNet50",
    "efficientnet_b0": "EfficientNetB0",
}
_MIN_SIZE = 32  # Keras Applications refuse smaller inputs


def application(input_shape: tuple[int, ...], num_classes: int, m: ModelConfig) -> Model:
    """A Keras Applications base (no ImageNet classifier) under a new head, for inputs in [0, 1].

    Layers: a frozen 1x1 channel map that turns the [0, 1] input (1 or 3 channels) into what
    the base expects (`PREPROCESS`), the base (a nested model named after `model.name`), global
    `pooling` (avg or max), a ReLU dense layer per `dense_units` entry, dropout, the classifier.

    Args:
        input_shape: `(height, width, channels)`, height and width at least 32, 1 or 3 channels.
        num_classes: the classifier's outputs.
        m: the `model` section. Its `name` is `mobilenet_v2`, `resnet50` or
            `efficientnet_b0`; `weights` is "none" (random initialisation) or the path of a
            weights file for the base without its classifier (`.weights.h5` from
            `save_weights`, a legacy `.h5`, or `.keras`), never downloaded;
            `trainable_base: false` freezes the base (its BatchNormalization then runs in
            inference mode), and only the head trains.
    """
    name, weights = m.name, m.weights
    _check_image_shape(name, input_shape)
    if weights != "none":
        _check_weights_file(name, weights)  # before the slow build
    keras = binding.keras()
    layers = keras.layers
    inputs = keras.Input(shape=input_shape)
    x = input_adapter(name, input_shape[-1])(inputs)
    base = getattr(keras.applications, BASES[name])(
        include_top=False, weights=None, input_shape=(*input_shape[:2], 3)
    )  # weights=None: Keras never downloads; a local file is loaded below
    _rename(base, name)  # the nested model's name, e.g. "mobilenet_v2", not "mobilenetv2_1.00_32"
    if weights != "none":
        load_base_weights(base, name, weights)
    base.trainable = m.trainable_base
    x = base(x)
    pool = layers.GlobalAveragePooling2D if m.pooling == "avg" else layers.GlobalMaxPooling2D
    x = pool(name=f"{m.pooling}_pool")(x)
    for units in m.dense_units:
        x = layers.Dense(units, activation="relu")(x)
    x = layers.Dropout(m.dropout)(x) if m.dropout else x
    return keras.Model(inputs, _head(x, num_classes, m.from_logits), name=f"{name}_classifier")


def _check_image_shape(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3 or shape[-1] not in (1, 3):
        raise ConfigError(
            f"model.name: {name} takes images of height x width x 1 or 3 channels, got input "
            f"shape {list(shape)}; use model.name: mlp or a model.factory for other inputs"
        )
    if min(shape[:2]) < _MIN_SIZE:
        raise ConfigError(
            f"model.name: {name} needs images of at least {_MIN_SIZE}x{_MIN_SIZE}, got "
            f"{shape[0]}x{shape[1]}; use larger images (data.image_size) or model.name: convnet"
        )


def input_adapter(name: str, channels: int) -> Any:
    """A frozen Dense on the channel axis: output channel j = scale x input channel src(j) +
    offset(j). It repeats a grey channel into three, reverses RGB to BGR where the base wants
    it, and rescales; plain Keras, so the exported model loads anywhere."""
    keras = binding.keras()
    scale, offset, bgr = PREPROCESS[name]
    kernel = np.zeros((channels, 3), np.float32)
    for j in range(3):
        kernel[0 if channels == 1 else (2 - j if bgr else j), j] = scale
    return keras.layers.Dense(
        3,
        kernel_initializer=keras.initializers.Constant(kernel.tolist()),
        bias_initializer=keras.initializers.Constant(list(offset)),
        trainable=False,
        name="preprocess",
    )


def _check_weights_file(name: str, path: str) -> None:
    keras_name = BASES[name]
    if not os.path.isfile(path):
        raise ConfigError(
            f"model.weights: {path!r} not found. Pretrained weights are never downloaded at run "
            f"time: on a machine with internet, run keras.applications.{keras_name}("
            f"weights='imagenet', include_top=False).save_weights('{name}_notop.weights.h5') (or "
            "copy the *_notop.h5 file Keras caches in ~/.keras/models/), then point model.weights "
            "at it"
        )


def load_base_weights(base: Model, name: str, path: str) -> None:
    """Loads a local weights file into an Applications base; a clear ConfigError otherwise."""
    _check_weights_file(name, path)
    keras_name = BASES[name]
    try:
        base.load_weights(path)
    except (ValueError, OSError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"model.weights: {path!r} does not fit the {keras_name} base without its classifier "
            f"(include_top=False): {first}"
        ) from None
    if name == "efficientnet_b0":
        _fix_efficientnet_imagenet_variance(base)


# ImageNet's per-channel standard deviation, which Keras' own EfficientNet weights store where
# Normalization expects a variance (tensorflow/tensorflow#49930).
_IMAGENET_STDDEV_RGB = (0.229, 0.224, 0.225)


def _fix_efficientnet_imagenet_variance(base: Model) -> None:
    """Keras corrects its ImageNet EfficientNet weights (standard deviations stored as the
    variance) with an extra Rescaling layer, but only when it downloads them itself. A local
    copy of those weights gets the same correction here, by squaring the stored values."""
    normalization = binding.keras().layers.Normalization
    norm = next(x for x in base.layers if isinstance(x, normalization))
    variance = np.asarray(norm.adapt_variance.numpy())
    if np.allclose(variance, _IMAGENET_STDDEV_RGB, atol=1e-6):
        norm.adapt_variance.assign(np.square(variance))
        norm.finalize_state()


# --------------------------------------------------------------------------- batch norm swaps


def to_sync_batch_norm(model: Model) -> Model:
    """The same model, same weights, with the binding's SyncBatchNormalization for every
    BatchNormalization (nested models included): batch statistics over the global batch."""
    active = binding.active()
    plain, sync = active.keras.layers.BatchNormalization, active.SyncBatchNormalization

    def swap(layer: Any) -> Any:
        if isinstance(layer, plain) and not isinstance(layer, sync):
            return sync.from_config(layer.get_config())
        return None

    try:
        return _clone_swapping(model, swap)
    except ValueError as e:
        raise ConfigError(
            f"model.sync_batch_norm: needs a functional or sequential Keras model ({e})"
        ) from None


def plain_clone(model: Model) -> Model:
    """A copy of `model` (same weights), uncompiled, with the binding's SyncBatchNormalization
    layers turned back into Keras' BatchNormalization, so it loads without Horovod or hvd_train.

    A functional model of a class of its own (a KerasHub task such as ImageClassifier) keeps
    its class (`_in_its_own_class`). Raises ValueError for a subclassed model, as
    `keras.models.clone_model` does."""
    active = binding.active()
    plain, sync = active.keras.layers.BatchNormalization, active.SyncBatchNormalization
    own = _in_its_own_class(model, sync)
    if own is not None:
        return own

    def swap(layer: Any) -> Any:
        return plain.from_config(layer.get_config()) if isinstance(layer, sync) else None

    with _read_as_uncompiled(model):
        return _clone_swapping(model, swap)


def plain_model(model: Model) -> Model:
    """A copy of a Keras 3 `model` (same weights, no optimizer) with every
    SyncBatchNormalization turned back into Keras' BatchNormalization: save it, and the file
    loads in plain Keras 3 where neither hvd_train nor Horovod is installed (`model.save` of
    the model itself writes SyncBatchNormalization, the optimizer and its warm-up schedule,
    which need hvd_train.keras3 imported to load). `hvd_train.keras3.plain_model`, for users'
    own scripts: it leaves the rest of hvd_train's Keras unchosen.

    Args:
        model: a functional or Sequential Keras 3 model, nested models included.

    Raises:
        ValueError: a subclassed model, which Keras cannot clone; save it as it is.
    """
    with binding.activated(binding.KERAS3):  # this copy's Keras; the rest of hvd_train's as was
        return plain_clone(model)


@contextlib.contextmanager
def _read_as_uncompiled(model: Model) -> Iterator[None]:
    """Keras 3's `clone_model` compiles the copy as its original was compiled, and a compiled
    model saves its optimizer's config: with hvd_train's learning-rate schedule in it, the file
    would load (`load_model`, compile=True by default) only where hvd_train is imported. Inside,
    `model` reads as uncompiled, so its copy is not compiled. (Keras 2 compiles no copy.)"""
    compiled = getattr(model, "compiled", False) is True
    if compiled:
        model.compiled = False
    try:
        yield
    finally:
        if compiled:
            model.compiled = True


def _in_its_own_class(model: Model, sync: type) -> Model | None:
    """A functional model whose class is not Keras' own (a KerasHub task: its `backbone`,
    `preprocessor` and `from_preset` come with it), rebuilt from its config as `load_model`
    rebuilds it, with its weights. `clone_model` would give a plain Functional of the same
    layers (Keras' cloning says that this "may be incorrect"). None for Keras' own classes, a
    subclassed model, one that holds SyncBatchNormalization (which only the clone swaps back),
    or a class that cannot be rebuilt from its config (it would not load from its file either).
    """
    cls = type(model)
    functional = any(c.__name__ == "Functional" for c in cls.__mro__)
    if not functional or cls.__module__.split(".")[0] in ("keras", "tf_keras"):
        return None
    if any(isinstance(layer, sync) for layer in _nested_layers(model)):
        return None
    try:
        copy = cls.from_config(model.get_config())
        copy.set_weights(model.get_weights())
    except (TypeError, ValueError, NotImplementedError):
        return None
    return copy


def _nested_layers(model: Model) -> Iterator[Any]:
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _nested_layers(layer)


def _rename(layer: Any, name: str) -> None:
    """Keras 3's `name` is an attribute, Keras 2's a read-only property over `_name`."""
    try:
        layer.name = name
    except AttributeError:
        layer._name = name


def _clone_swapping(model: Model, swap: Callable[[Any], Any | None]) -> Model:
    """`clone_model`, recursing into nested models, with `swap(layer)` replacing the layers it
    returns a new layer for; then the original's weights (same order) into the copy."""

    keras = binding.keras()

    def clone(layer: Any) -> Any:
        if isinstance(layer, keras.Model):
            return keras.models.clone_model(layer, clone_function=clone)
        return swap(layer) or layer.__class__.from_config(layer.get_config())

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
