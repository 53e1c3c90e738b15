"""`hvd-train config` (also `python -m hvd_train.config`): the resolved config, or single keys."""

from __future__ import annotations

import argparse
import sys

from hvd_train.base.errors import ConfigError
from hvd_train.config import add_config_arguments, dump_yaml, load_config, reference, schema_text
from hvd_train.config.typed_yaml import get


def main(argv: list[str] | None = None, prog: str = "hvd-train config") -> int:
    """`python -m hvd_train.config --config F [--set k=v ...] [--get KEY ...]`, for launch scripts.

    Prints the resolved YAML, or with `--get` each key's value on its own line; with
    `--reference`, docs/config.md; with `--schema`, docs/config.schema.json.
    """
    p = argparse.ArgumentParser(
        prog=prog,
        description="Print the resolved config (defaults, then the file, then each --set) as "
        "YAML, or with --get the value of each KEY on its own line.",
        epilog="Docs: docs/config.md (every key, as --reference prints; editors: --schema)",
    )
    add_config_arguments(p, required=False)
    p.add_argument(
        "--get", action="append", default=[], metavar="KEY",
        help="print this dotted key's value instead, e.g. --get train.epochs (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--reference", action="store_true",
        help="print every key with its type, default and meaning, as Markdown (docs/config.md)",
    )  # fmt: skip
    p.add_argument(
        "--schema", action="store_true",
        help="print the config's JSON Schema (draft 2020-12), for editors "
        "(docs/config.schema.json)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.reference or args.schema:
        sys.stdout.write(reference() if args.reference else schema_text())
        return 0
    if args.config is None:
        p.error("the following arguments are required: --config")
    try:
        cfg = load_config(args.config, args.overrides)
        values = [get(cfg, key) for key in args.get]
    except ConfigError as e:
        print(f"hvd_train: error: {e}", file=sys.stderr)
        return 2
    if not args.get:
        sys.stdout.write(dump_yaml(cfg))
    for v in values:
        print("" if v is None else (str(v).lower() if isinstance(v, bool) else v))
    return 0
