"""TensorFlow's import as a process starts: matplotlib left for its first use, and the garbage
collector kept off TensorFlow's objects (`import_tensorflow`).

TensorFlow 2.16+ imports Keras 3 at its own import (whichever Keras trains), and Keras 3 imports
`matplotlib.pyplot` and `matplotlib.patches` there, where matplotlib is installed, for
`keras.visualization`: a noticeable part of every worker's start-up (docs/benchmarks.md,
"Start-up"), for plots a worker never draws. Inside `matplotlib_deferred()`, `import matplotlib.pyplot as plt`
and `from matplotlib import patches` give stand-ins; on leaving it, the stand-ins leave
`sys.modules`, so any later import is the real one. A stand-in kept by Keras imports the real
module at the first attribute read from it: Keras' plotting works as before, only later.

TensorFlow's import leaves hundreds of thousands of Python objects that the collector tracks
(its modules, classes, functions), none of them garbage, and every full collection after it
walked them all: while Keras builds and traces a model, which allocates fast, these collections
took a large share of a worker's start-up (docs/benchmarks.md, "Start-up"). Inside `collector_paused()` the collector is off; after
it, what exists is frozen (`gc.freeze`: a permanent generation no collection visits), as
long-running Python servers do after their imports. Garbage made later is collected as before.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator

# The submodules Keras 3 imports from matplotlib (keras/src/visualization).
_SUBMODULES = ("pyplot", "patches")
_NAMES = ("matplotlib", *(f"matplotlib.{name}" for name in _SUBMODULES))


class _Deferred(types.ModuleType):
    """Stands for the module of its name: any attribute it lacks comes from the real module,
    imported at that moment."""

    def __getattr__(self, attr: str):
        if attr in ("__path__", "__file__"):  # not a package to the import system; unloaded
            raise AttributeError(attr)
        _remove()  # read inside the window too: the real modules from now on
        return getattr(importlib.import_module(self.__name__), attr)


def _remove() -> None:
    """Takes the stand-ins out of sys.modules (those still there)."""
    for name in _NAMES:
        if isinstance(sys.modules.get(name), _Deferred):
            del sys.modules[name]


@contextlib.contextmanager
def matplotlib_deferred() -> Iterator[None]:
    """While it lasts, importing matplotlib, its pyplot or its patches gives stand-ins (nothing
    when matplotlib is not installed or already imported)."""
    if "matplotlib" in sys.modules or importlib.util.find_spec("matplotlib") is None:
        yield
        return
    package = _Deferred("matplotlib")
    stand_ins = {"matplotlib": package}
    for name in _SUBMODULES:
        stand_ins[f"matplotlib.{name}"] = module = _Deferred(f"matplotlib.{name}")
        setattr(package, name, module)
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        _remove()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector off while it lasts; then every object alive is frozen (left out of
    all later collections) and the collector is on again, if it was on before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def import_tensorflow() -> None:
    """Imports TensorFlow (and with it Keras 3), matplotlib deferred and the collector paused;
    nothing when it is imported already (a lone command's `logs.quiet_tensorflow` did)."""
    if "tensorflow" in sys.modules:
        return
    with matplotlib_deferred(), collector_paused():
        import tensorflow  # noqa: F401
