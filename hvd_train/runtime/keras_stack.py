"""The one Keras hvd_train uses (Keras 2), and Horovod's Keras API bound to it.

Horovod 0.28.1's Keras API works with Keras 2 only. TensorFlow 2.15 ships Keras 2 as tf.keras.
From 2.16 the module `keras` is Keras 3, and Keras 2 lives on as the `tf_keras` package, which
tf.keras becomes when TF_USE_LEGACY_KERAS=1 is set before TensorFlow is imported. So:

- `import hvd_train` runs `select()`, which reads the installed TensorFlow's version from its
  package metadata (no TensorFlow import) and, on 2.16+, sets TF_USE_LEGACY_KERAS=1: a user's
  factory written with tf.keras then builds Keras 2 models on every stack;
- `keras` here is that Keras 2 (tf.keras on 2.15, tf_keras on 2.16+), and `hvd` is
  horovod.tensorflow.keras, imported with the module name `keras` bound to tf_keras (Horovod
  does `from keras import backend as K`), then unbound, so a user's own `import keras` still
  means what it means.

Every other module takes both from here (loaded on first use, PEP 562):

    from hvd_train.runtime.keras_stack import hvd, keras
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from typing import Any

# The TensorFlow wheels' distribution names (tensorflow-cpu: CPU-only Linux wheel).
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
_LEGACY_FROM = (2, 16)  # the first TensorFlow whose `keras` is Keras 3


def version_tuple(version: str | None) -> tuple[int, ...]:
    """`"2.15.1"` -> (2, 15, 1); `"2.16.0rc1"` -> (2, 16, 0); None or junk -> ()."""
    parts = []
    for piece in (version or "").split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def installed_tensorflow() -> str | None:
    """The installed TensorFlow's version, from its package metadata; None if none is."""
    for name in _TENSORFLOW_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def uses_tf_keras(tf_version: str | None = None) -> bool:
    """True where Keras 2 is the tf_keras package (TensorFlow 2.16+), False on 2.15."""
    return version_tuple(tf_version or installed_tensorflow()) >= _LEGACY_FROM


def select() -> None:
    """Makes tf.keras Keras 2 (TF_USE_LEGACY_KERAS=1 on TensorFlow 2.16+).

    Must run before TensorFlow is imported: TensorFlow reads the variable once, at its import.
    Set unconditionally there, as Horovod's Keras API cannot work with Keras 3.
    """
    if uses_tf_keras():
        os.environ["TF_USE_LEGACY_KERAS"] = "1"


def _load_keras() -> Any:
    if not uses_tf_keras():
        import tensorflow as tf

        return tf.keras
    import tensorflow as tf
    import tf_keras

    if not issubclass(tf.keras.Model, tf_keras.Model):
        raise ImportError(
            "tf.keras is Keras 3: TensorFlow was imported before hvd_train set "
            "TF_USE_LEGACY_KERAS=1; import hvd_train first, or set TF_USE_LEGACY_KERAS=1 in the "
            "environment"
        )
    return tf_keras


def _load_horovod_keras(keras: Any) -> Any:
    """horovod.tensorflow.keras, imported with `keras` bound to `keras` (tf_keras on 2.16+)."""
    if not uses_tf_keras():
        import horovod.tensorflow.keras as hvd

        return hvd
    saved = {n: m for n, m in sys.modules.items() if n == "keras" or n.startswith("keras.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["keras"] = keras
    try:
        import horovod.tensorflow.keras as hvd
    finally:
        for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
            del sys.modules[name]
        sys.modules.update(saved)
    return hvd


def __getattr__(name: str) -> Any:
    """`keras` and `hvd`, imported on first use (so `import hvd_train` imports no TensorFlow)."""
    if name not in ("keras", "hvd"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    keras = globals().get("keras") or _load_keras()
    globals()["keras"] = keras
    if name == "hvd":
        globals()["hvd"] = _load_horovod_keras(keras)
    return globals()[name]


def describe() -> str:
    """The Keras package and version in use: `"keras 2.15.0"` or `"tf_keras 2.18.0"`."""
    package = "tf_keras" if uses_tf_keras() else "keras"
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return f"{package} (not installed)"
