"""Reading a config: the file and `--set` overrides into the frozen tree, and back to YAML."""

from __future__ import annotations

import os
import typing
from typing import Any

import yaml

from hvd_train.config import typed_yaml
from hvd_train.config.schema import Config


def load_config(path: str | os.PathLike | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Reads a YAML config, applies `key=value` overrides and returns the frozen tree.

    Args:
        path: YAML file, or None for the defaults alone.
        overrides: `a.b=value` strings, applied in order; values are YAML scalars or lists.

    Raises:
        ConfigError: naming the file (or override), the dotted key and what was expected.
    """
    return typed_yaml.load(Config, path, overrides)


def to_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain YAML-able data (tuples become lists)."""
    out = typed_yaml.plain(cfg)
    out["callbacks"] = [c.as_dict() for c in cfg.callbacks]  # `class`, as the YAML spells it
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def add_config_arguments(
    p: Any,
    config_help: str = "YAML config file",
    set_help: str = "override a config key, e.g. --set train.epochs=5 (repeatable, applied in order)",
    required: bool = True,
) -> None:
    """`--config FILE` and repeatable `--set KEY=VALUE` (into `overrides`) on an argparse parser:
    the same two options on every command that reads a config through `load_config`."""
    p.add_argument("--config", required=required, help=config_help)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )
