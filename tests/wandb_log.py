"""What an offline W&B run wrote, read back from its transaction log (`run-<id>.wandb`).

wandb 0.31 keeps no Python reader of its own (its service, wandb-core, writes the log): the
format is LevelDB's log (32 KiB blocks of records, each with a 7-byte header: CRC32C, length,
kind FULL/FIRST/MIDDLE/LAST) after a 7-byte W&B header, and each record is a protobuf `Record`
of wandb.proto.wandb_internal_pb2. Skipped where wandb is not installed, with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import struct
from dataclasses import dataclass, field
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def unavailable() -> str | None:
    """Why the W&B tests cannot run here, or None when they can."""
    if importlib.util.find_spec("wandb") is None:
        return "wandb is not installed: HVD_TRAIN_WANDB=1 make install (make test installs it)"
    return None


@dataclass
class Logged:
    """One offline W&B run folder's records, as W&B would show the run."""

    run_id: str = ""
    project: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per log call
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # None: never finished
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # name, type, files

    def by_epoch(self, key: str) -> dict[int, float]:
        return {int(row["epoch"]): row[key] for row in self.history if key in row}


def records(path: pathlib.Path):
    """Every protobuf Record of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header: zeros
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # padding to the block's end
            pos += left
            continue
        parts += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def read(run_folder: str | pathlib.Path) -> Logged:
    """The run in `run_folder` (summary.json's `wandb.dir`)."""
    (path,) = pathlib.Path(run_folder).glob("run-*.wandb")
    logged = Logged()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            logged.run_id, logged.project = record.run.run_id, record.run.project
            logged.name = record.run.display_name
            for item in record.run.config.update:
                logged.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                logged.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            logged.history.append({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "summary":
            for item in record.summary.update:
                logged.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "exit":
            logged.exit_code = record.exit.exit_code
        elif kind == "artifact":
            files = sorted(c.path for c in record.artifact.manifest.contents)
            logged.artifacts.append({"name": record.artifact.name,
                                     "type": record.artifact.type, "files": files})  # fmt: skip
    return logged
