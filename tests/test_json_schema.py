"""The config's JSON Schema, for editors: a valid schema that every config the loader accepts
passes and the invalid configs fail, under a real validator (jsonschema) with draft 2020-12's
rules and draft-07's, which yaml-language-server applies; the loader stays the word."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import re
from dataclasses import dataclass, field
from typing import Literal

import jsonschema
import pytest
import yaml
from harness import ROOT

from hvd_train import cli
from hvd_train.base.errors import ConfigError
from hvd_train.config import Config, check, json_schema, load_config, to_dict
from hvd_train.config.json_schema import object_schema

SHIPPED = sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")])
INVALID = sorted((ROOT / "tests" / "invalid_configs").glob("*.yaml"))
# Invalid configs the schema cannot see, and why: the loader alone refuses them.
LOADER_ONLY = {"bad_yaml.yaml": "not YAML: there is no document to validate"}
VALIDATORS = (jsonschema.Draft202012Validator, jsonschema.Draft7Validator)


class EditorLoader(yaml.SafeLoader):
    """YAML as an editor reads it (yaml-language-server reads YAML 1.2), where `1e-3` is a
    number; PyYAML reads YAML 1.1, where it is a string, which the loader takes for a float."""


EditorLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def errors(document: object) -> list[jsonschema.ValidationError]:
    """What each validator finds wrong in `document`; both must agree on whether it is valid."""
    found = [list(v(json_schema()).iter_errors(document)) for v in VALIDATORS]
    assert bool(found[0]) == bool(found[1]), [[e.message for e in f] for f in found]
    return found[0]


def dotted(path: object) -> str:
    """A validation error's path as the loader writes a key: `callbacks[0].class`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


@pytest.mark.parametrize("validator", VALIDATORS, ids=lambda v: v.__name__)
def test_the_schema_is_a_valid_json_schema_under_both_drafts(validator) -> None:
    """docs/config.schema.json is a schema under draft 2020-12's meta-schema (what it declares)
    and draft-07's (what yaml-language-server checks with)."""
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator.check_schema(schema)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_validates(path: pathlib.Path) -> None:
    """Each YAML of configs/ and examples/ that the loader accepts passes the schema."""
    load_config(path)
    document = yaml.load(path.read_text(), Loader=EditorLoader)
    assert [e.message for e in errors(document)] == []


def test_the_shipped_configs_are_found() -> None:
    """Both folders are read, so the test above cannot pass by finding no config."""
    assert {"quickstart.yaml", "my_model.yaml"} <= {p.name for p in SHIPPED}


@pytest.mark.parametrize(
    "text",
    [
        "",  # an empty file: the defaults
        "train:\nruntime:\ncallbacks:\n",  # a section, or the list, with nothing under it
        "train: {verbose: true}\nruntime: {check_replicas: off}\n",  # old booleans
        "model: {name: convnet7}\n",  # convnet's old name
        "optimizer: {learning_rate: 1e-3}\ntrain: {steps_per_epoch: null}\n",
        "elastic: {discovery_script: ''}\n",
        "callbacks:\n- class: EarlyStopping\n  args: {monitor: val_loss, patience: 2}\n"
        "- {class: 'my_pkg.cbs:Log', args: null, ranks: chief}\n",
    ],
)
def test_what_the_loader_also_takes_validates(text: str, tmp_path) -> None:
    """Forms the loader takes beyond the plain type (null sections, old names and booleans,
    exponents, callbacks) pass the schema too."""
    (tmp_path / "c.yaml").write_text(text)
    load_config(tmp_path / "c.yaml")
    assert [e.message for e in errors(yaml.load(text, Loader=EditorLoader))] == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_each_invalid_config_is_refused_by_the_schema_and_the_loader(path) -> None:
    """Every config of tests/invalid_configs (an unknown key, a wrong type, a value out of
    range, a bad choice, a bad callback) fails the schema where the loader fails it, and the
    loader still refuses it with its own message (test_config.py checks each word)."""
    with pytest.raises(ConfigError) as info:
        load_config(path)
    if path.name in LOADER_ONLY:
        return
    found = errors(yaml.load(path.read_text(), Loader=EditorLoader))
    assert found, f"{path.name}: the schema accepts what the loader refuses: {info.value}"
    message = re.fullmatch(rf"{re.escape(str(path))}(?P<line> \(line \d+\))?: (?P<rest>.*)",
                           str(info.value), re.S)  # fmt: skip
    if message["line"]:  # past the document's bounds: the loader names a line, not a key
        return
    key = message["rest"].split(": ")[0]
    where = [dotted(e.absolute_path) for e in found]  # the same key, or one inside the other
    assert any(key.startswith(w) or w.startswith(key) for w in where), (where, str(info.value))


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("train: {epochs: 2.0}", "train.epochs: expected an integer, got 2.0"),  # JSON's 2.0 is 2
        ("callbacks: [{class: BackupAndRestore}]", "hvd_train already checkpoints"),
        ("horovod: {stall_shutdown_s: 30}", "stall_shutdown_s"),  # a rule across keys
    ],
)
def test_the_loader_refuses_what_the_schema_lets_through(text: str, refused: str, tmp_path):
    """The loader's error is the word: what JSON Schema cannot say, it still refuses."""
    assert errors(yaml.load(text, Loader=EditorLoader)) == []
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(refused)):
        check(load_config(tmp_path / "c.yaml"), world_size=2)


