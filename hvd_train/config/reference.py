"""docs/config.md, generated from the schema's field comments (`hvd-train config --reference`)."""

from __future__ import annotations

import re

from hvd_train.config import typed_yaml
from hvd_train.config.schema import Config
from hvd_train.config.typed_yaml import (
    MAX_CONFIG_BYTES,
    MAX_OVERRIDE_BYTES,
    MAX_STRING,
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
)


def reference() -> str:
    """docs/config.md: how a config is read, then every key with its type, default, allowed
    values and the comment beside its field above (`hvd-train config --reference`)."""
    tables = typed_yaml.reference(Config)
    return REFERENCE_INTRO + re.sub(r"\bdocs/(\w+\.md)", r"[\1](\1)", tables)  # links from docs/


REFERENCE_INTRO = f"""\
# Config: every key

<!-- Generated from hvd_train/config/schema.py by `hvd-train config --reference > docs/config.md`
(and config.schema.json by `hvd-train config --schema > docs/config.schema.json`): edit the
comments beside the fields there. tests/test_docs.py fails when either file is stale. -->

You are writing a config, or reading one, and want to know what a key does. One YAML file
drives a run, and every key has a default, so a file holds only what it changes:

```yaml
# hvd-train launch --np 2 --config my_run.yaml
run:
  dir: runs/my_run
train:
  epochs: 12
  batch_size: 32          # per worker
optimizer:
  name: adam
  learning_rate: 0.001
  warmup_epochs: 2
data:
  source: digits
```

- **Order:** the defaults, then the file (`--config FILE`), then each `--set a.b=value` in
  the order given, written in YAML (`--set model.dense_units=[64,32]`). Every command that
  takes `--config` takes `--set`.
- **Strict at load:** an unknown key or a wrong type ends the run with one line naming the
  file, the dotted key and what was expected, exit code 2 and no traceback:
  `hvd_train: error: FILE: train.batchsize: unknown key; did you mean train.batch_size?`
- **Rules that span keys** run once after the merge, and then the config is frozen: a
  `global` batch must divide by the worker count; `horovod.stall_shutdown_s` must exceed
  `horovod.stall_warning_s` (or be 0); `elastic.enabled` needs `elastic.discovery_script`,
  and `elastic.max_workers` may not be below `elastic.min_workers`; the `step` schedule needs
  boundaries after the warm-up, `warmup_decay` a warm-up shorter than the run; `image_folder`
  and `tfrecord` need `data.train_dir`, `data.image_size` as [height, width] and 1 or 3
  `data.channels`; `data.read: stream` needs one of them and no `data.cache: memory`;
  `model.weights` and `model.trainable_base` apply to the Keras Applications bases only;
  `logging.profile_steps` is `[first, last]` or `[]`.
- **Bounds:** a config file holds at most {MAX_CONFIG_BYTES // 2**20} MiB and one `--set` \
{MAX_OVERRIDE_BYTES // 2**10} KiB; a document at most {MAX_YAML_VALUES:,} YAML values once its \
aliases are expanded, nested {MAX_YAML_DEPTH} deep; a string {MAX_STRING:,} characters (a name \
or a path). [security.md](security.md) says why.
- **What a run will use:** `hvd-train config --config FILE [--set ...]` prints the resolved
  config, and `--get train.batch_size` one key; every run writes it to `run.dir/config.yaml`.

## In an editor

[config.schema.json](config.schema.json) is this page as a JSON Schema (draft 2020-12),
printed by `hvd-train config --schema` from the same fields. An editor that reads it completes
keys, shows each key's meaning and default, and marks an unknown key, a wrong type, a value out
of range or not among the choices as you type. It checks each key alone: the rules that span
keys are the loader's, and where an editor and a run disagree, the run's one-line error is the
one to follow.

VS Code reads it through Red Hat's YAML extension; Neovim, Helix, Emacs and other editors
through the same yaml-language-server. Either name the schema in a config, in a comment on any
line (the path is relative to the YAML file, here one in configs/; a URL works too):

```yaml
# yaml-language-server: $schema=../docs/config.schema.json
run:
  dir: runs/my_run
```

or map it once onto every config of some folders with the `yaml.schemas` setting, in the
workspace's `.vscode/settings.json` (the schema's path and the globs are relative to the
workspace's folder):

```json
{{
  "yaml.schemas": {{
    "./docs/config.schema.json": ["configs/*.yaml", "examples/*.yaml"]
  }}
}}
```

Outside this repository, write the schema of the hvd_train you installed beside your configs,
`hvd-train config --schema > hvd_train.schema.json`, and point at that file instead.

"""
