"""What a second busy core costs one, with no communication at all: a loop on one core alone,
then beside the same loop on another core, for a loop that touches no memory and for working
sets from a core's own caches to main memory. Prints, per loop, the median over repeats of
(the pair's mean rate / the rate alone), and each repeat's.

    .venv/bin/python lab/second-busy-core/shared_cache.py
    .venv/bin/python lab/second-busy-core/shared_cache.py --repeats 7 --seconds 2 --out /tmp/cache.json

This is the part of two workers' shortfall against twice one worker that neither Horovod nor
hvd_train takes (compare_peers.py's launch@1-independent measures it with the real worker):
what the compute loop, which touches no memory, loses beside another is the host's (its
clocks, its other tenants); the memory loops add what the cores share (the last-level cache,
memory bandwidth). The loops run interleaved, each in a fresh process bound to its core; a
pair starts at one agreed moment and both count what they did in the same window. Needs two
cores. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

# A loop's name and its working set in bytes (0: no memory). The sizes straddle this kind of
# machine's caches: 96 KiB of L1d and 2 MiB of L2 per core, 32 MiB of L3 shared.
LOOPS = {"compute": 0, "1MiB": 1 << 20, "8MiB": 8 << 20, "16MiB": 16 << 20, "32MiB": 32 << 20,
         "256MiB": 256 << 20}  # fmt: skip


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5, help="each run's timed window")
    p.add_argument("--cores", default=None, help="two cores, e.g. 0,1 (default: the first two)")
    p.add_argument("--out", default=None, help="write every run's rates here as JSON")
    p.add_argument("--child", nargs=4, metavar=("LOOP", "CORE", "START", "SECONDS"),
                   help=argparse.SUPPRESS)  # fmt: skip
    return p.parse_args()


def make_step(loop: str) -> Callable[[], int]:
    """One pass of `loop`; it returns what the pass did: bytes read and written (a memory
    loop over its arrays, made once here), or iterations (compute)."""
    if LOOPS[loop] == 0:

        def compute() -> int:
            s = 0
            for i in range(20_000):
                s += i * i
            return 20_000

        return compute
    import numpy as np  # only the children need it

    a = np.ones(LOOPS[loop] // 8, np.float32)  # two arrays of half the working set each
    b = np.empty_like(a)

    def memory() -> int:
        np.add(a, 1.0, out=b)
        return 2 * a.nbytes

    return memory


def rate(step: Callable[[], int], seconds: float) -> float:
    """What `step` does a second, run over and over for `seconds`."""
    done, start = 0, time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        done += step()
    return done / (now - start)


def child(loop: str, core: int, start_at: float, seconds: float) -> None:
    os.sched_setaffinity(0, {core})
    step = make_step(loop)
    rate(step, 0.2)  # warm: page the arrays in, fill the caches
    time.sleep(max(0.0, start_at - time.time()))
    print(json.dumps({"loop": loop, "core": core, "rate": rate(step, seconds)}))


def measure(loop: str, cores: list[int], seconds: float) -> list[float]:
    """The rates of `loop` run at once on each of `cores`, each in a fresh process."""
    start_at = time.time() + 1.0  # after every child has started and warmed up
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", loop, str(c), str(start_at), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in cores
    ]
    rates = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"shared_cache: the {loop} loop failed (exit {p.returncode})")
        rates.append(json.loads(out)["rate"])
    return rates


def main() -> None:
    args = parse()
    if args.child:
        loop, core, start_at, seconds = args.child
        child(loop, int(core), float(start_at), float(seconds))
        return
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(
        os.sched_getaffinity(0))[:2]  # fmt: skip
    if len(cores) != 2:
        raise SystemExit("shared_cache: needs two cores")
    runs: dict[str, list[dict]] = {loop: [] for loop in LOOPS}
    for r in range(args.repeats):
        for loop in LOOPS:  # interleaved: drift on the machine spreads over every loop
            alone = measure(loop, cores[:1], args.seconds)[0]
            pair = measure(loop, cores, args.seconds)
            runs[loop].append(
                {"alone": alone, "pair": pair, "ratio": statistics.mean(pair) / alone}
            )
            print(f"repeat {r + 1} {loop:>8}: pair/alone {runs[loop][-1]['ratio']:.3f}", flush=True)
    print(f"\ncores {cores[0]} and {cores[1]}, {args.repeats} repeats of {args.seconds:g} s")
    print("| loop | working set | rate alone | pair / alone (median) | per repeat |")
    print("|---|---|---:|---:|---|")
    for loop, rs in runs.items():
        scale, unit = (1e6, "M it/s") if LOOPS[loop] == 0 else (1e9, "GB/s")
        alone = statistics.median(r["alone"] for r in rs) / scale
        ratios = [r["ratio"] for r in rs]
        print(f"| {loop} | {'none' if LOOPS[loop] == 0 else loop} | {alone:.1f} {unit} | "
              f"{statistics.median(ratios):.3f} | {', '.join(f'{x:.3f}' for x in ratios)} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cores": cores, "seconds": args.seconds, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
