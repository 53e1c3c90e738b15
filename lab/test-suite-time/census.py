"""The census of a `make test` run's Python processes (census/sitecustomize.py's log): how many
imported TensorFlow and their CPU seconds, the training workers among them, the rest; then the
test files whose processes used the most CPU.

Usage: python3 census.py LOG.jsonl
"""

import collections
import json
import sys


def main(path: str) -> None:
    # A process id counts once (the last line it wrote), whatever wrote twice.
    procs = {}
    with open(path) as f:
        for line in f:
            p = json.loads(line)
            procs[p["pid"]] = p
    rows = {
        "imported TensorFlow": [p for p in procs.values() if p["tensorflow"]],
        "of them, training workers (python -m hvd_train --config ...)": [
            p
            for p in procs.values()
            if p["tensorflow"]
            and p["argv"][1:2] == ["--config"]
            and p["argv"][0].endswith("hvd_train/__main__.py")
        ],
        "did not": [p for p in procs.values() if not p["tensorflow"]],
    }
    print(f"{len(procs)} Python processes\n")
    print("| processes | how many | CPU s | CPU s each |\n|---|---:|---:|---:|")
    for name, ps in rows.items():
        cpu = sum(p["cpu_s"] for p in ps)
        print(f"| {name} | {len(ps)} | {cpu:.0f} | {cpu / max(len(ps), 1):.1f} |")
    by_file = collections.Counter()
    for p in procs.values():
        by_file[p["test"].split("::")[0] or "(no test)"] += p["cpu_s"]
    print("\n| test file | CPU s of its processes |\n|---|---:|")
    for name, cpu in by_file.most_common(12):
        print(f"| {name} | {cpu:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])
