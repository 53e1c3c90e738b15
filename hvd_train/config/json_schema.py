"""docs/config.schema.json: the config as a JSON Schema (draft 2020-12) for editors, generated
from the same fields, comments and metadata as docs/config.md (`hvd-train config --schema`).

An editor that reads it (VS Code's YAML extension, any yaml-language-server client) completes
keys, shows each key's meaning and default, and marks an unknown key, a wrong type, a value out
of range or not among the choices as you type. It says what the loader checks key by key; the
rules across keys (rules.py) and the bounds on a YAML document are the loader's alone, and the
loader's error is the word wherever the two differ. Only keywords that mean the same in
draft-07 are used, because yaml-language-server validates with draft-07's rules.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any, Literal

from hvd_train.config.schema import Config
from hvd_train.config.typed_yaml import (
    MAX_STRING,
    ONE_PATH,
    Described,
    default_of,
    described_fields,
    item_class,
    non_null,
    section_doc,
)

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def json_schema() -> dict[str, Any]:
    """The config's JSON Schema, as `hvd-train config --schema` prints it."""
    return {
        "$schema": DRAFT,
        "$comment": "Generated from hvd_train/config/schema.py by `hvd-train config --schema > "
        "docs/config.schema.json`; tests/test_docs.py fails when it is stale.",
        "title": "hvd_train config",
        "description": "One run's config (docs/config.md). Every key has a default, so a file "
        "holds only what it changes; hvd_train's loader checks it again, with the rules that "
        "span keys, and its error is the word.",
        **object_schema(Config),
    }


def schema_text() -> str:
    """`json_schema()` as the JSON file docs/config.schema.json holds."""
    return json.dumps(json_schema(), indent=2) + "\n"


def object_schema(cls: type, nullable: bool = True) -> dict[str, Any]:
    """A mapping of `cls`'s keys and no other. A section left empty (`train:`, null) reads as
    {} in the loader, so `nullable` lets null through."""
    fields = described_fields(cls)
    out: dict[str, Any] = {"type": ["object", "null"] if nullable else "object"}
    summary = section_doc(cls).split("\n\n")[0]  # the rest is for the code's reader
    if summary:
        out["description"] = " ".join(summary.split())
    out["properties"] = {d.key: key_schema(d) for d in fields}
    required = [d.key for d in fields if default_of(d.field) is dataclasses.MISSING]
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def key_schema(d: Described) -> dict[str, Any]:
    """One key: a section, or a value with its description and default."""
    if dataclasses.is_dataclass(d.type):
        return object_schema(d.type)
    inner, nullable = non_null(d.type)
    out = value_schema(inner, d.field.metadata)
    if nullable:
        _allow_null(out)
    if d.doc:
        out = {"description": d.doc, **out}
    default = default_of(d.field)
    if default is not dataclasses.MISSING:
        out["default"] = _json_value(default)
    return out


def value_schema(tp: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    """What the loader's `_coerce` accepts for a value of type `tp` (typed_yaml.py)."""
    if typing.get_origin(tp) is Literal:
        return {"enum": _choices(tp, meta)}
    if typing.get_origin(tp) is tuple:
        return _list_schema(tp)
    if typing.get_origin(tp) is Mapping:
        return {"type": ["object", "null"]}  # null is {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is str:
        out: dict[str, Any] = {"type": "string", "maxLength": MAX_STRING}
        if meta.get("executable"):  # "" is allowed: no script
            out["pattern"] = f"^(?:{ONE_PATH.pattern})?$"
        if "pattern" in meta:
            out["pattern"] = meta["pattern"]
        return out
    out = {"type": "integer" if tp is int else "number"}
    for key, keyword in _BOUNDS:
        if key in meta:
            out[keyword] = meta[key]
    return out


_BOUNDS = (("min", "minimum"), ("min_exclusive", "exclusiveMinimum"), ("max", "maximum"))


def _choices(tp: Any, meta: typing.Mapping[str, Any]) -> list[Any]:
    """A Literal's values, then what the loader also takes for them: old names (`aliases`),
    true/false for a level (`bool_as_int`) or for a choice (`bool_as`)."""
    values = list(typing.get_args(tp)) + list(meta.get("aliases", {}))
    if meta.get("bool_as_int"):
        values += [False, True]
    values += list(meta.get("bool_as", {}))
    return values


def _list_schema(tp: Any) -> dict[str, Any]:
    item = item_class(tp)
    if item is not None:  # a list of mappings (callbacks); null is [], as a section's is {}
        return {"type": ["array", "null"], "items": object_schema(item, nullable=False)}
    return {"type": "array", "items": {"type": "integer", "minimum": 1}}  # as _coerce checks


def _allow_null(out: dict[str, Any]) -> None:
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    else:
        out["type"] = [out["type"], "null"]


def _json_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    return list(value) if isinstance(value, tuple) else value
