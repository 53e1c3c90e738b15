"""Run by tests/test_gpu_placement.py on every rank of a 2-worker job: the ranks' GPU check
(runtime/distributed.py `refuse_shared_gpu`), each rank given a stand-in GPU identity in place of
CUDA's answer, as a scheduler would place them.

    gpu_identity.py OUT

In turn: each rank on a GPU of its own (the same bus id on two machines, as two 8-GPU hosts
have); both ranks on one GPU; one rank without CUDA's driver (identity None); one rank on the
CPU (no GPU to check, yet in the gather: the other rank waits in it). Each rank writes
OUT/rank-<r>.json: {case: the error's message, or null}.
"""

from __future__ import annotations

import json
import pathlib
import sys

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
from hvd_train.base import gpus
from hvd_train.base.errors import UserError
from hvd_train.config import HorovodConfig
from hvd_train.runtime import distributed

# (machine, PCI bus id, host name) per rank; what base/gpus.py `identity` returns.
CASES = {
    "own gpus, two hosts": [("boot-a", "00000000:18:00.0", "gpu-a"),
                            ("boot-b", "00000000:18:00.0", "gpu-b")],
    "own gpus, one host": [("boot-a", "00000000:18:00.0", "gpu-a"),
                           ("boot-a", "00000000:2A:00.0", "gpu-a")],
    "one gpu": [("boot-a", "00000000:2A:00.0", "gpu-a"), ("boot-a", "00000000:2A:00.0", "gpu-a")],
    "no driver on one": [("boot-a", "00000000:2A:00.0", "gpu-a"), None],
    "one on the cpu": [("boot-a", "00000000:2A:00.0", "gpu-a"), "cpu"],
}  # fmt: skip


def main(out: pathlib.Path) -> None:
    distributed.init(HorovodConfig(), "")
    rank, seen = distributed.rank(), {}
    for case, identities in CASES.items():
        gpus.identity = lambda ordinal, mine=identities[rank]: mine  # CUDA's answer, stood in
        try:
            distributed.refuse_shared_gpu(None if identities[rank] == "cpu" else 0)
            seen[case] = None
        except UserError as e:
            seen[case] = str(e)
    distributed.barrier("gpu_identity.done")  # no rank was left in a gather
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
