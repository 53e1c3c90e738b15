"""The base of hvd_train's own callbacks: a Keras callback for either Keras.

Keras 3's and Keras 2's `fit` call their callbacks through a CallbackList that needs, of each
callback, the same few methods: `set_model`, `set_params` and the `on_*` hooks, and on Keras 2
also whether the batch hooks are implemented (so it can skip them). A class that has those is
a callback to both, so one class serves either binding (runtime/keras/binding.py), and the binding
can be chosen after the model is built.

Each step's logs reach these hooks as tensors (`_supports_tf_logs`): reading one brings it to
the host, which on a GPU waits for the step to finish, so a hook reads the logs only where it
acts on them (an agreement, a progress line), never at every step. Keras 2 honours the flag
itself; Keras 3 converts every step's logs for every callback, so the Keras 3 binding gives
`fit` a callback list of its own that honours it too (runtime/keras/v3.py `CallbackList`).

Not for the callbacks that extend Keras' own classes (the progress bar, TensorBoard,
ReduceLROnPlateau): those are made from the active Keras' class (see their modules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _default(method: Callable[..., None]) -> Callable[..., None]:
    """Marks a hook as one that does nothing, as Keras' own `default` decorator does."""
    method._is_default = True  # type: ignore[attr-defined]
    return method


class Callback:
    """A Keras callback (Keras 3 or 2); override the hooks you need."""

    # The logs as tensors, read only where needed (Keras 2's flag; Keras 3: see above).
    _supports_tf_logs = True

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    # The hooks below do nothing until overridden; each is marked as Keras marks its own
    # defaults (`_is_default`), so Keras 2's batch hooks skip it (runtime/keras/v2.py).
    @_default
    def on_train_begin(self, logs: dict | None = None) -> None: ...
    @_default
    def on_train_end(self, logs: dict | None = None) -> None: ...
    @_default
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_test_begin(self, logs: dict | None = None) -> None: ...
    @_default
    def on_test_end(self, logs: dict | None = None) -> None: ...
    @_default
    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_predict_begin(self, logs: dict | None = None) -> None: ...
    @_default
    def on_predict_end(self, logs: dict | None = None) -> None: ...
    @_default
    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    @_default
    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None: ...

    def steps_done(self, batch: int) -> int:
        """The steps of this `fit`'s epoch done once the call into TensorFlow whose last step
        Keras indexes `batch` has run: a call runs `train.steps_per_execution` steps, and the
        last call of a part-done epoch may run fewer than its index says (Keras 3 stops at the
        end of its data), never past the epoch (`params["steps"]`)."""
        return min(batch + 1, self.params.get("steps") or batch + 1)

    # Whether the training batch hooks can do anything in this run: a callback whose hooks act
    # only at mid-epoch points that the config may leave unset sets it from the config.
    mid_epoch = True

    def acts_mid_epoch(self) -> bool:
        return self.mid_epoch

    # Keras 2's CallbackList asks these to skip the batch hooks no callback implements (the
    # binding's list, runtime/keras/v2.py, asks callback by callback).
    def _implements_train_batch_hooks(self) -> bool:
        return self.acts_mid_epoch() and self._overrides(
            "on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end"
        )

    def _implements_test_batch_hooks(self) -> bool:
        return self._overrides("on_test_batch_begin", "on_test_batch_end")

    def _implements_predict_batch_hooks(self) -> bool:
        return self._overrides("on_predict_batch_begin", "on_predict_batch_end")

    def _overrides(self, *hooks: str) -> bool:
        """Whether any of `hooks` is more than a default that does nothing (the marker above)."""
        return not all(getattr(getattr(self, h), "_is_default", False) for h in hooks)


def passes(every: int | None, before: int, after: int) -> bool:
    """Whether going from step `before` to step `after` reaches or passes a multiple of
    `every` (one step at a time: whether `after` is one); never for no `every`."""
    return bool(every) and before // every < after // every
