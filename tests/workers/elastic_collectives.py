"""Run by tests/test_elastic.py: hvd_train's Horovod Elastic run decorator
(`replicas.elastic_run`) around a loop of grouped all-reduces, as the Keras 3 step does them.

    elastic_collectives.py lost OUT         # under an elastic horovodrun of 2 workers: rank 1
                                            # exits after step 3; the survivor must reset
    elastic_collectives.py unreadable OUT   # alone: an image read over the network fails

Each rank writes OUT/rank-<r>.json when its run returns or raises.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState

from hvd_train.runtime import replicas

STEPS = 6


def main(mode: str, out: pathlib.Path) -> None:
    hvd.init()
    state = ObjectState(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, steps=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    tensors = [tf.Variable(tf.fill([1000], 1.0)) for _ in range(3)]

    @tf.function
    def step() -> list[tf.Tensor]:
        return hvd.grouped_allreduce([t * 1.0 for t in tensors], op=hvd.Average)

    @replicas.elastic_run
    def run(state: ObjectState) -> None:
        while state.steps < STEPS:
            if mode == "unreadable" and state.steps == 2:
                raise tf.errors.UnknownError(None, None, "gs://b/17.png: Connection reset by peer")
            step()
            state.steps += 1
            state.commit()
            if mode == "lost" and hvd.rank() == 1 and hvd.size() == 2 and state.steps == 3:
                os._exit(1)  # the survivor's next collective is the grouped all-reduce

    rank = hvd.rank()
    report = {"resets": resets}
    try:
        run(state)
    except Exception as e:
        report["raised"] = type(e).__name__
    report |= {"steps": state.steps, "size": hvd.size()}
    (out / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], pathlib.Path(sys.argv[2]))
