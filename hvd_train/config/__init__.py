"""The config: its schema, the rules that span keys, and the values derived from it.

Shared by the trainer and every launcher (`hvd-train config`, `python -m hvd_train.config`), so
there is one parser and one set of rules. The order of precedence is: field defaults, then
`--config FILE`, then each `--set a.b=value` in the order given. Values are checked against the
field's type as they are merged (typed_yaml.py, the generic YAML-to-dataclasses loader); rules
that span fields run once after the merge (rules.py, `check`); derived values (per-worker and
global batch, scaled learning rate, steps per epoch) are computed in one place (derived.py,
`derive`), the run's plan.

Standard library and PyYAML only: every launcher reads its config without TensorFlow.
"""

from hvd_train.config.derived import Derived, derive
from hvd_train.config.json_schema import json_schema, schema_text
from hvd_train.config.loading import add_config_arguments, dump_yaml, load_config, to_dict
from hvd_train.config.reference import reference
from hvd_train.config.rules import APPLICATIONS, check
from hvd_train.config.schema import (
    REFUSED_CALLBACKS,
    AugmentConfig,
    CallbackConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    ElasticConfig,
    HorovodConfig,
    LaunchConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    RuntimeConfig,
    TrainConfig,
)

__all__ = [
    "APPLICATIONS", "REFUSED_CALLBACKS", "AugmentConfig", "CallbackConfig", "CheckpointConfig",
    "Config", "DataConfig", "Derived", "ElasticConfig", "HorovodConfig", "LaunchConfig",
    "LoggingConfig", "ModelConfig", "OptimizerConfig", "RunConfig", "RuntimeConfig",
    "TrainConfig", "add_config_arguments", "check", "derive", "dump_yaml", "json_schema",
    "load_config", "reference", "schema_text", "to_dict",
]  # fmt: skip