def test_the_schema_gives_every_key_the_loaders_default() -> None:
    """The schema's defaults are the loader's defaults, key by key, and they pass the schema."""
    defaults = to_dict(Config())
    sections = json_schema()["properties"]
    for name, section in defaults.items():
        if isinstance(section, dict):
            shown = {k: p["default"] for k, p in sections[name]["properties"].items()}
            assert shown == section, name
    assert sections["callbacks"]["default"] == defaults["callbacks"] == []
    assert errors(defaults) == []


def test_every_key_says_what_it_means() -> None:
    """Every key of every section, and of a callback, has the description docs/config.md shows."""
    schema = json_schema()
    sections = [s for s in schema["properties"].values() if "properties" in s]
    sections.append(schema["properties"]["callbacks"]["items"])
    missing = [k for s in sections for k, p in s["properties"].items() if not p.get("description")]
    assert len(sections) == 13 and missing == []


@dataclass(frozen=True)
class Inner:
    """The inner section.

    Not for the editor: what the code's reader needs."""

    size: int = field(default=3, metadata={"min": 1})  # how many
    kind: Literal["small", "large"] = field(
        default="small", metadata={"aliases": {"tiny": "small"}}
    )
    ratio: float | None = field(default=None, metadata={"min_exclusive": 0.0, "max": 1.0})


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    name: str = field(default="x", metadata={"key": "class"})
    sizes: tuple[int, ...] = (2,)


def test_a_schema_that_is_not_hvd_trains_maps_each_check_to_its_keyword() -> None:
    """Bounds, choices with old names, null, YAML keys, defaults and comments, from dataclasses
    of a test's own."""
    inner = {
        "type": ["object", "null"],
        "description": "The inner section.",
        "properties": {
            "size": {"description": "how many", "type": "integer", "minimum": 1, "default": 3},
            "kind": {"enum": ["small", "large", "tiny"], "default": "small"},
            "ratio": {"type": ["number", "null"], "exclusiveMinimum": 0.0, "maximum": 1.0,
                      "default": None},
        },
        "additionalProperties": False,
    }  # fmt: skip
    assert object_schema(Outer) == {
        "type": ["object", "null"],
        "properties": {
            "inner": inner,
            "class": {"type": "string", "maxLength": 4096, "default": "x"},
            "sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}, "default": [2]},
        },
        "additionalProperties": False,
    }


def test_config_schema_prints_the_schema_as_json() -> None:
    """`hvd-train config --schema` prints the JSON Schema on stdout and exits 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["config", "--schema"])
    assert code == 0
    assert json.loads(out.getvalue()) == json_schema()
