"""What the replica check (`runtime.check_replicas`) costs, against an epoch of the quickstart.

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python lab/replica-check/replica_check.py

Every rank trains the shipped quickstart for 4 epochs with the check off (a scratch run.dir),
then times, on the trained model, what an epoch's end does with and without the check, each
`--repeats` times, interleaved, a barrier before each:
- `average`: the moving statistics' average (done with the check or without);
- `hash`: this rank's fingerprints alone (`Fingerprints.mine`);
- `gather`: the all-gather of the random states that an epoch's end does anyway;
- `gather + check`: the same all-gather carrying the fingerprints, and their comparison: what
  the check makes of an epoch's end; its cost is the difference from `gather` (each repeat's
  pair, then their median);
- `check alone`: the fingerprints all-gathered by themselves and compared, as at a step that
  `runtime.check_replicas_every_steps` adds;
- `hash, joined` and `gather + check, joined`: the same with the fingerprints a GPU worker takes
  (`Fingerprints(model, joined=True)`: the variables joined a group at a time by traced
  functions, then copied to host memory), here on the CPU, its tracing done before the repeats.
Rank 0 prints the medians and their share of the median epoch's training time (metrics.csv
`epoch_time_s`, the first epoch left out: it traces the step).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time

from hvd_train.config import load_config
from hvd_train.runtime.keras import binding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "quickstart.yaml"))
    args = parser.parse_args()
    run_dir = tempfile.mkdtemp(prefix=f"replica-check-{os.environ.get('HOROVOD_RANK', '0')}-")
    cfg = load_config(args.config, [f"run.dir={run_dir}", "train.epochs=4",
                                    "runtime.check_replicas=off", "train.verbose=false",
                                    "logging.tensorboard=false"])  # fmt: skip
    binding.prepare(cfg.runtime.keras)
    binding.import_tensorflow()
    from hvd_train.runtime import distributed, replicas
    from hvd_train.train.callbacks import random_states
    from hvd_train.train.run.trainer import train

    model, _ = train(cfg)
    prints = replicas.Fingerprints(model)  # made once a `fit`, as the callback does
    joined = replicas.Fingerprints(model, joined=True)
    joined.mine()  # traced once a process
    names = [n for n, _ in prints.named]

    def gather(also):
        mine = (random_states.read(model), random_states.window_sums(model), also and also())
        return distributed.allgather_object(mine, name="bench.random_states")

    steps = {
        "average": lambda: replicas.average_moving_statistics(model),
        "hash": prints.mine,
        "gather": lambda: gather(None),
        "gather + check": lambda: replicas.disagreement(
            names, [also for _, _, also in gather(prints.mine)]
        ),
        "check alone": lambda: replicas.disagreement(names, prints.gather()),
        "hash, joined": joined.mine,
        "gather + check, joined": lambda: replicas.disagreement(
            names, [also for _, _, also in gather(joined.mine)]
        ),
    }
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, fn in steps.items():
            distributed.barrier("bench.replica_check")
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    if not distributed.is_chief():
        return
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))[1:]  # the first epoch traces the step
        epoch_s = statistics.median(float(r["epoch_time_s"]) for r in rows)
    size = sum(int(v.shape.num_elements()) for _, v in prints.named)
    print(f"{distributed.size()} workers, {len(names)} replicated variables ({size} values), "
          f"median epoch {epoch_s:.3f} s, {args.repeats} repeats")  # fmt: skip
    print("| step | median ms | of an epoch |")
    print("|---|---:|---:|")
    medians = {name: 1000 * statistics.median(values) for name, values in timings.items()}
    # What the check adds to an epoch's end: each repeat's pair, then their median.
    for suffix in ("", ", joined"):
        pairs = zip(timings[f"gather + check{suffix}"], timings["gather"], strict=True)
        added = [c - g for c, g in pairs]
        medians[f"the check at an epoch's end{suffix}"] = 1000 * statistics.median(added)
    for name, ms in medians.items():
        print(f"| {name} | {ms:.2f} | {ms / 1000 / epoch_s:.2%} |")


if __name__ == "__main__":
    main()
