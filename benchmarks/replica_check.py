"""What the replica check (`runtime.check_replicas`) costs, against an epoch of the quickstart.

    .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python benchmarks/replica_check.py

Every rank trains the shipped quickstart for 4 epochs with the check off (a scratch run.dir),
then times, on the trained model, what the check does at each epoch's end: the moving
statistics' average (`replicas.average_moving_statistics`, also done without the check), the
hashing alone, and the check itself (`replicas.disagreement`: every replicated variable hashed,
one all-reduce), each
`--repeats` times, interleaved. Rank 0 prints the medians and their share of the median epoch's
training time (metrics.csv `epoch_time_s`, the first epoch left out: it traces the step). The
check runs once per epoch (and before each mid-epoch checkpoint), so that share is its cost.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time

from hvd_train.config import load_config
from hvd_train.runtime import binding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    from hvd_train.train.trainer import train

    model, _ = train(cfg)
    named = replicas.replicated_variables(model)  # found once a `fit`, as the callback does
    timings: dict[str, list[float]] = {"average": [], "hash": [], "check": []}
    for _ in range(args.repeats):
        for name, fn in (("average", replicas.average_moving_statistics),
                         ("hash", lambda m: [replicas.fingerprint(v) for _, v in named]),
                         ("check", lambda m: replicas.disagreement(m, named))):  # fmt: skip
            distributed.barrier("bench.replica_check")
            start = time.perf_counter()
            fn(model)
            timings[name].append(time.perf_counter() - start)
    if not distributed.is_chief():
        return
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))[1:]  # the first epoch traces the step
        epoch_s = statistics.median(float(r["epoch_time_s"]) for r in rows)
    count, size = len(named), sum(int(v.numpy().size) for _, v in named)
    print(f"{distributed.size()} workers, {count} replicated variables ({size} values), "
          f"median epoch {epoch_s:.3f} s, {args.repeats} repeats")  # fmt: skip
    print("| step | median ms | of an epoch |")
    print("|---|---:|---:|")
    for name, values in timings.items():
        ms = 1000 * statistics.median(values)
        print(f"| {name} | {ms:.2f} | {ms / 1000 / epoch_s:.2%} |")


if __name__ == "__main__":
    main()
