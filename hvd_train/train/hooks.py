"""The base of hvd_train's own callbacks: a Keras callback for either Keras.

Keras 3's and Keras 2's `fit` call their callbacks through a CallbackList that needs, of each
callback, the same few methods: `set_model`, `set_params` and the `on_*` hooks, and on Keras 2
also whether the batch hooks are implemented (so it can skip them). A class that has those is
a callback to both, so one class serves either binding (runtime/binding.py), and the binding
can be chosen after the model is built.

Not for the callbacks that extend Keras' own classes (the progress bar, TensorBoard,
ReduceLROnPlateau): those are made from the active Keras' class (see their modules).
"""

from __future__ import annotations

from typing import Any


class Callback:
    """A Keras callback (Keras 3 or 2); override the hooks you need."""

    # Keras 2: a callback that reads its batch logs only now and then may take them as
    # tensors, so that Keras does not convert them to NumPy at every step for it.
    _supports_tf_logs = False

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def on_train_begin(self, logs: dict | None = None) -> None: ...
    def on_train_end(self, logs: dict | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_begin(self, logs: dict | None = None) -> None: ...
    def on_test_end(self, logs: dict | None = None) -> None: ...
    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_begin(self, logs: dict | None = None) -> None: ...
    def on_predict_end(self, logs: dict | None = None) -> None: ...
    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None: ...

    # Keras 2's CallbackList asks these to skip the batch hooks no callback implements.
    def _implements_train_batch_hooks(self) -> bool:
        return self._overrides("on_batch_begin", "on_batch_end", "on_train_batch_begin",
                               "on_train_batch_end")  # fmt: skip

    def _implements_test_batch_hooks(self) -> bool:
        return self._overrides("on_test_batch_begin", "on_test_batch_end")

    def _implements_predict_batch_hooks(self) -> bool:
        return self._overrides("on_predict_batch_begin", "on_predict_batch_end")

    def _overrides(self, *hooks: str) -> bool:
        return any(getattr(type(self), h) is not getattr(Callback, h) for h in hooks)
