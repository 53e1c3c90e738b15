"""Which Keras trains, and its binding: everything that depends on the Keras sits behind one
module per Keras, as Keras puts one `backend/<name>/` per backend.

- `v3.py`: Keras 3 (`import keras`, TensorFlow 2.16+), on Horovod's TensorFlow ops (its
  Keras API cannot work with Keras 3 variables).
- `v2.py`: Keras 2: `tf.keras` on TensorFlow 2.15, the `tf_keras` package on 2.16+, with
  Horovod's Keras API.

Both have the same functions (the distributed optimizer, the first broadcast, metric averaging,
sync batch norm, the elastic state, what a checkpoint holds, the export); the rest of hvd_train
asks `active()` for them. The choice (`runtime.keras`):

- `auto`: the Keras of the model. The built-in models use Keras 3 on TensorFlow 2.16+ and
  Keras 2 on 2.15; a `model.factory` is trained with the Keras of the model it returns
  (`of_model`).
- `keras` or `tf_keras`: that one, for every model.

`prepare(choice)` runs before TensorFlow is imported: with `tf_keras` on TensorFlow 2.16+ it
sets TF_USE_LEGACY_KERAS=1, so that a factory written with `tf.keras` builds Keras 2 models.
With `keras` or `auto` it leaves `tf.keras` as TensorFlow gives it (Keras 3 on 2.16+).

Reads package metadata only; imports no TensorFlow until a binding is activated.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import zipfile
from collections.abc import Iterator
from importlib import metadata
from types import ModuleType
from typing import cast

from hvd_train.base import deferred
from hvd_train.base.errors import ConfigError
from hvd_train.runtime.keras.contract import KerasBinding

KERAS3 = "keras"  # the `runtime.keras` value and `versions.keras`'s package name
KERAS2 = "tf_keras"
CHOICES = ("auto", KERAS3, KERAS2)
# The TensorFlow wheels' distribution names (tensorflow-cpu: CPU-only Linux wheel).
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
_KERAS3_FROM = (2, 16)  # the first TensorFlow whose `keras` is Keras 3
_MODULES = {KERAS3: "hvd_train.runtime.keras.v3", KERAS2: "hvd_train.runtime.keras.v2"}

_active: KerasBinding | None = None


class KerasChoiceError(ConfigError):
    """`runtime.keras` names a Keras this TensorFlow cannot train with (exit code 2)."""


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


def has_keras3(tf_version: str | None = None) -> bool:
    """True on TensorFlow 2.16+, where `keras` is Keras 3 and Keras 2 the tf_keras package."""
    return version_tuple(tf_version or installed_tensorflow()) >= _KERAS3_FROM


def require_keras3(module: str) -> None:
    """Raises one ImportError line where `module` (a Keras 3 API of hvd_train's) is imported
    on a TensorFlow without Keras 3, pointing at Horovod's own Keras 2 API."""
    if has_keras3():
        return
    tf = installed_tensorflow()
    raise ImportError(
        f"{module} needs Keras 3, which comes with TensorFlow 2.16 or later; "
        + (f"this is TensorFlow {tf}" if tf else "TensorFlow is not installed")
        + ": for tf.keras (Keras 2) use horovod.tensorflow.keras"
    )


def default(tf_version: str | None = None) -> str:
    """The Keras of the built-in models: Keras 3 on TensorFlow 2.16+, Keras 2 on 2.15."""
    return KERAS3 if has_keras3(tf_version) else KERAS2


def resolve(choice: str, tf_version: str | None = None) -> str:
    """`runtime.keras` -> the Keras the run starts with (`auto`: the default).

    Raises:
        KerasChoiceError: `keras` on TensorFlow 2.15, which has no Keras 3.
    """
    if choice == "auto":
        return default(tf_version)
    if choice == KERAS3 and not has_keras3(tf_version):
        raise KerasChoiceError(
            f"runtime.keras: keras (Keras 3) needs TensorFlow 2.16 or later; this is TensorFlow "
            f"{tf_version or installed_tensorflow()}: use runtime.keras: tf_keras or auto"
        )
    return choice


def prepare(choice: str) -> str:
    """Before TensorFlow is imported: makes `tf.keras` Keras 2 where `runtime.keras` is tf_keras
    (TF_USE_LEGACY_KERAS=1 on 2.16+; TensorFlow reads it once, at its import); returns the
    resolved choice."""
    name = resolve(choice)
    if name == KERAS2 and has_keras3():
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    return name


def import_tensorflow() -> None:
    """After `prepare`: imports TensorFlow, and with it Keras 3, as a worker starts
    (base/deferred.py: matplotlib left for its first use, the collector kept off TensorFlow's
    objects)."""
    deferred.import_tensorflow()


def load(name: str) -> KerasBinding:
    """`name`'s binding module (imports its Keras), as the contract types it."""
    return cast(KerasBinding, importlib.import_module(_MODULES[name]))


def activate(name: str) -> KerasBinding:
    """Makes `name`'s binding the one this process trains with; returns it."""
    global _active
    _active = load(name)
    return _active


def chosen() -> KerasBinding | None:
    """The binding `activate` made active, or None while none has been."""
    return _active


def active() -> KerasBinding:
    """The binding this process trains with (the default one until `activate` chose)."""
    return _active or activate(default())


@contextlib.contextmanager
def activated(name: str) -> Iterator[KerasBinding]:
    """`name`'s binding active inside the block, the one active before it after (tests)."""
    global _active
    before = _active
    try:
        yield activate(name)
    finally:
        _active = before


def of(model: object) -> KerasBinding:
    """The binding of `model`'s Keras, without making it the active one (a user's own
    `model.fit` script chooses no binding for the rest of hvd_train); the active one for an
    object of neither Keras."""
    name = of_model(model)
    return load(name) if name else active()


def keras() -> ModuleType:
    """The active binding's Keras module (`keras`, or `tf_keras` / `tf.keras`)."""
    return active().keras


def of_model(model: object) -> str | None:
    """The Keras whose Model `model` is: KERAS3, KERAS2, or None for something else.

    Decided by the class's package, without importing a Keras the model does not come from.
    """
    for cls in type(model).__mro__:
        package = cls.__module__.split(".")[0]
        if cls.__name__ in ("Model", "Functional", "Sequential") and package in (
            "keras",
            "tf_keras",
        ):
            if package == "tf_keras":
                return KERAS2
            # TensorFlow 2.15's tf.keras is the `keras` package at version 2.
            return KERAS3 if has_keras3() else KERAS2
    return None


def of_saved(path: str) -> str | None:
    """The Keras that wrote a saved model: a `.keras` file says so in its metadata.json
    (`keras_version`); a SavedModel folder is Keras 2's; None where the file does not say
    (`.h5`, which both Kerases read)."""
    if os.path.isdir(path):
        return KERAS2
    try:
        with zipfile.ZipFile(path) as z, z.open("metadata.json") as f:
            version = json.load(f).get("keras_version", "")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return KERAS3 if version_tuple(version) >= (3,) else KERAS2


def describe(name: str) -> str:
    """summary.json's `versions.keras`: `"keras 3.15.1"`, `"tf_keras 2.21.0"` (`"keras 2.15.0"`
    on TensorFlow 2.15, whose Keras 2 is the keras package)."""
    package = KERAS2 if name == KERAS2 and has_keras3() else "keras"
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return f"{package} (not installed)"
