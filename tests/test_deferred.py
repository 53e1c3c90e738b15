"""matplotlib left for its first use in a worker (hvd_train/base/deferred.py): TensorFlow's
import of Keras 3 no longer loads it, and whoever plots gets the real thing."""

from __future__ import annotations

import json

import pytest
from harness import PYTHON, check, run

from hvd_train.runtime.keras.binding import has_keras3

pytestmark = pytest.mark.processes

# A process's start as every command that trains, evaluates or predicts does it, alone (where
# `quiet_tensorflow` imports TensorFlow) or as a launcher's worker, then what a user's code may do with
# matplotlib, and Keras' own plotting, in one process.
SCRIPT = """
import json, sys
from hvd_train.base import logs
from hvd_train.runtime.keras import binding
binding.prepare("auto")
logs.quiet_tensorflow()
binding.import_tensorflow()
import gc, weakref
import keras
seen = {"loaded": sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib"),
        "frozen": gc.get_freeze_count(), "collector_on": gc.isenabled()}
class Cycle: pass
cycle = Cycle(); cycle.self = cycle; gone = weakref.ref(cycle); del cycle
gc.collect()
seen["cycle_collected"] = gone() is None
import matplotlib
matplotlib.use("Agg")
import matplotlib.colors
import matplotlib.pyplot as plt
from keras.src.visualization import plot_bounding_box_gallery, plot_image_gallery
fig = plt.figure()
fig.savefig(sys.argv[1])
seen.update(rgb=list(matplotlib.colors.to_rgb("red")),
            real=type(sys.modules["matplotlib.pyplot"]).__name__,
            keras_plt=plot_image_gallery.plt.figure is plt.figure,
            keras_patches=plot_bounding_box_gallery.patches.Rectangle.__module__)
print(json.dumps(seen))
"""


@pytest.mark.skipif(not has_keras3(), reason="TensorFlow 2.15: no Keras 3")
def test_a_worker_starts_without_matplotlib_and_plots_still_work(tmp_path) -> None:
    """After a lone process's `quiet_tensorflow` and the binding's `import_tensorflow`,
    TensorFlow and Keras 3 are imported and no matplotlib module is; then `matplotlib.use`, a
    submodule, pyplot and Keras' own references to pyplot and patches all reach the real
    modules. TensorFlow's objects are frozen (no collection walks them again), the collector is
    on, and a cycle made later is collected."""
    png = tmp_path / "figure.png"
    proc = check(run([PYTHON, "-c", SCRIPT, str(png)], tmp_path))
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == [], seen
    assert seen["frozen"] > 100_000 and seen["collector_on"] and seen["cycle_collected"], seen
    assert seen["rgb"] == [1.0, 0.0, 0.0] and seen["real"] == "module", seen
    assert seen["keras_plt"] and seen["keras_patches"] == "matplotlib.patches", seen
    assert png.read_bytes()[:4] == b"\x89PNG"
