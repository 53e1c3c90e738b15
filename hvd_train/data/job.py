"""The job: the config, its plan for this worker count and the data source, which travel
together through the training path; and a position in it (an epoch, the steps of it done)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hvd_train.config import Config, Derived, derive
from hvd_train.data.sources import Source


@dataclass(frozen=True)
class Job:
    """What one training job trains: the config, the plan `derive` made of it for the worker
    count, and the data. Frozen: under Horovod Elastic the plan follows the worker count, and
    `resized` returns a new job for it."""

    cfg: Config
    plan: Derived
    source: Source

    def resized(self, world_size: int) -> Job:
        """This job for `world_size` workers: the plan derived anew, config and data kept."""
        return replace(self, plan=derive(self.cfg, world_size, self.source.num_train))


def plan_job(cfg: Config, source: Source, world_size: int) -> Job:
    """The job of `cfg` on `source` for `world_size` workers (config/derived.py `derive`).

    Raises:
        ConfigError, DataError: the config cannot train `source` on `world_size` workers.
    """
    return Job(cfg, derive(cfg, world_size, source.num_train), source)


@dataclass(frozen=True)
class Position:
    """Where training is: `epoch` (0-based) with `step` of its steps already done."""

    epoch: int = 0
    step: int = 0
